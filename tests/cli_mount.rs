//! The `mount` and `unmount` verbs through the binary: background mode, and what they refuse.

mod common;

use common::*;
use std::fs;
use std::path::Path;

fn mounted(path: &Path) -> bool {
    let canonical = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(canonical.to_str().unwrap()))
}

/// Unmounts `path` on drop, whatever the test did.
struct Cleanup<'a>(&'a Path);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if mounted(self.0) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.0)
                .status();
        }
    }
}

#[test]
fn a_background_mount_serves_until_unmounted() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    transformers_folder(&src);
    let store = dir.path().join("store");
    ok(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/tiny"],
    );
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let _cleanup = Cleanup(&mnt);
    let log = dir.path().join("mount.log");
    let out = ok(
        &store,
        &[
            "mount",
            mnt.to_str().unwrap(),
            "--log-file",
            log.to_str().unwrap(),
        ],
    );
    assert!(out.contains("mounted"), "{out}");
    assert!(mounted(&mnt), "the command returns once the mount is up");
    let lane = mnt.join("local/tiny/latest/f32");
    assert_eq!(files_of(&lane), files_of(&src));
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
    assert!(!mounted(&mnt));
}

#[test]
fn mounting_on_a_folder_with_files_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    tensorfs::store::Store::open(&store).unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    fs::write(mnt.join("keep.txt"), b"mine").unwrap();
    let _cleanup = Cleanup(&mnt);
    let err = fails(&store, &["mount", mnt.to_str().unwrap(), "--foreground"]);
    assert!(err.contains("not empty"), "{err}");
    assert!(!mounted(&mnt));
}

#[test]
fn unmount_leaves_other_filesystems_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    tensorfs::store::Store::open(&store).unwrap();
    let mnt = dir.path().join("tmpfs");
    fs::create_dir(&mnt).unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "none"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(status.success(), "mounting a tmpfs needs root");
    let _cleanup = Cleanup(&mnt);
    fs::write(mnt.join("data"), b"precious").unwrap();
    for args in [vec!["unmount"], vec!["unmount", "--lazy"]] {
        let mut args = args;
        args.push(mnt.to_str().unwrap());
        let err = fails(&store, &args);
        assert!(err.contains("not a TensorFS mount"), "{err}");
        assert!(mounted(&mnt), "the tmpfs is still mounted");
    }
    assert_eq!(fs::read(mnt.join("data")).unwrap(), b"precious");
}
