//! Views and FUSE passthrough through real mounts (root, /dev/fuse, Linux 6.9+): a file read to
//! its end gets a view, later opens read the view without the daemon, and open handles never
//! mix modes on one inode.

mod fuse_support;

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use fuse_support::*;
use tensorfs::store::Store;
use tensorfs::views::ViewConfig;

const FILE: &str = "local/x/latest/bf16/model.safetensors";

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    (dir, store)
}

/// A store with one model of lane `bf16` (a 2.5 MiB safetensors file and a README).
fn one_model(store: &Store, seed: u64) -> TestCommit {
    let c = commit(store, Some("bf16"), seed);
    set_repo(
        store,
        "local/x",
        vec![release("1.0", &[("bf16", &c)])],
        vec![],
    );
    c
}

fn mount_with_views(store: &Store, dir: &Path, capacity_bytes: u64) -> Mounted {
    let dir = dir.to_path_buf();
    mount_with(store, move |config| {
        config.fs.views = Some(ViewConfig::new(dir, capacity_bytes));
    })
}

fn view_state(path: &Path) -> String {
    let value = xattr(path, "user.tensorfs.view").expect("the view attribute");
    String::from_utf8(value).unwrap()
}

/// The files of views folder `dir` but its marker: views and temporary files.
fn views_in(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.ends_with(".tensorfs-views"))
        .collect();
    found.sort();
    found
}

#[test]
fn a_file_read_whole_gets_a_view_that_a_later_mount_reads_without_the_blobs() {
    let (tmp, store) = store();
    let c = one_model(&store, 1);
    let views = tmp.path().join("views");
    let m = mount_with_views(&store, &views, 64 << 20);
    let path = m.path(FILE);
    let expected = fs::read(&path).unwrap();
    wait_for(|| view_state(&path) == "ready", "the view to be built");
    let built = views_in(&views);
    assert_eq!(
        built.len(),
        1,
        "one view, no temporary file left: {built:?}"
    );
    assert_eq!(fs::read(&built[0]).unwrap(), expected);
    assert_eq!(
        fs::read(m.path("local/x/latest/bf16/README.md")).unwrap(),
        c.readme
    );
    assert_eq!(fs::read(&path).unwrap(), expected, "read through the view");
    m.unmount();

    // Without the chunks, only the view can give the file's bytes: a fresh mount (no page
    // cache) that reads them whole passes the file through to the view.
    for chunk in &c.chunks {
        fs::remove_file(store.object_path(chunk)).unwrap();
    }
    let m = mount_with_views(&store, &views, 64 << 20);
    let path = m.path(FILE);
    assert_eq!(view_state(&path), "ready", "views outlive the mount");
    assert_eq!(fs::read(&path).unwrap(), expected);
    let file = File::open(&path).unwrap();
    // SAFETY: the mapping is read-only and dropped with the file; the mount never changes.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    assert!(map[..] == expected[..], "mmap reads the view too");
    drop((map, file));
    m.unmount();

    // Without views the same mount has no bytes to give.
    let m = mount(&store);
    let err = fs::read(m.path(FILE)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert_eq!(xattr(&m.path(FILE), "user.tensorfs.view"), None);
    m.unmount();
}

/// Loaders read tensors out of file order: a file read back to front, in blocks the kernel
/// does not read ahead of, gets a view made of those reads and the holes the build filled.
#[test]
fn a_file_read_back_to_front_gets_a_view_of_its_bytes() {
    use std::os::unix::fs::FileExt;
    let (tmp, store) = store();
    one_model(&store, 2);
    let views = tmp.path().join("views");
    let m = mount_with_views(&store, &views, 64 << 20);
    let path = m.path(FILE);
    let file = File::open(&path).unwrap();
    let size = file.metadata().unwrap().len() as usize;
    let mut read = vec![0u8; size];
    let block = 96 << 10;
    let mut end = size;
    while end > 0 {
        let start = end.saturating_sub(block);
        file.read_exact_at(&mut read[start..end], start as u64)
            .unwrap();
        end = start;
    }
    drop(file);
    wait_for(|| view_state(&path) == "ready", "the view to be built");
    let built = views_in(&views);
    assert_eq!(built.len(), 1, "one view, no temporary file: {built:?}");
    assert!(fs::read(&built[0]).unwrap() == read, "the view is the file");
    let status = status(&m.root);
    assert_eq!(status["views"]["count"], 1, "{status}");
    assert_eq!(status["views"]["building"], 0, "{status}");
    m.unmount();
}

#[test]
fn an_inode_open_through_the_page_cache_stays_so_until_its_last_handle_closes() {
    let (tmp, store) = store();
    let c = one_model(&store, 2);
    let views = tmp.path().join("views");
    let m = mount_with_views(&store, &views, 64 << 20);
    let path = m.path(FILE);
    assert_eq!(view_state(&path), "absent");
    let mut cached = File::open(&path).unwrap();
    let mut expected = Vec::new();
    cached.read_to_end(&mut expected).unwrap();
    // A second handle read whole and closed asks for the view while `cached` stays open.
    assert_eq!(fs::read(&path).unwrap(), expected);
    wait_for(|| view_state(&path) == "ready", "the view to be built");
    // The kernel refuses a passthrough open beside a cached one (EIO to the caller): this one
    // must be opened cached too.
    let mut again = File::open(&path).unwrap();
    let mut bytes = Vec::new();
    again.read_to_end(&mut bytes).unwrap();
    assert_eq!(bytes, expected);
    drop((cached, again));

    // All closed: the next opens pass through, and handles opened together share the view.
    for chunk in &c.chunks {
        fs::remove_file(store.object_path(chunk)).unwrap();
    }
    let first = File::open(&path).unwrap();
    let second = File::open(&path).unwrap();
    for mut f in [first, second] {
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes, expected);
    }
    m.unmount();
}

#[test]
fn views_beyond_the_capacity_go_least_recently_opened_first() {
    let (tmp, store) = store();
    let a = commit(&store, Some("a"), 3);
    let b = commit(&store, Some("b"), 4);
    set_repo(
        &store,
        "local/x",
        vec![release("1.0", &[("a", &a), ("b", &b)])],
        vec![],
    );
    let views = tmp.path().join("views");
    // Room for one 2.5 MiB view, not two.
    let m = mount_with_views(&store, &views, 4 << 20);
    let path_a = m.path("local/x/latest/a/model.safetensors");
    let path_b = m.path("local/x/latest/b/model.safetensors");
    let bytes_a = fs::read(&path_a).unwrap();
    wait_for(|| view_state(&path_a) == "ready", "view a");
    let bytes_b = fs::read(&path_b).unwrap();
    wait_for(|| view_state(&path_b) == "ready", "view b");
    assert_eq!(view_state(&path_a), "absent", "a made room for b");
    assert_eq!(views_in(&views).len(), 1);
    assert_eq!(fs::read(&path_a).unwrap(), bytes_a);
    assert_eq!(fs::read(&path_b).unwrap(), bytes_b);
    m.unmount();
}

#[test]
fn a_file_read_in_part_or_too_large_for_the_cache_gets_no_view() {
    let (tmp, store) = store();
    one_model(&store, 5);
    let views = tmp.path().join("views");
    let m = mount_with_views(&store, &views, 1 << 20);
    let path = m.path(FILE);
    let mut head = [0u8; 4096];
    File::open(&path).unwrap().read_exact(&mut head).unwrap();
    assert_eq!(
        view_state(&path),
        "absent",
        "a read of the head asks for nothing"
    );
    let whole = fs::read(&path).unwrap();
    assert_eq!(&whole[..4096], &head[..]);
    // Larger than the 1 MiB capacity: the build is refused, logged, and not tried again.
    wait_for(|| logs().contains("larger than the cache"), "the refusal");
    assert_eq!(view_state(&path), "absent");
    assert!(views_in(&views).is_empty());
    assert_eq!(fs::read(&path).unwrap(), whole);
    m.unmount();
}

#[test]
fn a_views_folder_that_cannot_be_made_leaves_the_mount_serving() {
    let (tmp, store) = store();
    one_model(&store, 6);
    let not_a_folder = tmp.path().join("views");
    fs::write(&not_a_folder, b"a file").unwrap();
    let m = mount_with_views(&store, &not_a_folder, 64 << 20);
    let path = m.path(FILE);
    assert_eq!(
        fs::read(&path).unwrap().len() as u64,
        fs::metadata(&path).unwrap().len()
    );
    assert_eq!(
        xattr(&path, "user.tensorfs.view"),
        None,
        "no views, no attribute"
    );
    assert!(logs().contains("no views in"));
    m.unmount();
}

#[test]
fn a_folder_that_holds_other_files_is_not_taken_for_views() {
    let (tmp, store) = store();
    one_model(&store, 7);
    let theirs = tmp.path().join("shared");
    fs::create_dir(&theirs).unwrap();
    fs::set_permissions(&theirs, fs::Permissions::from_mode(0o1777)).unwrap();
    let precious = theirs.join("a".repeat(64));
    fs::write(&precious, b"not a view").unwrap();
    let m = mount_with_views(&store, &theirs, 64 << 20);
    let path = m.path(FILE);
    assert!(!fs::read(&path).unwrap().is_empty());
    assert_eq!(xattr(&path, "user.tensorfs.view"), None, "no views there");
    assert!(logs().contains("holds other files"));
    m.unmount();
    assert_eq!(fs::read(&precious).unwrap(), b"not a view");
    assert_eq!(
        fs::metadata(&theirs).unwrap().permissions().mode() & 0o7777,
        0o1777,
        "its mode is left alone"
    );
}

#[test]
fn a_view_that_is_not_a_file_is_dropped_without_stalling_opens() {
    let (tmp, store) = store();
    one_model(&store, 8);
    let views = tmp.path().join("views");
    let m = mount_with_views(&store, &views, 64 << 20);
    let expected = fs::read(m.path(FILE)).unwrap();
    wait_for(
        || view_state(&m.path(FILE)) == "ready",
        "the view to be built",
    );
    m.unmount();
    let view = views_in(&views).pop().unwrap();
    fs::remove_file(&view).unwrap();
    let c = std::ffi::CString::new(view.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);

    let m = mount_with_views(&store, &views, 64 << 20);
    // A FIFO opened to read would wait for a writer; the open must not.
    assert_eq!(fs::read(m.path(FILE)).unwrap(), expected);
    assert!(logs().contains("not a file of"));
    m.unmount();
}

#[test]
fn views_beyond_a_smaller_capacity_go_when_the_mount_starts() {
    let (tmp, store) = store();
    one_model(&store, 9);
    let views = tmp.path().join("views");
    let m = mount_with_views(&store, &views, 64 << 20);
    let path = m.path(FILE);
    let expected = fs::read(&path).unwrap();
    wait_for(|| view_state(&path) == "ready", "the view to be built");
    m.unmount();
    assert_eq!(views_in(&views).len(), 1);

    let m = mount_with_views(&store, &views, 1 << 20);
    assert!(
        views_in(&views).is_empty(),
        "the 2.5 MiB view is over the new 1 MiB"
    );
    assert_eq!(view_state(&m.path(FILE)), "absent");
    assert_eq!(fs::read(m.path(FILE)).unwrap(), expected);
    m.unmount();
}

/// An overlayfs at `dir/merged` (over `dir/lower`), unmounted on drop.
struct Overlay(PathBuf);

impl Overlay {
    fn new(dir: &Path) -> Overlay {
        for sub in ["lower", "upper", "work", "merged"] {
            fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            dir.join("lower").display(),
            dir.join("upper").display(),
            dir.join("work").display()
        );
        let merged = dir.join("merged");
        let status = std::process::Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &options])
            .arg(&merged)
            .status()
            .unwrap();
        assert!(status.success(), "mounting an overlayfs needs root");
        Overlay(merged)
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_kernel_that_refuses_passthrough_is_told_once_and_every_open_still_reads() {
    let (tmp, store) = store();
    let c = one_model(&store, 10);
    let other = commit(&store, Some("bf16"), 11);
    set_repo(
        &store,
        "local/y",
        vec![release("1.0", &[("bf16", &other)])],
        vec![],
    );
    // Views on overlayfs: a backing file there is one stacking level too deep (ELOOP).
    let overlay = Overlay::new(&tmp.path().join("overlay"));
    let views = overlay.0.join("views");
    let m = mount_with_views(&store, &views, 64 << 20);
    let path = m.path(FILE);
    let readme = m.path("local/x/latest/bf16/README.md");
    // The README's blob is on the store's local filesystem: it passes through, and stays so
    // while this handle is open, refusal or not (a page-cache open beside it would be EIO).
    let held = File::open(&readme).unwrap();
    let expected = fs::read(&path).unwrap();
    wait_for(|| view_state(&path) == "ready", "the view to be built");
    for _ in 0..3 {
        assert_eq!(fs::read(&path).unwrap(), expected);
        assert_eq!(fs::read(&readme).unwrap(), c.readme);
    }
    drop(held);
    assert_eq!(fs::read(&readme).unwrap(), c.readme);
    assert_eq!(logs().matches("the kernel refuses passthrough").count(), 1);
    // No view is built after the refusal: none could be read.
    let unviewed = m.path("local/y/latest/bf16/model.safetensors");
    fs::read(&unviewed).unwrap();
    assert_eq!(
        view_state(&unviewed),
        "absent",
        "no build after the refusal"
    );
    assert_eq!(views_in(&views).len(), 1, "only the view built before");
    m.unmount();
}

/// A tmpfs of `bytes`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(dir: &Path, bytes: u64) -> Tmpfs {
        fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// An object's bytes in memory.
struct Memory(Vec<u8>);

impl tensorfs::io::ObjectSource for Memory {
    fn read_object(
        &self,
        _: &tensorfs::format::ObjectRef,
        offset: u64,
        buf: &mut [u8],
    ) -> std::io::Result<()> {
        let start = offset as usize;
        buf.copy_from_slice(&self.0[start..start + buf.len()]);
        Ok(())
    }
}

/// Views under way are sparse: the room a second one checks for counts what the first will
/// still write, so two together never take the disk's reserve (found by a break test: two
/// overlapping views left 1 013 MiB free on a disk whose reserve is 1 GiB).
#[test]
fn views_under_way_count_against_the_disks_reserve() {
    use tensorfs::format::{ObjectRef, Sha256};
    use tensorfs::layout::Content;
    use tensorfs::views::{ViewCache, ViewState};
    capture_logs();
    let tmp = tempfile::tempdir().unwrap();
    // The reserve of a disk this small is the 1 GiB floor; 12 MiB above it fit one view of
    // 8 MiB, not two.
    let disk = Tmpfs::new(&tmp.path().join("small"), (1 << 30) + (12 << 20));
    let bytes = vec![7u8; 8 << 20];
    let content = Content::Object(ObjectRef::of(&bytes));
    let views = ViewCache::open(
        ViewConfig::new(disk.0.join("views"), 1 << 30),
        std::sync::Arc::new(Memory(bytes.clone())),
    )
    .unwrap();
    let (a, b) = (Sha256([1; 32]), Sha256([2; 32]));
    // Reads that go on keep both under way (the build waits for them to pause).
    views.served(a, &content, 0, &bytes[..2 << 20], || "a".into());
    views.served(b, &content, 0, &bytes[..2 << 20], || "b".into());
    assert_eq!(views.state(&a), ViewState::Building);
    assert_eq!(views.state(&b), ViewState::Absent, "no room beside a");
    assert!(logs().contains("promised to views under way"), "{}", logs());
    drop(views);
}
