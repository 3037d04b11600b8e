//! `tensorfs mount MOUNTPOINT [--foreground]` and `tensorfs unmount MOUNTPOINT`.

use std::fs::{self, OpenOptions};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::Context;

use super::Cli;
use crate::fuse::session::{self, MountConfig};

/// Arguments of `mount`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// An existing, empty folder to show the store in.
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: PathBuf,
    /// Serve in this process until unmounted or interrupted (SIGINT/SIGTERM unmount cleanly).
    #[arg(long)]
    pub foreground: bool,
    /// Worker threads serving requests (default: the CPU count, within 4..=8).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where a background daemon logs (default: ~/.local/state/tensorfs/mount.log).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
}

/// Arguments of `unmount`.
#[derive(Debug, clap::Args)]
pub struct UnmountArgs {
    /// The mount point to unmount.
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: PathBuf,
    /// Detach now even if files are open; the mount goes away when they close.
    #[arg(long)]
    pub lazy: bool,
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    let store = cli.store_root()?;
    // The store must exist: a mount never creates one.
    let store = crate::store::Store::open_existing(&store)?
        .root()
        .to_path_buf();
    let mountpoint = session::check_mountpoint(&args.mountpoint)?;
    if args.foreground {
        let mut config = MountConfig {
            foreground: true,
            ready_fd: session::ready_fd_from_env(),
            ..MountConfig::new(&store, &mountpoint)
        };
        if let Some(threads) = args.threads {
            config.threads = threads.max(1);
        }
        session::mount(config)?;
        return Ok(ExitCode::SUCCESS);
    }
    let log = match &args.log_file {
        Some(path) => path.clone(),
        None => default_log()?,
    };
    if let Some(dir) = log.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let log_file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("opening the log {}", log.display()))?;
    let mut command = Command::new(std::env::current_exe().context("finding this program")?);
    command
        .arg("--store")
        .arg(&store)
        .arg("mount")
        .arg(&mountpoint)
        .arg("--foreground");
    if let Some(threads) = args.threads {
        command.arg("--threads").arg(threads.to_string());
    }
    command.stderr(log_file);
    let pid = session::spawn_background(command, &mountpoint, Duration::from_secs(30))?;
    println!(
        "mounted {} at {} (daemon pid {pid}, log {}); stop it with `tensorfs unmount {}`",
        store.display(),
        mountpoint.display(),
        log.display(),
        mountpoint.display()
    );
    Ok(ExitCode::SUCCESS)
}

pub fn unmount(args: &UnmountArgs) -> anyhow::Result<ExitCode> {
    session::unmount(&args.mountpoint, args.lazy)?;
    Ok(ExitCode::SUCCESS)
}

/// `$XDG_STATE_HOME/tensorfs/mount.log`, else `~/.local/state/tensorfs/mount.log`.
fn default_log() -> anyhow::Result<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local").join("state")))
        .context("no HOME or XDG_STATE_HOME for the daemon's log; pass --log-file")?;
    Ok(state.join("tensorfs").join("mount.log"))
}
