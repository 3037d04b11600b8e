//! Faults between a client and `tensorfs serve`, injected by a proxy: connections dropped
//! mid-chunk, `500` and `503`, slow and stalled answers, a wrong byte, a truncated body, a
//! redirect loop. Through the lazy mount (real FUSE mounts) and `tensorfs download`: nothing
//! wrong is ever admitted, passing faults are retried, and after the deadline a read fails with
//! EIO and one log line naming the object and the endpoint.

mod common;
mod fuse_support;
#[path = "common/http.rs"]
mod http;
#[path = "common/origin.rs"]
mod origin;
#[path = "common/proxy.rs"]
mod proxy;

use std::time::{Duration, Instant};

use fuse_support::{errno, lazy_mount, logs};
use origin::{store_is_clean, Origin, Size};
use proxy::{Fault, Rule};
use tensorfs::lazy::FAILURE_MEMORY;
use tensorfs::store::Store;

/// Passing faults on the object whose digest is `hex`, once each: six failures, then a
/// stalled answer that completes (7 requests). The tree's first answer is slow; the header's
/// first two fail.
fn passing_faults(origin: &Origin, hex: &str) {
    let half = origin.chunks["a.safetensors"][0].length / 2;
    for fault in [
        Fault::DropAfter(100_000),
        Fault::Status(503),
        Fault::Truncate(half),
        Fault::WrongByte(12_345),
        Fault::Status(502),
        Fault::DropAfter(0),
        Fault::Stall(50_000, Duration::from_millis(1500)),
    ] {
        origin.proxy.add(Rule::times(hex, fault, 1));
    }
    let tree = origin.commit.sha256.hex();
    let slow = Fault::Delay(Duration::from_millis(800));
    origin.proxy.add(Rule::times(&tree, slow, 1));
    let header = origin.header.sha256.hex();
    origin
        .proxy
        .add(Rule::times(&header, Fault::Status(503), 1));
    origin
        .proxy
        .add(Rule::times(&header, Fault::WrongByte(3), 1));
}

/// Reads `path` through a read-only mapping in a child process and compares it with
/// `expected`: an `mmap` reader whose read fails is killed by SIGBUS, which must not take the
/// test process (and the mount it serves) with it.
fn mmap_read_in_child(path: &std::path::Path, expected: &[u8]) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    let length = expected.len();
    // SAFETY: the child only closes descriptors, maps, compares and exits (no allocation, no
    // locks); the parent waits for it.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // Only the mapped file stays open: a copy of the parent's sockets would keep
            // connections it closes open.
            let fd = file.as_raw_fd() as libc::c_uint;
            libc::syscall(libc::SYS_close_range, 3, fd - 1, 0);
            libc::syscall(libc::SYS_close_range, fd + 1, libc::c_uint::MAX, 0);
            let map = libc::mmap(
                std::ptr::null_mut(),
                length,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            if map == libc::MAP_FAILED {
                libc::_exit(2);
            }
            let same = libc::memcmp(map, expected.as_ptr().cast(), length) == 0;
            libc::_exit(if same { 0 } else { 1 });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
            (true, 0) => Ok(()),
            (true, 1) => Err("the mapped bytes differ".into()),
            (true, code) => Err(format!("the child failed ({code})")),
            _ => Err(format!(
                "the mmap reader was killed by signal {}",
                libc::WTERMSIG(status)
            )),
        }
    }
}

/// The faults the proxy applied to paths containing `hex`.
fn applied(origin: &Origin, hex: &str) -> usize {
    origin
        .proxy
        .seen()
        .iter()
        .filter(|s| s.path.contains(hex) && s.fault.is_some())
        .count()
}

#[test]
fn passing_faults_delay_an_mmap_reader_and_admit_nothing_wrong() {
    let origin = Origin::start("passing", 11, Size::Small);
    let local = origin.local_store("local");
    let chunk = origin.chunks["a.safetensors"][0];
    let hex = chunk.sha256.hex();
    passing_faults(&origin, &hex);
    let m = lazy_mount(&local, &origin.proxy.url, Duration::from_secs(20));
    let path = origin.mounted(&m.root, "a.safetensors");
    mmap_read_in_child(&path, &origin.files["a.safetensors"]).unwrap();
    assert_eq!(applied(&origin, &hex), 7, "{:#?}", origin.proxy.seen());
    assert_eq!(
        origin.proxy.gets(&hex),
        7,
        "each fault once, the last completes"
    );
    assert_eq!(applied(&origin, &origin.header.sha256.hex()), 2);
    assert_eq!(applied(&origin, &origin.commit.sha256.hex()), 1);
    drop(m);
    store_is_clean(&local);
    assert!(local.contains(&chunk));
}

#[test]
fn after_the_deadline_a_read_fails_with_eio_and_one_log_line() {
    let origin = Origin::start("deadline", 12, Size::Small);
    let local = origin.local_store("local");
    let chunk = origin.chunks["a.safetensors"][0];
    let hex = chunk.sha256.hex();
    origin.proxy.add(Rule::always(&hex, Fault::Status(503)));
    let deadline = Duration::from_secs(2);
    let m = lazy_mount(&local, &origin.proxy.url, deadline);
    let path = origin.mounted(&m.root, "a.safetensors");
    std::fs::metadata(&path).unwrap();
    let started = Instant::now();
    assert_eq!(errno(std::fs::read(&path)), libc::EIO);
    let waited = started.elapsed();
    assert!(
        waited >= deadline && waited < Duration::from_secs(15),
        "{waited:?}"
    );
    let lines: Vec<String> = logs()
        .lines()
        .filter(|l| l.contains(&hex))
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains(&origin.proxy.url), "{}", lines[0]);
    assert!(lines[0].contains("a.safetensors"), "{}", lines[0]);
    assert!(!lines[0].contains("verify --repair"), "{}", lines[0]);
    assert!(!local.contains(&chunk));
    store_is_clean(&local);

    // The fault passes: the next read asks again and succeeds.
    origin.proxy.clear();
    std::thread::sleep(FAILURE_MEMORY + Duration::from_millis(200));
    assert_eq!(std::fs::read(&path).unwrap(), origin.files["a.safetensors"]);
    drop(m);
}

#[test]
fn final_answers_and_endless_wrong_bytes_fail_without_admitting_anything() {
    let origin = Origin::start("final", 13, Size::Small);
    let local = origin.local_store("local");
    let a = origin.chunks["a.safetensors"][0];
    let b = origin.chunks["b.safetensors"][0];
    origin
        .proxy
        .add(Rule::always(&a.sha256.hex(), Fault::Status(500)));
    origin
        .proxy
        .add(Rule::always(&b.sha256.hex(), Fault::RedirectLoop));
    let m = lazy_mount(&local, &origin.proxy.url, Duration::from_secs(30));
    for (file, object) in [("a.safetensors", a), ("b.safetensors", b)] {
        let path = origin.mounted(&m.root, file);
        std::fs::metadata(&path).unwrap();
        let started = Instant::now();
        assert_eq!(errno(std::fs::read(&path)), libc::EIO, "{file}");
        assert!(started.elapsed() < Duration::from_secs(10), "{file}: final");
        assert!(!local.contains(&object));
    }
    assert!(logs().contains("more than 5 redirects"));
    drop(m);

    // A copy that is always wrong: refused until the deadline.
    origin.proxy.clear();
    origin
        .proxy
        .add(Rule::always(&a.sha256.hex(), Fault::WrongByte(7)));
    let m = lazy_mount(&local, &origin.proxy.url, Duration::from_secs(2));
    let path = origin.mounted(&m.root, "a.safetensors");
    assert_eq!(errno(std::fs::read(&path)), libc::EIO);
    assert!(origin.proxy.gets(&a.sha256.hex()) >= 2, "asked again");
    assert!(logs().contains("not its bytes"));
    assert!(!local.contains(&a));
    drop(m);
    store_is_clean(&local);
}

fn download(store: &Store, url: &str, name: &str, deadline: &str) -> std::process::Output {
    common::tensorfs()
        .arg("--store")
        .arg(store.root())
        .args([
            "download",
            name,
            "--endpoint",
            url,
            "--fetch-deadline",
            deadline,
        ])
        .env_remove("TENSORFS_ENDPOINT")
        .env_remove("TENSORFS_TOKEN")
        .output()
        .expect("the binary runs")
}

#[test]
fn download_rides_out_passing_faults_and_admits_only_right_bytes() {
    let origin = Origin::start("dl", 14, Size::Small);
    let local = origin.local_store("local");
    let hex = origin.chunks["a.safetensors"][0].sha256.hex();
    passing_faults(&origin, &hex);
    let out = download(&local, &origin.proxy.url, &origin.name, "20s");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(applied(&origin, &hex), 7);
    assert_eq!(applied(&origin, &origin.header.sha256.hex()), 2);
    for object in origin.closure() {
        assert!(local.contains(&object), "{object}");
    }
    store_is_clean(&local);
    common::ok(local.root(), &["verify"]);
}

#[test]
fn download_fails_at_the_deadline_or_a_final_answer_and_names_nothing() {
    let origin = Origin::start("dlfail", 15, Size::Small);
    let chunk = origin.chunks["a.safetensors"][0];
    let hex = chunk.sha256.hex();
    for (case, (fault, deadline, said)) in [
        (Fault::Status(503), "2s", "gave up after"),
        (Fault::WrongByte(9), "2s", "not its bytes"),
        (
            Fault::Stall(10_000, Duration::from_secs(30)),
            "2s",
            "gave up after",
        ),
        (Fault::Status(500), "60s", "answered 500"),
        (Fault::RedirectLoop, "60s", "more than 5 redirects"),
    ]
    .into_iter()
    .enumerate()
    {
        // A fresh store per case: each must show that its own failed download left nothing.
        let local = origin.local_store(&format!("local-{case}"));
        origin.proxy.clear();
        origin.proxy.add(Rule::always(&hex, fault.clone()));
        let started = Instant::now();
        let out = download(&local, &origin.proxy.url, &origin.name, deadline);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{fault:?}");
        assert!(stderr.contains(said), "{fault:?}: {stderr}");
        assert!(stderr.contains(&hex), "{fault:?}: {stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{fault:?}: {:?}",
            started.elapsed()
        );
        assert!(!local.contains(&chunk), "{fault:?}");
        assert!(local.repo(&origin.name).unwrap().is_none(), "{fault:?}");
        store_is_clean(&local);
    }
}
