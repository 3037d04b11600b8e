//! `tensorfs status [MOUNTPOINT] [--json]`: the running mounts, as each daemon reports itself
//! in the `user.tensorfs.status` attribute of its mount's root ([`crate::fs::status`]).
//!
//! Mounts are found in `/proc/self/mountinfo` (type `fuse.tensorfs`, or `fuse` with source
//! `tensorfs`). A mount whose daemon is
//! gone answers `ENOTCONN` (stale), one mounted by another user without `allow_other` refuses
//! (`EACCES`), and a daemon that does not answer within [`ANSWER_WAIT`] is reported as such;
//! none of them stops the others from being listed.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use serde_json::{json, Value};

use super::{count, human};
use crate::fs::status::STATUS;
use crate::fuse::session;

/// How long a daemon may take to answer.
pub const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// Arguments of `status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// One mount point (default: every TensorFS mount).
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: Option<PathBuf>,
    /// Print each mount's status as JSON (an array of objects).
    #[arg(long)]
    pub json: bool,
    /// How long to wait for each daemon's answer, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = ANSWER_WAIT.as_secs_f64(),
          value_parser = parse_wait)]
    pub wait: f64,
}

fn parse_wait(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 3600.0 => Ok(s),
        _ => Err(format!("{text:?} is no number of seconds in (0, 3600]")),
    }
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mounts = match &args.mountpoint {
        Some(path) => {
            let canonical = session::resolve_mountpoint(path);
            if !session::is_mounted(&canonical) {
                bail!("{} is not a TensorFS mount", path.display());
            }
            vec![canonical]
        }
        None => session::mounts(),
    };
    let wait = Duration::from_secs_f64(args.wait);
    let statuses: Vec<Value> = mounts.iter().map(|m| query_within(m, wait)).collect();
    let all_answered = statuses.iter().all(|s| s.get("problem").is_none());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&statuses)?);
    } else if statuses.is_empty() {
        println!("no TensorFS mounts (`tensorfs mount MOUNTPOINT` makes one)");
    } else {
        for status in &statuses {
            print!("{}", describe(status));
        }
    }
    Ok(match all_answered {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    })
}

/// The status of the mount at `mountpoint`, or `{"mountpoint", "problem", "fix"}`, its daemon
/// given [`ANSWER_WAIT`] to answer.
pub(super) fn query(mountpoint: &Path) -> Value {
    query_within(mountpoint, ANSWER_WAIT)
}

/// [`query`], its daemon given `wait` to answer.
fn query_within(mountpoint: &Path, wait: Duration) -> Value {
    let problem = |problem: String, fix: &str| json!({"mountpoint": mountpoint, "problem": problem, "fix": fix});
    let answer = match getxattr_within(mountpoint, STATUS, wait) {
        Ok(answer) => answer,
        Err(e) => return problem(format!("asking its daemon: {e}"), "see the daemon's log"),
    };
    match answer {
        Some(Ok(bytes)) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(status) => status,
            Err(e) => problem(
                format!("its status is not JSON ({e})"),
                "a daemon of another version: unmount and mount again",
            ),
        },
        Some(Err(e)) if e.raw_os_error() == Some(libc::ENOTCONN) => problem(
            "stale: its daemon is gone".into(),
            &format!(
                "tensorfs unmount --lazy {} (then mount again)",
                mountpoint.display()
            ),
        ),
        Some(Err(e)) if e.raw_os_error() == Some(libc::EACCES) => problem(
            "another user's mount (without allow_other): its status is theirs to read".into(),
            "run `tensorfs status` as that user",
        ),
        Some(Err(e)) if e.raw_os_error() == Some(libc::ENODATA) => problem(
            "its daemon reports no status (an older version)".into(),
            "unmount and mount again with this version",
        ),
        Some(Err(e)) => problem(format!("reading its status: {e}"), "see the daemon's log"),
        None => {
            let fix = match crate::fuse::takeover::daemons_of(mountpoint).as_slice() {
                [(pid, _)] => format!(
                    "see the daemon's log; `kill -9 {pid}` replaces the daemon and keeps the \
                     mount (its supervisor starts another), or `tensorfs unmount --lazy`"
                ),
                _ => "see the daemon's log; `kill` its pid, then `tensorfs unmount --lazy`".into(),
            };
            problem(
                format!("its daemon did not answer within {} s", wait.as_secs_f64()),
                &fix,
            )
        }
    }
}

/// The pid of the process serving the mount at `mountpoint` when it serves that mount alone
/// and ends with it (the CLI's daemon, `mount --foreground`), from its status.
pub(super) fn daemon_pid(mountpoint: &Path) -> Option<u32> {
    let status = query(mountpoint);
    (status["daemon"] == true)
        .then(|| status["pid"].as_u64())
        .flatten()
        .and_then(|pid| u32::try_from(pid).ok())
}

/// The attribute `name` of `path` (at most 64 KiB, the kernel's `XATTR_SIZE_MAX`), read in a
/// child process: `None` when no answer came within `wait`. A daemon that read the question and hangs (stopped
/// between reading and answering) keeps a FUSE request waiting for its answer even through
/// SIGKILL, and a process with such a thread cannot end; so the question is asked by a child
/// whose standard streams are `/dev/null`, left behind on a timeout, and neither this process
/// nor whoever reads its output waits for it. The child ends once the daemon answers, or the
/// daemon that replaces it answers the request sent again.
///
/// # Errors
/// The pipe or the child cannot be made.
fn getxattr_within(
    path: &Path,
    name: &str,
    wait: Duration,
) -> std::io::Result<Option<std::io::Result<Vec<u8>>>> {
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    const MAX: usize = 64 << 10;
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let c_name = CString::new(name)?;
    let null = c"/dev/null";
    // Everything the child touches is made before it is forked: it only makes system calls.
    let mut buf = vec![0u8; MAX];
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 made both descriptors, owned from here on.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child makes system calls only (open, dup2, getxattr, write, _exit) on memory
    // made before the fork, so no lock another thread held is taken in it.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if child == 0 {
        // SAFETY: as above; the child never returns from this block.
        unsafe {
            let devnull = libc::open(null.as_ptr(), libc::O_RDWR);
            for fd in 0..3 {
                libc::dup2(devnull, fd);
            }
            let n = libc::getxattr(
                c_path.as_ptr(),
                c_name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            );
            let code: i64 = if n < 0 {
                -i64::from(*libc::__errno_location())
            } else {
                n as i64
            };
            let head = code.to_le_bytes();
            let body = if n > 0 { &buf[..n as usize] } else { &buf[..0] };
            for part in [&head[..], body] {
                let mut at = 0;
                while at < part.len() {
                    let w = libc::write(
                        write_end.as_raw_fd(),
                        part[at..].as_ptr().cast(),
                        part.len() - at,
                    );
                    if w <= 0 {
                        libc::_exit(1);
                    }
                    at += w as usize;
                }
            }
            libc::_exit(0);
        }
    }
    drop(write_end);
    let deadline = std::time::Instant::now() + wait;
    let mut file = std::fs::File::from(read_end);
    let mut got = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut poll = libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, ms) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if ready == 0 {
            // No answer in time: the child stays behind, reparented when this process ends.
            return Ok(None);
        }
        match file.read(&mut chunk)? {
            0 => break,
            n => got.extend_from_slice(&chunk[..n]),
        }
    }
    // SAFETY: waiting for our own child, which has written all and is ending.
    unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
    Ok(Some(child_answer(&got)))
}

/// What the question's child wrote (`got`): getxattr's result as a little-endian `i64` (the
/// value's length, or the negated errno), then the value.
///
/// # Errors
/// The errno the child's getxattr failed with; `got` too short for the result (the child
/// ended early).
fn child_answer(got: &[u8]) -> std::io::Result<Vec<u8>> {
    let Some((head, body)) = got.split_first_chunk::<8>() else {
        return Err(std::io::Error::other("the question's child ended early"));
    };
    match i64::from_le_bytes(*head) {
        code if code < 0 => Err(std::io::Error::from_raw_os_error(
            i32::try_from(-code).unwrap_or(libc::EIO),
        )),
        _ => Ok(body.to_vec()),
    }
}

/// A mount's status as lines for a terminal.
fn describe(s: &Value) -> String {
    let u = |v: &Value| v.as_u64().unwrap_or(0);
    let text = |v: &Value| v.as_str().unwrap_or("?").to_owned();
    let mut out = format!("{}\n", text(&s["mountpoint"]));
    if let Some(problem) = s.get("problem") {
        out += &format!("  {}; fix: {}\n", text(problem), text(&s["fix"]));
        return out;
    }
    let from = match s["endpoint"].as_str() {
        Some(endpoint) => format!(" with the models of {endpoint}"),
        None => String::new(),
    };
    out += &format!(
        "  daemon pid {}, store {}{from}, up {}\n",
        u(&s["pid"]),
        text(&s["store"]),
        humantime::format_duration(Duration::from_secs(u(&s["uptime_s"])))
    );
    if u(&s["restarts"]) > 0 {
        // The counters and the uptime are the serving process's, which started at the restart.
        out += &format!(
            "  its server restarted {}: pid {} serves now, counted below since it started\n",
            count(u(&s["restarts"]) as usize, "time"),
            u(&s["server_pid"]),
        );
    }
    out += &format!(
        "  {} answered; {} served by {} ({} failed); {} open of {} opened\n",
        count(u(&s["requests"]) as usize, "request"),
        human(u(&s["bytes_served"])),
        count(u(&s["reads"]) as usize, "read"),
        u(&s["read_errors"]),
        count(u(&s["open_files"]) as usize, "file"),
        u(&s["opens"]),
    );
    out += &format!(
        "  holds {} ({}) against collections; blobs proven {} ({} hashed, {} damaged)\n",
        count(u(&s["holds"]["commits"]) as usize, "commit"),
        count(u(&s["holds"]["objects"]) as usize, "object"),
        u(&s["blobs"]["proven"]),
        u(&s["blobs"]["hashed"]),
        u(&s["blobs"]["damaged"]),
    );
    if s["fetch"].is_object() {
        let f = &s["fetch"];
        out += &format!(
            "  fetched {} ({}; {} received), {} failed\n",
            count(u(&f["objects"]) as usize, "object"),
            human(u(&f["bytes"])),
            human(u(&f["received_bytes"])),
            count(u(&f["failures"]) as usize, "transfer"),
        );
    }
    if s["cache"].is_object() {
        let c = &s["cache"];
        let budget = match c["budget_bytes"].as_u64() {
            Some(b) => format!("of a {} budget", human(b)),
            None => "(bounded by the disk's reserve)".to_owned(),
        };
        out += &format!(
            "  cache {} {budget}, peak {}; evicted {} ({})\n",
            human(u(&c["used_bytes"])),
            human(u(&c["peak_bytes"])),
            count(u(&c["evicted"]) as usize, "object"),
            human(u(&c["evicted_bytes"])),
        );
    }
    if s["views"].is_object() {
        let v = &s["views"];
        out += &format!(
            "  views {} ({} of {})\n",
            u(&v["count"]),
            human(u(&v["bytes"])),
            human(u(&v["budget_bytes"])),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::child_answer;

    #[test]
    fn the_childs_answer_is_its_value_its_errno_or_an_early_end() {
        let mut value = 3i64.to_le_bytes().to_vec();
        value.extend_from_slice(b"abc");
        assert_eq!(child_answer(&value).unwrap(), b"abc");
        let failed = (-i64::from(libc::ENODATA)).to_le_bytes();
        let err = child_answer(&failed).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENODATA));
        let err = child_answer(&[1, 2, 3]).unwrap_err();
        assert!(err.to_string().contains("ended early"), "{err}");
        assert!(child_answer(&[]).is_err());
    }
}
