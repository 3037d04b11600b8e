//! `tensorfs verify [REF] [--repair]`: re-hash objects.
//!
//! Without REF every blob in the store is hashed against its name, and every repo's commits
//! are checked for completeness (their trees, headers, chunks, assets and repo files present).
//! With REF, the closure of its commits. `--repair` removes damaged blobs (they cannot be
//! served anyway) and names the commits that need importing or downloading again.

use std::collections::BTreeSet;
use std::fs;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};

use super::target::resolve;
use super::Cli;
use crate::format::{ObjectRef, Sha256};
use crate::io::hash_file;
use crate::store::Store;
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
    // The commits to check for completeness.
    let mut commits: Vec<(String, ObjectRef)> = Vec::new();
    match &args.reference {
        Some(reference) => {
            for t in resolve(&store, reference, None)? {
                commits.push((
                    format!("{}/{}", t.repo.as_deref().unwrap_or("-"), t.lane),
                    t.commit,
                ));
            }
        }
        None => {
            for repo in store.repos()? {
                for c in repo.roots() {
                    commits.push((repo.name.clone(), *c));
                }
            }
        }
    }
    let mut wanted: BTreeSet<ObjectRef> = BTreeSet::new();
    let mut incomplete: Vec<String> = Vec::new();
    for (owner, id) in &commits {
        match closure(&store, id) {
            Ok(objects) => {
                let missing: Vec<&ObjectRef> =
                    objects.iter().filter(|o| !store.contains(o)).collect();
                if !missing.is_empty() {
                    incomplete.push(format!(
                        "{owner} commit {} lacks {} objects (first: {})",
                        id.id(),
                        missing.len(),
                        missing[0]
                    ));
                }
                wanted.extend(objects);
            }
            Err(e) => incomplete.push(format!("{owner} commit {}: {e:#}", id.id())),
        }
    }
    // What to hash: the closure of REF, or every blob.
    let blobs: Vec<ObjectRef> = match &args.reference {
        Some(_) => wanted
            .iter()
            .filter(|o| store.contains(o))
            .copied()
            .collect(),
        None => all_blobs(&store)?,
    };
    let bad = hash_all(&store, &blobs);
    for object in &bad {
        let path = store.object_path(object);
        problems.push(format!("damaged blob {}", path.display()));
        if args.repair {
            fs::remove_file(&path)?;
            problems.push(format!("removed {}", path.display()));
        }
    }
    for line in &incomplete {
        problems.push(line.clone());
    }
    if problems.is_empty() {
        println!(
            "verified {} objects of {} commits",
            blobs.len(),
            commits.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    for p in &problems {
        eprintln!("tensorfs: {p}");
    }
    if args.repair && !bad.is_empty() {
        eprintln!(
            "tensorfs: import or download the affected models again to restore the removed objects"
        );
    }
    Ok(ExitCode::FAILURE)
}

/// A commit's closure (spec §7): the tree, its files, its header's chunks and assets.
fn closure(store: &Store, id: &ObjectRef) -> anyhow::Result<Vec<ObjectRef>> {
    let commit = store.commit(id)?;
    let mut out = vec![*id];
    out.extend(commit.tree.files.values().copied());
    out.extend(commit.header.objects().copied());
    Ok(out)
}

/// Every blob under `blobs/`, named by its file name and sized by its length.
fn all_blobs(store: &Store) -> anyhow::Result<Vec<ObjectRef>> {
    let mut out = Vec::new();
    let root = store.root().join("blobs");
    for a in fs::read_dir(&root)? {
        for b in fs::read_dir(a?.path())? {
            for entry in fs::read_dir(b?.path())? {
                let entry = entry?;
                let Some(sha256) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<Sha256>().ok())
                else {
                    continue;
                };
                let length = entry.metadata()?.len();
                out.push(ObjectRef { sha256, length });
            }
        }
    }
    Ok(out)
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
                let ok = fs::File::open(store.object_path(object))
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
