//! Revisions of a repo (spec §7 resolution): which commit each `<revision>/<lane>` names.
//!
//! - `latest`: the newest release's lanes when the repo has releases; otherwise, for each lane
//!   label, the newest commit in `commits` (newest last) that carries it.
//! - each release's version: that release's lanes;
//! - each commit the repo names, by its 64 hex digits: its own lane.
//!
//! A commit without a lane label shows as lane [`NO_LANE`], which no label can be.

use std::collections::BTreeMap;

use crate::format::{ObjectRef, Repo, Tree};
use crate::store::{Store, StoreResult};

/// The lane folder of a commit without a lane label.
pub const NO_LANE: &str = "_";

/// The alias of the newest revision.
pub const LATEST: &str = "latest";

/// A revision folder: its name and the commit of each lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revision {
    /// `latest`, a version, or a commit's hex digits.
    pub name: String,
    /// Lane folder name → commit.
    pub lanes: BTreeMap<String, ObjectRef>,
}

/// The lane folder name of `tree`.
pub fn lane_of(tree: &Tree) -> String {
    tree.lane.clone().unwrap_or_else(|| NO_LANE.to_owned())
}

/// Every revision of `repo`: `latest` first, then releases oldest first, then each commit.
/// Trees of unreleased commits are read to learn their lanes; one that cannot be read is left
/// out with a warning.
///
/// # Errors
/// None today besides what reading trees reports through warnings; kept fallible for callers.
pub fn revisions(store: &Store, repo: &Repo) -> StoreResult<Vec<Revision>> {
    let mut lane_of_commit: BTreeMap<ObjectRef, String> = BTreeMap::new();
    for release in &repo.releases {
        for (lane, commit) in &release.lanes {
            lane_of_commit.insert(*commit, lane.clone());
        }
    }
    for commit in &repo.commits {
        if lane_of_commit.contains_key(commit) {
            continue;
        }
        let tree = store.read_verified(commit).and_then(|bytes| {
            Tree::from_json(&bytes).map_err(|source| crate::store::StoreError::Format {
                path: store.object_path(commit),
                source,
            })
        });
        match tree {
            Ok(tree) => {
                lane_of_commit.insert(*commit, lane_of(&tree));
            }
            Err(e) => tracing::warn!(
                "repo {}: commit {} is unreadable: {e}",
                repo.name,
                commit.id()
            ),
        }
    }
    let latest: BTreeMap<String, ObjectRef> = match repo.releases.last() {
        Some(release) => release.lanes.clone(),
        None => {
            let mut lanes = BTreeMap::new();
            for commit in &repo.commits {
                if let Some(lane) = lane_of_commit.get(commit) {
                    lanes.insert(lane.clone(), *commit);
                }
            }
            lanes
        }
    };
    let mut out = vec![Revision {
        name: LATEST.into(),
        lanes: latest,
    }];
    for release in &repo.releases {
        out.push(Revision {
            name: release.version.clone(),
            lanes: release.lanes.clone(),
        });
    }
    for commit in repo.roots() {
        let Some(lane) = lane_of_commit.get(commit) else {
            continue;
        };
        let name = commit.sha256.hex();
        if out.iter().any(|r| r.name == name) {
            continue;
        }
        out.push(Revision {
            name,
            lanes: BTreeMap::from([(lane.clone(), *commit)]),
        });
    }
    Ok(out)
}
