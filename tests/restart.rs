//! Restarts that keep the mount: the daemon serving a background mount is killed (or
//! restarted with SIGHUP) under readers, and a new one takes over the same connection.

mod common;

use common::*;
use std::fs;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A store at `<dir>/store` holding `local/big`: one 24 MiB U8 tensor (many chunks, so reads
/// take many requests). Returns (the file's bytes, store).
fn imported(dir: &Path) -> (Vec<u8>, PathBuf) {
    let data: Vec<u8> = (0..24u64 << 20)
        .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
        .collect();
    let file = safetensors_file(
        &[T("w", safetensors::Dtype::U8, vec![data.len()], data)],
        None,
    );
    let src = dir.join("src");
    write_tree(&src, &[("model.safetensors", file.clone())]);
    let store = dir.join("store");
    ok(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/big"],
    );
    (file, store)
}

/// [`imported`], mounted in the background at `<dir>/mnt` with `extra` flags. Returns (the
/// file's bytes, store, mount point).
fn mounted(dir: &Path, extra: &[&str]) -> (Vec<u8>, PathBuf, PathBuf) {
    let (file, store) = imported(dir);
    let mnt = dir.join("mnt");
    fs::create_dir(&mnt).unwrap();
    mount_background(&store, &mnt, &dir.join("mount.log"), extra);
    (file, store, mnt)
}

fn status(store: &Path, mnt: &Path) -> serde_json::Value {
    let said = ok(store, &["status", mnt.to_str().unwrap(), "--json"]);
    serde_json::from_str::<serde_json::Value>(&said).unwrap()[0].clone()
}

fn pid(value: &serde_json::Value) -> i32 {
    value.as_i64().unwrap_or_else(|| panic!("no pid: {value}")) as i32
}

fn kill(pid: i32, signal: i32) {
    // SAFETY: a signal to a process id; no memory is passed.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill {pid}");
}

/// Waits until a daemon other than `old` serves the mount (status answers from it).
fn new_server(store: &Path, mnt: &Path, old: i32) -> serde_json::Value {
    for _ in 0..200 {
        let s = status(store, mnt);
        if pid(&s["server_pid"]) != old {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no daemon took over from {old}");
}

/// The store's fence, taken as a collection takes it (exclusively) until dropped.
fn collections_fenced_off(store: &Path) -> fs::File {
    let fence = fs::File::options()
        .read(true)
        .write(true)
        .open(store.join("holds/gc.lock"))
        .unwrap();
    fence.lock().unwrap();
    fence
}

/// Whether FUSE passthrough is impossible here (it needs `CAP_SYS_ADMIN`): test `name` then
/// says it is skipped, and fails under CI, which runs as root.
fn no_passthrough(name: &str) -> bool {
    if tensorfs::fuse::session::may_pass_through() {
        return false;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI runs as root, where passthrough is possible"
    );
    eprintln!("skipped {name}: needs CAP_SYS_ADMIN");
    true
}

/// [`mounted`] with views on, its file read once so it has a view, which later opens pass
/// through to: (the file's bytes, store, mount point, the mounted file, its unmounting).
fn mounted_with_a_view(dir: &Path) -> (Vec<u8>, PathBuf, PathBuf, PathBuf, Unmount) {
    let (want, store, mnt) = mounted(dir, &[]);
    let cleanup = Unmount(mnt.clone());
    let path = mnt.join("local/big/latest/u8/model.safetensors");
    viewed(&store, &mnt, &path, &want);
    (want, store, mnt, path, cleanup)
}

/// Reads the mounted file `path` (whose bytes are `want`) once, so it gets a view, and waits
/// for the view: later opens pass through to it.
fn viewed(store: &Path, mnt: &Path, path: &Path, want: &[u8]) {
    assert!(fs::read(path).unwrap() == want);
    for _ in 0..200 {
        if status(store, mnt)["views"]["count"] == 1 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no view of {}", path.display());
}

/// Drops the file's cached pages, so the next reads ask the daemon.
fn uncache(path: &Path) {
    let file = fs::File::open(path).unwrap();
    // SAFETY: fadvise on an open descriptor; no memory is passed.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// A request the dead daemon had read and not answered is sent again and answered by the
/// next: an open that waits on the store's fence (held here, as a collection holds it) while
/// the daemon is killed completes once the fence is let go, and reads the right bytes.
#[test]
fn a_request_the_killed_daemon_left_unanswered_is_answered_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let (want, store, mnt) = mounted(dir.path(), &["--view-cache", "0"]);
    let _cleanup = Unmount(mnt.clone());
    let first = status(&store, &mnt);
    let supervisor = pid(&first["pid"]);
    let server = pid(&first["server_pid"]);
    assert_ne!(supervisor, server, "the supervisor does not serve: {first}");
    let path = mnt.join("local/big/latest/u8/model.safetensors");
    assert!(path.exists());

    let fence = collections_fenced_off(&store);
    let opened = Arc::new(AtomicBool::new(false));
    let (done, reader) = std::sync::mpsc::channel();
    {
        let (path, opened) = (path.clone(), opened.clone());
        std::thread::spawn(move || {
            let mut file = fs::File::open(&path).unwrap();
            opened.store(true, Ordering::SeqCst);
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).unwrap();
            let _ = done.send(bytes);
        });
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !opened.load(Ordering::SeqCst),
        "the open waits on the fence, in the daemon"
    );
    kill(server, libc::SIGKILL);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!opened.load(Ordering::SeqCst), "it still waits: no error");
    fence.unlock().unwrap();
    let got = reader
        .recv_timeout(Duration::from_secs(30))
        .expect("the open was answered, without an error");
    assert!(got == want, "the reader got the file's bytes");

    let now = new_server(&store, &mnt, server);
    assert_eq!(pid(&now["pid"]), supervisor, "{now}");
    assert_eq!(now["restarts"], 1, "{now}");
    assert!(
        now["resent"].as_u64().unwrap() >= 1,
        "the open was resent: {now}"
    );
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
    assert!(
        tensorfs::fuse::session::wait_for_exit(supervisor as u32, Duration::from_secs(10)),
        "the supervisor ends with the mount"
    );
}

/// An mmap reader and a sequential reader of a mounted file both finish with the file's
/// bytes while the daemon is killed twice and restarted once by SIGHUP to the supervisor
/// (what an upgrade does).
#[test]
fn readers_finish_with_the_right_bytes_while_the_daemon_is_killed_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let (want, store, mnt) = mounted(dir.path(), &["--view-cache", "0"]);
    let _cleanup = Unmount(mnt.clone());
    let path = mnt.join("local/big/latest/u8/model.safetensors");
    uncache(&path);
    let step = 256 << 10;
    let mapped = {
        let path = path.clone();
        std::thread::spawn(move || {
            let file = fs::File::open(&path).unwrap();
            // SAFETY: the mounted file never changes while mapped.
            let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
            let mut bytes = Vec::with_capacity(map.len());
            for part in map.chunks(step) {
                bytes.extend_from_slice(part);
                std::thread::sleep(Duration::from_millis(4));
            }
            bytes
        })
    };
    let sequential = {
        let path = path.clone();
        std::thread::spawn(move || {
            let mut file = fs::File::open(&path).unwrap();
            let mut bytes = Vec::new();
            let mut buf = vec![0; step];
            loop {
                let n = file.read(&mut buf).unwrap();
                if n == 0 {
                    return bytes;
                }
                bytes.extend_from_slice(&buf[..n]);
                std::thread::sleep(Duration::from_millis(4));
            }
        })
    };
    let supervisor = pid(&status(&store, &mnt)["pid"]);
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(120));
        let server = pid(&status(&store, &mnt)["server_pid"]);
        match round {
            1 => kill(supervisor, libc::SIGHUP),
            _ => kill(server, libc::SIGKILL),
        }
        new_server(&store, &mnt, server);
    }
    let mapped = mapped
        .join()
        .expect("the mmap reader saw no SIGBUS or error");
    let sequential = sequential
        .join()
        .expect("the sequential reader saw no error");
    assert!(mapped == want, "the mmap reader got the file's bytes");
    assert!(
        sequential == want,
        "the sequential reader got the file's bytes"
    );
    let s = status(&store, &mnt);
    assert_eq!(s["restarts"], 3, "{s}");
    assert_eq!(pid(&s["pid"]), supervisor);
    // What was looked up before the restarts is served after them.
    assert_eq!(fs::read(&path).unwrap(), want);
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
}

/// With views (root), a file open through passthrough when the daemon dies opens again after:
/// the new daemon knows the inode's mode and backing file from the journal, where guessing
/// would make the kernel refuse the open (ETXTBSY or EBUSY).
#[test]
fn a_file_open_through_passthrough_opens_again_after_a_restart() {
    if no_passthrough("a_file_open_through_passthrough_opens_again_after_a_restart") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (want, store, mnt, path, _cleanup) = mounted_with_a_view(dir.path());
    let mut held = fs::File::open(&path).unwrap();
    let served = status(&store, &mnt)["bytes_served"].clone();
    uncache(&path);
    let mut bytes = Vec::new();
    held.read_to_end(&mut bytes).unwrap();
    assert!(bytes == want);
    assert_eq!(
        status(&store, &mnt)["bytes_served"],
        served,
        "read through passthrough, not the daemon"
    );
    let server = pid(&status(&store, &mnt)["server_pid"]);
    kill(server, libc::SIGKILL);
    new_server(&store, &mnt, server);
    for _ in 0..2 {
        assert!(
            fs::read(&path).unwrap() == want,
            "opened again after the restart"
        );
    }
    drop(held);
    assert!(
        fs::read(&path).unwrap() == want,
        "and after the last old handle closed"
    );
    let s = status(&store, &mnt);
    assert_eq!(s["read_errors"], 0, "{s}");
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
}

/// A daemon that keeps dying is not started for ever: past the supervisor's limit the mount
/// is detached (nothing stale is left) and the supervisor ends, saying why in the log.
#[test]
fn a_daemon_that_keeps_dying_ends_the_mount() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mnt) = mounted(dir.path(), &["--view-cache", "0"]);
    let _cleanup = Unmount(mnt.clone());
    let supervisor = pid(&status(&store, &mnt)["pid"]);
    let limit = tensorfs::fuse::supervise::MAX_RESTARTS;
    for _ in 0..limit {
        let server = pid(&status(&store, &mnt)["server_pid"]);
        kill(server, libc::SIGKILL);
        new_server(&store, &mnt, server);
    }
    kill(pid(&status(&store, &mnt)["server_pid"]), libc::SIGKILL);
    assert!(
        tensorfs::fuse::session::wait_for_exit(supervisor as u32, Duration::from_secs(10)),
        "the supervisor gave up"
    );
    assert!(!tensorfs::fuse::session::is_mounted(&mnt), "no stale mount");
    let log = fs::read_to_string(dir.path().join("mount.log")).unwrap();
    assert!(log.contains(&format!("died {} times", limit + 1)), "{log}");
}

/// The commit of a file open when the daemon dies stays held against collections: the next
/// daemon opens the journal's handles again before it serves, and the supervisor fences
/// collections off until it does. A model removed while its file is open keeps its bytes
/// through a restart and a collection, and its handle reads on.
#[test]
fn an_open_file_of_a_removed_model_keeps_its_bytes_through_a_restart_and_a_collection() {
    let dir = tempfile::tempdir().unwrap();
    let (want, store, mnt) = mounted(dir.path(), &["--view-cache", "0"]);
    let _cleanup = Unmount(mnt.clone());
    let path = mnt.join("local/big/latest/u8/model.safetensors");
    let mut held = fs::File::open(&path).unwrap();
    let mut head = [0u8; 4096];
    held.read_exact(&mut head).unwrap();
    ok(&store, &["rm", "local/big"]);
    let server = pid(&status(&store, &mnt)["server_pid"]);
    kill(server, libc::SIGKILL);
    let now = new_server(&store, &mnt, server);
    assert_eq!(now["open_files"], 1, "the handle is open again: {now}");
    assert_eq!(now["holds"]["commits"], 1, "and its commit held: {now}");
    let said = ok(&store, &["gc", "--grace", "0"]);
    assert!(said.contains("removed 0 objects"), "{said}");
    uncache(&path);
    let mut bytes = Vec::new();
    std::io::Seek::rewind(&mut held).unwrap();
    held.read_to_end(&mut bytes)
        .expect("the held handle reads on");
    assert!(bytes == want, "the held handle reads the file's bytes");
    drop(held);
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
}

/// SIGTERM to the daemon (not its supervisor) replaces it, as a crash does: the mount stays.
#[test]
fn sigterm_to_the_daemon_replaces_it_and_the_mount_stays() {
    let dir = tempfile::tempdir().unwrap();
    let (want, store, mnt) = mounted(dir.path(), &["--view-cache", "0"]);
    let _cleanup = Unmount(mnt.clone());
    let path = mnt.join("local/big/latest/u8/model.safetensors");
    let held = fs::File::open(&path).unwrap();
    let server = pid(&status(&store, &mnt)["server_pid"]);
    kill(server, libc::SIGTERM);
    let now = new_server(&store, &mnt, server);
    assert_eq!(now["restarts"], 1, "{now}");
    uncache(&path);
    assert!(fs::read(&path).unwrap() == want);
    drop(held);
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
}

/// A reload (SIGHUP) onto a binary that does not start keeps the mount: the supervisor starts
/// the daemon from the binary it runs itself.
#[test]
fn a_reload_onto_a_binary_that_does_not_start_falls_back_to_the_running_one() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (want, store) = imported(dir.path());
    let bin = dir.path().join("bin/tensorfs");
    fs::create_dir_all(bin.parent().unwrap()).unwrap();
    fs::copy(env!("CARGO_BIN_EXE_tensorfs"), &bin).unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let _cleanup = Unmount(mnt.clone());
    ok_command(
        std::process::Command::new(&bin)
            .arg("--store")
            .arg(&store)
            .args(["mount", mnt.to_str().unwrap(), "--view-cache", "0"])
            .arg("--log-file")
            .arg(dir.path().join("mount.log")),
    );
    // An upgrade that does not start.
    fs::remove_file(&bin).unwrap();
    fs::write(&bin, "#!/bin/sh\nexit 1\n").unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    let first = status(&store, &mnt);
    kill(pid(&first["pid"]), libc::SIGHUP);
    let now = new_server(&store, &mnt, pid(&first["server_pid"]));
    assert_eq!(now["restarts"], 1, "{now}");
    let path = mnt.join("local/big/latest/u8/model.safetensors");
    assert!(fs::read(&path).unwrap() == want);
    let log = fs::read_to_string(dir.path().join("mount.log")).unwrap();
    assert!(
        log.contains("from the binary this supervisor runs instead"),
        "{log}"
    );
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
}

/// A mount detached lazily while a file is open keeps serving it through a restart: the
/// connection, not the mount table, says whether the mount is still there.
#[test]
fn a_lazily_detached_mount_serves_its_open_file_through_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (want, store, mnt) = mounted(dir.path(), &["--view-cache", "0"]);
    let _cleanup = Unmount(mnt.clone());
    let path = mnt.join("local/big/latest/u8/model.safetensors");
    let mut held = fs::File::open(&path).unwrap();
    let s = status(&store, &mnt);
    ok(&store, &["unmount", "--lazy", mnt.to_str().unwrap()]);
    assert!(!tensorfs::fuse::session::is_mounted(&mnt));
    kill(pid(&s["server_pid"]), libc::SIGKILL);
    // No status to ask now: the held file is the only way in.
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: fadvise on an open descriptor; no memory is passed.
    unsafe { libc::posix_fadvise(held.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut bytes = Vec::new();
    held.read_to_end(&mut bytes)
        .expect("the open file reads through the new daemon");
    assert!(bytes == want);
    let supervisor = pid(&s["pid"]);
    drop(held);
    assert!(
        tensorfs::fuse::session::wait_for_exit(supervisor as u32, Duration::from_secs(10)),
        "the supervisor ends once the last file closes"
    );
}

/// A hung daemon (stopped here) is named by `status`, which says `kill -9` of it replaces it;
/// done, the mount answers again.
#[test]
fn status_names_a_hung_daemon_and_killing_it_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let (want, store, mnt) = mounted(dir.path(), &["--view-cache", "0"]);
    let _cleanup = Unmount(mnt.clone());
    let server = pid(&status(&store, &mnt)["server_pid"]);
    let found = tensorfs::fuse::takeover::daemons_of(&mnt.canonicalize().unwrap());
    let pids: Vec<u32> = found.iter().map(|(pid, _)| *pid).collect();
    assert_eq!(pids, [server as u32]);
    kill(server, libc::SIGSTOP);
    let out = run(&store, &["status", mnt.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("did not answer"), "{said}");
    assert!(said.contains(&format!("kill -9 {server}")), "{said}");
    kill(server, libc::SIGKILL);
    new_server(&store, &mnt, server);
    let path = mnt.join("local/big/latest/u8/model.safetensors");
    assert!(fs::read(&path).unwrap() == want);
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
}

/// `status` ends, and closes its output, even when its daemon hangs after reading the
/// question: stopped while the question is on its way (one of the daemon's threads may read it
/// before the stop takes), the request waits in the daemon's hands, through SIGKILL of the
/// asker. Before, such a `status` could not end, nor could a reader of its output, until the
/// daemon went on or died. Each round stops the daemon a little later after asking (0 to
/// 4.5 ms in steps of 30 µs, where the question reaches it here), and lets it go on once
/// `status` has ended.
#[test]
fn status_ends_when_the_daemon_hangs_after_reading_its_question() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mnt) = mounted(dir.path(), &["--view-cache", "0"]);
    let _cleanup = Unmount(mnt.clone());
    let server = pid(&status(&store, &mnt)["server_pid"]);
    for round in 0..150u64 {
        let (tx, rx) = std::sync::mpsc::channel();
        let (store2, mnt2) = (store.clone(), mnt.clone());
        std::thread::spawn(move || {
            let _ = tx.send(run(
                &store2,
                &["status", mnt2.to_str().unwrap(), "--wait", "0.1"],
            ));
        });
        // Where the question reaches the daemon: a few milliseconds after the start.
        std::thread::sleep(Duration::from_micros(30 * round));
        kill(server, libc::SIGSTOP);
        // Bounded, so that a status that cannot end fails here instead of hanging the suite.
        let out = rx.recv_timeout(Duration::from_secs(30));
        kill(server, libc::SIGCONT);
        let out = out.unwrap_or_else(|_| panic!("round {round}: status did not end"));
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("/mnt"), "round {round}: {said}");
    }
    assert_eq!(pid(&status(&store, &mnt)["server_pid"]), server);
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
}

/// `unmount` of a mount whose daemon is hung (stopped here) unmounts: it finds the supervisor
/// to wait for without asking the mount, where a question left waiting kept the mount busy.
#[test]
fn unmount_does_not_wait_on_a_hung_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mnt) = mounted(dir.path(), &["--view-cache", "0"]);
    let _cleanup = Unmount(mnt.clone());
    let s = status(&store, &mnt);
    let server = pid(&s["server_pid"]);
    kill(server, libc::SIGSTOP);
    let out = run(&store, &["unmount", mnt.to_str().unwrap()]);
    kill(server, libc::SIGCONT);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!tensorfs::fuse::session::is_mounted(&mnt));
    assert!(
        tensorfs::fuse::session::wait_for_exit(pid(&s["pid"]) as u32, Duration::from_secs(10)),
        "the supervisor ends"
    );
}

/// SIGTERM while a new daemon is starting (a slow one here) unmounts at once, not once the
/// start is done.
#[test]
fn a_stop_during_a_restart_is_not_kept_waiting_for_the_start() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = imported(dir.path());
    let bin = dir.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    fs::copy(env!("CARGO_BIN_EXE_tensorfs"), bin.join("tensorfs.real")).unwrap();
    fs::copy(env!("CARGO_BIN_EXE_tensorfs"), bin.join("tensorfs")).unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let _cleanup = Unmount(mnt.clone());
    ok_command(
        std::process::Command::new(bin.join("tensorfs"))
            .arg("--store")
            .arg(&store)
            .args(["mount", mnt.to_str().unwrap(), "--view-cache", "0"])
            .arg("--log-file")
            .arg(dir.path().join("mount.log")),
    );
    // An upgrade whose daemon takes 20 s to start.
    let slow = bin.join("tensorfs");
    fs::remove_file(&slow).unwrap();
    let script = format!(
        "#!/bin/sh\nsleep 20\nexec {} \"$@\"\n",
        bin.join("tensorfs.real").display()
    );
    fs::write(&slow, script).unwrap();
    fs::set_permissions(&slow, fs::Permissions::from_mode(0o755)).unwrap();
    let supervisor = pid(&status(&store, &mnt)["pid"]);
    kill(supervisor, libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    let asked = std::time::Instant::now();
    kill(supervisor, libc::SIGTERM);
    assert!(
        tensorfs::fuse::session::wait_for_exit(supervisor as u32, Duration::from_secs(10)),
        "the supervisor ends"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    assert!(!tensorfs::fuse::session::is_mounted(&mnt));
}

/// A collection that began before the daemon died finds its holds alive: the supervisor keeps
/// a descriptor of each hold (and so its lock) until the next daemon has taken its own. Here
/// the test is the collection: it holds the fence while the daemon dies, and every hold file
/// is still locked; after the restart, a real collection frees nothing the open file needs.
#[test]
fn holds_outlive_the_daemon_that_took_them() {
    let dir = tempfile::tempdir().unwrap();
    let (want, store, mnt) = mounted(dir.path(), &["--view-cache", "0"]);
    let _cleanup = Unmount(mnt.clone());
    let path = mnt.join("local/big/latest/u8/model.safetensors");
    let mut held = fs::File::open(&path).unwrap();
    ok(&store, &["rm", "local/big"]);
    let server = pid(&status(&store, &mnt)["server_pid"]);
    let fence = collections_fenced_off(&store);
    kill(server, libc::SIGKILL);
    std::thread::sleep(Duration::from_millis(300));
    let mut holds = 0;
    for entry in fs::read_dir(store.join("holds")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() == "gc.lock" {
            continue;
        }
        let file = fs::File::open(&path).unwrap();
        assert!(
            matches!(file.try_lock(), Err(fs::TryLockError::WouldBlock)),
            "{} is locked though its daemon died",
            path.display()
        );
        holds += 1;
    }
    assert!(holds >= 1, "the open file's commit is held");
    fence.unlock().unwrap();
    new_server(&store, &mnt, server);
    let said = ok(&store, &["gc", "--grace", "0"]);
    assert!(said.contains("removed 0 objects"), "{said}");
    uncache(&path);
    let mut bytes = Vec::new();
    held.read_to_end(&mut bytes)
        .expect("the held handle reads on");
    assert!(bytes == want);
    drop(held);
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
}

/// An `OPEN` the daemon journaled but died before answering is sent again, and answered with
/// the handle the next daemon opened again for it, not a new one: files opened and closed
/// through many restarts leave no handle open (and no commit held) once all are closed.
#[test]
fn opens_and_closes_through_many_restarts_leave_no_handle_open() {
    opens_and_closes_through_restarts(false);
}

/// The same through passthrough (root): a resent `OPEN` of a file passed through to its view
/// is answered with its handle and the backing file the inode has, and a resent `RELEASE`
/// the daemon before had journaled is not counted out twice (which unregistered the backing
/// file of handles still open, so the next open was refused: EIO).
#[test]
fn passthrough_opens_and_closes_through_many_restarts_leave_no_handle_open() {
    if no_passthrough("passthrough_opens_and_closes_through_many_restarts_leave_no_handle_open") {
        return;
    }
    opens_and_closes_through_restarts(true);
}

fn opens_and_closes_through_restarts(views: bool) {
    let dir = tempfile::tempdir().unwrap();
    let extra: &[&str] = if views { &[] } else { &["--view-cache", "0"] };
    let (want, store, mnt) = mounted(dir.path(), extra);
    let _cleanup = Unmount(mnt.clone());
    let path = mnt.join("local/big/latest/u8/model.safetensors");
    if views {
        viewed(&store, &mnt, &path, &want);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let openers: Vec<_> = (0..4)
        .map(|_| {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut opens = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut file = fs::File::open(&path).expect("opens through restarts");
                    let mut head = [0u8; 8];
                    file.read_exact(&mut head).expect("reads through restarts");
                    opens += 1;
                }
                opens
            })
        })
        .collect();
    let supervisor = pid(&status(&store, &mnt)["pid"]);
    for _ in 0..40 {
        let server = pid(&status(&store, &mnt)["server_pid"]);
        kill(supervisor, libc::SIGHUP);
        new_server(&store, &mnt, server);
    }
    stop.store(true, Ordering::Relaxed);
    let opens: u64 = openers.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(opens > 40, "{opens} opens");
    // Releases are sent after the close returns: give the last ones a moment.
    let mut now = status(&store, &mnt);
    for _ in 0..50 {
        if now["open_files"] == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        now = status(&store, &mnt);
    }
    assert_eq!(now["open_files"], 0, "{now}");
    assert_eq!(now["holds"]["commits"], 0, "{now}");
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
}

/// Opens and closes of a file passed through to its view, from several threads, never fail
/// (no restart here): the inode's mode and backing file follow its open handles exactly, or
/// the kernel refuses an open (EIO).
#[test]
fn passthrough_opens_and_closes_in_parallel_never_fail() {
    if no_passthrough("passthrough_opens_and_closes_in_parallel_never_fail") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mnt, path, _cleanup) = mounted_with_a_view(dir.path());
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut failed = Vec::new();
                while std::time::Instant::now() < until {
                    if let Err(e) =
                        fs::File::open(&path).and_then(|mut f| f.read_exact(&mut [0; 8]))
                    {
                        failed.push(e.to_string());
                    }
                }
                failed
            })
        })
        .collect();
    let failed: Vec<String> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert!(
        failed.is_empty(),
        "{} opens failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
}
