//! Restarts that keep the mount. The process `tensorfs mount` leaves running is a supervisor:
//! it makes the mount, answers the kernel's one `INIT` (recording its [`Offer`]), keeps the
//! `/dev/fuse` descriptor and a [`Journal`], and starts the daemon that serves, handing it
//! all three ([`Handoff`]). When the daemon dies (a crash, `kill -9`, or `SIGHUP` to the
//! supervisor, which restarts it from the binary now installed: an upgrade), the supervisor
//! starts another. It takes the descriptor over without a handshake, gives out the inodes and
//! handles the journal lists again, and asks the kernel to resend what the dead daemon read
//! and never answered, so readers (`read(2)`, page faults of an `mmap`) see a pause, never an
//! error or `SIGBUS`. The connection lives as long as the supervisor holds the descriptor.
//!
//! Signals: SIGTERM or SIGINT to the supervisor unmount; to the daemon, they only replace it.
//! SIGHUP restarts the daemon (from the binary now installed, else from the supervisor's
//! own). A daemon whose supervisor dies unmounts. A daemon that dies more than
//! [`MAX_RESTARTS`] times within [`RESTART_WINDOW`] is not started again: the mount is
//! detached and the supervisor fails.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fuser::Session;

use super::session::{self, MountConfig, MountError};
use super::takeover::{recv_fd, Handoff, Journal, Offer, HANDOFF_ENV, REPLACE_ME, SUPERVISOR_DIED};
use super::Handshake;
use crate::store::Store;
use crate::sync::lock;

/// How many times a daemon may die within [`RESTART_WINDOW`] before the supervisor gives up.
pub const MAX_RESTARTS: usize = 5;

/// See [`MAX_RESTARTS`].
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// How long a daemon may take to say it serves.
const READY_WAIT: Duration = Duration::from_secs(60);

/// The command that starts a daemon: `program` with `args`, run with [`HANDOFF_ENV`] set (the
/// CLI's: `tensorfs … mount MOUNTPOINT --foreground …`, which serves when handed a mount).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonCommand {
    /// The binary, by path: after an upgrade, the new one.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
}

impl DaemonCommand {
    /// This process's own command line.
    ///
    /// # Errors
    /// Its binary cannot be found.
    pub fn this_process() -> io::Result<DaemonCommand> {
        Ok(DaemonCommand {
            program: std::env::current_exe()?,
            args: std::env::args_os().skip(1).collect(),
        })
    }
}

/// A daemon the supervisor started.
struct Daemon {
    child: tokio::process::Child,
    generation: u64,
}

/// What the supervisor keeps across daemons.
struct Supervisor {
    mountpoint: PathBuf,
    /// The store, whose collections are fenced off while no daemon holds its open files'
    /// commits (between one daemon's death and the next one's readiness).
    store: Store,
    /// Whether the mount shows an endpoint's models (their blobs are fetched again when
    /// evicted, and a fetch may need the fence exclusively: not fenced).
    remote: bool,
    /// What starts a daemon.
    daemon: DaemonCommand,
    device: RawFd,
    journal: Journal,
    offer: Offer,
    /// Daemons started, and how many of them took over from another.
    generation: u64,
    restarts: u64,
    /// The daemons' end of the socket on which they send their holds, and the holds received
    /// (a descriptor of each, with the generation of the daemon that took it).
    hold_socket: OwnedFd,
    holds: KeptHolds,
}

/// Descriptors of daemons' holds, each with the generation of the daemon that took it.
type KeptHolds = Arc<Mutex<Vec<(u64, OwnedFd)>>>;

/// Mounts as the module says: this process is the supervisor, and `daemon` starts the
/// daemons, until the mount is unmounted or SIGTERM/SIGINT arrives. A process started by a
/// supervisor (its [`HANDOFF_ENV`] set) is that daemon instead, and serves
/// ([`session::serve_handed_off`]).
///
/// # Errors
/// As [`session::mount`]; also a daemon that fails before serving, or dies too often, and a
/// malformed handoff.
pub fn mount(config: MountConfig, daemon: DaemonCommand) -> Result<(), MountError> {
    let handoff = Handoff::from_env().map_err(|source| MountError::Serve {
        mountpoint: config.mountpoint.clone(),
        source,
    })?;
    match handoff {
        Some(handoff) => session::serve_handed_off(config, handoff),
        None => {
            let mountpoint = config.mountpoint.clone();
            session::block_on(&mountpoint, supervise(config, daemon))
        }
    }
}

/// The supervisor's part of [`mount`].
async fn supervise(config: MountConfig, daemon: DaemonCommand) -> Result<(), MountError> {
    use tokio::signal::unix::{signal, SignalKind};
    let given = config.mountpoint.clone();
    let serve_err = |source| MountError::Serve {
        mountpoint: given.clone(),
        source,
    };
    let mut term = signal(SignalKind::terminate()).map_err(serve_err)?;
    let mut int = signal(SignalKind::interrupt()).map_err(serve_err)?;
    let mut hup = signal(SignalKind::hangup()).map_err(serve_err)?;
    let ready_fd = config.ready_fd;
    let (mut session, mut supervisor) = match make(config, daemon).await {
        Ok(mounted) => mounted,
        Err(e) => {
            session::notify_ready(ready_fd, Err(&e));
            return Err(e);
        }
    };
    let mountpoint = supervisor.mountpoint.clone();
    let mut daemon = match supervisor.start().await {
        Ok(daemon) => daemon,
        Err(e) => {
            session::notify_ready(ready_fd, Err(&e));
            let _ = session::detach(Some(&mut session.unmount_callable()), &mountpoint);
            return Err(e);
        }
    };
    session::notify_ready(ready_fd, Ok(()));
    session::notify_systemd(&format!(
        "READY=1\nSTATUS=serving {}\n",
        mountpoint.display()
    ));
    let mut deaths: Vec<Instant> = Vec::new();
    loop {
        let (why, fence) = tokio::select! {
            status = daemon.child.wait() => {
                let status = status.map_err(serve_err)?;
                if status.success() {
                    // It served until the mount was unmounted.
                    return Ok(());
                }
                if !supervisor.connected() {
                    tracing::info!(
                        "daemon {} ended ({status}) after the mount at {} went",
                        daemon.generation,
                        mountpoint.display()
                    );
                    return Ok(());
                }
                deaths.retain(|t| t.elapsed() < RESTART_WINDOW);
                deaths.push(Instant::now());
                if deaths.len() > MAX_RESTARTS {
                    return Err(give_up(&mut session, &mountpoint, &deaths, &status.to_string()));
                }
                // What its open files need is not held now: no collection until the next
                // daemon holds it again.
                let fence = supervisor.fence();
                let why = match status.code() {
                    Some(REPLACE_ME) => format!("daemon {} ended on a signal sent to it", daemon.generation),
                    _ => format!("daemon {} died ({status})", daemon.generation),
                };
                (why, fence)
            }
            _ = hup.recv() => {
                let fence = supervisor.fence();
                // SAFETY: kill sends a signal to our own child, which has not been reaped.
                if let Some(pid) = daemon.child.id() {
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
                let _ = daemon.child.wait().await;
                (format!(
                    "SIGHUP: restarting daemon {} from {}",
                    daemon.generation,
                    supervisor.daemon.program.display()
                ), fence)
            }
            _ = term.recv() => return stop(&mut session, &mountpoint, daemon, "SIGTERM", &mut term, &mut int).await,
            _ = int.recv() => return stop(&mut session, &mountpoint, daemon, "SIGINT", &mut term, &mut int).await,
        };
        tracing::warn!("{why}; a new daemon takes over {}", mountpoint.display());
        daemon = loop {
            // A stop asked for meanwhile is not kept waiting for the start (up to a minute):
            // the mount goes now, and a daemon started anyway finds it gone and ends.
            let started = tokio::select! {
                started = supervisor.start() => started,
                _ = term.recv() => return stop_starting(&mut session, &mountpoint, "SIGTERM"),
                _ = int.recv() => return stop_starting(&mut session, &mountpoint, "SIGINT"),
            };
            match started {
                Ok(daemon) => break daemon,
                Err(e) => {
                    deaths.retain(|t| t.elapsed() < RESTART_WINDOW);
                    deaths.push(Instant::now());
                    if deaths.len() > MAX_RESTARTS {
                        return Err(give_up(&mut session, &mountpoint, &deaths, &e.to_string()));
                    }
                    tracing::warn!("{e}; trying again in a second");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        drop(fence);
    }
}

/// Stops on `signal` while no daemon serves (one is starting): unmounts, lazily when busy.
fn stop_starting(
    session: &mut Session<Handshake>,
    mountpoint: &Path,
    signal: &str,
) -> Result<(), MountError> {
    tracing::info!(
        "{signal} while a daemon starts: unmounting {}",
        mountpoint.display()
    );
    session::notify_systemd("STOPPING=1\n");
    session::detach(Some(&mut session.unmount_callable()), mountpoint)
}

/// Detaches the mount after too many deaths; the error says so.
fn give_up(
    session: &mut Session<Handshake>,
    mountpoint: &Path,
    deaths: &[Instant],
    last: &str,
) -> MountError {
    let _ = session::detach(Some(&mut session.unmount_callable()), mountpoint);
    MountError::Daemon(format!(
        "the daemon serving {} died {} times within {} s (last: {last}); the mount is \
         detached: see the log",
        mountpoint.display(),
        deaths.len(),
        RESTART_WINDOW.as_secs()
    ))
}

/// Makes the mount: the mount point checked, the store opened, the kernel's `INIT` answered.
async fn make(
    config: MountConfig,
    daemon: DaemonCommand,
) -> Result<(Session<Handshake>, Supervisor), MountError> {
    let mountpoint = session::check_mountpoint(&config.mountpoint)?;
    // Refused here, before mounting, rather than by the daemon after.
    let store = Store::open_existing(&config.store)?;
    let serve_err = |source| MountError::Serve {
        mountpoint: mountpoint.clone(),
        source,
    };
    let offer = Arc::new(Mutex::new(None));
    let handshake = Handshake {
        passthrough: config.fs.views.is_some(),
        offer: offer.clone(),
    };
    let session =
        Session::new(handshake, &mountpoint, &config.fuser_config()).map_err(|source| {
            MountError::Mount {
                mountpoint: mountpoint.clone(),
                hint: session::mount_hint(
                    &source,
                    Path::new(session::FUSE_DEVICE),
                    session::is_root(),
                ),
                source,
            }
        })?;
    session::raise_read_ahead(&mountpoint, config.read_ahead_kb);
    let offer = lock(&offer).ok_or_else(|| serve_err(io::Error::other("no INIT offer")))?;
    let journal = Journal::create().map_err(serve_err)?;
    let device = session.as_fd().as_raw_fd();
    let (hold_socket, holds) = keep_holds().map_err(serve_err)?;
    let supervisor = Supervisor {
        hold_socket,
        holds,
        mountpoint,
        store,
        remote: config.remote.is_some(),
        daemon,
        device,
        journal,
        offer,
        generation: 0,
        restarts: 0,
    };
    Ok((session, supervisor))
}

/// A socket whose one end daemons send their holds on, and the holds a thread of this process
/// receives and keeps: so a hold outlives the daemon that took it, until the next daemon has
/// taken its own ([`Supervisor::start`] lets the older ones go). A hold its daemon ended
/// (its file removed) is let go as the next one arrives.
fn keep_holds() -> io::Result<(OwnedFd, KeptHolds)> {
    let (ours, theirs) = super::takeover::socket_pair()?;
    let holds = KeptHolds::default();
    let kept = holds.clone();
    std::thread::Builder::new()
        .name("tensorfs-holds".into())
        .spawn(move || loop {
            match recv_fd(ours.as_raw_fd()) {
                Ok(Some(hold)) => {
                    let mut kept = lock(&kept);
                    kept.retain(|(_, fd)| linked(fd));
                    kept.push(hold);
                }
                Ok(None) => return,
                Err(e) => tracing::warn!("receiving a daemon's hold: {e}"),
            }
        })?;
    Ok((theirs, holds))
}

/// Whether the file `fd` is open to still has a name (a hold its daemon ended was removed).
fn linked(fd: &OwnedFd) -> bool {
    // SAFETY: fstat fills the zeroed struct it is given; `fd` is open.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) == 0 && stat.st_nlink > 0 }
}

impl Supervisor {
    /// Whether the mount's FUSE connection is alive: it outlives a lazy unmount while files
    /// are open, and once it ends the kernel says so on the device (`POLLERR`; fs/fuse/dev.c
    /// `fuse_dev_poll`).
    fn connected(&self) -> bool {
        let mut poll = libc::pollfd {
            fd: self.device,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll reads and writes the one pollfd it is given, and does not wait.
        let n = unsafe { libc::poll(&mut poll, 1, 0) };
        n >= 0 && poll.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) == 0
    }

    /// The store's fence taken shared, so no collection starts (see [`Supervisor::store`]);
    /// `None` for a mount of an endpoint's models, or when it cannot be taken (logged). A
    /// collection running now is not waited for: it began while the dead daemon's holds were
    /// there, or too late for any fence to help, and waiting would only hold the mount up.
    fn fence(&self) -> Option<crate::store::Lock> {
        if self.remote {
            return None;
        }
        match self.store.try_fence() {
            Ok(Some(fence)) => Some(fence),
            Ok(None) => {
                tracing::warn!("a collection is running while the daemon restarts");
                None
            }
            Err(e) => {
                tracing::warn!("collections are not fenced off during the restart: {e}");
                None
            }
        }
    }

    /// Starts the next daemon and waits until it serves: from the configured binary, and,
    /// should that fail (an upgrade that does not start), from the one this process runs.
    async fn start(&mut self) -> Result<Daemon, MountError> {
        let program = self.daemon.program.clone();
        let daemon = match self.start_from(&program).await {
            Err(e) if program != Path::new(SELF) => {
                tracing::error!(
                    "{e}; starting the daemon from the binary this supervisor runs instead"
                );
                self.start_from(Path::new(SELF)).await?
            }
            started => started?,
        };
        if daemon.generation > 1 {
            self.restarts += 1;
        }
        // It holds what its open files need now: the holds of the daemons before it go.
        lock(&self.holds).retain(|(generation, _)| *generation >= daemon.generation);
        Ok(daemon)
    }

    async fn start_from(&mut self, program: &Path) -> Result<Daemon, MountError> {
        self.generation += 1;
        let (reader, writer) =
            io::pipe().map_err(|e| MountError::Daemon(format!("a pipe: {e}")))?;
        let handoff = Handoff {
            device: self.device,
            journal: self.journal.file().as_raw_fd(),
            ready: writer.as_raw_fd(),
            holds: self.hold_socket.as_raw_fd(),
            generation: self.generation,
            restarts: self.restarts + u64::from(self.generation > 1),
            offer: self.offer,
            supervisor: std::process::id(),
            mountpoint: self.mountpoint.clone(),
        };
        let mut command = tokio::process::Command::new(program);
        command
            .args(&self.daemon.args)
            .env(HANDOFF_ENV, handoff.to_env())
            .env_remove(session::READY_FD_ENV)
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Signals from the terminal go to the supervisor, which tells the daemon.
            .process_group(0);
        let inherited = [
            handoff.device,
            handoff.journal,
            handoff.ready,
            handoff.holds,
        ];
        // SAFETY: between fork and exec only async-signal-safe calls: fcntl and prctl.
        unsafe {
            command.pre_exec(move || {
                for fd in inherited {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                // The daemon unmounts and ends when the supervisor dies.
                libc::prctl(libc::PR_SET_PDEATHSIG, SUPERVISOR_DIED);
                Ok(())
            });
        }
        let generation = self.generation;
        let child = command.spawn().map_err(|e| {
            MountError::Daemon(format!(
                "daemon {generation}: cannot start {}: {e}",
                program.display()
            ))
        })?;
        drop(writer);
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            let _ = BufReader::new(reader).read_line(&mut line);
            line
        });
        let mut daemon = Daemon { child, generation };
        let pid = daemon.child.id().unwrap_or(0);
        let line = match tokio::time::timeout(READY_WAIT, line).await {
            Ok(Ok(line)) => line,
            _ => {
                let _ = daemon.child.start_kill();
                let _ = daemon.child.wait().await;
                return Err(MountError::Timeout {
                    mountpoint: self.mountpoint.clone(),
                    waited: READY_WAIT,
                });
            }
        };
        if line.trim_end() == session::READY_LINE {
            return Ok(daemon);
        }
        let status = daemon
            .child
            .wait()
            .await
            .map(|s| s.to_string())
            .unwrap_or_default();
        Err(MountError::Daemon(
            match line.trim_end().strip_prefix("error: ") {
                Some(why) => format!(
                    "daemon {generation} (pid {pid}, {}): {why}",
                    program.display()
                ),
                None => format!(
                    "daemon {generation} (pid {pid}, {}) exited ({status}) before serving",
                    program.display()
                ),
            },
        ))
    }
}

/// The binary this process runs, even once the file it was started from is replaced.
const SELF: &str = "/proc/self/exe";

/// Stops on `signal`: unmounts (lazily when files are open, which the daemon serves until
/// they close) and waits for the daemon to end with the mount; a second signal returns at
/// once.
async fn stop(
    session: &mut Session<Handshake>,
    mountpoint: &Path,
    mut daemon: Daemon,
    signal: &str,
    term: &mut tokio::signal::unix::Signal,
    int: &mut tokio::signal::unix::Signal,
) -> Result<(), MountError> {
    tracing::info!("{signal}: unmounting {}", mountpoint.display());
    session::notify_systemd("STOPPING=1\n");
    session::detach(Some(&mut session.unmount_callable()), mountpoint)?;
    tokio::select! {
        _ = daemon.child.wait() => Ok(()),
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    }
}
