//! `cozytensors._native`: the native half of the `cozytensors` Python package.
//!
//! For a `.safetensors` file of a TensorFS mount it asks the daemon where a tensor's bytes lie
//! (the extents ioctl, `docs/extents.md`) and hands out the store's chunk blobs with their
//! bytes proven (the store's verification ledger shows the blob unchanged since it was hashed,
//! or it is hashed now, once per process), so the Python side maps or reads them itself and the
//! bytes never cross FUSE. The Python side (`cozytensors/_loader.py`) owns the safetensors API;
//! this module only locates, proves and reads.
//!
//! Errors are `OSError`s with an errno and a message naming the file and tensor (the ioctl's
//! errno, `EIO` for a damaged blob, `EACCES` for a store the caller cannot read).
//!
//! It also carries the format's API over a local store ([`checkpoint`]: a commit's components,
//! configs, assets and tensor reads, decoded or as stored) and the arrays it returns
//! ([`array`], shared through DLPack); `cozytensors/_api.py` is their Python face, and their
//! errors are `Failure(code, detail)`, which it raises as its `Error` family.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PyList};
use tensorfs::extents::ioctl::{self, QueryError};
use tensorfs::format::{ObjectRef, Sha256};
use tensorfs::io::{BlobReader, BlobReaderConfig, ObjectRead, ObjectSource};
use tensorfs::store::Store;

mod array;
mod checkpoint;
#[cfg(feature = "cuda")]
mod device;
mod failure;
mod mounted;

/// Native work done without the GIL, and `fork()`: a child gets a copy of every lock as it
/// was, held by threads it does not have, so a fork while another thread is inside the
/// reader (proving a blob, reading one) would leave the child waiting forever on its next
/// read. Such work passes through this gate ([`detached`]), and `os.fork()` waits, in
/// [`before_fork`] (registered with `os.register_at_fork`), until none is inside and keeps new
/// work out until [`after_fork`].
mod fork_gate {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::time::{Duration, Instant};

    static INSIDE: AtomicUsize = AtomicUsize::new(0);
    static FORKING: AtomicBool = AtomicBool::new(false);

    /// How long a fork waits for work inside; past it, the fork goes on (a read stuck on a
    /// dead disk must not hang the parent too).
    const PATIENCE: Duration = Duration::from_secs(30);

    /// A pass through the gate, held while native work runs.
    pub struct Pass(());

    impl Pass {
        /// Waits while a fork is under way, then enters. Atomics only: a lock could itself be
        /// copied held into the child.
        pub fn enter() -> Pass {
            loop {
                while FORKING.load(SeqCst) {
                    std::thread::sleep(Duration::from_micros(200));
                }
                INSIDE.fetch_add(1, SeqCst);
                if !FORKING.load(SeqCst) {
                    return Pass(());
                }
                INSIDE.fetch_sub(1, SeqCst);
            }
        }
    }

    impl Drop for Pass {
        fn drop(&mut self) {
            INSIDE.fetch_sub(1, SeqCst);
        }
    }

    /// Closes the gate and waits until no work is inside (at most [`PATIENCE`]).
    pub fn close() {
        FORKING.store(true, SeqCst);
        let start = Instant::now();
        while INSIDE.load(SeqCst) > 0 && start.elapsed() < PATIENCE {
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Opens the gate again (in the parent and in the child).
    pub fn open() {
        FORKING.store(false, SeqCst);
    }
}

/// `f` run without the GIL, through the fork gate ([`fork_gate`]).
pub(crate) fn detached<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    py.detach(|| {
        let _pass = fork_gate::Pass::enter();
        f()
    })
}

/// Called by `os.fork()` before it forks (with the GIL): waits until no native work is
/// under way and keeps new work from starting, so the child's copies of the reader's locks
/// are free.
#[pyfunction]
fn before_fork() {
    fork_gate::close();
}

/// Called by `os.fork()` after it forks, in the parent and in the child: work may start again.
#[pyfunction]
fn after_fork() {
    fork_gate::open();
}

/// One reader per store root for the life of the process: each blob is proven once.
static READERS: Mutex<Option<HashMap<PathBuf, Arc<BlobReader>>>> = Mutex::new(None);

fn os_error(errno: i32, message: String) -> PyErr {
    PyOSError::new_err((errno, message))
}

/// The errno of a read's error: the OS error's own, also where the reader wrapped it in an
/// error naming the blob (`EMFILE` stays `EMFILE`); else by kind (a damaged blob is `EIO`).
fn errno_of(e: &io::Error) -> i32 {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = cause {
        cause = match error.downcast_ref::<io::Error>() {
            Some(io) => match io.raw_os_error() {
                Some(code) => return code,
                // An `io::Error`'s `source()` skips its inner error: step into that.
                None => io
                    .get_ref()
                    .map(|inner| inner as &(dyn std::error::Error + 'static)),
            },
            None => error.source(),
        };
    }
    match e.kind() {
        io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => libc::EIO,
        io::ErrorKind::PermissionDenied => libc::EACCES,
        io::ErrorKind::NotFound => libc::ENOENT,
        _ => libc::EIO,
    }
}

fn io_error(what: &str, e: &io::Error) -> PyErr {
    let errno = errno_of(e);
    os_error(errno, format!("{what}: {e}"))
}

/// Most blob descriptors a reader keeps open (the daemon's keeps 1024). A loader reads blob
/// after blob, and shares the process's descriptor limit (1024 by default) with everything
/// else the program opens; a blob let go is opened again and proven by the stamp the reader
/// noted, without hashing.
const OPEN_BLOBS: usize = 64;

/// The reader of the store at `root`.
fn reader(root: &Path) -> PyResult<Arc<BlobReader>> {
    let mut readers = READERS.lock().unwrap_or_else(|p| p.into_inner());
    let readers = readers.get_or_insert_with(HashMap::new);
    if let Some(reader) = readers.get(root) {
        return Ok(reader.clone());
    }
    let store = Store::open_existing(root).map_err(|e| {
        let e = io::Error::other(e);
        os_error(errno_of(&e), format!("the store {}: {e}", root.display()))
    })?;
    let config = BlobReaderConfig {
        max_open_files: OPEN_BLOBS,
        ..BlobReaderConfig::default()
    };
    let reader = Arc::new(BlobReader::new(store, config));
    readers.insert(root.to_path_buf(), reader.clone());
    Ok(reader)
}

fn object(sha256: &str, length: u64) -> PyResult<ObjectRef> {
    let sha256: Sha256 = sha256
        .parse()
        .map_err(|e| os_error(libc::EINVAL, format!("blob {sha256:?}: {e}")))?;
    Ok(ObjectRef { sha256, length })
}

/// Where the tensor `name` of the mounted file open as descriptor `fd` (named `path` in
/// errors) lies, as a dict: `key`, `dtype`, `shape`,
/// `encoding` (`None`, or `(scheme, params JSON)`), `store` (the store's root; `None` when no
/// part has bytes), and `parts`, each a dict of `role`, `dtype`, `shape`, `begin` and `end`
/// (absolute offsets in the file) and `extents`, a list of `(blob sha256 hex, blob length,
/// offset in the blob, length, offset in the file)` in file order. `None` when the file is not
/// a TensorFS file (the ioctl is `ENOTTY`, as on any other filesystem).
///
/// # Errors
/// `OSError` with the ioctl's errno (`ENOENT`: no such tensor; `ENODATA`: decoded in this
/// view; `EPROTO`: a daemon of another ABI), naming the file and tensor.
///
/// The caller keeps one descriptor open for all its queries: each open of a mounted file is a
/// request to the daemon, which places a hold for it.
#[pyfunction]
fn locate(py: Python<'_>, fd: i32, path: &str, name: &str) -> PyResult<Option<Py<PyDict>>> {
    // SAFETY: borrowed for the call; the caller owns and closes `fd`.
    let file = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    let located = match py.detach(|| ioctl::query(&file, path, name)) {
        Ok(located) => located,
        Err(QueryError::Errno { errno, .. }) if errno == libc::ENOTTY => return Ok(None),
        Err(e @ QueryError::Errno { errno, .. }) => return Err(os_error(errno, e.to_string())),
        Err(e) => return Err(os_error(libc::EINVAL, e.to_string())),
    };
    let out = PyDict::new(py);
    out.set_item("key", &located.key)?;
    out.set_item("dtype", located.dtype.name())?;
    out.set_item("shape", &located.shape)?;
    match &located.encoding {
        None => out.set_item("encoding", py.None())?,
        Some(e) => out.set_item("encoding", (&e.scheme, &e.params))?,
    }
    // A blob is `<root>/blobs/<aa>/<bb>/<sha256>`.
    let store = located
        .extents
        .first()
        .and_then(|e| e.path.ancestors().nth(4))
        .map(Path::to_path_buf);
    out.set_item("store", store)?;
    let parts = PyList::empty(py);
    for (i, part) in located.parts.iter().enumerate() {
        let p = PyDict::new(py);
        p.set_item("role", &part.role)?;
        p.set_item("dtype", part.dtype.name())?;
        p.set_item("shape", &part.shape)?;
        p.set_item("begin", part.file_range.start)?;
        p.set_item("end", part.file_range.end)?;
        let extents: Vec<(String, u64, u64, u64, u64)> = located
            .part_extents(i)
            .iter()
            .map(|e| {
                (
                    e.blob.sha256.hex(),
                    e.blob.length,
                    e.offset,
                    e.length,
                    e.file_offset,
                )
            })
            .collect();
        p.set_item("extents", extents)?;
        parts.append(p)?;
    }
    out.set_item("parts", parts)?;
    Ok(Some(out.unbind()))
}

/// Every tensor of the mounted file open as descriptor `fd` (named `path` in errors) and where
/// its bytes lie, in one query (the extents ioctl's ABI 2): the daemon's JSON text
/// (`docs/extents.md`), which also keeps the file's blobs present while `fd` stays open.
/// `None` when the file is not a TensorFS file or its daemon speaks only ABI 1 (`ENOTTY`).
///
/// # Errors
/// `OSError` with the ioctl's errno, naming the file.
#[pyfunction]
fn describe(py: Python<'_>, fd: i32, path: &str) -> PyResult<Option<String>> {
    // SAFETY: borrowed for the call; the caller owns and closes `fd`.
    let file = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    match py.detach(|| ioctl::query_file(&file, path)) {
        Ok(text) => String::from_utf8(text)
            .map(Some)
            .map_err(|_| os_error(libc::EIO, format!("{path}: the description is not UTF-8"))),
        Err(e) => match e.errno() {
            Some(libc::ENOTTY) => Ok(None),
            Some(errno) => Err(os_error(errno, e.to_string())),
            None => Err(os_error(libc::EIO, e.to_string())),
        },
    }
}

/// A private, copy-on-write mapping (`MAP_PRIVATE`, readable and writable: a write makes the
/// process's own copy of a page, never touching a blob) of blob ranges laid end to end: a
/// whole blob, or a tensor's ranges in the blobs of the chunks it spans, stitched into one
/// range of memory. It keeps no descriptor: a model of thousands of blobs stays within the
/// descriptor limit, as safetensors' one mapping of its file does. Unmapped when dropped;
/// whoever makes a buffer over `address` keeps this object alive as long as the buffer.
#[pyclass(frozen)]
struct BlobMap {
    /// The first mapped byte: page-aligned, at most a page before `address`.
    base: usize,
    /// Bytes mapped from `base`: whole pages.
    span: usize,
    address: usize,
    length: usize,
}

#[pymethods]
impl BlobMap {
    /// Where the ranges' bytes start.
    #[getter]
    fn address(&self) -> usize {
        self.address
    }

    /// Their length in bytes.
    #[getter]
    fn length(&self) -> usize {
        self.length
    }
}

impl Drop for BlobMap {
    fn drop(&mut self) {
        // SAFETY: the pages this object mapped; nothing uses them once the object goes
        // (buffers over them hold the object).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.span) };
    }
}

/// Where each of `lengths` (bytes, in order, the first starting `lead` bytes into a page)
/// lies from the page where the first starts, when laid end to end, if each range after the
/// first can be mapped there: it starts on a page boundary (`offsets`, in its blob) where the
/// ranges before it end. `None` when one cannot, or a range is empty.
fn stitch(lead: usize, offsets: &[u64], lengths: &[usize], page: usize) -> Option<Vec<usize>> {
    let mut at = Vec::with_capacity(lengths.len());
    let mut end = lead;
    for (k, (&offset, &length)) in offsets.iter().zip(lengths).enumerate() {
        if length == 0
            || (k > 0 && (!end.is_multiple_of(page) || !offset.is_multiple_of(page as u64)))
        {
            return None;
        }
        at.push(if k == 0 { 0 } else { end });
        end = end.checked_add(length)?;
    }
    Some(at)
}

/// A range of a blob to map: `(sha256 hex, blob length, offset, length, stamp)`, the stamp
/// as [`proven_blob`] takes it.
type Extent = (String, u64, u64, u64, Option<[i64; 5]>);

/// A [`BlobMap`] of `extents` of the store at `store`, each `(blob sha256 hex, blob length,
/// offset, length, stamp)`: the ranges `[offset, offset + length)` of the blobs, laid end to
/// end in that order, each blob's bytes proven first ([`proven_blob`], with the daemon's
/// `stamp` when there is one). One extent of a whole blob maps the blob; several map a
/// tensor that spans chunks, stitched, as it lies in the file. `None` when the ranges cannot
/// be stitched: a range after the first does not start on a page boundary of its blob, or one
/// before it does not end on a page boundary (the store's chunks split a large tensor every
/// 64 MiB from its first byte, so its ranges can; spec §10). `what` names the file and tensor
/// in errors.
///
/// # Errors
/// As [`proven_blob`]; `EINVAL` for an empty range or one past its blob's length, naming the
/// blob; the `mmap` call's errno (`ENOMEM`), naming the blob.
#[pyfunction]
fn map_extents(
    py: Python<'_>,
    store: PathBuf,
    extents: Vec<Extent>,
    what: &str,
) -> PyResult<Option<BlobMap>> {
    let mut lengths = Vec::with_capacity(extents.len());
    for (sha256, blob_length, offset, length) in extents.iter().map(|e| (&e.0, e.1, e.2, e.3)) {
        let fits = offset
            .checked_add(length)
            .is_some_and(|end| end <= blob_length);
        match usize::try_from(length) {
            Ok(l) if l > 0 && fits => lengths.push(l),
            _ => {
                return Err(os_error(
                    libc::EINVAL,
                    format!(
                        "{what}: bytes {offset}..+{length} of blob {sha256} ({blob_length} bytes) \
                         cannot be mapped"
                    ),
                ))
            }
        }
    }
    let page = tensorfs::extents::stage::page_size();
    let Some(first) = extents.first() else {
        return Ok(None);
    };
    let lead = (first.2 % page as u64) as usize;
    let offsets: Vec<u64> = extents.iter().map(|e| e.2).collect();
    let Some(at) = stitch(lead, &offsets, &lengths, page) else {
        return Ok(None);
    };
    let length: usize = lengths.iter().sum();
    let Some(span) = (lead + length).checked_next_multiple_of(page) else {
        return Ok(None);
    };
    // Each blob is proven and mapped in turn, its descriptor closed before the next opens:
    // a tensor of a thousand chunks keeps no thousand descriptors at once.
    let map_at = |address: usize, k: usize| {
        let (sha256, blob_length, offset, _, stamp) = &extents[k];
        let file = proven_blob(py, &store, &object(sha256, *blob_length)?, what, *stamp)?;
        let skip = if k == 0 { lead } else { 0 };
        let bytes = (skip + lengths[k]).next_multiple_of(page);
        let fixed = if address == 0 { 0 } else { libc::MAP_FIXED };
        // SAFETY: with `MAP_FIXED`, pages of this function's reservation alone are replaced:
        // `address + bytes` stays within it (the ranges end to end, the last rounded up to its
        // page); else the kernel picks the address. The offset is page-aligned (`stitch`).
        // The last page may run past the blob's end: those bytes read as zeros, and they are
        // no tensor's. The descriptor may close after the call: the mapping keeps the file.
        let mapped = unsafe {
            libc::mmap(
                address as *mut libc::c_void,
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | fixed,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                (offset - skip as u64) as libc::off_t,
            )
        };
        if mapped == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io_error(&format!("{what}: mapping blob {sha256}"), &e));
        }
        Ok(mapped as usize)
    };
    if extents.len() == 1 {
        let base = map_at(0, 0)?;
        return Ok(Some(BlobMap {
            base,
            span,
            address: base + lead,
            length,
        }));
    }
    // SAFETY: a new reservation of `span` bytes, no access, no memory committed; the kernel
    // picks the address. Only this function maps into it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        return Err(io_error(&format!("{what}: mapping {length} bytes"), &e));
    }
    // Owns the reservation from here: an error below (a blob refused, a mapping failed)
    // unmaps all of it.
    let map = BlobMap {
        base: base as usize,
        span,
        address: base as usize + lead,
        length,
    };
    for (k, &at) in at.iter().enumerate() {
        map_at(map.base + at, k)?;
    }
    Ok(Some(map))
}

/// The blob of `object` in the store at `store`, its bytes proven: by `stamp` (`[st_dev,
/// st_ino, st_size, mtime ns, ctime ns]`, the daemon's proof in its whole-file answer) when
/// the blob's own `fstat` matches it, else by the store's ledger or by hashing (once per
/// process). `what` names the file and tensor in errors.
///
/// # Errors
/// `OSError`: the store or blob cannot be read (`EACCES`, `ENOENT`), or the blob is damaged
/// (`EIO`, saying what to run).
fn proven_blob(
    py: Python<'_>,
    store: &Path,
    object: &ObjectRef,
    what: &str,
    stamp: Option<[i64; 5]>,
) -> PyResult<File> {
    if let Some(stamp) = stamp {
        let path = store.join(object.blob_path());
        // Non-blocking: a FIFO in a blob's place would block the open, with the GIL held, for
        // as long as no one writes to it. Only a regular file can be the stamped blob; others
        // go to the reader, which names what it found.
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path);
        if let Ok(file) = opened {
            if let Ok(meta) = file.metadata() {
                let found = tensorfs::store::verified::Stamp::of(&meta).fields();
                if meta.is_file() && found.iter().zip(stamp).all(|(&a, b)| a == i128::from(b)) {
                    return Ok(file);
                }
            }
        }
    }
    let reader = reader(store)?;
    detached(py, || reader.proven_file(object)).map_err(|e| io_error(what, &e))
}

/// Readies the `length` bytes at `address`, in a mapping of a blob, for reading, and returns
/// before anything there is read by the caller: a hint given before a tensor over the range
/// is built. Whether the range is cached is asked of its first and last bytes' pages
/// (`mincore`, which for a file's mapping looks in the page cache; two system calls, not a
/// walk of the range):
/// - cached: the range's page-table entries are made in one call (`MADV_POPULATE_READ`,
///   Linux 5.14+), so the reads that follow take no page faults;
/// - not cached: the range is read into the page cache in the background (`MADV_WILLNEED`),
///   so a cold tensor is read in large requests the disk serves together, while the caller
///   copies what has arrived, instead of fault by fault from a read-ahead window that starts
///   small in every blob. One such call reads at most the device's read-ahead window
///   (`read_ahead_kb`, or its largest request: `force_page_cache_ra`), so the range is
///   hinted [`AHEAD_STEP`] at a time.
///
/// Nothing at `address` is written: an address that is not mapped makes the calls fail, and
/// failures are ignored (an older kernel's `EINVAL` too), since it is a hint. The kernel
/// answers "cached" for a file the caller could not open for writing and does not own (Linux
/// 5.0+, `mincore(2)`): a store shared read-only then has its cold ranges read as the page
/// tables are made, as its faults would read them.
#[pyfunction]
fn will_need(address: usize, length: usize) {
    let page = tensorfs::extents::stage::page_size();
    let start = address & !(page - 1);
    let span = length.saturating_add(address - start);
    let cached = |at: usize| {
        let mut resident = 0u8;
        // SAFETY: one page is asked about, so the kernel writes one byte, into `resident`;
        // the page is only looked up, never touched.
        let asked = unsafe { libc::mincore(at as *mut libc::c_void, page, &mut resident) };
        (asked == 0).then_some(resident & 1 == 1)
    };
    let last = start.saturating_add(span.saturating_sub(1)) & !(page - 1);
    let (advice, step) = match (cached(start), cached(last)) {
        (Some(true), Some(true)) => (libc::MADV_POPULATE_READ, span),
        (Some(_), Some(_)) => (libc::MADV_WILLNEED, AHEAD_STEP),
        _ => return,
    };
    let end = start.saturating_add(span);
    let mut at = start;
    while at < end {
        let length = step.min(end - at);
        // SAFETY: neither advice changes the range's contents: MADV_WILLNEED starts reads
        // into the page cache, MADV_POPULATE_READ maps the range's pages as a read would.
        unsafe { libc::madvise(at as *mut libc::c_void, length, advice) };
        at += length;
    }
}

/// How much of a cold range one `MADV_WILLNEED` asks for: within what the kernel reads for
/// one call (the larger of the device's read-ahead window and its largest request, commonly
/// 512 KiB or more), so that no part of the range is left out. Measured
/// (2-core VM, virtio disk with an 8 MiB window, 1 GiB file of 64 tensors loaded cold):
/// 0.66 s against 0.83 s with one call per tensor, which read the first 8 MiB of each.
const AHEAD_STEP: usize = 512 << 10;

/// The bytes of `extents` (each `(blob sha256 hex, blob length, offset, length)`) of the store
/// at `store`, concatenated into a new `bytearray` of `length` bytes: blobs proven first, and
/// proven again when one changed while it was read. `what` names the file and tensor in errors.
///
/// # Errors
/// `OSError` as [`open_blob`]; `EINVAL` when the extents do not add up to `length`.
#[pyfunction]
fn read(
    py: Python<'_>,
    store: PathBuf,
    extents: Vec<(String, u64, u64, u64)>,
    length: usize,
    what: &str,
) -> PyResult<Py<PyByteArray>> {
    let total: u64 = extents.iter().map(|e| e.3).sum();
    if total != length as u64 {
        return Err(os_error(
            libc::EINVAL,
            format!("{what}: extents of {total} bytes for {length}"),
        ));
    }
    let objects: Vec<(ObjectRef, u64, u64)> = extents
        .iter()
        .map(|(sha, blob_length, offset, len)| Ok((object(sha, *blob_length)?, *offset, *len)))
        .collect::<PyResult<_>>()?;
    let reader = reader(&store)?;
    let mut failed: Option<io::Error> = None;
    let bytes = PyByteArray::new_with(py, length, |buf| {
        let mut reads = Vec::with_capacity(objects.len());
        let mut rest = buf;
        for (object, offset, len) in &objects {
            let (head, tail) = rest.split_at_mut(*len as usize);
            reads.push(ObjectRead {
                object,
                offset: *offset,
                buf: head,
            });
            rest = tail;
        }
        // The bytearray is not yet visible to Python: filling it without the GIL is safe.
        failed = detached(py, || reader.read_objects(&mut reads)).err();
        Ok(())
    })?;
    match failed {
        Some(e) => Err(io_error(what, &e)),
        None => Ok(bytes.unbind()),
    }
}

/// Closes the descriptors that this process's reader of the store at `store` keeps of the
/// blobs `sha256s` (hex) since it proved them, and with them their shared locks, which keep a
/// collection (`tensorfs gc`) from sweeping a blob: a handle calls it when it closes. A later
/// read opens the blob again and proves it by the stamp the reader noted, without hashing.
/// Blobs it does not keep open, and a store it has no reader of, are left alone.
#[pyfunction]
fn release(store: PathBuf, sha256s: Vec<String>) {
    let readers = READERS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(reader) = readers.as_ref().and_then(|r| r.get(&store)) {
        let digests: Vec<Sha256> = sha256s.iter().filter_map(|s| s.parse().ok()).collect();
        reader.close(&digests);
    }
}

/// The store the `tensorfs` command uses when none is named (`tensorfs::store::default_root`:
/// `$TENSORFS_HOME`, else `~/.cache/tensorfs`); `None` when neither `TENSORFS_HOME` nor `HOME`
/// is set.
#[pyfunction]
fn default_store() -> Option<PathBuf> {
    tensorfs::store::default_root()
}

/// The mount points of the TensorFS mounts this process sees (`/proc/self/mountinfo`, a
/// mount point mounted over counting only when its topmost mount is ours).
#[pyfunction]
fn mounts() -> Vec<PathBuf> {
    tensorfs::fuse::session::mounts()
}

/// The module `cozytensors._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<array::Array>()?;
    m.add_class::<checkpoint::Checkpoint>()?;
    m.add("Failure", m.py().get_type::<failure::Failure>())?;
    m.add_function(wrap_pyfunction!(checkpoint::open_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(default_store, m)?)?;
    m.add_function(wrap_pyfunction!(mounts, m)?)?;
    m.add_function(wrap_pyfunction!(describe, m)?)?;
    m.add_function(wrap_pyfunction!(mounted::header, m)?)?;
    m.add_function(wrap_pyfunction!(mounted::index, m)?)?;
    m.add_function(wrap_pyfunction!(mounted::is_fuse, m)?)?;
    m.add_function(wrap_pyfunction!(locate, m)?)?;
    m.add_class::<BlobMap>()?;
    m.add_function(wrap_pyfunction!(map_extents, m)?)?;
    m.add_function(wrap_pyfunction!(read, m)?)?;
    m.add_function(wrap_pyfunction!(will_need, m)?)?;
    m.add_function(wrap_pyfunction!(release, m)?)?;
    m.add_function(wrap_pyfunction!(before_fork, m)?)?;
    m.add_function(wrap_pyfunction!(after_fork, m)?)?;
    #[cfg(feature = "cuda")]
    m.add_function(wrap_pyfunction!(device::to_device, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_stitch_where_they_meet_on_page_boundaries() {
        const PAGE: usize = 4096;
        const CHUNK: usize = 64 << 20;
        // A large tensor as the store splits it: whole chunks from offset 0, then the rest.
        assert_eq!(
            stitch(0, &[0, 0, 0], &[CHUNK, CHUNK, 123], PAGE),
            Some(vec![0, CHUNK, 2 * CHUNK])
        );
        // A first range starting inside a page, ending on a boundary.
        assert_eq!(
            stitch(100, &[8292, 0], &[PAGE - 100, 5], PAGE),
            Some(vec![0, PAGE])
        );
        // One range: always.
        assert_eq!(stitch(7, &[7], &[10], PAGE), Some(vec![0]));
        // A range ending inside a page, a later range starting inside one, an empty range.
        assert_eq!(stitch(0, &[0, 0], &[PAGE + 1, 5], PAGE), None);
        assert_eq!(stitch(0, &[0, 512], &[PAGE, 5], PAGE), None);
        assert_eq!(stitch(0, &[0, 0], &[PAGE, 0], PAGE), None);
        // Lengths that overflow the address space.
        assert_eq!(stitch(PAGE - 1, &[4095, 0], &[usize::MAX, 1], PAGE), None);
    }

    #[test]
    fn a_wrapped_os_error_keeps_its_errno() {
        let wrapped = |kind| io::Error::new(kind, "blob ab…: Permission denied (os error 13)");
        assert_eq!(
            errno_of(&wrapped(io::ErrorKind::PermissionDenied)),
            libc::EACCES
        );
        assert_eq!(errno_of(&wrapped(io::ErrorKind::NotFound)), libc::ENOENT);
        assert_eq!(errno_of(&wrapped(io::ErrorKind::InvalidData)), libc::EIO);
        assert_eq!(
            errno_of(&io::Error::from_raw_os_error(libc::EROFS)),
            libc::EROFS
        );
    }

    /// The store's errors name the blob and keep the OS error as their source: a reader out
    /// of descriptors says `EMFILE`, not `EIO`.
    #[test]
    fn an_os_error_under_the_stores_own_error_is_found() {
        #[derive(Debug)]
        struct Naming(io::Error);
        impl std::fmt::Display for Naming {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "open blobs/ab/cd/abcd: {}", self.0)
            }
        }
        impl std::error::Error for Naming {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let emfile = io::Error::other(Naming(io::Error::from_raw_os_error(libc::EMFILE)));
        assert_eq!(errno_of(&emfile), libc::EMFILE);
        let plain = io::Error::other(Naming(io::Error::other("no errno")));
        assert_eq!(errno_of(&plain), libc::EIO);
    }
}
