//! SIGTERM unmounts a foreground mount cleanly. Its own test binary: the signal goes to the
//! whole process, and no other mount may share it.

mod fuse_support;

use std::time::Duration;

use fuse_support::*;
use tensorfs::fuse::session::{self, MountConfig};
use tensorfs::store::Store;

#[test]
fn sigterm_unmounts_a_foreground_mount_and_returns() {
    capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let c = commit(&store, Some("bf16"), 61);
    set_repo(
        &store,
        "local/x",
        vec![release("1.0", &[("bf16", &c)])],
        vec![],
    );
    let mountpoint = tempfile::tempdir().unwrap();
    let root = mountpoint.path().canonicalize().unwrap();
    let config = MountConfig {
        foreground: true,
        ..MountConfig::new(store.root(), &root)
    };
    let daemon = std::thread::spawn(move || session::mount(config));
    wait_for(|| session::is_mounted(&root), "the mount to appear");
    assert_eq!(
        std::fs::read(root.join("local/x/latest/bf16/README.md")).unwrap(),
        c.readme
    );

    // SAFETY: kill with our own pid; `mount` installed its SIGTERM handler before mounting.
    assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
    let start = std::time::Instant::now();
    while !daemon.is_finished() {
        if start.elapsed() > Duration::from_secs(5) {
            let _ = session::unmount(&root, true);
            panic!("mount() did not return within 5 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon.join().unwrap().expect("a clean unmount");
    assert!(!session::is_mounted(&root));
    assert!(logs().contains("SIGTERM: unmounting"), "{}", logs());
}
