//! `tensorfs gc [--dry-run] [--json] [--grace DURATION]`: run the store's collection now
//! ([`crate::store::retention`], the reference's regime): put back what a killed collection
//! left, clear holds of dead processes, expire uses past the TTL (and the least recently used
//! while the disk is short of its reserve), and remove every object older than the grace that
//! no root or use keeps. A collection already running elsewhere, or a writer holding the
//! fence, makes this one skip (it says so); it never interleaves.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context;

use super::{count, human, Cli};
use crate::store::retention::{Collect, GRACE};

/// Arguments of `gc`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Say what would be removed; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the outcome as JSON.
    #[arg(long)]
    pub json: bool,
    /// Keep unreferenced objects written or reused within this long (`1h`, `10m`, `90`
    /// seconds, `0`); the
    /// default is the reference's hour, which keeps what an import is about to name.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub grace: Option<Duration>,
}

/// `90` (seconds), `30s`, `10m`, `1h`, `2d`; `M` (humantime's months) is refused as the
/// likely typo for minutes it is.
fn parse_duration(text: &str) -> Result<Duration, String> {
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    if text.contains('M') {
        return Err(format!(
            "{text:?}: write minutes as m (10m); M would be months"
        ));
    }
    humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e} (write 1h, 10m, 30s or 0)"))
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    let store = cli.existing_store()?;
    let options = Collect {
        grace: args.grace.unwrap_or(GRACE),
        dry_run: args.dry_run,
        now: SystemTime::now(),
        ..Collect::default()
    };
    let report = store
        .collect(&options)
        .with_context(|| format!("collecting {}", store.root().display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    if report.skipped {
        eprintln!(
            "tensorfs: gc skipped: another process holds the collector's fence ({}): an \
             import, a download or a collection is running; nothing was removed, run it again \
             later",
            store.root().join("holds/gc.lock").display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    println!(
        "{verb} {} ({}); kept {} ({}) that refs, holds or uses keep, and {} ({}) younger than \
         the grace ({})",
        count(report.removed.len(), "object"),
        human(report.removed_bytes),
        count(report.kept, "object"),
        human(report.kept_bytes),
        count(report.young, "object"),
        human(report.young_bytes),
        humantime::format_duration(options.grace),
    );
    let (cleared, expired) = match args.dry_run {
        true => ("would be cleared", "would expire"),
        false => ("cleared", "expired"),
    };
    let mut notes = Vec::new();
    if report.busy > 0 {
        notes.push(format!(
            "{} open by readers, left for later",
            count(report.busy, "object")
        ));
    }
    if !report.dropped_uses.is_empty() {
        notes.push(format!(
            "{} {expired}",
            count(report.dropped_uses.len(), "use")
        ));
    }
    if report.dead_holds > 0 {
        notes.push(format!(
            "{} of exited processes {cleared}",
            count(report.dead_holds, "hold")
        ));
    }
    if report.temps_removed > 0 || report.snapshots_removed > 0 || report.stale_records > 0 {
        notes.push(format!(
            "{}, {} and {} {cleared}",
            count(report.temps_removed, "stale temp file"),
            count(report.snapshots_removed, "unnamed snapshot folder"),
            count(report.stale_records, "stale files/ record"),
        ));
    }
    if !report.evicted.is_empty() {
        notes.push(format!(
            "evicted from the cache (download them again to use them): {}",
            report.evicted.join(", ")
        ));
    }
    if report.restored > 0 {
        notes.push(format!(
            "{} an interrupted collection left in tmp/gc put back",
            count(report.restored, "object")
        ));
    }
    if report.reserve_short > 0 {
        notes.push(format!(
            "the disk was {} short of its reserve",
            human(report.reserve_short)
        ));
    }
    if !notes.is_empty() {
        println!("{}", notes.join("; "));
    }
    Ok(ExitCode::SUCCESS)
}
