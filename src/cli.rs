//! The `tensorfs` command line: argument parsing, logging setup and one module per verb.

mod docs;
mod doctor;
mod download;
mod du;
mod export;
mod gc;
mod helper;
mod hf_cache;
mod import;
mod inspect;
mod locate;
mod mount;
mod quantize;
mod rm;
mod serve;
mod status;
mod upload;
mod verify;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::store::Store;

/// Model checkpoints stored once, mounted as ordinary Diffusers and Transformers folders.
#[derive(Debug, Parser)]
#[command(name = "tensorfs", version, about, long_about = None)]
pub struct Cli {
    /// The store: this flag, else $TENSORFS_HOME, else ~/.cache/tensorfs.
    #[arg(long, global = true, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// The verb.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Import a Diffusers or Transformers folder, or .safetensors (.sft) and .gguf files, as local/NAME.
    Import(import::Args),
    /// List the store's repos, revisions and lanes.
    Ls(inspect::LsArgs),
    /// Describe a checkpoint: components, tensors, chunks and files.
    Inspect(inspect::Args),
    /// Write a lane folder's files (the same files the mount shows) into DIR.
    Export(export::Args),
    /// Write a new lane with REF's weights encoded by a scheme (int8.rowwise, fp8.rowwise, mxfp8, nvfp4).
    Quantize(quantize::Args),
    /// Where a tensor's bytes lie in the store: locate PATH TENSOR (a mounted file) or locate REF FILE TENSOR.
    Locate(locate::Args),
    /// Re-hash objects: every blob, or the closure of REF; --repair removes damaged ones.
    Verify(verify::Args),
    /// Take a repo, a release or a commit out of the refs (gc then frees what nothing else keeps).
    Rm(rm::Args),
    /// Collect now: remove objects no ref, hold or use keeps (the reference's retention rules).
    Gc(gc::Args),
    /// Where the space goes: per repo and lane its logical, shared and unique bytes; store totals.
    Du(du::Args),
    /// Show the store as folders at MOUNTPOINT (read-only FUSE; in the background by default);
    /// with --endpoint, an endpoint's models too, fetched as they are read.
    #[command(after_long_help = helper::help())]
    Mount(mount::Args),
    /// Unmount a mount point and stop its daemon.
    Unmount(mount::UnmountArgs),
    /// The running mounts: store, endpoint, cache and budget, views, holds, and counters.
    Status(status::Args),
    /// Serve the store over HTTP as a distribution/1 endpoint.
    Serve(serve::Args),
    /// Download a model's commit from an endpoint into the store.
    Download(download::Args),
    /// Upload a repo's newest commits (every lane, or one) to an endpoint.
    Upload(upload::Args),
    /// Check what this machine and user can do (FUSE, fusermount3, passthrough, io_uring, the
    /// store, stale mounts), each finding with its fix; fails when a mount cannot run.
    Doctor(doctor::Args),
    /// Print a shell's completion script for tensorfs (bash, zsh, fish, elvish, powershell).
    Completions(docs::CompletionArgs),
    /// Write the man pages (tensorfs.1, tensorfs-VERB.1) into DIR; for packaging.
    #[command(hide = true)]
    Manpages(docs::ManArgs),
}

impl Cli {
    /// The store this invocation uses.
    ///
    /// # Errors
    /// No store flag, no `TENSORFS_HOME` and no `HOME`.
    pub fn store_root(&self) -> anyhow::Result<PathBuf> {
        if let Some(dir) = &self.store {
            return Ok(dir.clone());
        }
        crate::store::default_root().ok_or_else(|| {
            anyhow::anyhow!("no store: pass --store DIR or set TENSORFS_HOME (HOME is unset)")
        })
    }

    /// Opens the store, creating it when absent (for verbs that write one).
    ///
    /// # Errors
    /// The directory is not a store.
    pub fn open_store(&self) -> anyhow::Result<Store> {
        Ok(Store::open(self.store_root()?)?)
    }

    /// Runs `verb` on the store, created when absent; when the store was created for it and
    /// `verb` failed or stored nothing (an empty hub cache), the new store is removed again, with
    /// any folders made for it, so such a command leaves no store behind (nothing was there
    /// before).
    ///
    /// # Errors
    /// The store cannot be opened, or `verb`'s error.
    pub fn with_new_store<T>(
        &self,
        verb: impl FnOnce(&Store) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let root = self.store_root()?;
        // The highest folder this call creates: removed on failure, if still unused.
        let created = root
            .ancestors()
            .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
            .last()
            .map(Path::to_path_buf);
        let store = Store::open(&root)?;
        let result = verb(&store);
        if let Some(top) = created {
            // Best effort: the command's own error is what the user needs to see.
            if store.remove_if_unused().unwrap_or(false) {
                let mut dir = root.parent();
                while let Some(d) = dir.filter(|d| d.starts_with(&top)) {
                    if std::fs::remove_dir(d).is_err() {
                        break;
                    }
                    dir = d.parent();
                }
            }
        }
        result
    }

    /// Opens an existing store (for verbs that only read, so a mistyped path is an error, not an
    /// empty new store).
    ///
    /// # Errors
    /// No store there.
    pub fn existing_store(&self) -> anyhow::Result<Store> {
        Ok(Store::open_existing(self.store_root()?)?)
    }
}

/// Sets up logging once: `RUST_LOG` when set, else warnings and errors on stderr.
pub fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs the command line; errors are printed with their causes.
pub fn main() -> ExitCode {
    // `println!` panics when standard output fails (a full disk, /dev/full): say so in one
    // line, as any other error, instead of a panic's backtrace.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(why) = message.strip_prefix("failed printing to stdout: ") {
            eprintln!("tensorfs: writing to standard output: {why}");
            std::process::exit(1);
        }
        default_hook(info);
    }));
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let verbs = Cli::command();
    let is_verb = |word: &std::ffi::OsStr| {
        word.to_str()
            .is_some_and(|w| w == "help" || verbs.find_subcommand(w).is_some())
    };
    // `mount(8)`'s helper command line, `tensorfs STORE MOUNTPOINT -o OPTS`, is a mount.
    let cli = match helper::translate(&args, is_verb) {
        None => Cli::parse_from(&args),
        Some(Ok(mount)) => Cli::parse_from(&mount),
        Some(Err(why)) => {
            eprintln!("tensorfs: {why}");
            return ExitCode::FAILURE;
        }
    };
    if !matches!(cli.command, Command::Mount(_) | Command::Serve(_)) {
        // Like other Unix tools, end quietly when the reader of our output goes away
        // (`tensorfs ls | head`); Rust's default turns that into a panic. The mount daemon keeps
        // ignoring SIGPIPE: its parent may close the readiness pipe early. So does the server:
        // a client that hangs up mid-answer makes its next write to the socket raise it.
        // SAFETY: resetting a signal disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // The mount daemon's log says what it served and refused; commands only warn.
    init_logging(match cli.command {
        Command::Mount(_) | Command::Serve(_) => "info",
        // Its trial mount's warnings are findings it reports.
        Command::Doctor(_) => "error",
        _ => "warn",
    });
    if let Err(why) = crate::io::Backend::from_env() {
        eprintln!("tensorfs: {why}");
        return ExitCode::FAILURE;
    }
    let result = match &cli.command {
        Command::Import(args) => import::run(&cli, args),
        Command::Ls(args) => inspect::ls(&cli, args),
        Command::Inspect(args) => inspect::run(&cli, args),
        Command::Export(args) => export::run(&cli, args),
        Command::Quantize(args) => quantize::run(&cli, args),
        Command::Locate(args) => locate::run(&cli, args),
        Command::Verify(args) => verify::run(&cli, args),
        Command::Rm(args) => rm::run(&cli, args),
        Command::Gc(args) => gc::run(&cli, args),
        Command::Du(args) => du::run(&cli, args),
        Command::Mount(args) => mount::run(&cli, args),
        Command::Unmount(args) => mount::unmount(args),
        Command::Status(args) => status::run(args),
        Command::Serve(args) => serve::run(&cli, args),
        Command::Download(args) => download::run(&cli, args),
        Command::Upload(args) => upload::run(&cli, args),
        Command::Doctor(args) => doctor::run(&cli, args),
        Command::Completions(args) => docs::completions(args),
        Command::Manpages(args) => docs::manpages(args),
    };
    crate::store::release_writer_locks();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tensorfs: {}", describe(&e));
            ExitCode::FAILURE
        }
    }
}

/// A leading unsigned decimal number and the trimmed rest (its unit): `"1.5 GiB"` → `(1.5, "GiB")`.
fn number_and_unit(text: &str) -> Option<(f64, &str)> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    Some((number.parse().ok()?, unit.trim()))
}

/// A duration on the command line: seconds (`60`, `1.5`), or a number with `ms`, `s`, `m` or
/// `h`.
///
/// # Errors
/// Not such a number, or negative.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let (value, unit) = number_and_unit(text)
        .ok_or_else(|| format!("{text:?} is not a duration (60, 60s, 500ms, 2m)"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("{other:?} is not a unit of time (ms, s, m, h)")),
    };
    std::time::Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// A size on the command line in bytes: a number, or one with a binary unit `K`, `M`, `G`,
/// `T` (`KiB`, `GiB`… and `KB`, `GB`… mean the same: 1024-based).
///
/// # Errors
/// Not such a size, or more than 2^64 bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (value, unit) = number_and_unit(text)
        .ok_or_else(|| format!("{text:?} is not a size (1073741824, 512M, 20G)"))?;
    let unit = unit.to_ascii_uppercase();
    let unit = unit.trim_end_matches('B').trim_end_matches('I');
    let scale: u64 = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(format!("{text:?}: the unit is not one of K, M, G, T")),
    };
    let bytes = value * scale as f64;
    if !(0.0..18_446_744_073_709_551_615.0).contains(&bytes) {
        return Err(format!("{text:?} is too large"));
    }
    if bytes.fract() != 0.0 {
        return Err(format!("{text:?} is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

/// An error and its causes on one line. Messages of this crate already hold their source's
/// text, so a cause is left out when the line says it already.
fn describe(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if line.contains(&part) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&part);
    }
    line
}

/// An endpoint URL on the command line or in `TENSORFS_ENDPOINT`, where an empty one is a
/// mistake to name (download and upload need an endpoint).
///
/// # Errors
/// The text is empty.
pub fn parse_endpoint(text: &str) -> Result<String, String> {
    match text.trim().is_empty() {
        true => Err("an empty URL: pass --endpoint URL, or set TENSORFS_ENDPOINT to one".into()),
        false => Ok(text.to_owned()),
    }
}

/// Bytes for people: `1.5 GiB`.
pub(crate) fn human(bytes: u64) -> String {
    indicatif::BinaryBytes(bytes).to_string()
}

/// `1 commit`, `2 commits`.
pub(crate) fn count(n: usize, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_read_as_binary_units() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("20G"), Ok(20 << 30));
        assert_eq!(parse_size("20GiB"), Ok(20 << 30));
        assert_eq!(parse_size("1.5k"), Ok(1536));
        assert_eq!(parse_size("0.5G"), Ok(512 << 20));
        assert_eq!(parse_size("2 TB"), Ok(2 << 40));
        for bad in ["", "G", "-1G", "1X", "20000000T", "0.4", "1.5"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
