//! Helpers for real-mount tests: a test store built with the library, a mount guard that
//! unmounts and joins on drop (also on panic), and a log capture.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tensorfs::format::{
    Body, ClassRef, Component, Config, Dtype, Encoding, Header, Location, ObjectRef, Release, Repo,
    Tensor, Tree, Value,
};
use tensorfs::fuse::session::{self, MountConfig, MountHandle};
use tensorfs::lazy::LazyConfig;
use tensorfs::store::Store;

/// Deterministic, non-periodic bytes (xorshift), so a misplaced offset never reads equal bytes.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// A tensor of a test model: its name, dtype, shape and bytes.
pub struct TestTensor {
    pub name: &'static str,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub bytes: Vec<u8>,
}

/// One committed checkpoint of a test store.
pub struct TestCommit {
    pub id: ObjectRef,
    pub header: ObjectRef,
    pub chunks: Vec<ObjectRef>,
    pub tensors: Vec<TestTensor>,
    pub readme: Vec<u8>,
}

/// Stores the header of a one-component checkpoint (a Transformers BertModel) of `tensors` over
/// `chunks`, with `encodings`; returns its object.
fn bert_header(
    store: &Store,
    chunks: Vec<ObjectRef>,
    encodings: Vec<Encoding>,
    tensors: Vec<Tensor>,
) -> ObjectRef {
    let mut config = Config::new();
    config.insert("hidden_size".into(), Value::Uint(1024));
    config.insert("model_type".into(), Value::Text("bert".into()));
    let header = Header {
        format: "cozytensors/1".into(),
        chunks,
        encodings,
        pipeline: None,
        components: vec![Component {
            name: "model".into(),
            class: ClassRef {
                library: "transformers".into(),
                version: "4.46.0".into(),
                name: "BertModel".into(),
            },
            config,
            tensors,
            assets: BTreeMap::new(),
            config_file: None,
        }],
        metadata: Config::new(),
    };
    store.put_bytes(&header.to_cbor().unwrap()).unwrap()
}

/// Stores a one-component checkpoint (a Transformers BertModel) of `tensors` over `chunks`, with
/// `encodings`, as a tree of lane `lane`; returns the commit (the tree's object).
pub fn bert_commit(
    store: &Store,
    lane: Option<&str>,
    chunks: Vec<ObjectRef>,
    encodings: Vec<Encoding>,
    tensors: Vec<Tensor>,
) -> ObjectRef {
    let header_ref = bert_header(store, chunks, encodings, tensors);
    let tree = Tree {
        lane: lane.map(str::to_owned),
        files: BTreeMap::from([("model.cozytensors".to_owned(), header_ref)]),
    };
    store.put_bytes(&tree.to_json()).unwrap()
}

/// 1.5 MiB + 1 MiB + 2000 bytes of F32/F16 tensors in three chunks: `b.weight` starts 1.5 MiB
/// into chunk 0 (2 MiB long) and continues 512 KiB into chunk 1.
pub fn commit(store: &Store, lane: Option<&str>, seed: u64) -> TestCommit {
    let a = noise(1_572_864, seed);
    let b = noise(1 << 20, seed + 1);
    let c = noise(2000, seed + 2);
    let mut chunk0 = a.clone();
    chunk0.extend_from_slice(&b[..524_288]);
    let mut chunk1 = b[524_288..].to_vec();
    chunk1.extend_from_slice(&c);
    let chunks = vec![
        store.put_bytes(&chunk0).unwrap(),
        store.put_bytes(&chunk1).unwrap(),
    ];
    let tensor =
        |name: &'static str, dtype: Dtype, shape: Vec<u64>, bytes: Vec<u8>, chunk, offset| {
            let location = Location {
                chunk,
                offset,
                length: bytes.len() as u64,
            };
            (
                Tensor {
                    key: name.into(),
                    dtype: dtype.clone(),
                    shape: shape.clone(),
                    body: Body::Plain(location),
                },
                TestTensor {
                    name,
                    dtype,
                    shape,
                    bytes,
                },
            )
        };
    let (tensors, expected): (Vec<Tensor>, Vec<TestTensor>) = [
        tensor("a.weight", Dtype::F32, vec![384, 1024], a, 0, 0),
        tensor("b.weight", Dtype::F32, vec![256, 1024], b, 0, 1_572_864),
        tensor("c.bias", Dtype::F16, vec![1000], c, 1, 524_288),
    ]
    .into_iter()
    .unzip();
    let header_ref = bert_header(store, chunks.clone(), vec![], tensors);
    let readme = format!("# test model {seed}\n").into_bytes();
    let files = BTreeMap::from([
        ("model.cozytensors".to_owned(), header_ref),
        ("README.md".to_owned(), store.put_bytes(&readme).unwrap()),
    ]);
    let tree = Tree {
        lane: lane.map(str::to_owned),
        files,
    };
    let id = store.put_bytes(&tree.to_json()).unwrap();
    TestCommit {
        id,
        header: header_ref,
        chunks,
        tensors: expected,
        readme,
    }
}

/// A release of `commits` by lane.
pub fn release(version: &str, lanes: &[(&str, &TestCommit)]) -> Release {
    Release {
        version: version.into(),
        lanes: lanes.iter().map(|(l, c)| (l.to_string(), c.id)).collect(),
    }
}

/// Writes repo `name`.
pub fn set_repo(store: &Store, name: &str, releases: Vec<Release>, commits: Vec<ObjectRef>) {
    store
        .update_repo(name, |_| Repo {
            name: name.into(),
            releases,
            commits,
        })
        .unwrap();
}

/// A mount of a test store; dropping it unmounts (lazily if needed) and joins the session.
pub struct Mounted {
    handle: Option<MountHandle>,
    pub root: PathBuf,
    _dir: tempfile::TempDir,
}

/// Mounts `store` on a new folder; fails the test when the mount does not appear within 5 s.
pub fn mount(store: &Store) -> Mounted {
    mount_with(store, |_| {})
}

/// Mounts `store` on a new folder with the settings `adjust` makes; fails the test when the
/// mount does not appear within 5 s.
pub fn mount_with(store: &Store, adjust: impl FnOnce(&mut MountConfig)) -> Mounted {
    capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let mut config = MountConfig::new(store.root(), &root);
    adjust(&mut config);
    let handle = session::spawn(config).expect("mounts");
    wait_for(|| session::is_mounted(&root), "the mount to appear");
    Mounted {
        handle: Some(handle),
        root,
        _dir: dir,
    }
}

/// A lazy mount of `store` over the endpoint at `url`, whose fetches give up after `deadline`.
pub fn lazy_mount(store: &Store, url: &str, deadline: Duration) -> Mounted {
    mount_with(store, |config| {
        let mut remote = LazyConfig::new(url);
        remote.fetch_deadline = deadline;
        config.remote = Some(remote);
    })
}

/// The errno of a failed call; fails the test when the call succeeded or has no OS error.
pub fn errno(result: std::io::Result<impl Sized>) -> i32 {
    result
        .err()
        .and_then(|e| e.raw_os_error())
        .expect("an OS error")
}

impl Mounted {
    /// A path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Unmounts now, failing the test on error.
    pub fn unmount(mut self) {
        self.handle.take().unwrap().unmount().expect("unmounts");
        assert!(!session::is_mounted(&self.root));
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            if let Err(e) = handle.unmount() {
                eprintln!("unmounting {}: {e}", self.root.display());
            }
        }
        // Never leave a mount behind, whatever happened above.
        if session::is_mounted(&self.root) {
            let _ = session::unmount(&self.root, true);
        }
    }
}

/// Polls `done` for up to 5 s; fails the test when it never holds.
pub fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The names in folder `path`, sorted.
pub fn list(path: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(path)
        .unwrap_or_else(|e| panic!("listing {}: {e}", path.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

static LOGS: OnceLock<LogBuffer> = OnceLock::new();

/// Sends this process's tracing output to a buffer [`logs`] reads.
pub fn capture_logs() {
    LOGS.get_or_init(|| {
        let buffer = LogBuffer::default();
        let writer = buffer.clone();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("tensorfs=info"))
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .init();
        buffer
    });
}

/// Everything logged so far.
pub fn logs() -> String {
    String::from_utf8_lossy(&LOGS.get().expect("capture_logs ran").0.lock().unwrap()).into_owned()
}

/// The readahead window of the mount at `root` (its bdi's `read_ahead_kb`).
pub fn read_ahead_kb(root: &Path) -> u32 {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let device = mountinfo
        .lines()
        .rev()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| Path::new(f[4]) == root)
        .map(|f| f[2].to_owned())
        .expect("the mount is in mountinfo");
    let path = format!("/sys/class/bdi/{device}/read_ahead_kb");
    std::fs::read_to_string(&path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// `statvfs(path)`: (total blocks, block size).
pub fn statvfs(path: &Path) -> (u64, u64) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: statvfs writes into the zeroed struct we own; `c` is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_blocks, st.f_frsize)
}

/// Drops the kernel's cached pages of a mounted file, so the next read reaches the daemon.
pub fn drop_cached_pages(path: &std::path::Path) {
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: advice on a descriptor we own; it changes no memory of ours.
    let rc = unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    assert_eq!(rc, 0);
}

/// The value of extended attribute `name` of `path`, `None` when it has none (or on error).
pub fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: both strings are NUL-terminated; a null buffer of size 0 asks for the size.
    let size = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    if size < 0 {
        return None;
    }
    let mut buf = vec![0u8; size as usize];
    // SAFETY: the buffer is ours and its length is passed.
    let len = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| {
        buf.truncate(len as usize);
        buf
    })
}

/// What the daemon of the mount at `root` says of itself (`user.tensorfs.status`).
pub fn status(root: &Path) -> serde_json::Value {
    let bytes = xattr(root, "user.tensorfs.status").expect("the mount's status");
    serde_json::from_slice(&bytes).expect("the status is JSON")
}
