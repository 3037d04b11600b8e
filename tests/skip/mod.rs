//! Skipping a test whose prerequisite is missing, so that the skip is seen and counted.
//!
//! Cargo has no skipped state and hides a passing test's output, so a test that returns early
//! looks like a test that passed. Each skip therefore appends one line, `BINARY TEST: WHY`, to
//! `$CARGO_TARGET_TMPDIR/skips.txt` (under the target folder), which `tools/test.sh` empties
//! before the suite and prints, by name and count, in its summary.
//!
//! Under `CI=true`, a missing prerequisite that `tools/test.sh` installs or sets (a venv, the
//! reference `tfs`, nginx, s3s-fs, a C compiler) fails the test instead: there it means the
//! suite is broken. Absent hardware (a GPU) is a skip everywhere.
#![allow(dead_code)]

use std::io::Write;

/// Whether this run is CI's (`CI=true`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The running test's name (the test harness names each test's thread after it).
fn test_name() -> String {
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("?");
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| s.rsplit_once('-').map_or(s.clone(), |(b, _)| b.to_owned()))
        .unwrap_or_default();
    format!("{binary} {name}")
}

fn record(why: &str) {
    let line = format!("{}: {why}", test_name());
    eprintln!("SKIPPED {line}");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skips.txt");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        eprintln!("could not record the skip in {}: {e}", path.display());
    }
}

/// Records a skip for a missing prerequisite that `tools/test.sh` provides; under `CI=true`
/// the test fails instead, naming it.
pub fn missing(why: &str) {
    if in_ci() {
        panic!("CI=true, but a prerequisite that tools/test.sh provides is missing: {why}");
    }
    record(why);
}

/// Records a skip for hardware this machine lacks (a GPU): a skip under CI too.
pub fn no_hardware(why: &str) {
    record(why);
}
