//! Mounting, serving, signals and unmounting.
//!
//! - [`mount`]: the foreground daemon. Mounts, serves on [`MountConfig::threads`] workers until
//!   the mount is unmounted from outside or SIGINT/SIGTERM arrives, then unmounts (lazily when
//!   files are still open) and returns.
//! - [`spawn_background`]: what the CLI's background mode calls: it starts the binary again
//!   with `--foreground`, waits for the daemon's readiness line on a pipe, and reports the
//!   daemon's error when mounting failed.
//! - [`spawn`]: a mount served by threads of this process, unmounted when its handle drops
//!   (tests, embedding).
//! - [`unmount`]: `umount2` as root, else the setuid `fusermount3 -u` (`-uz` when lazy).
//!
//! A daemon that dies without unmounting leaves a stale mount ("Transport endpoint is not
//! connected"). Mounting checks for one and says how to clear it; as root with `fusermount3`
//! installed the mount is made with `auto_unmount`, so the helper unmounts even after SIGKILL.

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{MountOption, Session, SessionACL, SessionUnmounter};

use super::mountinfo::set_read_ahead;
pub use super::mountinfo::{is_mounted, mounts};
use super::takeover::Handoff;
use super::FuseAdapter;
use crate::fs::{FsConfig, TensorFs};
use crate::lazy::{LazyConfig, LazyError, LazyMount};
use crate::store::{Store, StoreError};

/// The environment variable naming the descriptor a background daemon reports readiness on.
pub const READY_FD_ENV: &str = "TENSORFS_READY_FD";

/// The line a daemon writes to its readiness descriptor once the mount is up; a failure writes
/// `error: <why>` instead.
pub const READY_LINE: &str = "ready";

/// How to mount a store.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// An existing folder to mount on.
    pub mountpoint: PathBuf,
    /// The store's root folder (it must exist).
    pub store: PathBuf,
    /// Whether the CLI serves in its own process (`--foreground`, and so the daemon) or starts
    /// a daemon with [`spawn_background`]. [`mount`] itself always serves in the calling
    /// process; a foreground process serves this mount alone and ends with it, which its
    /// status says (`daemon`), so `unmount` waits for it to end.
    pub foreground: bool,
    /// Worker threads reading requests (default: the CPU count, within 4..=8), so one slow
    /// first read (hashing a large blob) does not stall the others.
    pub threads: usize,
    /// Let every user, and other containers sharing the mount, read it (`allow_other`).
    /// Default: when running as root. Others need `user_allow_other` in `/etc/fuse.conf`.
    pub allow_other: bool,
    /// Have `fusermount3` unmount when this process dies, even by SIGKILL (`auto_unmount`;
    /// needs `allow_other`). Default: as root when `fusermount3` is installed (apt `fuse3`).
    pub auto_unmount: bool,
    /// The mount's readahead window in KiB, set on its bdi after mounting; 0 keeps the
    /// kernel's (128 KiB). Default 16384, one chunk: the kernel cuts a window into requests of
    /// at most 1 MiB and sends them together, so several are read at once. Against a 1 MiB
    /// window in the same runs (1 GiB, 2 cores), a fresh mount's first read was 1.0–1.6× as
    /// fast warm and 1.3–1.4× cold, and a safetensors `safe_open` load 1.0–2.4×.
    pub read_ahead_kb: u32,
    /// Namespace settings (TTLs, cache sizes).
    pub fs: FsConfig,
    /// An endpoint whose models the mount shows too, fetching their bytes when first read
    /// ([`crate::lazy`]); `None`: the store alone.
    pub remote: Option<LazyConfig>,
    /// A descriptor to write [`READY_LINE`] (or `error: …`) to once mounted, then close; the
    /// background mode passes 1 (stdout, a pipe to the parent). See [`ready_fd_from_env`].
    pub ready_fd: Option<RawFd>,
}

impl MountConfig {
    /// The defaults for mounting `store` at `mountpoint`.
    pub fn new(store: impl Into<PathBuf>, mountpoint: impl Into<PathBuf>) -> MountConfig {
        let root = is_root();
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get().clamp(4, 8));
        MountConfig {
            mountpoint: mountpoint.into(),
            store: store.into(),
            foreground: false,
            threads,
            allow_other: root,
            auto_unmount: root && find_in_path("fusermount3").is_some(),
            read_ahead_kb: 16 << 10,
            fs: FsConfig::default(),
            remote: None,
            ready_fd: None,
        }
    }

    pub(super) fn fuser_config(&self) -> fuser::Config {
        let mut options = vec![
            MountOption::RO,
            MountOption::FSName(super::mountinfo::FSNAME.into()),
            MountOption::Subtype("tensorfs".into()),
            MountOption::DefaultPermissions,
        ];
        if self.auto_unmount {
            options.push(MountOption::AutoUnmount);
        }
        let mut config = fuser::Config::default();
        config.mount_options = options;
        config.acl = if self.allow_other || self.auto_unmount {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        config.n_threads = Some(self.threads.max(1));
        // One descriptor per worker: requests are not funnelled through one queue.
        config.clone_fd = true;
        config
    }
}

/// Why mounting or unmounting failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The store cannot be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The endpoint of a lazy mount is refused, or its transfers cannot start.
    #[error(transparent)]
    Remote(#[from] LazyError),
    /// The mount point is a mount whose daemon is gone.
    #[error(
        "{0} is a stale mount (its daemon is gone: \"Transport endpoint is not connected\"); \
         clear it with `tensorfs unmount --lazy {0}` (or `fusermount3 -uz {0}`, or `umount -l {0}` as root)",
        .mountpoint.display()
    )]
    Stale {
        /// The mount point.
        mountpoint: PathBuf,
    },
    /// `allow_other` asked for by a user other than root, whom `/etc/fuse.conf` does not let.
    #[error(
        "other users may read a mount of a user other than root only where /etc/fuse.conf has \
         the line `user_allow_other`: add it (as root), or mount without allow_other"
    )]
    AllowOtherRefused,
    /// A TensorFS mount is already there.
    #[error("{0} is already a TensorFS mount; unmount it first (`tensorfs unmount {0}`)", .mountpoint.display())]
    AlreadyMounted {
        /// The mount point.
        mountpoint: PathBuf,
    },
    /// The mount point cannot be used.
    #[error("mount point {}: {source}", .mountpoint.display())]
    Mountpoint {
        /// The mount point.
        mountpoint: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The kernel or `fusermount3` refused the mount.
    #[error("mounting at {}: {source}{hint}", .mountpoint.display())]
    Mount {
        /// The mount point.
        mountpoint: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
        /// What to do about it, when the cause is known (empty, or `; ` and advice).
        hint: String,
    },
    /// Serving requests failed.
    #[error("serving {}: {source}", .mountpoint.display())]
    Serve {
        /// The mount point.
        mountpoint: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Unmounting failed.
    #[error("unmounting {}: {source}{hint}", .mountpoint.display())]
    Unmount {
        /// The mount point.
        mountpoint: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
        /// What to do about it.
        hint: &'static str,
    },
    /// The mount is another user's: only they (or root) may unmount it.
    #[error(
        "{} is mounted by {owner}: only that user or root can unmount it",
        .mountpoint.display()
    )]
    NotTheirs {
        /// The mount point.
        mountpoint: PathBuf,
        /// Who mounted it: `user NAME (uid N)`, or `uid N`.
        owner: String,
    },
    /// The path does not exist, so nothing is mounted there.
    #[error("{} does not exist: nothing to unmount", .mountpoint.display())]
    NoSuchPath {
        /// The path given.
        mountpoint: PathBuf,
    },
    /// The path is not a TensorFS mount, so `unmount` leaves it alone.
    #[error("{0} is not a TensorFS mount; `tensorfs unmount` only unmounts its own mounts", .mountpoint.display())]
    NotOurs {
        /// The path given.
        mountpoint: PathBuf,
    },
    /// The mount point holds files, which the mount would hide.
    #[error("mount point {0} is not empty; mount on an empty folder so nothing in it is hidden", .mountpoint.display())]
    NotEmpty {
        /// The mount point.
        mountpoint: PathBuf,
    },
    /// A background daemon failed before its mount was up.
    #[error("the mount daemon failed: {0}")]
    Daemon(String),
    /// A background daemon's mount did not appear in time.
    #[error("the mount at {} did not appear within {waited:?}", .mountpoint.display())]
    Timeout {
        /// The mount point.
        mountpoint: PathBuf,
        /// How long was waited.
        waited: Duration,
    },
}

/// The FUSE device.
pub(super) const FUSE_DEVICE: &str = "/dev/fuse";

/// Advice for a refused mount whose cause can be seen: a missing FUSE device, or one this user
/// may not open (Debian and Ubuntu make `/dev/fuse` 0666; some systems keep it 0600, root's
/// alone). Empty when nothing is known.
pub(super) fn mount_hint(source: &io::Error, device: &Path, root: bool) -> String {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = match fs::metadata(device) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return format!(
                "; there is no {}: load the FUSE module (`modprobe fuse`) or run where the \
                 device exists",
                device.display()
            )
        }
        Err(_) => return String::new(),
    };
    if source.kind() != io::ErrorKind::PermissionDenied || root {
        return String::new();
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o006 == 0o006 {
        return format!(
            "; {} is mode {mode:04o}, open to every user: check that `fusermount3` (apt fuse3) \
             is installed setuid root",
            device.display()
        );
    }
    format!(
        "; {} is mode {mode:04o} (owner uid {}, group gid {}), so only they may open it: a user \
         other than root mounts once it is 0666, as Debian and Ubuntu ship it (`sudo chmod 0666 \
         {}`, or a udev rule `KERNEL==\"fuse\", MODE=\"0666\"`)",
        device.display(),
        meta.uid(),
        meta.gid(),
        device.display()
    )
}

/// A mount made and handshaken, not yet served.
struct Mounted {
    session: Session<FuseAdapter>,
    /// `None` when another process made the mount ([`super::supervise`]).
    unmounter: Option<SessionUnmounter>,
    mountpoint: PathBuf,
}

/// A lazy mount's transfers and its endpoint, which its status reports.
type Fetching = Option<(Arc<crate::lazy::Fetcher>, String)>;

/// The namespace `config` shows, and a lazy mount's transfers.
fn namespace(config: &MountConfig) -> Result<(Arc<TensorFs>, Fetching), MountError> {
    let store = Store::open_existing(&config.store)?;
    let (fs, fetcher) = match &config.remote {
        None => (TensorFs::over_store(store, config.fs.clone()), None),
        Some(remote) => {
            let lazy = LazyMount::open(store, remote.clone())?;
            let fs = TensorFs::new(lazy.catalog, lazy.objects, config.fs.clone());
            (fs, Some((lazy.fetcher, remote.endpoint.clone())))
        }
    };
    Ok((Arc::new(fs), fetcher))
}

fn start(config: &MountConfig) -> Result<Mounted, MountError> {
    let mountpoint = check_mountpoint(&config.mountpoint)?;
    let (fs, fetcher) = namespace(config)?;
    let adapter = FuseAdapter::new(fs.clone());
    fs.set_status_extra(status_extra(
        &mountpoint,
        config.foreground,
        fetcher,
        None,
        &adapter,
    ));
    let mut session =
        Session::new(adapter.clone(), &mountpoint, &config.fuser_config()).map_err(|source| {
            MountError::Mount {
                mountpoint: mountpoint.clone(),
                hint: mount_hint(&source, Path::new(FUSE_DEVICE), is_root()),
                source,
            }
        })?;
    adapter.serve_on(session.as_fd().as_raw_fd());
    let unmounter = session.unmount_callable();
    raise_read_ahead(&mountpoint, config.read_ahead_kb);
    log_mounted(config, &mountpoint);
    Ok(Mounted {
        session,
        unmounter: Some(unmounter),
        mountpoint,
    })
}

/// Sets the mount's readahead window to `kb` KiB (0 keeps the kernel's). The INIT reply sets
/// the bdi's readahead, so this must follow the handshake.
pub(super) fn raise_read_ahead(mountpoint: &Path, kb: u32) {
    if kb > 0 {
        if let Err(e) = set_read_ahead(mountpoint, kb) {
            tracing::warn!(
                "keeping the kernel's readahead for {}: {e}",
                mountpoint.display()
            );
        }
    }
}

pub(super) fn log_mounted(config: &MountConfig, mountpoint: &Path) {
    match &config.remote {
        None => tracing::info!(
            "mounted {} at {}",
            config.store.display(),
            mountpoint.display()
        ),
        Some(remote) => tracing::info!(
            "mounted {} with the models of {} at {}",
            config.store.display(),
            remote.endpoint,
            mountpoint.display()
        ),
    }
}

/// Serves the mount a supervisor made, as daemon `handoff.generation` of it: the namespace
/// is built, the journal read back, the session started on the supervisor's `/dev/fuse`
/// descriptor without a handshake (the kernel sent its only `INIT` to the supervisor), and
/// after a takeover the kernel asked to send again what the dead daemon left unanswered.
fn take_over(config: &MountConfig, handoff: &Handoff) -> Result<Mounted, MountError> {
    let mountpoint = handoff.mountpoint.clone();
    let serve_err = |source| MountError::Serve {
        mountpoint: mountpoint.clone(),
        source,
    };
    let (fs, fetcher) = namespace(config)?;
    // SAFETY: the supervisor passed the journal's descriptor for this process to own.
    let journal = unsafe { File::from_raw_fd(handoff.journal) };
    let (journal, replay) = super::takeover::Journal::resume(journal).map_err(serve_err)?;
    fs.hand_out_from(super::takeover::first_handle(handoff.generation));
    // Each hold goes to the supervisor too, before the open it is for is answered, so it
    // outlives this process should it die.
    let (socket, generation) = (handoff.holds, handoff.generation);
    fs.on_hold(Box::new(move |hold| {
        let fd = std::os::fd::AsRawFd::as_raw_fd(hold.file());
        if let Err(e) = super::takeover::send_fd(socket, fd, generation) {
            tracing::warn!("handing a hold to the supervisor: {e}; it ends with this daemon");
        }
    }));
    let adapter = FuseAdapter::resuming(fs.clone(), Arc::new(journal), replay)
        .map_err(|e| serve_err(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    fs.set_status_extra(status_extra(
        &mountpoint,
        config.foreground,
        fetcher,
        Some(handoff),
        &adapter,
    ));
    let mut fuser_config = config.fuser_config();
    // Clones of the descriptor would be this process's alone, and the kernel ends the requests
    // read from a clone when its last descriptor closes: a crash would fail them.
    fuser_config.clone_fd = false;
    let session =
        super::takeover::session_on(adapter.clone(), handoff, fuser_config).map_err(serve_err)?;
    let device = session.as_fd().as_raw_fd();
    adapter.serve_on(device);
    if handoff.generation > 1 {
        match handoff.offer.can_resend() {
            true => super::takeover::resend(device).map_err(serve_err)?,
            false => tracing::warn!(
                "the kernel (FUSE {}.{}) cannot send again what the daemon before this one \
                 left unanswered (Linux 6.9+): those readers wait until the mount is unmounted",
                handoff.offer.major,
                handoff.offer.minor
            ),
        }
        tracing::info!(
            "took over {} (daemon {} of this mount)",
            mountpoint.display(),
            handoff.generation
        );
    } else {
        log_mounted(config, &mountpoint);
    }
    Ok(Mounted {
        session,
        unmounter: None,
        mountpoint,
    })
}

/// The status fields a mount adds to its namespace's: `pid`, `mountpoint`, and over an
/// endpoint `endpoint`, `fetch` (its transfers) and `cache` (its use and budget); null
/// without one.
fn status_extra(
    mountpoint: &Path,
    daemon: bool,
    fetcher: Fetching,
    supervised: Option<&Handoff>,
    adapter: &FuseAdapter,
) -> crate::fs::status::StatusExtra {
    let (resent, offer) = (adapter.resent(), adapter.offer.clone());
    let mountpoint = mountpoint.to_path_buf();
    let pid = supervised.map_or(std::process::id(), |h| h.supervisor);
    let restarts = supervised.map(|h| h.restarts);
    Box::new(move || {
        let (endpoint, fetch, cache) = match &fetcher {
            Some((fetcher, endpoint)) => (
                serde_json::json!(endpoint),
                serde_json::json!(fetcher.stats()),
                serde_json::json!(fetcher.cache().stats()),
            ),
            None => Default::default(),
        };
        let mut fields = serde_json::Map::new();
        // The process that ends once the mount is unmounted: the supervisor, if any.
        fields.insert("pid".into(), pid.into());
        // That process serves this mount alone.
        fields.insert("daemon".into(), daemon.into());
        // The process serving requests now, and how many times one took over from another.
        fields.insert("server_pid".into(), std::process::id().into());
        fields.insert("restarts".into(), serde_json::json!(restarts));
        let resent = resent.load(std::sync::atomic::Ordering::Relaxed);
        fields.insert("resent".into(), resent.into());
        // Whether a daemon taking over is sent what its predecessor left unanswered.
        let resend = crate::sync::lock(&offer).map(|o| o.can_resend());
        fields.insert("resend".into(), serde_json::json!(resend));
        fields.insert("mountpoint".into(), serde_json::json!(mountpoint));
        fields.insert("endpoint".into(), endpoint);
        fields.insert("fetch".into(), fetch);
        fields.insert("cache".into(), cache);
        fields
    })
}

/// Mounts and serves in this process until the mount is unmounted from outside or
/// SIGINT/SIGTERM arrives; then unmounts (lazily when busy) and returns. A second signal
/// returns at once, leaving a busy mount detached to die with the process. (The CLI's mounts
/// are supervised instead: [`super::supervise::mount`].)
///
/// # Errors
/// The mount point is stale, already mounted or unusable, the store cannot be opened, the
/// kernel refuses the mount, or serving fails.
pub fn mount(config: MountConfig) -> Result<(), MountError> {
    let mountpoint = config.mountpoint.clone();
    block_on(&mountpoint, serve(config, None))
}

/// Serves the mount a supervisor made, as the daemon `handoff` describes, until the mount
/// ends, SIGTERM/SIGINT arrive (this daemon ends, for the supervisor to replace), or the
/// supervisor dies (it unmounts).
///
/// # Errors
/// The store cannot be opened, the journal is damaged, or serving fails.
pub fn serve_handed_off(config: MountConfig, handoff: Handoff) -> Result<(), MountError> {
    let mountpoint = handoff.mountpoint.clone();
    block_on(&mountpoint, serve(config, Some(handoff)))
}

/// Runs `serving` on a runtime of this thread.
pub(super) fn block_on(
    mountpoint: &Path,
    serving: impl std::future::Future<Output = Result<(), MountError>>,
) -> Result<(), MountError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| MountError::Serve {
            mountpoint: mountpoint.to_path_buf(),
            source,
        })?;
    let result = runtime.block_on(serving);
    // A session still running after a second signal must not hold the process.
    runtime.shutdown_background();
    result
}

/// Serves, as [`mount`] says: a mount of its own, or (with `handoff`) the supervisor's.
async fn serve(config: MountConfig, handoff: Option<Handoff>) -> Result<(), MountError> {
    use tokio::signal::unix::{signal, SignalKind};
    let serve_err = |source| MountError::Serve {
        mountpoint: config.mountpoint.clone(),
        source,
    };
    // Handlers first: a SIGTERM sent as soon as the mount appears must unmount, not kill us.
    let mut term = signal(SignalKind::terminate()).map_err(serve_err)?;
    let mut int = signal(SignalKind::interrupt()).map_err(serve_err)?;
    let mounted = match &handoff {
        None => start(&config),
        Some(handoff) => take_over(&config, handoff),
    };
    let ready_fd = handoff.as_ref().map_or(config.ready_fd, |h| Some(h.ready));
    notify_ready(ready_fd, mounted.as_ref().map(|_| ()));
    let Mounted {
        session,
        mut unmounter,
        mountpoint,
    } = mounted?;
    if handoff.is_none() {
        // A systemd unit of `Type=notify` starts what depends on the mount only now.
        notify_systemd(&format!(
            "READY=1\nSTATUS=serving {}\n",
            mountpoint.display()
        ));
    }
    let mut run = tokio::task::spawn_blocking(move || ended(session.run()));
    let mut orphaned =
        signal(SignalKind::from_raw(super::takeover::SUPERVISOR_DIED)).map_err(serve_err)?;
    let signal = tokio::select! {
        ended = &mut run => return ended_session(&mountpoint, ended),
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = orphaned.recv() => "the supervisor died",
    };
    if let (Some(handoff), true) = (&handoff, signal.starts_with("SIG")) {
        // A supervised daemon told to stop ends, and its supervisor starts another; the
        // supervisor is who unmounts. What this one read and did not answer is sent again.
        tracing::warn!(
            "{signal}: daemon {} ends; its supervisor (pid {}) starts another",
            handoff.generation,
            handoff.supervisor
        );
        std::process::exit(super::takeover::REPLACE_ME);
    }
    tracing::info!("{signal}: unmounting {}", mountpoint.display());
    if handoff.is_none() {
        notify_systemd("STOPPING=1\n");
    }
    detach(unmounter.as_mut(), &mountpoint)?;
    tokio::select! {
        ended = &mut run => ended_session(&mountpoint, ended),
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    }
}

fn ended_session(
    mountpoint: &Path,
    ended: Result<io::Result<()>, tokio::task::JoinError>,
) -> Result<(), MountError> {
    let source = match ended {
        Ok(Ok(())) => {
            tracing::info!("unmounted {}", mountpoint.display());
            return Ok(());
        }
        Ok(Err(e)) => e,
        Err(e) => io::Error::other(format!("the session panicked: {e}")),
    };
    Err(MountError::Serve {
        mountpoint: mountpoint.to_path_buf(),
        source,
    })
}

/// Unmounts; when files in the mount are open, detaches it lazily so it goes away as soon as
/// they close (the session keeps serving them until then).
///
/// We unmount ourselves rather than through `fuser`: with `auto_unmount`, `fuser` only closes
/// its socket to `fusermount3`, which unmounts only a filesystem whose daemon is gone
/// (ENOTCONN); a live one would stay mounted and the session would never end.
pub(super) fn detach(
    unmounter: Option<&mut SessionUnmounter>,
    mountpoint: &Path,
) -> Result<(), MountError> {
    if let Err(e) = unmount(mountpoint, false) {
        if is_mounted(mountpoint) {
            tracing::warn!("{e}; detaching it: it goes away when its files close");
            unmount(mountpoint, true)?;
        }
    }
    // Lets `fuser` release its side (the auto_unmount socket); the mount is already gone, so
    // `fusermount3` finds nothing to do.
    if let Some(Err(e)) = unmounter.map(SessionUnmounter::unmount) {
        tracing::debug!("fuser unmount of {}: {e}", mountpoint.display());
    }
    Ok(())
}

/// Writes the readiness line (or the error) to `fd` and closes it; a standard descriptor is
/// pointed at `/dev/null` instead, so later writes to it still succeed.
pub(super) fn notify_ready(fd: Option<RawFd>, result: Result<(), &MountError>) {
    let Some(fd) = fd else { return };
    let line = match result {
        Ok(()) => format!("{READY_LINE}\n"),
        Err(e) => format!("error: {}\n", e.to_string().replace('\n', " ")),
    };
    // SAFETY: the caller hands `fd` over (MountConfig::ready_fd): open, writable and ours to
    // close; it is closed (or replaced) below and not used again.
    let mut file = unsafe { File::from_raw_fd(fd) };
    let _ = file.write_all(line.as_bytes());
    if fd <= 2 {
        if let Ok(null) = File::options().write(true).open("/dev/null") {
            // SAFETY: both descriptors are open; dup2 atomically replaces `fd`.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
        std::mem::forget(file);
    }
}

/// Tells the service manager `message` (`KEY=value` lines) when it asked to be told: one
/// datagram to `NOTIFY_SOCKET`, a path or, starting with `@`, an abstract socket name
/// (sd_notify(3), systemd's `Type=notify`); nothing otherwise. A failure only costs the
/// manager's view, so it is logged.
pub(super) fn notify_systemd(message: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = (|| {
        let address = match target.as_encoded_bytes().strip_prefix(b"@") {
            Some(name) => SocketAddr::from_abstract_name(name)?,
            None => SocketAddr::from_pathname(Path::new(&target))?,
        };
        UnixDatagram::unbound()?.send_to_addr(message.as_bytes(), &address)
    })();
    if let Err(e) = sent {
        tracing::warn!(
            "telling the service manager (NOTIFY_SOCKET={}): {e}",
            target.to_string_lossy()
        );
    }
}

/// The readiness descriptor a background parent passed in [`READY_FD_ENV`], if any.
pub fn ready_fd_from_env() -> Option<RawFd> {
    std::env::var(READY_FD_ENV).ok()?.parse().ok()
}

/// Whether this process may hand the kernel backing files (FUSE passthrough registers them
/// only for `CAP_SYS_ADMIN`): the effective capabilities of `/proc/self/status`. `false` when
/// they cannot be read.
pub fn may_pass_through() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| has_sys_admin(&status))
}

/// Whether a `/proc/<pid>/status` text gives `CAP_SYS_ADMIN` (bit 21 of `CapEff`, in hex).
fn has_sys_admin(status: &str) -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// Starts `command` (the binary with `mount … --foreground`) as a daemon in its own process
/// group, and waits up to `timeout` for its readiness line on its stdout (so the daemon must
/// print nothing else there first; its logs go to stderr, which the caller directs, e.g. to a
/// log file). Returns its pid.
///
/// # Errors
/// The command cannot start, reports an error, exits, or is not ready in time (it is then
/// killed).
pub fn spawn_background(
    mut command: Command,
    mountpoint: &Path,
    timeout: Duration,
) -> Result<u32, MountError> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .env(READY_FD_ENV, "1")
        .process_group(0);
    let mut child = command.spawn().map_err(|e| {
        MountError::Daemon(format!("cannot start {:?}: {e}", command.get_program()))
    })?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    match rx.recv_timeout(timeout) {
        Ok(line) if line.trim_end() == READY_LINE => Ok(child.id()),
        Ok(line) => {
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            Err(MountError::Daemon(
                match line.trim_end().strip_prefix("error: ") {
                    Some(why) => why.to_owned(),
                    None => format!("it exited ({status}) before mounting; see its log"),
                },
            ))
        }
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(MountError::Timeout {
                mountpoint: mountpoint.to_path_buf(),
                waited: timeout,
            })
        }
    }
}

/// Waits up to `timeout` for process `pid` to end (gone from `/proc`, or a zombie its parent
/// has not reaped); returns whether it did.
pub fn wait_for_exit(pid: u32, timeout: Duration) -> bool {
    let stat = PathBuf::from(format!("/proc/{pid}/stat"));
    let start = std::time::Instant::now();
    loop {
        // The state follows the parenthesized command name, which may hold spaces.
        let ended = match fs::read_to_string(&stat) {
            Err(_) => true,
            Ok(text) => text
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        };
        if ended {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A mount served by threads of this process. Dropping it unmounts and joins.
#[derive(Debug)]
pub struct MountHandle {
    mountpoint: PathBuf,
    unmounter: Option<SessionUnmounter>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

/// A session's result, with the connection's end by abort counted as its normal end: once a
/// lazily detached mount's last file closes, the kernel may answer the daemon's next read with
/// `ECONNABORTED` rather than `ENODEV` (fuser ends quietly only on the latter), and either way
/// the mount is gone.
fn ended(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(()),
        other => other,
    }
}

/// Mounts and serves on background threads of this process.
///
/// # Errors
/// As [`mount`], before serving starts.
pub fn spawn(config: MountConfig) -> Result<MountHandle, MountError> {
    let Mounted {
        session,
        unmounter,
        mountpoint,
    } = start(&config)?;
    let unmounter = unmounter.expect("a mount of this process has its unmounter");
    let thread = std::thread::Builder::new()
        .name("tensorfs-session".into())
        .spawn(move || ended(session.run()))
        .map_err(|source| MountError::Serve {
            mountpoint: mountpoint.clone(),
            source,
        })?;
    Ok(MountHandle {
        mountpoint,
        unmounter: Some(unmounter),
        thread: Some(thread),
    })
}

impl MountHandle {
    /// Where it is mounted (canonical).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts (lazily when busy) and waits for the session to end.
    ///
    /// # Errors
    /// Unmounting fails, or the session ended with an error.
    pub fn unmount(mut self) -> Result<(), MountError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), MountError> {
        if let Some(mut unmounter) = self.unmounter.take() {
            if let Err(e) = detach(Some(&mut unmounter), &self.mountpoint) {
                // Joining would wait for a session that may never end.
                self.thread.take();
                return Err(e);
            }
        }
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let source = match thread.join() {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => io::Error::other("the session panicked"),
        };
        Err(MountError::Serve {
            mountpoint: self.mountpoint.clone(),
            source,
        })
    }
}

impl Drop for MountHandle {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!("{e}");
        }
    }
}

/// How often, and how far apart, an unmount that finds the mount busy tries again.
const BUSY_TRIES: u32 = 10;
const BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Unmounts the TensorFS mount at `mountpoint`; `lazy` detaches it now and lets it go when its
/// files close. Works on stale mounts; refuses any other filesystem. A mount still busy after
/// a second of tries is an error.
///
/// # Errors
/// Not a TensorFS mount, busy (without `lazy`), or not permitted.
pub fn unmount(mountpoint: &Path, lazy: bool) -> Result<(), MountError> {
    let path = resolve_mountpoint(mountpoint);
    if !is_mounted(&path) {
        // A stale mount point fails to stat with ENOTCONN, not ENOENT, so only a path that is
        // really absent is called so.
        if fs::symlink_metadata(&path).is_err_and(|e| e.kind() == io::ErrorKind::NotFound) {
            return Err(MountError::NoSuchPath { mountpoint: path });
        }
        return Err(MountError::NotOurs { mountpoint: path });
    }
    let fail = |source: io::Error, hint| MountError::Unmount {
        mountpoint: path.clone(),
        source,
        hint,
    };
    if is_root() {
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|e| fail(io::Error::new(io::ErrorKind::InvalidInput, e), ""))?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // A moment's reference (another process's stat or getxattr of the mount, a file whose
        // close is still being released) also reads as busy: tried again for a second first.
        let mut tries = 0;
        // SAFETY: `c_path` is a NUL-terminated path that outlives the call.
        while unsafe { libc::umount2(c_path.as_ptr(), flags) } != 0 {
            let source = io::Error::last_os_error();
            tries += 1;
            if source.raw_os_error() == Some(libc::EBUSY) && tries < BUSY_TRIES {
                std::thread::sleep(BUSY_PAUSE);
                continue;
            }
            let hint = match source.raw_os_error() {
                Some(libc::EBUSY) => {
                    "; files in it are open: unmount lazily (--lazy) to detach it now"
                }
                _ => "",
            };
            return Err(fail(source, hint));
        }
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if let Some(owner) = super::mountinfo::owner(&path).filter(|&uid| uid != me) {
        // fusermount3 would say only that the mount is not in /etc/mtab.
        return Err(MountError::NotTheirs {
            mountpoint: path,
            owner: user_name(owner).map_or(format!("uid {owner}"), |name| {
                format!("user {name} (uid {owner})")
            }),
        });
    }
    // Only the setuid helper may unmount for other users.
    let flag = if lazy { "-uz" } else { "-u" };
    for tries in 1.. {
        let output = Command::new("fusermount3")
            .arg(flag)
            .arg(&path)
            .output()
            .or_else(|e| match e.kind() {
                io::ErrorKind::NotFound => Command::new("fusermount").arg(flag).arg(&path).output(),
                _ => Err(e),
            })
            .map_err(|e| fail(e, "; install fusermount3 (apt package fuse3)"))?;
        if output.status.success() {
            break;
        }
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        if stderr.contains("busy") && tries < BUSY_TRIES {
            std::thread::sleep(BUSY_PAUSE);
            continue;
        }
        return Err(fail(io::Error::other(stderr), ""));
    }
    Ok(())
}

/// The login name of `uid`, from the user database (`getpwuid_r`).
fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: passwd is plain data; zeroed is a valid value for the call to overwrite.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to memory of the length given, live for the call; on success
    // `found` points at `entry`, whose strings point into `buf`.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string in `buf`, which outlives this borrow.
    let name = unsafe { std::ffi::CStr::from_ptr(entry.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

/// Checks that `path` can be mounted on, and returns it canonical.
///
/// # Errors
/// [`MountError::Stale`] for a dead mount, [`MountError::AlreadyMounted`], or a path that is
/// absent or not a folder.
pub fn check_mountpoint(path: &Path) -> Result<PathBuf, MountError> {
    let unusable = |source| MountError::Mountpoint {
        mountpoint: path.to_path_buf(),
        source,
    };
    match fs::metadata(path) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(MountError::Stale {
                mountpoint: path.to_path_buf(),
            })
        }
        Err(e) => return Err(unusable(e)),
        Ok(meta) if !meta.is_dir() => {
            return Err(unusable(io::Error::from_raw_os_error(libc::ENOTDIR)))
        }
        Ok(_) => {}
    }
    let canonical = fs::canonicalize(path).map_err(unusable)?;
    if is_mounted(&canonical) {
        return Err(MountError::AlreadyMounted {
            mountpoint: canonical,
        });
    }
    if fs::read_dir(&canonical).map_err(unusable)?.next().is_some() {
        return Err(MountError::NotEmpty {
            mountpoint: canonical,
        });
    }
    Ok(canonical)
}

/// The mount point `path` names, as mountinfo lists it: symlinks and `..` resolved as `mount`
/// resolved them, without asking the mount itself (a stale one answers `ENOTCONN`): its
/// folder is resolved, and the last component only when it is a symlink.
pub fn resolve_mountpoint(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let (Some(parent), Some(name)) = (absolute.parent(), absolute.file_name()) else {
        return fs::canonicalize(&absolute).unwrap_or(absolute);
    };
    let joined = fs::canonicalize(parent)
        .unwrap_or_else(|_| parent.to_path_buf())
        .join(name);
    match fs::read_link(&joined) {
        Ok(_) => fs::canonicalize(&joined).unwrap_or(joined),
        Err(_) => joined,
    }
}

/// That this process may mount with `allow_other`: root may; another user when
/// `/etc/fuse.conf` has a `user_allow_other` line (`fusermount3` refuses it otherwise, fuse(8)).
///
/// # Errors
/// [`MountError::AllowOtherRefused`].
pub fn check_allow_other() -> Result<(), MountError> {
    match is_root() || fs::read_to_string("/etc/fuse.conf").is_ok_and(|c| allows_other(&c)) {
        true => Ok(()),
        false => Err(MountError::AllowOtherRefused),
    }
}

/// Whether a `fuse.conf` text has the `user_allow_other` line (comments start with `#`).
fn allows_other(conf: &str) -> bool {
    conf.lines()
        .any(|l| l.split('#').next().unwrap_or("").trim() == "user_allow_other")
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// Where `program` is on `PATH` (the first folder holding a file of that name), if anywhere.
pub fn find_in_path(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner of another user's mount is named by login, or by uid alone when the user
    /// database has no entry for it.
    #[test]
    fn a_uid_is_named_by_its_login_when_it_has_one() {
        assert_eq!(user_name(0).as_deref(), Some("root"));
        assert_eq!(user_name(u32::MAX - 7), None);
    }

    #[test]
    fn fuse_conf_allows_other_users_only_by_its_uncommented_line() {
        assert!(allows_other("# comment\nuser_allow_other\n"));
        assert!(allows_other(
            "mount_max = 1000\n  user_allow_other  # for tensorfs\n"
        ));
        assert!(!allows_other("#user_allow_other\n"));
        assert!(!allows_other("# user_allow_other\nmount_max = 1000\n"));
        assert!(!allows_other(""));
    }

    #[test]
    fn cap_sys_admin_is_read_from_the_effective_set() {
        let status = |eff: &str| {
            format!(
                "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t{eff}\n"
            )
        };
        assert!(has_sys_admin(&status("000001ffffffffff")), "root");
        assert!(
            has_sys_admin(&status("0000000000200000")),
            "the one capability"
        );
        assert!(
            !has_sys_admin(&status("0000000000000000")),
            "an ordinary user"
        );
        assert!(
            !has_sys_admin(&status("00000000a80425fb")),
            "a container's default set"
        );
        assert!(!has_sys_admin("Name:\tx\n"), "no CapEff line");
    }

    #[test]
    fn a_missing_file_or_non_empty_mountpoint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        for path in [dir.path().join("absent"), file] {
            assert!(
                matches!(check_mountpoint(&path), Err(MountError::Mountpoint { .. })),
                "{path:?}"
            );
        }
        assert!(matches!(
            check_mountpoint(dir.path()),
            Err(MountError::NotEmpty { .. })
        ));
        let empty = dir.path().join("empty");
        fs::create_dir(&empty).unwrap();
        assert_eq!(
            check_mountpoint(&empty).unwrap(),
            fs::canonicalize(&empty).unwrap()
        );
    }

    #[test]
    fn a_refused_mount_names_the_device_and_its_permission() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let device = dir.path().join("fuse");
        fs::write(&device, b"").unwrap();
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        fs::set_permissions(&device, fs::Permissions::from_mode(0o600)).unwrap();
        let hint = mount_hint(&denied, &device, false);
        assert!(hint.contains("mode 0600"), "{hint}");
        assert!(hint.contains(&device.display().to_string()), "{hint}");
        assert!(hint.contains("0666"), "{hint}");
        assert_eq!(
            mount_hint(&denied, &device, true),
            "",
            "root opens any mode"
        );
        fs::set_permissions(&device, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(mount_hint(&denied, &device, false).contains("fusermount3"));
        let other = io::Error::from_raw_os_error(libc::EINVAL);
        assert_eq!(mount_hint(&other, &device, false), "");
        let gone = dir.path().join("absent");
        assert!(mount_hint(&other, &gone, true).contains("modprobe fuse"));
    }

    #[test]
    fn an_aborted_connection_ends_the_session_like_an_unmount() {
        let aborted = io::Error::from_raw_os_error(libc::ECONNABORTED);
        assert!(ended(Err(aborted)).is_ok());
        let other = io::Error::from_raw_os_error(libc::EIO);
        assert_eq!(
            ended(Err(other)).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        assert!(ended(Ok(())).is_ok());
    }
}
