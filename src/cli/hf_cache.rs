//! `tensorfs import --hf-cache [DIR]`: every model snapshot of a Hugging Face hub cache, each
//! checked against its etags and tree listing, imported as `local/ORG--NAME` with its hub
//! identity recorded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use indicatif::ProgressBar;
use serde::Serialize;

use super::import::{Args, Bar, STOP};
use super::{count, human};
use crate::import::hub_cache::{self, CacheSnapshot};
use crate::import::{import, ImportConfig, ImportError};
use crate::store::hub::{HubRevision, TreeEntry};
use crate::store::Store;

/// What became of one snapshot.
#[derive(Debug, Serialize)]
struct Outcome {
    /// `ORG/NAME`.
    hub_id: String,
    /// The snapshot's commit.
    revision: String,
    /// The cache refs that name it.
    refs: Vec<String>,
    /// The snapshot folder.
    path: PathBuf,
    /// The local repo it is (or would have been) imported into.
    repo: String,
    /// `imported`, `up to date` or `skipped`.
    status: &'static str,
    /// Why it was skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<String>,
    /// Its lanes' commits (`lane` → `sha256:<hex>`), when imported.
    lanes: BTreeMap<String, String>,
    /// Bytes of the snapshot's files read (hashed, and for an import chunked).
    bytes_read: u64,
    /// Bytes of new objects stored.
    new_bytes: u64,
    /// Bytes of the lanes' chunks that were in the store already (dedup).
    saved_bytes: u64,
    /// Files no etag named (their hashes were taken, not checked).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unchecked: Vec<String>,
    /// What the check noticed and let pass (files of the listing not downloaded, a listing
    /// that could not be read).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
}

/// The totals over every snapshot.
#[derive(Debug, Default, Serialize)]
struct Summary {
    repos: usize,
    snapshots: usize,
    imported: usize,
    up_to_date: usize,
    skipped: usize,
    bytes_read: u64,
    new_bytes: u64,
    /// Bytes of chunks that were in the store already.
    saved_bytes: u64,
}

pub fn run(store: &Store, args: &Args, dir: Option<&Path>) -> anyhow::Result<ExitCode> {
    let dir = match dir {
        Some(dir) => dir.to_path_buf(),
        None => hub_cache::default_dir().context(
            "no hub cache named and none found: set HF_HUB_CACHE or HF_HOME, or pass --hf-cache DIR",
        )?,
    };
    let listing = hub_cache::scan(&dir)
        .with_context(|| format!("cannot list the hub cache {}", dir.display()))?;
    // A hub id recorded for a local repo goes on in that repo; recorded for two, in the one
    // whose ref changed last (the one the @hf view shows).
    let mut repo_of: BTreeMap<String, (std::time::SystemTime, String)> = BTreeMap::new();
    for record in store.hub_records()? {
        let changed = store
            .ref_path(&record.repo)
            .ok()
            .and_then(|p| std::fs::metadata(p).ok())
            .and_then(|m| m.modified().ok())
            .unwrap_or(std::time::UNIX_EPOCH);
        let held = repo_of.get(&record.hub_id);
        if held.is_none_or(|(t, _)| changed > *t) {
            repo_of.insert(record.hub_id, (changed, record.repo));
        }
    }
    let progress = Bar::on_terminal("");
    let total: usize = listing.repos.iter().map(|r| r.snapshots.len()).sum();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for repo in &listing.repos {
        let name = repo_of
            .get(&repo.id)
            .map(|(_, name)| name.clone())
            .unwrap_or_else(|| hub_cache::local_name(&repo.id));
        for snapshot in &repo.snapshots {
            let label = format!("{} ({}/{total})", snapshot.hub, outcomes.len() + 1);
            let outcome = one(store, args, repo, snapshot, &name, &label, &progress);
            let outcome = match outcome {
                Err(ImportError::Interrupted) => {
                    if let Some(bar) = &progress.0 {
                        bar.finish_and_clear();
                    }
                    if args.json {
                        let out = serde_json::json!({"cache": dir, "snapshots": outcomes, "interrupted": true});
                        println!("{}", serde_json::to_string_pretty(&out)?);
                    }
                    let done = outcomes.iter().filter(|o| o.status == "imported").count();
                    anyhow::bail!(
                        "interrupted: {} was not imported; the {} imported before it stay in the store",
                        snapshot.hub,
                        count(done, "snapshot"),
                    );
                }
                Err(e) => Outcome {
                    status: "skipped",
                    why: Some(e.to_string()),
                    ..outcome_of(snapshot, &name)
                },
                Ok(outcome) => outcome,
            };
            if !args.json {
                say(&outcome, progress.0.as_ref());
            }
            outcomes.push(outcome);
        }
    }
    if let Some(bar) = &progress.0 {
        bar.finish_and_clear();
    }
    let mut summary = Summary {
        repos: listing.repos.len(),
        snapshots: outcomes.len(),
        ..Summary::default()
    };
    for o in &outcomes {
        match o.status {
            "imported" => summary.imported += 1,
            "up to date" => summary.up_to_date += 1,
            _ => summary.skipped += 1,
        }
        summary.bytes_read += o.bytes_read;
        summary.new_bytes += o.new_bytes;
        summary.saved_bytes += o.saved_bytes;
    }
    if args.json {
        let left_out: Vec<_> = listing
            .left_out
            .iter()
            .map(|(path, why)| serde_json::json!({"path": path, "why": why}))
            .collect();
        let out = serde_json::json!({
            "cache": dir,
            "snapshots": outcomes,
            "left_out": left_out,
            "summary": summary,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for (path, why) in &listing.left_out {
            eprintln!("tensorfs: left out {}: {why}", path.display());
        }
        println!(
            "{} of {} in {}: {} imported, {} up to date, {} skipped; read {}, stored {} new, \
             {} of chunks already in the store",
            count(summary.snapshots, "snapshot"),
            count(summary.repos, "model repo"),
            dir.display(),
            summary.imported,
            summary.up_to_date,
            summary.skipped,
            human(summary.bytes_read),
            human(summary.new_bytes),
            human(summary.saved_bytes),
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn outcome_of(snapshot: &CacheSnapshot, name: &str) -> Outcome {
    Outcome {
        hub_id: snapshot.hub.id.clone(),
        revision: snapshot.hub.revision.clone().unwrap_or_default(),
        refs: snapshot.refs.clone(),
        path: snapshot.path.clone(),
        repo: name.to_owned(),
        status: "imported",
        why: None,
        lanes: BTreeMap::new(),
        bytes_read: 0,
        new_bytes: 0,
        saved_bytes: 0,
        unchecked: Vec::new(),
        notes: Vec::new(),
    }
}

/// One line per snapshot, above the progress bar.
fn say(o: &Outcome, bar: Option<&ProgressBar>) {
    let line = match o.status {
        "skipped" => format!(
            "tensorfs: skipped {}@{}: {}",
            o.hub_id,
            o.revision,
            o.why.as_deref().unwrap_or_default()
        ),
        status => {
            let lanes: Vec<String> = o
                .lanes
                .iter()
                .map(|(lane, commit)| format!("{lane} {commit}"))
                .collect();
            let lanes = match lanes.is_empty() {
                true => String::new(),
                false => format!(": {}", lanes.join(", ")),
            };
            format!(
                "{}@{} → {} {status}{lanes}, {} new",
                o.hub_id,
                o.revision,
                o.repo,
                human(o.new_bytes)
            )
        }
    };
    match (bar, o.status) {
        (Some(bar), _) => bar.println(line),
        (None, "skipped") => eprintln!("{line}"),
        (None, _) => println!("{line}"),
    }
    for note in &o.notes {
        eprintln!("tensorfs: note: {}@{}: {note}", o.hub_id, o.revision);
    }
    for file in &o.unchecked {
        eprintln!(
            "tensorfs: warning: {}/{file}: no etag names it; taken unchecked",
            o.path.display()
        );
    }
}

/// Checks and imports one snapshot into local repo `name`.
fn one(
    store: &Store,
    args: &Args,
    repo: &hub_cache::CacheRepo,
    snapshot: &CacheSnapshot,
    name: &str,
    label: &str,
    progress: &Bar,
) -> Result<Outcome, ImportError> {
    let mut outcome = outcome_of(snapshot, name);
    let files = hub_cache::list(&snapshot.path).map_err(skip)?;
    // A local repo of that name holding other models is not taken over.
    let record = store.hub_record(name)?;
    let ours = record.is_some_and(|r| r.hub_id == snapshot.hub.id);
    if !ours
        && store
            .repo(name)?
            .is_some_and(|r| r.roots().next().is_some())
    {
        return Err(ImportError::Usage(format!(
            "{name} already holds models that are not hub repo {}: import the snapshot on its \
             own with `tensorfs import {} --name local/OTHER`",
            snapshot.hub.id,
            snapshot.path.display()
        )));
    }
    let recorded = recorded_files(store, name, snapshot)?;
    let linked: Option<BTreeMap<&String, (u64, &str)>> = files
        .iter()
        .map(|(p, f)| Some((p, (f.size, f.linked_etag.as_deref()?))))
        .collect();
    if linked.is_some() && linked == recorded.as_ref().map(|(files, _)| as_linked(files)) {
        return up_to_date(store, name, snapshot, recorded, outcome);
    }
    if let Some(bar) = &progress.0 {
        bar.set_message(format!("checking {label}"));
        bar.set_position(0);
    }
    let checked = hub_cache::check(snapshot, &repo.folder, &files, progress).map_err(skip)?;
    outcome.bytes_read = checked.bytes;
    outcome.unchecked = checked.unchecked.clone();
    outcome.notes = checked.notes.clone();
    if recorded.as_ref().map(|(files, _)| files) == Some(&checked.files) {
        return up_to_date(store, name, snapshot, recorded, outcome);
    }
    if let Some(bar) = &progress.0 {
        bar.set_message(format!("importing {label}"));
        bar.set_position(0);
    }
    let mut config = ImportConfig::default();
    if let Some(threads) = args.threads {
        config.threads = threads.max(1);
    }
    config.converter = args.converter.clone();
    config.hub = Some(snapshot.hub.clone());
    config.hub_refs = Some(snapshot.refs.clone());
    config.hub_files = Some(checked.files);
    config.cancel = Some(&STOP);
    let report = import(
        store,
        std::slice::from_ref(&snapshot.path),
        name,
        &config,
        progress,
    )?;
    outcome.new_bytes = report.new_bytes;
    // New bytes hold documents too: a lane of all-new chunks saved nothing.
    outcome.saved_bytes = report.chunk_bytes.saturating_sub(report.new_bytes);
    outcome.lanes = report
        .lanes
        .into_iter()
        .map(|l| (l.lane, l.commit))
        .collect();
    Ok(outcome)
}

/// A snapshot that cannot be imported, as an import error naming the file.
fn skip(e: hub_cache::SnapshotError) -> ImportError {
    ImportError::Source {
        path: e.path,
        why: e.why,
    }
}

/// What was recorded for a revision: its file listing and its refs.
type Recorded = (BTreeMap<String, TreeEntry>, Vec<String>);

/// A snapshot imported before: its refs recorded anew when the cache's moved.
fn up_to_date(
    store: &Store,
    name: &str,
    snapshot: &CacheSnapshot,
    recorded: Option<Recorded>,
    mut outcome: Outcome,
) -> Result<Outcome, ImportError> {
    outcome.status = "up to date";
    if recorded.is_some_and(|(_, refs)| refs != snapshot.refs) {
        let revision = HubRevision {
            refs: snapshot.refs.clone(),
            ..HubRevision::new(snapshot.hub.revision.clone(), Vec::new())
        };
        store.record_hub(name, &snapshot.hub.id, revision)?;
    }
    Ok(outcome)
}

/// The files and refs recorded for `snapshot`'s revision in local repo `name`, when every
/// commit recorded with them is still in the repo with every object of its closure (a blob
/// `verify --repair` removed is imported again).
fn recorded_files(
    store: &Store,
    name: &str,
    snapshot: &CacheSnapshot,
) -> Result<Option<Recorded>, ImportError> {
    let Some(record) = store.hub_record(name)? else {
        return Ok(None);
    };
    if record.hub_id != snapshot.hub.id {
        return Ok(None);
    }
    let Some(revision) = record
        .revisions
        .into_iter()
        .find(|r| r.revision == snapshot.hub.revision)
    else {
        return Ok(None);
    };
    let Some(repo) = store.repo(name)? else {
        return Ok(None);
    };
    let complete = |c: &crate::format::ObjectRef| {
        repo.roots().any(|r| r == c)
            && store
                .commit(c)
                .is_ok_and(|commit| commit.closure().iter().all(|o| store.contains(o)))
    };
    let present = !revision.commits.is_empty() && revision.commits.iter().all(complete);
    Ok(revision
        .files
        .filter(|_| present)
        .map(|files| (files, revision.refs)))
}

fn as_linked(files: &BTreeMap<String, TreeEntry>) -> BTreeMap<&String, (u64, &str)> {
    files.iter().map(|(p, e)| (p, (e.size, e.etag()))).collect()
}
