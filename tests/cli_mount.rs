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

/// The small Transformers folder at `<dir>/src`, imported as `local/tiny` into the store
/// `<dir>/<store>`: (source, store).
fn imported_tiny(dir: &Path, store: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let src = dir.join("src");
    transformers_folder(&src);
    let store = dir.join(store);
    ok(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/tiny"],
    );
    (src, store)
}

/// The small Transformers folder imported as `local/tiny` and mounted in the background at
/// `<dir>/mnt`: (source, store, mount point, the mount command's output).
fn mounted_tiny(
    dir: &Path,
    extra: &[&str],
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    std::path::PathBuf,
    String,
) {
    let (src, store) = imported_tiny(dir, "store");
    let mnt = dir.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let out = mount_background(&store, &mnt, &dir.join("mount.log"), extra);
    (src, store, mnt, out)
}

#[test]
fn a_background_mount_serves_until_unmounted() {
    let dir = tempfile::tempdir().unwrap();
    let (src, store, mnt, out) = mounted_tiny(dir.path(), &[]);
    let _cleanup = Cleanup(&mnt);
    assert!(out.contains("mounted"), "{out}");
    assert!(mounted(&mnt), "the command returns once the mount is up");
    let lane = mnt.join("local/tiny/latest/f32");
    assert_eq!(files_of(&lane), files_of(&src));
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
    assert!(!mounted(&mnt));
}

#[test]
fn an_unmount_waits_out_a_moments_reference() {
    let dir = tempfile::tempdir().unwrap();
    let (_src, store, mnt, _) = mounted_tiny(dir.path(), &[]);
    let _cleanup = Cleanup(&mnt);
    // A file held open for a moment (as another process's scan would) is let go of while the
    // unmount tries again.
    let held = fs::File::open(mnt.join("local/tiny/latest/f32/config.json")).unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(held);
    });
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
    release.join().unwrap();
    assert!(!mounted(&mnt));
}

#[test]
fn a_root_mount_made_without_fusermount3_is_ours_to_unmount() {
    // Without fusermount3 (a container without the fuse3 package), root mounts with mount(2)
    // itself, and the kernel lists the mount as type `fuse`, not `fuse.tensorfs`: `unmount`
    // refused it as "not a TensorFS mount".
    let dir = tempfile::tempdir().unwrap();
    let (_src, store) = imported_tiny(dir.path(), "store");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let _cleanup = Cleanup(&mnt);
    let no_tools = dir.path().join("empty-path");
    fs::create_dir(&no_tools).unwrap();
    let mount = tensorfs()
        .env("PATH", &no_tools)
        .arg("--store")
        .arg(&store)
        .args(["mount", mnt.to_str().unwrap(), "--log-file"])
        .arg(dir.path().join("mount.log"))
        .output()
        .unwrap();
    assert!(
        mount.status.success(),
        "{}",
        String::from_utf8_lossy(&mount.stderr)
    );
    assert!(mounted(&mnt));
    let status = ok(&store, &["status", mnt.to_str().unwrap(), "--json"]);
    assert!(
        status.contains("\"pid\""),
        "status finds the mount: {status}"
    );
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

fn getxattr(path: &Path, name: &str) -> Result<String, i32> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings; a null buffer of size 0 asks for the size.
    let size = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    if size < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    let mut buf = vec![0u8; size as usize];
    // SAFETY: a buffer of `size` bytes we own.
    let got = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(got, size);
    Ok(String::from_utf8(buf).unwrap())
}

#[test]
fn tensor_attributes_read_through_the_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mnt, _) = mounted_tiny(dir.path(), &[]);
    let _cleanup = Cleanup(&mnt);
    let lane = mnt.join("local/tiny/latest/f32");
    let weights = lane.join("model.safetensors");
    assert_eq!(
        getxattr(&weights, "user.tensorfs.component").unwrap(),
        "model"
    );
    assert_eq!(
        getxattr(&lane, "user.tensorfs.class").unwrap(),
        r#"["transformers","4.8.2","BertModel"]"#
    );
    assert_eq!(
        getxattr(&weights, "user.tensorfs.tensors").unwrap(),
        r#"{"count":4,"pages":1}"#
    );
    let keys: Vec<String> =
        serde_json::from_str(&getxattr(&weights, "user.tensorfs.tensors.0").unwrap()).unwrap();
    assert_eq!(keys.len(), 4);
    let query: serde_json::Value = serde_json::from_str(
        &getxattr(
            &weights,
            "user.tensorfs.tensor.encoder.layer.0.attention.self.query.weight",
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(query["dtype"], "F32");
    assert_eq!(query["shape"], serde_json::json!([8, 8]));
    assert_eq!(
        getxattr(&lane.join("README.md"), "user.tensorfs.component"),
        Err(libc::ENODATA)
    );
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
}

/// A mount that may pass files through (these tests run as root) has views unless told not
/// to, up to a tenth of their filesystem; `--view-cache 0` turns them off.
#[test]
fn a_root_mount_has_views_by_default_and_view_cache_0_turns_them_off() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mnt, _) = mounted_tiny(dir.path(), &[]);
    let _cleanup = Cleanup(&mnt);
    let weights = mnt.join("local/tiny/latest/f32/model.safetensors");
    assert!(tensorfs::fuse::session::may_pass_through(), "run as root");
    assert_eq!(getxattr(&weights, "user.tensorfs.view").unwrap(), "absent");
    let mnt_arg = mnt.to_str().unwrap();
    let said: serde_json::Value =
        serde_json::from_str(&ok(&store, &["status", mnt_arg, "--json"])).unwrap();
    let status = &said[0];
    let disk = tensorfs::store::Capacity::of(&store).unwrap();
    assert_eq!(
        status["views"]["budget_bytes"],
        disk.total_bytes() / 10,
        "{status}"
    );
    assert!(store.join("views").is_dir());
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
    ok(
        &store,
        &["mount", mnt.to_str().unwrap(), "--view-cache", "0"],
    );
    assert_eq!(
        getxattr(&weights, "user.tensorfs.view"),
        Err(libc::ENODATA),
        "no views"
    );
    let said: serde_json::Value =
        serde_json::from_str(&ok(&store, &["status", mnt_arg, "--json"])).unwrap();
    assert!(said[0]["views"].is_null(), "{said}");
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
    let err = fails(
        &store,
        &[
            "mount",
            mnt.to_str().unwrap(),
            "--view-cache",
            "0",
            "--view-dir",
            "/tmp/v",
        ],
    );
    assert!(err.contains("--view-cache 0 turns them off"), "{err}");
    // A views' folder inside the mount point would be hidden by the mount, and what it left
    // there would keep later mounts off the folder: refused, nothing made.
    let inside = mnt.join("views");
    let err = fails(
        &store,
        &[
            "mount",
            mnt.to_str().unwrap(),
            "--view-dir",
            inside.to_str().unwrap(),
        ],
    );
    assert!(err.contains("inside the mount point"), "{err}");
    assert!(!inside.exists());
    // A relative name is the working folder's (found by a break test: a bare name was taken
    // for a folder on no filesystem, and views for off).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tensorfs"))
        .current_dir(dir.path())
        .args([
            "--store",
            store.to_str().unwrap(),
            "mount",
            mnt_arg,
            "--view-dir",
            "rel",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path().join("rel").is_dir());
    ok(&store, &["unmount", mnt_arg]);
}

#[test]
fn a_background_mount_takes_its_view_cache_settings() {
    let dir = tempfile::tempdir().unwrap();
    let views = dir.path().join("my-views");
    let (src, store, mnt, _) = mounted_tiny(
        dir.path(),
        &["--view-cache", "1G", "--view-dir", views.to_str().unwrap()],
    );
    let _cleanup = Cleanup(&mnt);
    assert!(views.is_dir(), "the daemon made its views' folder");
    let lane = mnt.join("local/tiny/latest/f32");
    assert_eq!(files_of(&lane), files_of(&src));
    let weights = lane.join("model.safetensors");
    // The tiny file is under the 1 MiB a view needs, so it stays served by the daemon.
    assert_eq!(getxattr(&weights, "user.tensorfs.view").unwrap(), "absent");
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
    let err = fails(
        &store,
        &["mount", mnt.to_str().unwrap(), "--view-cache", "lots"],
    );
    assert!(err.contains("not a size"), "{err}");
    // A folder of other files is refused before anything is mounted.
    let taken = dir.path().join("taken");
    fs::create_dir(&taken).unwrap();
    fs::write(taken.join("keep.txt"), b"mine").unwrap();
    let err = fails(
        &store,
        &[
            "mount",
            mnt.to_str().unwrap(),
            "--view-cache",
            "1G",
            "--view-dir",
            taken.to_str().unwrap(),
        ],
    );
    assert!(err.contains("holds other files"), "{err}");
    assert!(!mounted(&mnt));
    assert_eq!(
        fs::read_dir(&taken).unwrap().count(),
        1,
        "the folder is untouched"
    );
}

#[test]
fn a_mount_over_an_endpoint_makes_its_absent_store_and_one_without_refuses() {
    let dir = tempfile::tempdir().unwrap();
    // The endpoint: a `file://` folder that a local store uploaded one model to.
    let (src, local) = imported_tiny(dir.path(), "local");
    let endpoint = format!("file://{}", dir.path().join("endpoint").display());
    ok(
        &local,
        &["upload", "local/tiny", "acme/tiny", "--endpoint", &endpoint],
    );

    let store = dir.path().join("cache");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let _cleanup = Cleanup(&mnt);
    let err = fails(&store, &["mount", mnt.to_str().unwrap(), "--foreground"]);
    assert!(err.contains("not a store"), "{err}");
    assert!(!store.exists(), "a mount of the store alone creates none");
    let log = dir.path().join("mount.log");
    let args = [
        "mount",
        mnt.to_str().unwrap(),
        "--endpoint",
        &endpoint,
        "--log-file",
        log.to_str().unwrap(),
    ];
    ok(&store, &args);
    assert!(store.join("format").is_file(), "the cache store was made");
    assert_eq!(
        files_of(&mnt.join("acme/tiny/latest/f32")),
        files_of(&src),
        "the endpoint's model reads through the new store"
    );
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
    // The daemon wrote objects and records; ended, it leaves no writer lock in `tmp/`.
    let left: Vec<_> = fs::read_dir(store.join("tmp"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in tmp/: {left:?}");
}

/// Resumes a stopped daemon on drop, whatever the test did.
struct Resume(i32);

impl Drop for Resume {
    fn drop(&mut self) {
        // SAFETY: a signal to a process id; no memory is passed.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// The daemon's pid, from the mount command's output.
fn daemon_pid(out: &str) -> i32 {
    out.split("daemon pid ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {out}"))
}

/// Closing a mounted file asks the daemon nothing (no FLUSH: nothing is ever dirty), so a close
/// never waits for a busy daemon. The failing case: a forked child's exec closed the mounted
/// files it had inherited while every worker of an in-process daemon waited on a fetch, which
/// waited on the store's fence held by the child's copy of the evicting descriptor: a hang.
#[test]
fn closing_a_mounted_file_does_not_wait_for_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mnt, _) = mounted_tiny(dir.path(), &[]);
    let _cleanup = Cleanup(&mnt);
    // The process serving requests, not its supervisor.
    let said = ok(&store, &["status", mnt.to_str().unwrap(), "--json"]);
    let said: serde_json::Value = serde_json::from_str(&said).unwrap();
    let pid = said[0]["server_pid"].as_i64().unwrap() as i32;
    let file = fs::File::open(mnt.join("local/tiny/latest/f32/model.safetensors")).unwrap();
    let resume = Resume(pid);
    // SAFETY: a signal to a process id; no memory is passed.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let (done, closed) = std::sync::mpsc::channel();
    let closer = std::thread::spawn(move || {
        drop(file);
        let _ = done.send(());
    });
    let waited = closed.recv_timeout(std::time::Duration::from_secs(10));
    drop(resume);
    closer.join().unwrap();
    assert!(
        waited.is_ok(),
        "closing a mounted file waited for the stopped daemon"
    );
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
    assert!(!mounted(&mnt));
}

/// `status` and `unmount` take the mount point as `mount` did, through a symlink or `..`
/// (a home behind a symlink): they were refused as "not a TensorFS mount".
#[test]
fn status_and_unmount_resolve_symlinks_and_dotdot_as_mount_does() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mnt, _) = mounted_tiny(dir.path(), &[]);
    let _cleanup = Cleanup(&mnt);
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&mnt, &link).unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    let dotdot = dir.path().join("sub/../mnt");
    for path in [&link, &dotdot] {
        let said = ok(&store, &["status", path.to_str().unwrap()]);
        assert!(said.contains("daemon pid"), "{}: {said}", path.display());
    }
    ok(&store, &["unmount", link.to_str().unwrap()]);
    assert!(!mounted(&mnt));
}

#[test]
fn status_reports_a_running_mount_from_its_daemon() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mnt, out) = mounted_tiny(dir.path(), &[]);
    let _cleanup = Cleanup(&mnt);
    let pid = daemon_pid(&out);
    let weights = mnt.join("local/tiny/latest/f32/model.safetensors");
    let mut file = fs::File::open(&weights).unwrap();
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).unwrap();
    let mnt_arg = mnt.to_str().unwrap();

    let said: serde_json::Value =
        serde_json::from_str(&ok(&store, &["status", mnt_arg, "--json"])).unwrap();
    let s = &said[0];
    assert_eq!(s["pid"], pid, "{said}");
    assert_eq!(
        s["mountpoint"],
        mnt.canonicalize().unwrap().to_str().unwrap()
    );
    assert_eq!(s["store"], store.canonicalize().unwrap().to_str().unwrap());
    assert_eq!(s["open_files"], 1, "{said}");
    assert_eq!(
        s["holds"]["commits"], 1,
        "the open file's commit is held: {said}"
    );
    assert!(
        s["bytes_served"].as_u64().unwrap() >= bytes.len() as u64,
        "{said}"
    );
    assert!(s["blobs"]["proven"].as_u64().unwrap() >= 1, "{said}");
    assert!(s["endpoint"].is_null() && s["cache"].is_null(), "{said}");
    let human = ok(&store, &["status", mnt_arg]);
    assert!(human.contains(&format!("daemon pid {pid}")), "{human}");
    assert!(human.contains("1 file open"), "{human}");
    drop(file);

    // Unmounted: no mount there to report.
    ok(&store, &["unmount", mnt_arg]);
    let err = fails(&store, &["status", mnt_arg]);
    assert!(err.contains("not a TensorFS mount"), "{err}");
    let err = fails(&store, &["status", dir.path().to_str().unwrap()]);
    assert!(err.contains("not a TensorFS mount"), "{err}");
}
