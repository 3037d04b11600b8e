//! `tensorfs du [REF…] [--json]`: where the store's space goes. Per repo and per commit (lane)
//! it names: its logical size (its closure's bytes, as a copy of it alone would take), the
//! stored bytes it shares with other repos, the bytes only it holds (what `rm` then `gc` would
//! free), and what keeps it (a `local/` root, a use and when it expires, or nothing); then the
//! store's totals: bytes stored, bytes no repo names, and the dedup ratio (logical bytes over
//! stored bytes named).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::bail;
use serde::Serialize;

use super::{human, Cli};
use crate::format::{ObjectRef, Sha256};
use crate::store::retention::TTL;

/// Arguments of `du`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Repos to show (org/name); every repo when none. Totals are the whole store's.
    #[arg(value_name = "REF")]
    pub repos: Vec<String>,
    /// Print the accounting as JSON.
    #[arg(long)]
    pub json: bool,
}

/// One commit's (lane's) space.
#[derive(Debug, Serialize)]
struct LaneSpace {
    lane: String,
    commit: String,
    logical: u64,
    /// Stored bytes no other commit of the store names.
    unique: u64,
}

/// One repo's space.
#[derive(Debug, Serialize)]
struct RepoSpace {
    repo: String,
    kept_by: String,
    logical: u64,
    stored: u64,
    shared: u64,
    unique: u64,
    lanes: Vec<LaneSpace>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    problems: Vec<String>,
}

/// The store's totals.
#[derive(Debug, Serialize)]
struct Totals {
    repos: usize,
    commits: usize,
    logical: u64,
    stored: u64,
    named: u64,
    unnamed: u64,
    rooted: u64,
    cache: u64,
    dedup_ratio: f64,
    /// The store's own views (copies of mounted files, `STORE/views`): how many, their bytes.
    views: usize,
    views_bytes: u64,
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    let store = cli.existing_store()?;
    let present: HashMap<Sha256, u64> = store
        .blobs()?
        .into_iter()
        .map(|o| (o.sha256, o.length))
        .collect();
    let repos = store.repos()?;
    for wanted in &args.repos {
        if !repos.iter().any(|r| r.name.eq_ignore_ascii_case(wanted)) {
            bail!(
                "no repo {wanted:?} in the store at {}",
                store.root().display()
            );
        }
    }
    // Each commit's closure, and which repos and commits name each object.
    let mut closures: HashMap<Sha256, Result<(String, Vec<ObjectRef>), String>> = HashMap::new();
    let mut by_repo: HashMap<Sha256, BTreeSet<usize>> = HashMap::new();
    let mut by_commit: HashMap<Sha256, BTreeSet<Sha256>> = HashMap::new();
    for (i, repo) in repos.iter().enumerate() {
        for commit in repo.roots() {
            let closure = closures.entry(commit.sha256).or_insert_with(|| {
                store
                    .commit(commit)
                    .map(|c| {
                        let objects: BTreeSet<ObjectRef> = c.closure().into_iter().collect();
                        (
                            crate::revisions::lane_of(&c.tree),
                            objects.into_iter().collect(),
                        )
                    })
                    .map_err(|e| e.to_string())
            });
            if let Ok((_, objects)) = closure {
                for o in objects {
                    by_repo.entry(o.sha256).or_default().insert(i);
                    by_commit.entry(o.sha256).or_default().insert(commit.sha256);
                }
            }
        }
    }
    let stored = |d: &Sha256| present.get(d).copied().unwrap_or(0);
    let now = SystemTime::now();
    let mut rows = Vec::new();
    let mut rooted: BTreeSet<Sha256> = BTreeSet::new();
    let mut logical_total = 0;
    for (i, repo) in repos.iter().enumerate() {
        let local = repo.name.to_ascii_lowercase().starts_with("local/");
        let mut objects: BTreeSet<Sha256> = BTreeSet::new();
        let mut lanes = Vec::new();
        let mut problems = Vec::new();
        let mut logical = 0;
        let mut last_use: Option<SystemTime> = None;
        let commits: BTreeSet<ObjectRef> = repo.roots().copied().collect();
        for commit in &commits {
            last_use = last_use.max(store.last_use(&commit.sha256));
            match &closures[&commit.sha256] {
                Ok((lane, closure)) => {
                    let size: u64 = closure.iter().map(|o| o.length).sum();
                    logical += size;
                    objects.extend(closure.iter().map(|o| o.sha256));
                    let unique = closure
                        .iter()
                        .filter(|o| by_commit[&o.sha256].len() == 1)
                        .map(|o| stored(&o.sha256))
                        .sum();
                    lanes.push(LaneSpace {
                        lane: lane.clone(),
                        commit: commit.id(),
                        logical: size,
                        unique,
                    });
                }
                Err(e) => problems.push(format!("commit {}: {e}", commit.id())),
            }
        }
        logical_total += logical;
        if local {
            rooted.extend(objects.iter().copied());
        }
        let held: u64 = objects.iter().map(stored).sum();
        let unique: u64 = objects
            .iter()
            .filter(|d| by_repo[*d].len() == 1 && by_repo[*d].contains(&i))
            .map(stored)
            .sum();
        let kept_by = match (local, last_use) {
            (true, _) => "root (local/)".to_owned(),
            (false, Some(at)) => {
                let age = now.duration_since(at).unwrap_or_default();
                format!(
                    "use, last {} ago (expires in {})",
                    humantime::format_duration(round(age)),
                    humantime::format_duration(round(TTL.saturating_sub(age)))
                )
            }
            (false, None) => "nothing (a collection frees it)".to_owned(),
        };
        if args.repos.is_empty()
            || args
                .repos
                .iter()
                .any(|w| w.eq_ignore_ascii_case(&repo.name))
        {
            rows.push(RepoSpace {
                repo: repo.name.clone(),
                kept_by,
                logical,
                stored: held,
                shared: held - unique,
                unique,
                lanes,
                problems,
            });
        }
    }
    let named: u64 = by_repo.keys().map(stored).sum();
    let stored_total: u64 = present.values().sum();
    let rooted_bytes: u64 = rooted.iter().map(stored).sum();
    let views = store.views()?;
    let totals = Totals {
        views: views.len(),
        views_bytes: views.iter().map(|(_, bytes, _)| bytes).sum(),
        repos: repos.len(),
        commits: closures.len(),
        logical: logical_total,
        stored: stored_total,
        named,
        unnamed: stored_total - named,
        rooted: rooted_bytes,
        cache: named - rooted_bytes,
        dedup_ratio: if named == 0 {
            1.0
        } else {
            logical_total as f64 / named as f64
        },
    };
    if args.json {
        let out = serde_json::json!({"repos": rows, "total": totals});
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("REPO / LANE\tLOGICAL\tSHARED\tUNIQUE\tKEPT BY");
    for r in &rows {
        println!(
            "{}\t{}\t{}\t{}\t{}",
            r.repo,
            human(r.logical),
            human(r.shared),
            human(r.unique),
            r.kept_by
        );
        let mut lanes: BTreeMap<(&str, &str), &LaneSpace> = BTreeMap::new();
        for l in &r.lanes {
            lanes.insert((&l.lane, &l.commit), l);
        }
        for ((lane, commit), l) in lanes {
            let short = &commit[..commit.len().min(19)];
            println!(
                "  {lane} {short}…\t{}\t\t{}\t",
                human(l.logical),
                human(l.unique)
            );
        }
        for p in &r.problems {
            println!("  problem: {p}");
        }
    }
    println!(
        "total: {} repos, {} commits: {} logical in {} stored ({:.2}× dedup); {} rooted by \
         local/ repos, {} of other repos (cache: kept while used, evicted least recently used first), {} named by no repo (uses or holds \
         may still keep it: `gc --dry-run` says what goes){}",
        totals.repos,
        totals.commits,
        human(totals.logical),
        human(totals.named),
        totals.dedup_ratio,
        human(totals.rooted),
        human(totals.cache),
        human(totals.unnamed),
        match totals.views {
            0 => String::new(),
            n => format!(
                "; and {} in {} (copies mounts read through, dropped first when space is short)",
                human(totals.views_bytes),
                super::count(n, "view")
            ),
        },
    );
    Ok(ExitCode::SUCCESS)
}

/// `d` to the second, for reading.
fn round(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_secs(d.as_secs())
}
