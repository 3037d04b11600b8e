//! The upper levels: orgs and repos from a snapshot of the refs, and what each revision folder
//! holds.
//!
//! A repo's revision folders, in listing order: [`LATEST`], each release's version (oldest
//! first), then every commit the repo names as its 64 hex digits. A name that an earlier kind
//! already took (a version spelled `latest`) is shown once, as the earlier kind.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::{RepoEntry, LATEST, UNLABELLED_LANE};
use crate::format::{ObjectRef, Release, Repo, Sha256};

/// The repos of one org.
#[derive(Debug)]
pub struct Org {
    /// The newest ref mtime among its repos (the org folder's mtime).
    pub mtime: SystemTime,
    /// Repos by the second part of their name.
    pub repos: BTreeMap<String, Arc<RepoEntry>>,
}

/// The refs as read at one moment.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Orgs by name (the first part of repo names, in the documents' spelling).
    pub orgs: BTreeMap<String, Org>,
}

impl Snapshot {
    /// Groups `repos` by org. A name that is not `<org>/<name>` is skipped with a warning.
    pub fn new(repos: Vec<RepoEntry>) -> Snapshot {
        let mut orgs: BTreeMap<String, Org> = BTreeMap::new();
        for entry in repos {
            let Ok((org, name)) = crate::format::names::split_repo_name(&entry.repo.name) else {
                tracing::warn!("skipping repo {:?}: not <org>/<name>", entry.repo.name);
                continue;
            };
            let (org, name) = (org.to_owned(), name.to_owned());
            let folder = orgs.entry(org).or_insert_with(|| Org {
                mtime: UNIX_EPOCH,
                repos: BTreeMap::new(),
            });
            folder.mtime = folder.mtime.max(entry.mtime);
            folder.repos.insert(name, Arc::new(entry));
        }
        Snapshot { orgs }
    }

    /// The repo `org/name`.
    pub fn repo(&self, org: &str, name: &str) -> Option<&Arc<RepoEntry>> {
        self.orgs.get(org)?.repos.get(name)
    }
}

/// What a revision folder stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revision<'a> {
    /// The newest release, or the newest commit of each lane.
    Latest,
    /// One release.
    Release(&'a Release),
    /// One commit the repo names.
    Commit(ObjectRef),
}

/// The names of `repo`'s revision folders, in listing order.
pub fn revision_names(repo: &Repo) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut names = Vec::new();
    let versions = repo.releases.iter().map(|r| r.version.clone());
    let commits = repo.roots().map(|c| c.sha256.hex());
    for name in std::iter::once(LATEST.to_owned())
        .chain(versions)
        .chain(commits)
    {
        if seen.insert(name.clone()) {
            names.push(name);
        }
    }
    names
}

/// The revision folder `name` of `repo`, with the priority of [`revision_names`].
pub fn revision<'a>(repo: &'a Repo, name: &str) -> Option<Revision<'a>> {
    if name == LATEST {
        return Some(Revision::Latest);
    }
    if let Some(release) = repo.releases.iter().find(|r| r.version == name) {
        return Some(Revision::Release(release));
    }
    let digest: Sha256 = name.parse().ok()?;
    repo.roots()
        .find(|c| c.sha256 == digest)
        .map(|c| Revision::Commit(*c))
}

/// The lane folders of revision `rev` of `repo`: (folder name, commit), sorted by name.
/// `lane_of` gives a commit's lane label (reading its tree).
///
/// # Errors
/// `lane_of` fails for a commit the revision needs.
pub fn lanes<E>(
    repo: &Repo,
    rev: Revision<'_>,
    mut lane_of: impl FnMut(&ObjectRef) -> Result<Option<String>, E>,
) -> Result<Vec<(String, ObjectRef)>, E> {
    let folder = |lane: Option<String>| lane.unwrap_or_else(|| UNLABELLED_LANE.to_owned());
    let release_lanes = |r: &Release| {
        r.lanes
            .iter()
            .map(|(lane, c)| (lane.clone(), *c))
            .collect::<Vec<_>>()
    };
    Ok(match rev {
        Revision::Latest => match repo.releases.last() {
            Some(newest) => release_lanes(newest),
            None => {
                // Commits are newest last: the first commit seen from the end wins its lane.
                let mut by_lane = BTreeMap::new();
                for commit in repo.commits.iter().rev() {
                    by_lane.entry(folder(lane_of(commit)?)).or_insert(*commit);
                }
                by_lane.into_iter().collect()
            }
        },
        Revision::Release(release) => release_lanes(release),
        Revision::Commit(commit) => vec![(folder(lane_of(&commit)?), commit)],
    })
}
