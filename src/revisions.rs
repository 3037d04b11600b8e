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
//!
//! A reference names a revision ([`resolve`]), as the command line and the Python API write it:
//! ```text
//! REF = <org>/<name>[@<revision>] | sha256:<commit hex>
//! revision = latest | <release version> | <commit hex> | sha256:<commit hex>
//! ```

use std::collections::{BTreeMap, HashSet};

use crate::format::{ObjectRef, Release, Repo, Sha256, Tree};
use crate::store::{Commit, Store, StoreError, StoreResult};

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

/// One resolved lane of a revision.
#[derive(Clone, Debug)]
pub struct Target {
    /// The repo, when named by one.
    pub repo: Option<String>,
    /// The lane folder name.
    pub lane: String,
    /// The commit.
    pub commit: ObjectRef,
}

/// Why a reference names nothing in a store.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// No repo document of that name.
    #[error("no repo {name:?} in {place}")]
    NoRepo {
        /// The name asked for.
        name: String,
        /// Where it was looked for: `the store at <root>`, `<endpoint url>`.
        place: String,
    },
    /// The repo has no such revision.
    #[error("repo {repo} has no revision {revision:?} (it has: {})", have.join(", "))]
    NoRevision {
        /// The repo.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// Its revision names ([`revision_names`]).
        have: Vec<String>,
    },
    /// The revision has no such lane.
    #[error("{reference} has no lane {lane:?} (it has: {})", have.join(", "))]
    NoLane {
        /// The reference as written.
        reference: String,
        /// The lane asked for.
        lane: String,
        /// The revision's lanes.
        have: Vec<String>,
    },
    /// One lane was needed and the revision has several.
    #[error("{reference} has several lanes ({}); pick one", have.join(", "))]
    SeveralLanes {
        /// The reference as written.
        reference: String,
        /// The revision's lanes.
        have: Vec<String>,
    },
    /// The reference is not `<org>/<name>[@<revision>]` nor `sha256:<hex>`.
    #[error("{reference:?} is not a reference: {why}")]
    BadReference {
        /// The reference as written.
        reference: String,
        /// What is wrong with it.
        why: String,
    },
    /// No object of that digest, or one that is not a commit.
    #[error("{} is not a commit (a cozytensors.tree/1 object) of the store at {}", commit.id(), root.display())]
    NotACommit {
        /// The digest (length 0 when no object has it).
        commit: ObjectRef,
        /// The store's root.
        root: std::path::PathBuf,
    },
    /// The store failed to read a document the resolution needs.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another source of documents (an endpoint) failed to give one.
    #[error("{0}")]
    Source(String),
}

impl ResolveError {
    /// Whether the reference names nothing (as opposed to a store that failed).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            ResolveError::NoRepo { .. }
                | ResolveError::NoRevision { .. }
                | ResolveError::NoLane { .. }
                | ResolveError::NotACommit { .. }
        )
    }
}

/// `reference` (module doc) split into its repo name (`None` for `sha256:<commit>`) and its
/// revision ([`LATEST`] when it names none).
pub fn split_reference(reference: &str) -> (Option<&str>, &str) {
    match reference.split_once('@') {
        Some((repo, rev)) => (Some(repo), rev),
        None if reference.starts_with("sha256:") => (None, reference),
        None => (Some(reference), LATEST),
    }
}

/// Refuses a reference whose repo name is not `<org>/<name>` (spec §7 segments: no `..`, no
/// slash or NUL inside), whose revision is empty or holds a slash or `@`, or whose
/// `sha256:` revision is not a digest, before any path is made of it.
///
/// # Errors
/// [`ResolveError::BadReference`], saying why.
pub fn check_reference(reference: &str) -> Result<(), ResolveError> {
    let bad = |why: String| ResolveError::BadReference {
        reference: reference.to_owned(),
        why,
    };
    let (repo, revision) = split_reference(reference);
    if let Some(repo) = repo {
        crate::format::names::split_repo_name(repo).map_err(|e| bad(e.to_string()))?;
    }
    let not_a_revision = || {
        bad(format!(
            "the revision {revision:?} is not latest, a release version or a commit"
        ))
    };
    if revision.is_empty() || revision.contains(['/', '@', '\0']) {
        return Err(not_a_revision());
    }
    if let Some(hex) = revision.strip_prefix("sha256:") {
        hex.parse::<Sha256>()
            .map_err(|e| bad(format!("the revision {revision:?}: {e}")))?;
    }
    Ok(())
}

/// Every lane that `reference` (module doc) names in `store`, or just `lane` when given.
///
/// # Errors
/// [`ResolveError`]: no such repo, revision or lane, a malformed digest, or a store that
/// fails to read a repo or tree.
pub fn resolve(
    store: &Store,
    reference: &str,
    lane: Option<&str>,
) -> Result<Vec<Target>, ResolveError> {
    check_reference(reference)?;
    let (repo_name, revision) = split_reference(reference);
    let Some(name) = repo_name else {
        let commit = commit_by_hex(store, revision)?;
        let tree = store.tree(&commit).map_err(|_| ResolveError::NotACommit {
            commit,
            root: store.root().to_path_buf(),
        })?;
        return pick_lane(
            reference,
            vec![Target {
                repo: None,
                lane: lane_of(&tree),
                commit,
            }],
            lane,
        );
    };
    let repo = store.repo(name)?.ok_or_else(|| ResolveError::NoRepo {
        name: name.to_owned(),
        place: format!("the store at {}", store.root().display()),
    })?;
    resolve_in(&repo, reference, lane, |commit| {
        Ok(store.tree(commit)?.lane)
    })
}

/// The lanes that `reference`, a reference to `repo` (`<org>/<name>[@<revision>]`), names, or
/// just `lane` when given; `lane_label` gives a commit's lane label (reading its tree, from a
/// store or an endpoint).
///
/// # Errors
/// No such revision or lane; what `lane_label` returns.
pub fn resolve_in(
    repo: &Repo,
    reference: &str,
    lane: Option<&str>,
    lane_label: impl FnMut(&ObjectRef) -> Result<Option<String>, ResolveError>,
) -> Result<Vec<Target>, ResolveError> {
    check_reference(reference)?;
    let (_, revision) = split_reference(reference);
    let wanted = revision.strip_prefix("sha256:").unwrap_or(revision);
    let Some(rev) = self::revision(repo, wanted) else {
        return Err(ResolveError::NoRevision {
            repo: repo.name.clone(),
            revision: revision.to_owned(),
            have: revision_names(repo),
        });
    };
    let targets = lanes(repo, rev, lane_label)?
        .into_iter()
        .map(|(lane, commit)| Target {
            repo: Some(repo.name.clone()),
            lane,
            commit,
        })
        .collect();
    pick_lane(reference, targets, lane)
}

/// `targets`, or only the one of lane `lane` when given.
fn pick_lane(
    reference: &str,
    targets: Vec<Target>,
    lane: Option<&str>,
) -> Result<Vec<Target>, ResolveError> {
    let Some(lane) = lane else {
        return Ok(targets);
    };
    let have: Vec<String> = targets.iter().map(|t| t.lane.clone()).collect();
    let picked: Vec<Target> = targets.into_iter().filter(|t| t.lane == lane).collect();
    if picked.is_empty() {
        return Err(ResolveError::NoLane {
            reference: reference.to_owned(),
            lane: lane.to_owned(),
            have,
        });
    }
    Ok(picked)
}

/// Exactly one of `targets`, the lanes `reference` names.
///
/// # Errors
/// [`ResolveError::SeveralLanes`] when there are several.
pub fn only_lane(reference: &str, mut targets: Vec<Target>) -> Result<Target, ResolveError> {
    if targets.len() != 1 {
        return Err(ResolveError::SeveralLanes {
            reference: reference.to_owned(),
            have: targets.iter().map(|t| t.lane.clone()).collect(),
        });
    }
    Ok(targets.remove(0))
}

/// Exactly one lane of `reference`, with its commit read.
///
/// # Errors
/// As [`resolve`]; [`ResolveError::SeveralLanes`] when `lane` is `None` and the revision has
/// several; the commit's tree or header cannot be read.
pub fn resolve_one(
    store: &Store,
    reference: &str,
    lane: Option<&str>,
) -> Result<(Target, Commit), ResolveError> {
    let target = only_lane(reference, resolve(store, reference, lane)?)?;
    let commit = store.commit(&target.commit)?;
    Ok((target, commit))
}

/// The object with digest `text` (`sha256:<hex>` or hex), found by its blob.
fn commit_by_hex(store: &Store, text: &str) -> Result<ObjectRef, ResolveError> {
    let hex = text.strip_prefix("sha256:").unwrap_or(text);
    let sha256: Sha256 = hex.parse().map_err(|e| ResolveError::BadReference {
        reference: text.to_owned(),
        why: format!("{e}"),
    })?;
    let probe = ObjectRef { sha256, length: 0 };
    match std::fs::metadata(store.object_path(&probe)) {
        Ok(meta) => Ok(ObjectRef {
            sha256,
            length: meta.len(),
        }),
        Err(_) => Err(ResolveError::NotACommit {
            commit: probe,
            root: store.root().to_path_buf(),
        }),
    }
}
