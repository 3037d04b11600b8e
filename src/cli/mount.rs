//! `tensorfs mount MOUNTPOINT [--foreground] [--endpoint URL]` and
//! `tensorfs unmount MOUNTPOINT`.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::Context;

use super::{parse_duration, parse_size, Cli};
use crate::fuse::session::{self, MountConfig};
use crate::lazy::LazyConfig;
use crate::store::Capacity;
use crate::views::ViewConfig;

/// Arguments of `mount`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// An existing, empty folder to show the store in.
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: PathBuf,
    /// Stay in the foreground until unmounted or interrupted (SIGINT/SIGTERM unmount cleanly).
    /// This process holds the mount and serves it through a daemon it starts again should it
    /// die, so readers only pause; SIGHUP restarts that daemon from the binary now installed
    /// (after an upgrade).
    #[arg(long)]
    pub foreground: bool,
    /// Worker threads serving requests (default: the CPU count, within 4..=8).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where a background daemon logs (default: ~/.local/state/tensorfs/mount.log).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Also show the models of this endpoint (https://…, http:// on loopback, s3://bucket/prefix
    /// or file:///dir); their bytes are fetched into the store when first read.
    #[arg(
        long,
        env = "TENSORFS_ENDPOINT",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub endpoint: Option<String>,
    /// A bearer token for the endpoint, sent to its origin only.
    #[arg(
        long,
        env = "TENSORFS_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// A model of the endpoint to show, as ORG/NAME (repeat for more); an endpoint that lists
    /// its models (`tensorfs serve`) needs none.
    #[arg(long = "repo", value_name = "ORG/NAME", requires = "endpoint")]
    pub repos: Vec<String>,
    /// How long a transfer from the endpoint may go without a byte received before the read
    /// waiting for it fails with EIO (60, 60s, 500ms, 2m).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub fetch_deadline: Duration,
    /// Keep the store's cache (what no local/ repo keeps: fetched models) within SIZE (20G,
    /// 512M), evicting the least recently read objects; an open file fetches an evicted part
    /// again. Default: what the disk holds above its reserve (2 % of it, 1–10 GiB).
    #[arg(long, value_name = "SIZE", requires = "endpoint", value_parser = parse_size)]
    pub cache_size: Option<u64>,
    /// Serve files loaders read from local copies (views) at the speed of a local file,
    /// keeping up to SIZE of views (20G, 512M; 0: off). Files that are one blob pass through to
    /// it. Needs FUSE passthrough (Linux 6.9+, CAP_SYS_ADMIN). Default: a tenth of the views'
    /// filesystem where this process may pass files through (root), else off.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub view_cache: Option<u64>,
    /// Where views go (default: the store's `views` folder).
    #[arg(long, value_name = "DIR")]
    pub view_dir: Option<PathBuf>,
    /// Let other users read the mount (root's mounts always do); for a user other than root
    /// it needs `user_allow_other` in /etc/fuse.conf.
    #[arg(long)]
    pub allow_other: bool,
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
    /// Unmounting uses no store: the global `--store` is taken here, accepted and hidden, so
    /// the help offers only what matters.
    #[arg(long, hide = true, value_name = "DIR")]
    pub store: Option<PathBuf>,
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    // A mount of the store alone needs it to exist (a mistyped path is an error, not an empty
    // mount). Over an endpoint the store is where fetched objects are kept: made when absent,
    // as `download` does. An empty TENSORFS_ENDPOINT is no endpoint, as an empty token is no
    // token.
    let endpoint = args.endpoint.as_deref().filter(|e| !e.is_empty());
    let store = if endpoint.is_some() {
        cli.open_store()?
    } else {
        cli.existing_store()?
    };
    let store = store.root().to_path_buf();
    let view_dir = match &args.view_dir {
        Some(dir) => Some(std::path::absolute(dir).context("the views' folder")?),
        None => None,
    };
    let view_cache = match args.view_cache {
        Some(size) => size,
        // What the views' folder, or the folder it goes in, lies on.
        None if session::may_pass_through() => {
            let dir = view_dir.as_deref().unwrap_or(&store);
            let on = dir.ancestors().find(|d| d.exists()).unwrap_or(dir);
            Capacity::of(on)
                .map(|disk| crate::views::default_capacity(&disk))
                .unwrap_or(0)
        }
        None => 0,
    };
    if args.view_dir.is_some() && view_cache == 0 {
        anyhow::bail!(if args.view_cache.is_some() {
            "--view-dir needs views: --view-cache 0 turns them off"
        } else {
            "--view-dir needs --view-cache SIZE: views are off by default for a process that may \
             not use FUSE passthrough (it needs CAP_SYS_ADMIN)"
        });
    }
    if args.allow_other {
        session::check_allow_other()?;
    }
    let mountpoint = match crate::fuse::takeover::Handoff::from_env()? {
        // The daemon of a supervisor's mount: the mount point is already mounted, and asking
        // it anything would wait for this process.
        Some(handoff) => handoff.mountpoint,
        None => session::check_mountpoint(&args.mountpoint)?,
    };
    // Views asked for but impossible are refused here, where the user sees it; the daemon
    // alone would only log it and serve without them.
    let view_dir = match (view_cache, view_dir) {
        (0, _) => None,
        (_, Some(dir)) => Some(dir),
        (_, None) => Some(store.join("views")),
    };
    if let Some(dir) = &view_dir {
        let real = dir.ancestors().find_map(|d| {
            d.canonicalize()
                .ok()
                .map(|c| c.join(dir.strip_prefix(d).unwrap_or(dir)))
        });
        if real.is_some_and(|real| real.starts_with(&mountpoint)) {
            anyhow::bail!(
                "the views' folder {} is inside the mount point {}: give views a folder outside it",
                dir.display(),
                mountpoint.display()
            );
        }
        crate::views::claim(dir).with_context(|| format!("the views' folder {}", dir.display()))?;
    }
    let remote = endpoint.map(|endpoint| LazyConfig {
        token: args.token.clone().filter(|t| !t.is_empty()),
        repos: args.repos.clone(),
        fetch_deadline: args.fetch_deadline,
        cache_size: args.cache_size,
        ..LazyConfig::new(endpoint.to_owned())
    });
    if args.foreground {
        let mut config = MountConfig {
            foreground: true,
            ready_fd: session::ready_fd_from_env(),
            remote,
            ..MountConfig::new(&store, &mountpoint)
        };
        if let Some(threads) = args.threads {
            config.threads = threads.max(1);
        }
        config.allow_other |= args.allow_other;
        if let Some(dir) = view_dir {
            config.fs.views = Some(ViewConfig::new(dir, view_cache));
        }
        // This command line again serves the mount, so a daemon that dies is replaced.
        let daemon = crate::fuse::supervise::DaemonCommand::this_process()
            .context("finding this program")?;
        crate::fuse::supervise::mount(config, daemon)?;
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
    if args.allow_other {
        command.arg("--allow-other");
    }
    // The daemon gets the budget chosen here, off included.
    command.arg("--view-cache").arg(view_cache.to_string());
    if let Some(dir) = &view_dir {
        command.arg("--view-dir").arg(dir);
    }
    if let Some(remote) = &remote {
        command.arg("--endpoint").arg(&remote.endpoint);
        for repo in &remote.repos {
            command.arg("--repo").arg(repo);
        }
        let deadline = format!("{}ms", remote.fetch_deadline.as_millis());
        command.arg("--fetch-deadline").arg(deadline);
        if let Some(size) = remote.cache_size {
            command.arg("--cache-size").arg(size.to_string());
        }
        // The token by the environment, never on a command line others can read.
        match &remote.token {
            Some(token) => command.env("TENSORFS_TOKEN", token),
            None => command.env_remove("TENSORFS_TOKEN"),
        };
    }
    command.stderr(log_file);
    // A unit that runs `mount` in the background is told by `mount` returning; the daemon
    // must not report to that unit's manager as if it were the unit.
    command.env_remove("NOTIFY_SOCKET");
    let pid = session::spawn_background(command, &mountpoint, Duration::from_secs(30))?;
    let from = match &remote {
        Some(remote) => format!(" with the models of {}", remote.endpoint),
        None => String::new(),
    };
    // The mount is live: a line nobody can read (stdout full or closed) does not undo that,
    // so mount(8) is not told it failed.
    let _ = writeln!(
        std::io::stdout(),
        "mounted {}{from} at {} (daemon pid {pid}, log {}); stop it with `tensorfs unmount {}`",
        store.display(),
        mountpoint.display(),
        log.display(),
        mountpoint.display()
    );
    Ok(ExitCode::SUCCESS)
}

pub fn unmount(args: &UnmountArgs) -> anyhow::Result<ExitCode> {
    // Asked before: once unmounted, the daemon cannot be asked. A supervised mount's
    // supervisor is found without asking the mount (a restarting or hung daemon would keep
    // the question, and so the mount, busy).
    let resolved = session::resolve_mountpoint(&args.mountpoint);
    let daemon = match args.lazy {
        true => None,
        false => match crate::fuse::takeover::daemons_of(&resolved).first() {
            Some((_, handoff)) => Some(handoff.supervisor),
            None => super::status::daemon_pid(&resolved),
        },
    };
    session::unmount(&args.mountpoint, args.lazy)?;
    let how = if args.lazy { "detached" } else { "unmounted" };
    println!("{how} {}", args.mountpoint.display());
    // A script that goes on (gc, rm -r of the store) finds the daemon's writes done.
    if let Some(pid) = daemon {
        if !session::wait_for_exit(pid, DAEMON_EXIT_WAIT) {
            eprintln!(
                "tensorfs: the daemon (pid {pid}) is still ending {} s after the unmount; see \
                 its log",
                DAEMON_EXIT_WAIT.as_secs()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How long `unmount` waits for the daemon to end.
const DAEMON_EXIT_WAIT: Duration = Duration::from_secs(10);

/// `$XDG_STATE_HOME/tensorfs/mount.log`, else `~/.local/state/tensorfs/mount.log`, else (root
/// without `HOME`, as fstab mounts at boot are) `/var/log/tensorfs/mount.log`.
fn default_log() -> anyhow::Result<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local").join("state")))
        // Root's mounts from fstab run with no HOME: the system's log folder.
        .or_else(|| session::is_root().then(|| PathBuf::from("/var/log")))
        .context("no HOME or XDG_STATE_HOME for the daemon's log; pass --log-file")?;
    Ok(state.join("tensorfs").join("mount.log"))
}
