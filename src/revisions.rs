//! Revisions of a repo (spec §7 resolution): which commit each `<revision>/<lane>` names. The
//! mount's folders and the command line's `REF@revision` both resolve here.
//!
//! A repo's revision folders, in listing order:
//! - [`LATEST`]: the newest release's lanes when the repo has releases; otherwise, for each lane
//!   label, the newest commit in `commits` (newest last) that carries it;
//! - each release's version (oldest first): that release's lanes;
//! - every commit the repo names, as its 64 hex digits: its own lane.
//!
//! A name an earlier kind already took (a version spelled `latest`) is shown once, as the
//! earlier kind. A commit without a lane label shows as lane [`NO_LANE`], which no label can be.

use std::collections::{BTreeMap, HashSet};

use crate::format::{ObjectRef, Release, Repo, Sha256, Tree};
use crate::store::{Store, StoreResult};

/// The lane folder of a commit without a lane label (`_` starts no label).
pub const NO_LANE: &str = "_";

/// The alias of the newest revision.
pub const LATEST: &str = "latest";

/// The lane folder name of `tree`.
pub fn lane_of(tree: &Tree) -> String {
    tree.lane.clone().unwrap_or_else(|| NO_LANE.to_owned())
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
    let folder = |lane: Option<String>| lane.unwrap_or_else(|| NO_LANE.to_owned());
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

/// Lane folders by name, each with its commit.
pub type Lanes = Vec<(String, ObjectRef)>;

/// Every revision of `repo` with its lane folders, reading unreleased commits' trees from
/// `store` to learn their lanes.
///
/// # Errors
/// A tree a revision needs is absent, damaged or malformed.
pub fn revisions(store: &Store, repo: &Repo) -> StoreResult<Vec<(String, Lanes)>> {
    let lane_of_commit = |commit: &ObjectRef| store.tree(commit).map(|t| t.lane);
    let mut out = Vec::new();
    for name in revision_names(repo) {
        let rev = revision(repo, &name).expect("listed names resolve");
        out.push((name, lanes(repo, rev, lane_of_commit)?));
    }
    Ok(out)
}
