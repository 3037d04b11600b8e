//! `tensorfs verify [REF] [--repair]`: re-hash objects.
//!
//! Without REF every blob in the store is hashed against its name, and every repo's commits
//! are checked for completeness (their trees, headers, chunks, assets and repo files present).
//! With REF, the closure of its commits. Each damaged blob is named with the models that use
//! it; `--repair` removes it through the store (it cannot be served anyway), and those models
//! are the ones to import or download again.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};

use super::{count, human, Cli};
use crate::format::{ObjectRef, Sha256};
use crate::revisions::resolve;
use crate::store::Store;
use crate::store::{hash_file, open_blob};
use crate::sync::lock;

/// Arguments of `verify`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// org/name[@revision] or sha256:<commit>; all of the store when absent.
    #[arg(value_name = "REF")]
    pub reference: Option<String>,
    /// Remove damaged blobs.
    #[arg(long)]
    pub repair: bool,
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    let store = cli.existing_store()?;
    let mut problems: Vec<String> = Vec::new();
    // The commits to check for completeness, with the repo naming each (none for a bare
    // `sha256:` reference).
    let mut commits: Vec<(Option<String>, ObjectRef)> = Vec::new();
    match &args.reference {
        Some(reference) => {
            for t in resolve(&store, reference, None)? {
                commits.push((t.repo.clone(), t.commit));
            }
        }
        None => {
            for repo in store.repos()? {
                for c in repo.roots() {
                    commits.push((Some(repo.name.clone()), *c));
                }
            }
        }
    }
    // Which models use each object, so a damage names them and not only its blob.
    // By digest: a blob listed from `blobs/` has the length its file has now, which damage
    // may have changed.
    let mut users: BTreeMap<Sha256, BTreeSet<String>> = BTreeMap::new();
    let mut wanted: BTreeSet<ObjectRef> = BTreeSet::new();
    let mut incomplete: Vec<String> = Vec::new();
    // Cached models (outside local/) fetched as read, or partly evicted: noted, not failed.
    let mut partial: Vec<String> = Vec::new();
    // Something at the blob's path, whole or not: what is there is hashed (and found damaged
    // when it is not the object); only what is not there at all is missing.
    let present = |o: &ObjectRef| std::fs::symlink_metadata(store.object_path(o)).is_ok();
    for (repo, id) in &commits {
        // A model is its repo and lane (`local/minilm/f32`), or the commit alone.
        let owner = |lane: Option<&str>| match (repo, lane) {
            (Some(repo), Some(lane)) => format!("{repo}/{lane}"),
            (Some(repo), None) => repo.clone(),
            (None, _) => format!("commit {}", id.id()),
        };
        match closure(&store, id) {
            Ok((lane, objects)) => {
                let owner = owner(lane.as_deref());
                let label = match repo {
                    Some(_) => format!("{owner} commit {}", id.id()),
                    None => owner.clone(),
                };
                let missing: Vec<&ObjectRef> = objects.iter().filter(|o| !present(o)).collect();
                let cached = repo.as_deref().is_some_and(|r| !crate::remote::is_local(r));
                if !missing.is_empty() && cached {
                    partial.push(format!(
                        "{label}: {} not here (a cached model: a lazy mount fetches what is \
                         read, and a cache budget evicts; `tensorfs download {}` completes it)",
                        count(missing.len(), "object"),
                        repo.as_deref().unwrap_or_default()
                    ));
                } else if !missing.is_empty() {
                    incomplete.push(format!(
                        "{label} lacks {} (first: {})",
                        count(missing.len(), "object"),
                        missing[0]
                    ));
                }
                for o in objects {
                    users.entry(o.sha256).or_default().insert(owner.clone());
                    wanted.insert(o);
                }
            }
            Err(e) => incomplete.push(match repo {
                Some(repo) => format!("{repo} commit {}: {e:#}", id.id()),
                None => format!("commit {}: {e:#}", id.id()),
            }),
        }
    }
    // What to hash: the closure of REF, or every blob.
    let blobs: Vec<ObjectRef> = match &args.reference {
        Some(_) => wanted.iter().filter(|o| present(o)).copied().collect(),
        None => store.blobs()?,
    };
    let bad = hash_all(&store, &blobs);
    for object in &bad {
        let path = store.object_path(object);
        let used_by = match users.get(&object.sha256) {
            Some(names) => format!(
                "used by {}",
                names.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
            None => "used by no model".to_owned(),
        };
        let repair = if args.repair {
            match store.remove_damaged(object)? {
                true => "; removed: import or download those models again to restore it",
                false => "; not removed: it is intact now (replaced meanwhile)",
            }
        } else {
            "; run `tensorfs verify --repair` to remove it, then import or download those \
             models again"
        };
        problems.push(format!(
            "damaged blob {} ({used_by}){repair}",
            path.display()
        ));
    }
    problems.extend(incomplete);
    for p in &partial {
        eprintln!("tensorfs: partial: {p}");
    }
    if problems.is_empty() {
        let distinct: BTreeSet<&ObjectRef> = commits.iter().map(|(_, id)| id).collect();
        let bytes: u64 = blobs.iter().map(|o| o.length).sum();
        println!(
            "verified {} ({} of stored bytes, chunks and documents) of {}",
            count(blobs.len(), "object"),
            human(bytes),
            count(distinct.len(), "commit")
        );
        return Ok(ExitCode::SUCCESS);
    }
    for p in &problems {
        eprintln!("tensorfs: {p}");
    }
    Ok(ExitCode::FAILURE)
}

/// A commit's lane and closure.
fn closure(store: &Store, id: &ObjectRef) -> anyhow::Result<(Option<String>, Vec<ObjectRef>)> {
    let commit = store.commit(id)?;
    Ok((commit.tree.lane.clone(), commit.closure()))
}

/// Hashes `blobs` on every core; returns the damaged ones.
fn hash_all(store: &Store, blobs: &[ObjectRef]) -> Vec<ObjectRef> {
    let total: u64 = blobs.iter().map(|o| o.length).sum();
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("verifying {bytes}/{total_bytes} {wide_bar} {eta}")
                .expect("valid"),
        );
        bar
    });
    let next = AtomicUsize::new(0);
    let bad = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(object) = blobs.get(i) else { break };
                let ok = open_blob(&store.object_path(object))
                    .and_then(|f| hash_file(&f))
                    .is_ok_and(|found| found == *object);
                if !ok {
                    lock(&bad).push(*object);
                }
                if let Some(bar) = &bar {
                    bar.inc(object.length);
                }
            });
        }
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    bad.into_inner().unwrap_or_else(|e| e.into_inner())
}
