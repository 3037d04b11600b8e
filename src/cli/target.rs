//! Naming a checkpoint on the command line.
//!
//! ```text
//! REF = <org>/<name>[@<revision>] | sha256:<commit hex>
//! revision = latest | <release version> | <commit hex> | sha256:<commit hex>
//! ```
//! With several lanes at that revision, `--lane` picks one.

use anyhow::{anyhow, bail, Context};

use crate::format::{ObjectRef, Sha256};
use crate::revisions::{self, LATEST};
use crate::store::{Commit, Store};

/// One resolved lane of a revision.
#[derive(Debug)]
pub struct Target {
    /// The repo, when named by one.
    pub repo: Option<String>,
    /// The lane folder name.
    pub lane: String,
    /// The commit.
    pub commit: ObjectRef,
}

/// Every lane `reference` names (just `lane` when given).
pub fn resolve(store: &Store, reference: &str, lane: Option<&str>) -> anyhow::Result<Vec<Target>> {
    let (repo_name, revision) = match reference.split_once('@') {
        Some((repo, rev)) => (Some(repo), rev),
        None if reference.starts_with("sha256:") => (None, reference),
        None => (Some(reference), LATEST),
    };
    let targets = match repo_name {
        None => {
            let commit = commit_by_hex(store, revision)?;
            let c = store.commit(&commit).with_context(|| {
                format!(
                    "{} is not a commit (a cozytensors.tree/1 object) of this store",
                    commit.id()
                )
            })?;
            vec![Target {
                repo: None,
                lane: crate::revisions::lane_of(&c.tree),
                commit,
            }]
        }
        Some(name) => {
            let repo = store.repo(name)?.ok_or_else(|| {
                anyhow!(
                    "no repo {name:?} in the store at {}",
                    store.root().display()
                )
            })?;
            let wanted = revision.strip_prefix("sha256:").unwrap_or(revision);
            let Some(rev) = revisions::revision(&repo, wanted) else {
                bail!(
                    "repo {name} has no revision {revision:?} (it has: {})",
                    revisions::revision_names(&repo).join(", ")
                );
            };
            let lanes = revisions::lanes(&repo, rev, |commit| store.tree(commit).map(|t| t.lane))?;
            lanes
                .into_iter()
                .map(|(lane, commit)| Target {
                    repo: Some(repo.name.clone()),
                    lane,
                    commit,
                })
                .collect()
        }
    };
    match lane {
        None => Ok(targets),
        Some(lane) => {
            let lanes: Vec<String> = targets.iter().map(|t| t.lane.clone()).collect();
            let picked: Vec<Target> = targets.into_iter().filter(|t| t.lane == lane).collect();
            if picked.is_empty() {
                bail!(
                    "{reference} has no lane {lane:?} (it has: {})",
                    lanes.join(", ")
                );
            }
            Ok(picked)
        }
    }
}

/// Exactly one lane of `reference`.
pub fn resolve_one(
    store: &Store,
    reference: &str,
    lane: Option<&str>,
) -> anyhow::Result<(Target, Commit)> {
    let mut targets = resolve(store, reference, lane)?;
    if targets.len() != 1 {
        let lanes: Vec<&str> = targets.iter().map(|t| t.lane.as_str()).collect();
        bail!(
            "{reference} has several lanes ({}); pick one",
            lanes.join(", ")
        );
    }
    let target = targets.remove(0);
    let commit = store
        .commit(&target.commit)
        .with_context(|| format!("reading commit {}", target.commit.id()))?;
    Ok((target, commit))
}

/// The commit object with digest `text` (`sha256:<hex>` or hex), found by its blob.
fn commit_by_hex(store: &Store, text: &str) -> anyhow::Result<ObjectRef> {
    let hex = text.strip_prefix("sha256:").unwrap_or(text);
    let sha256: Sha256 = hex.parse().map_err(|e| anyhow!("{text:?}: {e}"))?;
    let probe = ObjectRef { sha256, length: 0 };
    let path = store.object_path(&probe);
    let length = std::fs::metadata(&path)
        .map_err(|_| {
            anyhow!(
                "no commit sha256:{hex} in the store at {}",
                store.root().display()
            )
        })?
        .len();
    Ok(ObjectRef { sha256, length })
}
