//! `tensorfs doctor [--json]`: what this machine and this user can do with TensorFS, each
//! finding with its fix; the exit status says whether a mount can run.
//!
//! Checks, in order: `/dev/fuse` and `fusermount3` (a mount needs them), `user_allow_other`
//! (only `--allow-other` of a user other than root needs it), the kernel's FUSE (passthrough
//! from Linux 6.9, large folios from 7.4), whether this process may pass files through
//! (`CAP_SYS_ADMIN`, for views), io_uring (`kernel.io_uring_disabled`, a seccomp filter that
//! refuses `io_uring_setup`, as containers' default profiles do), `RLIMIT_MEMLOCK` for the
//! registered read buffers, `fs.fuse.max_pages_limit`, an overlayfs under the views' folder,
//! the store (its format, free space above the reserve), stale mounts of ours, then a trial
//! mount of an empty store (which also reads the FUSE protocol version the kernel speaks).

use std::path::Path;
use std::process::ExitCode;

use serde_json::json;

use super::Cli;
use crate::fuse::session;
use crate::store::{Capacity, Store, STORE_FORMAT};

/// Arguments of `doctor`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the findings as a JSON array of {check, status, finding, fix}.
    #[arg(long)]
    pub json: bool,
}

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// Works.
    Ok,
    /// Works, slower or with less; the fix says how to get all of it.
    Warn,
    /// A mount cannot run until fixed.
    Fail,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check's finding.
struct Finding {
    check: &'static str,
    status: Status,
    finding: String,
    fix: Option<String>,
}

fn ok(check: &'static str, finding: impl Into<String>) -> Finding {
    Finding {
        check,
        status: Status::Ok,
        finding: finding.into(),
        fix: None,
    }
}

fn not_ok(
    check: &'static str,
    status: Status,
    finding: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        check,
        status,
        finding: finding.into(),
        fix: Some(fix.into()),
    }
}

/// Runs every check and prints the findings; fails when a mount cannot run.
///
/// # Errors
/// Never: what cannot be checked is a finding.
pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    let root = session::is_root();
    let kernel = kernel_release();
    let mut findings = vec![
        dev_fuse(root),
        fusermount(root),
        allow_other(root),
        fuse_kernel(kernel),
        passthrough(kernel),
        io_uring(),
        memlock(),
        max_pages(),
        readahead(root),
    ];
    findings.extend(store(cli));
    findings.push(stale_mounts());
    findings.push(match findings.iter().any(|f| f.status == Status::Fail) {
        true => not_ok(
            "trial mount",
            Status::Fail,
            "not tried: the failures above keep a mount from running",
            "fix them, then run tensorfs doctor again",
        ),
        false => trial_mount(),
    });
    if args.json {
        let list: Vec<_> = findings
            .iter()
            .map(|f| {
                json!({"check": f.check, "status": f.status.word(), "finding": f.finding,
                       "fix": f.fix})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for f in &findings {
            println!("{:<4}  {:<17} {}", f.status.word(), f.check, f.finding);
            if let Some(fix) = &f.fix {
                println!("{:<23} fix: {fix}", "");
            }
        }
    }
    Ok(match findings.iter().any(|f| f.status == Status::Fail) {
        true => ExitCode::FAILURE,
        false => ExitCode::SUCCESS,
    })
}

/// Whether this process may use `path` as `mode` asks (`R_OK`, `W_OK`, `X_OK` bits;
/// `access(2)`, by the real ids); a path holding a NUL may not.
fn may(path: &Path, mode: libc::c_int) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path; access only reads it.
    unsafe { libc::access(c.as_ptr(), mode) == 0 }
}

fn dev_fuse(root: bool) -> Finding {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    const CHECK: &str = "/dev/fuse";
    let meta =
        match std::fs::metadata("/dev/fuse") {
            Ok(m) if m.file_type().is_char_device() => m,
            _ => return not_ok(
                CHECK,
                Status::Fail,
                "missing: the kernel's FUSE is not loaded, or this container has no /dev/fuse",
                "modprobe fuse (as root); in a container, pass the device (docker run --device \
                 /dev/fuse --cap-add SYS_ADMIN)",
            ),
        };
    let mode = meta.permissions().mode() & 0o777;
    match root || may(Path::new("/dev/fuse"), libc::R_OK | libc::W_OK) {
        true => ok(CHECK, format!("usable (mode {mode:04o})")),
        false => not_ok(
            CHECK,
            Status::Fail,
            format!("mode {mode:04o}: this user may not open it"),
            "chmod 0666 /dev/fuse (as root; Debian and Ubuntu ship it so, udev keeps it)",
        ),
    }
}

fn fusermount(root: bool) -> Finding {
    use std::os::unix::fs::PermissionsExt;
    const CHECK: &str = "fusermount3";
    let Some(path) = session::find_in_path("fusermount3") else {
        return match root {
            true => not_ok(
                CHECK,
                Status::Warn,
                "not installed: root mounts without it, but a crashed daemon leaves its mount \
                 stale until unmounted by hand",
                "apt install fuse3",
            ),
            false => not_ok(
                CHECK,
                Status::Fail,
                "not installed: a user other than root mounts through it",
                "apt install fuse3 (as root)",
            ),
        };
    };
    let setuid = std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o4000 != 0);
    match setuid || root {
        true => ok(CHECK, format!("{}", path.display())),
        false => not_ok(
            CHECK,
            Status::Fail,
            format!(
                "{} is not setuid root: it cannot mount for users",
                path.display()
            ),
            format!("chmod u+s {} (as root), or reinstall fuse3", path.display()),
        ),
    }
}

fn allow_other(root: bool) -> Finding {
    const CHECK: &str = "allow_other";
    if root {
        return ok(CHECK, "root's mounts let every user read them");
    }
    match session::check_allow_other() {
        Ok(()) => ok(
            CHECK,
            "/etc/fuse.conf has user_allow_other: --allow-other works",
        ),
        Err(_) => not_ok(
            CHECK,
            Status::Warn,
            "/etc/fuse.conf has no user_allow_other: only you can read your mounts \
             (--allow-other is refused)",
            "echo user_allow_other >> /etc/fuse.conf (as root), if other users or containers \
             must read them",
        ),
    }
}

/// The kernel's release as (major, minor), from `uname`.
fn kernel_release() -> Option<(u32, u32)> {
    // SAFETY: uname fills the zeroed struct we own.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    // SAFETY: uname NUL-terminates the release.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }.to_string_lossy();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    Some((numbers.next()?, numbers.next()?))
}

fn fuse_kernel(kernel: Option<(u32, u32)>) -> Finding {
    const CHECK: &str = "kernel FUSE";
    let Some((major, minor)) = kernel else {
        return not_ok(
            CHECK,
            Status::Warn,
            "the kernel's release is unknown",
            "none needed",
        );
    };
    let at_least = |m: u32, n: u32| (major, minor) >= (m, n);
    let mut has = vec![];
    if at_least(6, 9) {
        has.push("passthrough (6.9)");
    }
    if at_least(6, 14) {
        has.push("FUSE over io_uring (6.14; the daemon does not use it yet)");
    }
    if at_least(7, 4) {
        has.push("large folios (7.4)");
    }
    let finding = format!(
        "Linux {major}.{minor}{}",
        match has.is_empty() {
            true => String::new(),
            false => format!(": {}", has.join(", ")),
        }
    );
    match at_least(7, 4) {
        true => ok(CHECK, finding),
        false => not_ok(
            CHECK,
            Status::Warn,
            format!(
                "{finding}; FUSE files are read a 4 KiB page at a time, 2–13× a local file's \
                 time through the mount"
            ),
            "views (root, docs/views.md) or the Python package's loader (docs/python.md) read \
             at a local file's speed; Linux 7.4 reads FUSE files in large folios",
        ),
    }
}

fn passthrough(kernel: Option<(u32, u32)>) -> Finding {
    const CHECK: &str = "passthrough";
    if kernel.is_some_and(|k| k < (6, 9)) {
        return not_ok(
            CHECK,
            Status::Warn,
            "the kernel has no FUSE passthrough (6.9+): mounts have no views",
            "a kernel of 6.9 or later",
        );
    }
    match session::may_pass_through() {
        true => ok(
            CHECK,
            "this process may pass files through (views on by default)",
        ),
        false => not_ok(
            CHECK,
            Status::Warn,
            "no CAP_SYS_ADMIN: this user's mounts have no views",
            "mount as root (or a service with CAP_SYS_ADMIN) for views; otherwise read with \
             the Python package's loader (docs/python.md)",
        ),
    }
}

fn io_uring() -> Finding {
    const CHECK: &str = "io_uring";
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok());
    match io_uring::IoUring::new(2) {
        Ok(_) => ok(
            CHECK,
            format!(
                "available (kernel.io_uring_disabled = {})",
                disabled.map_or("absent".into(), |d| d.to_string())
            ),
        ),
        Err(e) => {
            let (why, fix) = match disabled {
                Some(d) if d > 0 => (
                    format!("kernel.io_uring_disabled = {d}"),
                    "sysctl kernel.io_uring_disabled=0 (as root; 1 allows the group \
                     kernel.io_uring_group only)",
                ),
                _ => (
                    "a seccomp filter refuses it (containers' default profiles do)".to_owned(),
                    "run the container with a seccomp profile that allows io_uring_setup, \
                     io_uring_enter and io_uring_register",
                ),
            };
            not_ok(
                CHECK,
                Status::Warn,
                format!("refused ({e}): {why}; chunk reads go through pread, slower cold"),
                fix,
            )
        }
    }
}

fn memlock() -> Finding {
    const CHECK: &str = "RLIMIT_MEMLOCK";
    // Each reading thread's ring registers 4 bounce buffers of 1 MiB (io::backend), and a
    // mount reads on up to 8 worker threads.
    const NEED: u64 = 8 * (4 << 20);
    if session::is_root() {
        return ok(CHECK, "not binding: root may lock memory (CAP_IPC_LOCK)");
    }
    // SAFETY: getrlimit fills the zeroed struct we own.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return not_ok(CHECK, Status::Warn, "unknown", "none needed");
    }
    let shown = |n: libc::rlim_t| match n {
        libc::RLIM_INFINITY => "unlimited".to_owned(),
        n => super::human(n),
    };
    match limit.rlim_cur == libc::RLIM_INFINITY || limit.rlim_cur >= NEED {
        true => ok(
            CHECK,
            format!("{}: registered read buffers fit", shown(limit.rlim_cur)),
        ),
        false => not_ok(
            CHECK,
            Status::Warn,
            format!(
                "{}: io_uring's registered buffers (4 MiB a reading thread, up to 8 threads: \
                 32 MiB) do not all fit; the threads past it read unregistered",
                shown(limit.rlim_cur)
            ),
            "raise it (ulimit -l, LimitMEMLOCK= in a unit, memlock in /etc/security/limits.conf)",
        ),
    }
}

fn max_pages() -> Finding {
    const CHECK: &str = "max_pages_limit";
    match std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        Some(pages) if pages >= 256 => ok(
            CHECK,
            format!("{pages} pages: FUSE requests up to 1 MiB, as the mount asks"),
        ),
        Some(pages) => not_ok(
            CHECK,
            Status::Warn,
            format!("{pages} pages: FUSE requests smaller than the 1 MiB the mount asks"),
            "sysctl fs.fuse.max_pages_limit=256 (as root)",
        ),
        None => ok(
            CHECK,
            "not set by this kernel: requests up to 1 MiB (256 pages)",
        ),
    }
}

fn readahead(root: bool) -> Finding {
    const CHECK: &str = "readahead";
    match root {
        true => ok(CHECK, "a mount raises its readahead to 1 MiB"),
        false => not_ok(
            CHECK,
            Status::Warn,
            "a mount of a user other than root keeps the kernel's 128 KiB readahead (the \
             setting, /sys/class/bdi/*/read_ahead_kb, is root's): slower sequential reads",
            "as root, after mounting: echo 1024 > /sys/class/bdi/$(mountpoint -d MOUNTPOINT)/read_ahead_kb",
        ),
    }
}

/// The store's findings: format, free space, the views' filesystem.
fn store(cli: &Cli) -> Vec<Finding> {
    const CHECK: &str = "store";
    let root = match cli.store_root() {
        Ok(root) => root,
        Err(e) => {
            return vec![not_ok(
                CHECK,
                Status::Fail,
                e.to_string(),
                "pass --store DIR",
            )]
        }
    };
    // Where the store is, or the folder it would be made in: this user must write it.
    let existing = root.ancestors().find(|d| d.exists()).unwrap_or(&root);
    if !may(existing, libc::R_OK | libc::W_OK | libc::X_OK) {
        return vec![not_ok(
            CHECK,
            Status::Fail,
            format!(
                "{}: this user may not write {}",
                root.display(),
                existing.display()
            ),
            "use a store of your own (--store DIR, or TENSORFS_HOME), or ask its owner",
        )];
    }
    let empty = std::fs::read_dir(&root).is_ok_and(|mut d| d.next().is_none());
    if !root.exists() || empty {
        return vec![not_ok(
            CHECK,
            Status::Warn,
            format!(
                "{}: none yet, so a mount of it alone fails (one over an endpoint makes it)",
                root.display()
            ),
            "tensorfs import a model first (that makes the store)",
        )];
    }
    let store = match Store::open_existing(&root) {
        Ok(store) => store,
        Err(e) => {
            return vec![not_ok(
                CHECK,
                Status::Fail,
                e.to_string(),
                format!("pass --store DIR of a {STORE_FORMAT} store, or set TENSORFS_HOME"),
            )]
        }
    };
    let mut out = vec![ok(CHECK, format!("{}: {STORE_FORMAT}", root.display()))];
    out.push(match Capacity::of(store.root()) {
        Ok(disk) => {
            let reserve = crate::store::retention::reserve(&disk);
            let free = disk.available_bytes();
            let finding = format!(
                "{} free, reserve {} (2 % of the disk, 1–10 GiB)",
                super::human(free),
                super::human(reserve)
            );
            match free > reserve {
                true => ok("free space", finding),
                false => not_ok(
                    "free space",
                    Status::Warn,
                    format!("{finding}: imports and fetches are refused"),
                    "tensorfs rm unused models, then tensorfs gc; or free the disk",
                ),
            }
        }
        Err(e) => not_ok("free space", Status::Warn, format!("statvfs: {e}"), "none"),
    });
    out.push(views_filesystem(&store.root().join("views")));
    out
}

/// An overlayfs (a container's root) under the views refuses passthrough (`ELOOP`).
fn views_filesystem(views: &Path) -> Finding {
    const CHECK: &str = "views' filesystem";
    const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
    let dir = views.ancestors().find(|d| d.exists()).unwrap_or(views);
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return not_ok(CHECK, Status::Warn, "a NUL in the path", "none");
    };
    // SAFETY: statfs fills the zeroed struct we own; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return not_ok(
            CHECK,
            Status::Warn,
            format!(
                "statfs {}: {}",
                dir.display(),
                std::io::Error::last_os_error()
            ),
            "none",
        );
    }
    #[allow(clippy::unnecessary_cast)]
    match st.f_type as i64 == OVERLAYFS_SUPER_MAGIC {
        true => not_ok(
            CHECK,
            Status::Warn,
            format!(
                "{} is on overlayfs: the kernel refuses passthrough to it, so mounts have no views",
                dir.display()
            ),
            "put the store, or the views (--view-dir), on a volume (docker run -v)",
        ),
        false => ok(CHECK, format!("{} is no overlayfs", dir.display())),
    }
}

/// Mounts of ours whose daemon is gone (`ENOTCONN`).
fn stale_mounts() -> Finding {
    const CHECK: &str = "stale mounts";
    // Asked as `tensorfs status` asks, within its time: a hung daemon does not hang this.
    let stale: Vec<String> = session::mounts()
        .into_iter()
        .filter(|m| {
            super::status::query(m)["problem"]
                .as_str()
                .is_some_and(|p| p.starts_with("stale"))
        })
        .map(|m| m.display().to_string())
        .collect();
    match stale.first() {
        None => ok(CHECK, "none"),
        Some(first) => not_ok(
            CHECK,
            Status::Warn,
            format!("{}: their daemon is gone", stale.join(", ")),
            format!("tensorfs unmount --lazy {first} (each of them)"),
        ),
    }
}

/// Mounts an empty store on a folder of its own, reads the mount's status (the FUSE protocol
/// the kernel speaks), and unmounts: what the findings above predict, done.
fn trial_mount() -> Finding {
    const CHECK: &str = "trial mount";
    let dir = std::env::temp_dir().join(format!("tensorfs-doctor-{}", std::process::id()));
    let result = try_mount(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok((protocol, Some(false))) => not_ok(
            CHECK,
            Status::Warn,
            format!(
                "an empty store mounted, answered and unmounted (FUSE protocol {protocol}), but \
                 the kernel cannot send again what a dying daemon left unanswered: readers of a \
                 mount whose daemon is restarted may wait until it is unmounted"
            ),
            "a kernel of Linux 6.9 or newer (FUSE_NOTIFY_RESEND)",
        ),
        Ok((protocol, _)) => ok(
            CHECK,
            format!(
                "an empty store mounted, answered and unmounted (FUSE protocol {protocol}; a \
                 restarted daemon is sent what the one before left unanswered)"
            ),
        ),
        Err(why) => not_ok(
            CHECK,
            Status::Fail,
            format!("mounting an empty store in {} failed: {why}", dir.display()),
            "the error says what; tensorfs mount reports the same",
        ),
    }
}

/// The FUSE protocol version a trial mount under `dir` reported, and whether the kernel
/// resends requests to a daemon that takes over.
fn try_mount(dir: &Path) -> Result<(String, Option<bool>), String> {
    use session::MountConfig;
    let (store, mountpoint) = (dir.join("store"), dir.join("mnt"));
    std::fs::create_dir_all(&mountpoint).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Store::open(&store).map_err(|e| e.to_string())?;
    let handle =
        session::spawn(MountConfig::new(&store, &mountpoint)).map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    while !session::is_mounted(handle.mountpoint())
        && started.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let status = super::status::query(handle.mountpoint());
    let unmounted = handle.unmount().map_err(|e| format!("unmounting: {e}"));
    let protocol = match (status["fuse_protocol"].as_str(), status["problem"].as_str()) {
        (Some(protocol), _) => protocol.to_owned(),
        (None, Some(problem)) => return Err(format!("the mount does not answer: {problem}")),
        (None, None) => "unknown".to_owned(),
    };
    unmounted.map(|()| (protocol, status["resend"].as_bool()))
}
