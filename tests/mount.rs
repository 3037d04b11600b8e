//! Real FUSE mounts of test stores (the tests run as root with /dev/fuse). Every mount lives in
//! a guard that unmounts and joins on drop; a mount that does not appear fails the test.

mod fuse_support;

use std::ffi::CString;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use fuse_support::*;
use tensorfs::fuse::session::{self, MountError};
use tensorfs::io::{BlobReader, BlobReaderConfig};
use tensorfs::layout::LaneView;
use tensorfs::store::Store;

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    (dir, store)
}

/// The bytes of every file of `commit`'s lane, read through the library (what export writes).
fn library_files(store: &Store, commit: &TestCommit) -> Vec<(String, Vec<u8>)> {
    let c = store.commit(&commit.id).unwrap();
    let view = LaneView::build(&c.id, &c.tree, &c.header).unwrap();
    let reader = BlobReader::new(store.clone(), BlobReaderConfig::default());
    view.files
        .iter()
        .map(|f| {
            let mut buf = vec![0u8; f.content.size() as usize];
            assert_eq!(f.content.read_at(&reader, 0, &mut buf).unwrap(), buf.len());
            (f.path.clone(), buf)
        })
        .collect()
}

#[test]
fn every_level_lists_and_every_alias_reads_the_same_files() {
    let (_dir, store) = store();
    let v1 = commit(&store, Some("bf16"), 1);
    let v2 = commit(&store, Some("bf16"), 2);
    let draft = commit(&store, None, 3);
    set_repo(
        &store,
        "local/x",
        vec![
            release("1.0", &[("bf16", &v1)]),
            release("2.0", &[("bf16", &v2)]),
        ],
        vec![draft.id],
    );
    let m = mount(&store);

    assert_eq!(
        read_ahead_kb(&m.root),
        16 << 10,
        "a readahead window of 16 1 MiB requests"
    );
    assert_eq!(
        statvfs(&m.root),
        statvfs(store.root()),
        "df shows the store's filesystem"
    );
    assert_eq!(list(&m.root), ["@comfyui", "@hf", "local"]);
    assert_eq!(list(&m.path("local")), ["x"]);
    let mut revisions = vec!["1.0".to_owned(), "2.0".to_owned(), "latest".to_owned()];
    revisions.extend([&v1, &v2, &draft].iter().map(|c| c.id.sha256.hex()));
    revisions.sort();
    assert_eq!(list(&m.path("local/x")), revisions);
    assert_eq!(list(&m.path("local/x/latest")), ["bf16"]);
    assert_eq!(
        list(&m.path(&format!("local/x/{}", draft.id.sha256))),
        ["_"]
    );
    let files = ["README.md", "config.json", "model.safetensors"];
    assert_eq!(list(&m.path("local/x/latest/bf16")), files);

    let expected = library_files(&store, &v2);
    for alias in ["latest", "2.0", &v2.id.sha256.hex()] {
        for (path, bytes) in &expected {
            let got = fs::read(m.path(&format!("local/x/{alias}/bf16/{path}"))).unwrap();
            assert!(
                got == *bytes,
                "{alias}/bf16/{path} differs from the library's bytes"
            );
        }
    }
    let old = fs::read(m.path("local/x/1.0/bf16/README.md")).unwrap();
    assert_eq!(old, v1.readme);
    let unlabelled = fs::read(m.path(&format!("local/x/{}/_/README.md", draft.id.sha256))).unwrap();
    assert_eq!(unlabelled, draft.readme);

    let latest = fs::metadata(m.path("local/x/latest/bf16/model.safetensors")).unwrap();
    let by_hex =
        fs::metadata(m.path(&format!("local/x/{}/bf16/model.safetensors", v2.id.sha256))).unwrap();
    assert_eq!(latest.ino(), by_hex.ino(), "aliases share one file inode");
    assert_eq!(latest.permissions().mode() & 0o777, 0o444);
    assert_eq!(latest.blksize(), 1 << 20);
    let tree_mtime = fs::metadata(store.object_path(&v2.id))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(latest.modified().unwrap(), tree_mtime);
    let lane = fs::metadata(m.path("local/x/latest/bf16")).unwrap();
    assert!(lane.is_dir());
    assert_eq!(lane.permissions().mode() & 0o777, 0o555);
    m.unmount();
}

#[test]
fn a_synthesized_file_parses_and_reads_whole_ranged_and_across_chunks() {
    let (_dir, store) = store();
    let c = commit(&store, Some("bf16"), 7);
    set_repo(
        &store,
        "local/x",
        vec![release("1.0", &[("bf16", &c)])],
        vec![],
    );
    let m = mount(&store);
    let path = m.path("local/x/latest/bf16/model.safetensors");
    let whole = fs::read(&path).unwrap();

    let parsed = safetensors::SafeTensors::deserialize(&whole).expect("a safetensors file");
    for t in &c.tensors {
        let view = parsed.tensor(t.name).unwrap();
        assert_eq!(view.dtype().to_string(), t.dtype.name());
        assert_eq!(
            view.shape(),
            t.shape.iter().map(|&d| d as usize).collect::<Vec<_>>()
        );
        assert!(view.data() == t.bytes.as_slice(), "{} differs", t.name);
    }

    // Where chunk 0 ends inside b.weight, in file offsets.
    let (_, meta) = safetensors::SafeTensors::read_metadata(&whole).unwrap();
    let data_start = whole.len()
        - meta
            .tensors()
            .values()
            .map(|i| i.data_offsets.1)
            .max()
            .unwrap();
    let b = meta.info("b.weight").unwrap();
    let boundary = data_start + b.data_offsets.0 + 524_288;
    let file = File::open(&path).unwrap();
    for (offset, len) in [
        (0, 1),
        (3, 4097),
        (boundary - 1, 2),
        (boundary - 100_000, 300_000),
        (boundary - (1 << 20), 3 << 20),
        (whole.len() - 10, 10),
    ] {
        let len = len.min(whole.len() - offset);
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, offset as u64).unwrap();
        assert!(buf == whole[offset..offset + len], "range {offset}+{len}");
    }
    let mut tail = Vec::new();
    let mut f = File::open(&path).unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(whole.len() as u64 - 5)).unwrap();
    f.read_to_end(&mut tail).unwrap();
    assert_eq!(tail, whole[whole.len() - 5..]);
    drop((file, f));
    m.unmount();
}

#[test]
fn mmap_of_a_mounted_file_works() {
    let (_dir, store) = store();
    let c = commit(&store, Some("bf16"), 11);
    set_repo(&store, "local/x", vec![], vec![c.id]);
    let m = mount(&store);
    let path = m.path("local/x/latest/bf16/model.safetensors");
    let expected = fs::read(&path).unwrap();
    let file = File::open(&path).unwrap();
    // SAFETY: the mounted file is read-only and never changes while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.expect("mmap works on the mount");
    assert!(map[..] == expected[..]);
    drop((map, file));
    m.unmount();
}

#[test]
fn a_damaged_blob_is_eio_with_a_log_line_while_other_files_still_read() {
    let (_dir, store) = store();
    let c = commit(&store, Some("bf16"), 21);
    set_repo(
        &store,
        "local/x",
        vec![release("1.0", &[("bf16", &c)])],
        vec![],
    );
    // Same length, other bytes: only hashing can tell.
    let blob = store.object_path(&c.chunks[1]);
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&blob, noise(c.chunks[1].length as usize, 999)).unwrap();
    let m = mount(&store);

    let err = fs::read(m.path("local/x/latest/bf16/model.safetensors")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert_eq!(
        fs::read(m.path("local/x/latest/bf16/README.md")).unwrap(),
        c.readme
    );
    assert!(fs::read(m.path("local/x/latest/bf16/config.json")).is_ok());
    let logs = logs();
    let line = logs
        .lines()
        .find(|l| l.contains("ERROR") && l.contains(&c.id.id()) && l.contains("model.safetensors"))
        .unwrap_or_else(|| panic!("no error line names the commit and file:\n{logs}"));
    assert_eq!(
        line.matches("verify --repair").count(),
        1,
        "the repair is advised once: {line}"
    );
    // The request's span: the operation, the kernel's request id and the inode; the errno.
    assert!(line.contains("read{req="), "{line}");
    assert!(line.contains("errno=5"), "{line}");
    assert!(
        line.contains(&blob.display().to_string()),
        "the line names the blob: {line}"
    );
    m.unmount();
}

#[test]
fn a_blob_damaged_or_removed_after_it_was_served_is_eio() {
    let (_dir, store) = store();
    let c = commit(&store, Some("bf16"), 23);
    set_repo(
        &store,
        "local/x",
        vec![release("1.0", &[("bf16", &c)])],
        vec![],
    );
    let m = mount(&store);
    let file = m.path("local/x/latest/bf16/model.safetensors");
    let good = fs::read(&file).unwrap();

    // One byte flipped in place: the proven descriptor must not serve it.
    let blob = store.object_path(&c.chunks[1]);
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = fs::read(&blob).unwrap();
    bytes[100] ^= 0xff;
    let mut writer = fs::OpenOptions::new().write(true).open(&blob).unwrap();
    std::io::Write::write_all(&mut writer, &bytes).unwrap();
    drop(writer);
    drop_cached_pages(&file);
    let err = fs::read(&file).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");

    // Restored bytes serve again; then the blob removed (as a repair does) is EIO too.
    bytes[100] ^= 0xff;
    fs::write(&blob, &bytes).unwrap();
    drop_cached_pages(&file);
    assert_eq!(fs::read(&file).unwrap(), good);
    fs::remove_file(&blob).unwrap();
    drop_cached_pages(&file);
    let err = fs::read(&file).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");

    // A FIFO in the blob's place is EIO at once: opening it must not wait for a writer (the
    // request thread would hang, and with it the mount).
    let c_path = CString::new(blob.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    drop_cached_pages(&file);
    let err = fs::read(&file).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(fs::read(m.path("local/x/latest/bf16/README.md")).is_ok());
    m.unmount();
}

#[test]
fn a_ref_added_while_mounted_appears() {
    let (_dir, store) = store();
    let v1 = commit(&store, Some("bf16"), 31);
    set_repo(
        &store,
        "local/x",
        vec![release("1.0", &[("bf16", &v1)])],
        vec![],
    );
    let m = mount(&store);
    assert_eq!(list(&m.root), ["@comfyui", "@hf", "local"]);
    let readme = m.path("local/x/latest/bf16/README.md");
    assert_eq!(fs::read(&readme).unwrap(), v1.readme);

    let v2 = commit(&store, Some("bf16"), 32);
    set_repo(
        &store,
        "local/x",
        vec![
            release("1.0", &[("bf16", &v1)]),
            release("2.0", &[("bf16", &v2)]),
        ],
        vec![],
    );
    let other = commit(&store, None, 33);
    set_repo(&store, "other/y", vec![], vec![other.id]);
    wait_for(
        || list(&m.root) == ["@comfyui", "@hf", "local", "other"],
        "the new org to appear",
    );
    wait_for(
        || list(&m.path("local/x")).contains(&"2.0".to_owned()),
        "the new release to appear",
    );
    wait_for(
        || fs::read(&readme).is_ok_and(|b| b == v2.readme),
        "latest to move to 2.0",
    );
    assert_eq!(
        fs::read(m.path("other/y/latest/_/README.md")).unwrap(),
        other.readme
    );
    m.unmount();
}

#[test]
fn xattrs_ioctls_and_writes_through_the_kernel() {
    let (_dir, store) = store();
    let c = commit(&store, Some("bf16"), 41);
    set_repo(
        &store,
        "local/x",
        vec![release("1.0", &[("bf16", &c)])],
        vec![],
    );
    let m = mount(&store);
    let file = m.path("local/x/1.0/bf16/config.json");
    // getxattr(2) into `buf`: what it answers (the value's length, also for a size probe with
    // an empty buffer), or the errno.
    let getxattr_into = |path: &Path, name: &str, buf: &mut [u8]| -> Result<usize, i32> {
        let p = CString::new(path.as_os_str().as_bytes()).unwrap();
        let n = CString::new(name).unwrap();
        // SAFETY: valid C strings and a buffer of `buf.len()` bytes.
        let r =
            unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if r < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
        }
        Ok(r as usize)
    };
    let getxattr = |path: &Path, name: &str, size: usize| -> Result<Vec<u8>, i32> {
        let mut buf = vec![0u8; size];
        let r = getxattr_into(path, name, &mut buf)?;
        buf.truncate(r);
        Ok(buf)
    };
    let commit_id = c.id.id().into_bytes();
    assert_eq!(
        getxattr(&file, "user.tensorfs.commit", 256).unwrap(),
        commit_id
    );
    assert_eq!(
        getxattr_into(&file, "user.tensorfs.commit", &mut []),
        Ok(commit_id.len()),
        "a size probe answers the value's length"
    );
    assert_eq!(
        getxattr(&file, "user.tensorfs.commit", 8),
        Err(libc::ERANGE)
    );
    assert_eq!(getxattr(&file, "user.nope", 256), Err(libc::ENODATA));
    let lane = m.path("local/x/1.0/bf16");
    assert_eq!(
        getxattr(&lane, "user.tensorfs.header", 256).unwrap(),
        c.header.id().into_bytes()
    );

    let f = File::open(&file).unwrap();
    let mut termios = std::mem::MaybeUninit::<libc::termios>::uninit();
    // SAFETY: TCGETS writes a termios into the buffer we own.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::TCGETS,
            termios.as_mut_ptr(),
        )
    };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOTTY)
    );
    drop(f);

    assert_eq!(
        errno(fs::OpenOptions::new().write(true).open(&file)),
        libc::EROFS
    );
    assert_eq!(errno(fs::create_dir(m.path("local/new"))), libc::EROFS);
    assert_eq!(errno(fs::remove_file(&file)), libc::EROFS);
    assert_eq!(
        errno(fs::metadata(m.path("local/x/1.0/bf16/missing"))),
        libc::ENOENT
    );
    assert_eq!(errno(fs::metadata(m.path("local/x/9.9"))), libc::ENOENT);
    m.unmount();
}

#[test]
fn unmounting_a_busy_mount_detaches_it_and_open_files_keep_reading() {
    let (_dir, store) = store();
    let c = commit(&store, Some("bf16"), 51);
    set_repo(
        &store,
        "local/x",
        vec![release("1.0", &[("bf16", &c)])],
        vec![],
    );
    let m = mount(&store);
    let root = m.root.clone();
    let open = File::open(m.path("local/x/1.0/bf16/README.md")).unwrap();
    let unmounting = std::thread::spawn(move || m.unmount());
    wait_for(
        || !session::is_mounted(&root),
        "the busy mount to be detached",
    );
    let mut text = Vec::new();
    (&open).read_to_end(&mut text).unwrap();
    assert_eq!(text, c.readme);
    drop(open);
    unmounting.join().unwrap();
}

#[test]
fn a_stale_mountpoint_is_detected_and_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    // A FUSE mount whose daemon is gone: mount /dev/fuse, then close the device.
    let fuse = File::options()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .unwrap();
    let options = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0",
        std::os::fd::AsRawFd::as_raw_fd(&fuse)
    );
    let target = CString::new(root.as_os_str().as_bytes()).unwrap();
    let (source, fstype) = (
        CString::new("tensorfs").unwrap(),
        CString::new("fuse.tensorfs").unwrap(),
    );
    let options = CString::new(options).unwrap();
    // SAFETY: valid C strings for the duration of the call.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            options.as_ptr().cast(),
        )
    };
    assert_eq!(r, 0, "mount: {}", std::io::Error::last_os_error());
    drop(fuse);
    assert_eq!(errno(fs::metadata(&root)), libc::ENOTCONN);

    let err = session::check_mountpoint(&root).unwrap_err();
    assert!(matches!(err, MountError::Stale { .. }), "{err}");
    assert!(err.to_string().contains("umount -l"), "{err}");
    // `tensorfs doctor` names it, with the fix.
    let doctor = std::process::Command::new(env!("CARGO_BIN_EXE_tensorfs"))
        .args(["doctor", "--json", "--store"])
        .arg(dir.path().join("no-store"))
        .output()
        .unwrap();
    let said: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let finding = |check: &str| {
        said.as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == check)
            .unwrap_or_else(|| panic!("no {check} finding: {said}"))
    };
    let stale = finding("stale mounts");
    let shown = root.display().to_string();
    assert_eq!(stale["status"], "warn", "{stale}");
    assert!(
        stale["finding"].as_str().unwrap().contains(&shown),
        "{stale}"
    );
    assert!(
        stale["fix"].as_str().unwrap().contains("unmount --lazy"),
        "{stale}"
    );
    // Its trial mount reads the FUSE protocol from the mount's status.
    let trial = finding("trial mount");
    assert_eq!(trial["status"], "ok", "{trial}");
    assert!(
        trial["finding"]
            .as_str()
            .unwrap()
            .contains("FUSE protocol 7."),
        "{trial}"
    );
    // This kernel (6.18) resends what a dying daemon left unanswered, which restarts need.
    assert!(
        trial["finding"]
            .as_str()
            .unwrap()
            .contains("a restarted daemon is sent what the one before left unanswered"),
        "{trial}"
    );
    session::unmount(&root, true).unwrap();
    wait_for(
        || session::check_mountpoint(&root).is_ok(),
        "the stale mount to clear",
    );
}

#[test]
fn mounting_twice_on_one_folder_is_refused() {
    let (_dir, store) = store();
    set_repo(&store, "local/x", vec![], vec![]);
    let m = mount(&store);
    let err = session::spawn(session::MountConfig::new(store.root(), &m.root)).unwrap_err();
    assert!(matches!(err, MountError::AlreadyMounted { .. }), "{err}");
    assert_eq!(list(&m.path("local/x")), ["latest"]);
    std::thread::sleep(Duration::from_millis(10));
    m.unmount();
}
