//! Chunk I/O backends: how byte ranges of blobs reach memory.
//!
//! Three ways to read, behind one call ([`read`]):
//! - [`Backend::Pread`]: positioned reads (`pread`), several requests on the thread pool;
//! - [`Backend::Mmap`]: a copy out of a read-only mapping of the blob;
//! - [`Backend::Uring`]: one io_uring submission for a whole batch of requests, adjacent ranges
//!   of one blob coalesced into one vectored read into the caller's memory;
//! - [`Backend::UringDirect`]: io_uring with O_DIRECT, each range's aligned superset read into
//!   registered, page-aligned bounce buffers (fixed-buffer reads), then copied out.
//!
//! [`Backend::Auto`] picks per batch by size and cache state (docs/io.md gives the
//! measurements behind it): a batch of few or large ranges goes to `pread`, whose readahead
//! streams them; in a batch of many small ranges, each first tries a non-blocking read
//! (`preadv2` with `RWF_NOWAIT`), which copies what the page cache holds and never waits for
//! the disk, and what remains cold goes to io_uring in one submission. Neither mmap (fastest in copies, but a
//! truncated blob would kill the reader with SIGBUS, and mapped chunks count in the daemon's
//! memory) nor O_DIRECT (five times slower on the virtual disks measured) is chosen
//! automatically; `TENSORFS_IO` selects any backend.
//!
//! Every backend fills every byte of every request or fails: a short read is continued, and a
//! read past the blob's end is `UnexpectedEof` naming the blob.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::OnceLock;

use rayon::prelude::*;

/// How chunk bytes are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// Positioned reads; a batch on the thread pool.
    Pread,
    /// Copies from a read-only mapping of each blob.
    Mmap,
    /// io_uring: a batch in one submission, adjacent ranges of a blob as one vectored read.
    Uring,
    /// io_uring with O_DIRECT: each range's aligned superset into registered bounce buffers,
    /// bypassing the page cache (falls back to buffered reads where O_DIRECT is refused).
    UringDirect,
    /// Few or large ranges by `pread`; many small ones by a non-blocking read of what the
    /// page cache holds, the rest by io_uring (docs/io.md).
    #[default]
    Auto,
}

impl FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Backend, String> {
        match s {
            "pread" => Ok(Backend::Pread),
            "mmap" => Ok(Backend::Mmap),
            "uring" | "io_uring" => Ok(Backend::Uring),
            "uring-direct" => Ok(Backend::UringDirect),
            "auto" => Ok(Backend::Auto),
            other => Err(format!(
                "{other:?} is not an I/O backend (pread, mmap, uring, uring-direct, auto)"
            )),
        }
    }
}

impl Backend {
    /// The backend `TENSORFS_IO` names (`pread`, `mmap`, `uring`, `auto`), else `Auto`.
    ///
    /// # Errors
    /// The variable names no backend.
    pub fn from_env() -> Result<Backend, String> {
        match std::env::var("TENSORFS_IO") {
            Ok(v) if !v.is_empty() => v.parse().map_err(|e| format!("TENSORFS_IO: {e}")),
            _ => Ok(Backend::Auto),
        }
    }

    /// Every concrete backend (for tests and benchmarks).
    pub const ALL: [Backend; 5] = [
        Backend::Pread,
        Backend::Mmap,
        Backend::Uring,
        Backend::UringDirect,
        Backend::Auto,
    ];
}

/// O_DIRECT alignment of offsets, lengths and buffers.
const ALIGN: usize = 4096;

/// Bounce buffers per ring, and their size.
const BOUNCE_COUNT: usize = 4;
const BOUNCE_BYTES: usize = 1 << 20;

/// Requests a batch must hold, and their average size, before it is spread over the thread
/// pool.
const PARALLEL_MIN: usize = 4;
const PARALLEL_MIN_BYTES: usize = 64 << 10;

/// An open blob: its descriptor, and when first needed an O_DIRECT descriptor and a mapping.
#[derive(Debug)]
pub struct Blob {
    file: File,
    path: PathBuf,
    length: u64,
    direct: OnceLock<Option<File>>,
    map: OnceLock<Option<memmap2::Mmap>>,
}

impl Blob {
    /// A blob of `length` bytes open as `file`, at `path` (for errors and O_DIRECT).
    pub fn new(file: File, path: PathBuf, length: u64) -> Blob {
        Blob {
            file,
            path,
            length,
            direct: OnceLock::new(),
            map: OnceLock::new(),
        }
    }

    /// The buffered descriptor.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The blob's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An O_DIRECT descriptor, if the filesystem takes one.
    fn direct(&self) -> Option<&File> {
        self.direct
            .get_or_init(|| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&self.path)
                    .ok()
            })
            .as_ref()
    }

    /// A read-only mapping of the blob, if it maps.
    fn map(&self) -> Option<&memmap2::Mmap> {
        self.map
            .get_or_init(|| {
                // SAFETY: blobs are read-only objects that are never written in place once
                // admitted (a repair unlinks and replaces them); callers check the inode stamp
                // after reading, so changed bytes are never served.
                unsafe { memmap2::Mmap::map(&self.file) }.ok()
            })
            .as_ref()
    }

    fn past_end(&self, offset: u64, len: usize) -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "{}: read of {len} bytes at {offset} is past its end ({} bytes)",
                self.path.display(),
                self.length
            ),
        )
    }
}

/// One range to read: `buf.len()` bytes of `blob` from `offset`.
pub struct Request<'a> {
    /// The blob.
    pub blob: &'a Blob,
    /// Offset in the blob.
    pub offset: u64,
    /// Where the bytes go; filled whole.
    pub buf: &'a mut [u8],
}

/// Fills every request's buffer by `backend`.
///
/// # Errors
/// A read fails, or a range lies past its blob's end (`UnexpectedEof`, naming the blob).
pub fn read(backend: Backend, requests: &mut [Request<'_>]) -> io::Result<()> {
    for r in requests.iter() {
        let end = r.offset.checked_add(r.buf.len() as u64);
        if end.is_none_or(|end| end > r.blob.length) {
            return Err(r.blob.past_end(r.offset, r.buf.len()));
        }
    }
    match backend {
        Backend::Pread => read_pread(requests),
        Backend::Mmap => read_mmap(requests),
        Backend::Uring => read_uring(requests, false),
        Backend::UringDirect => read_uring(requests, true),
        Backend::Auto => read_auto(requests),
    }
}

/// Whether a batch is worth spreading over the thread pool: several requests, large enough
/// that a copy outweighs handing it to another thread.
fn parallel(requests: &[Request<'_>]) -> bool {
    let bytes: usize = requests.iter().map(|r| r.buf.len()).sum();
    requests.len() >= PARALLEL_MIN && bytes / requests.len() >= PARALLEL_MIN_BYTES
}

fn read_pread(requests: &mut [Request<'_>]) -> io::Result<()> {
    if parallel(requests) {
        requests
            .par_iter_mut()
            .try_for_each(|r| pread_all(r.blob, r.offset, r.buf))
    } else {
        requests
            .iter_mut()
            .try_for_each(|r| pread_all(r.blob, r.offset, r.buf))
    }
}

fn pread_all(blob: &Blob, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    blob.file
        .read_exact_at(buf, offset)
        .map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => blob.past_end(offset, buf.len()),
            _ => io::Error::new(e.kind(), format!("{}: {e}", blob.path.display())),
        })
}

fn read_mmap(requests: &mut [Request<'_>]) -> io::Result<()> {
    for r in requests.iter_mut() {
        match r.blob.map() {
            Some(map) => {
                let from = r.offset as usize;
                let bytes = map
                    .get(from..from + r.buf.len())
                    .ok_or_else(|| r.blob.past_end(r.offset, r.buf.len()))?;
                r.buf.copy_from_slice(bytes);
            }
            None => pread_all(r.blob, r.offset, r.buf)?,
        }
    }
    Ok(())
}

/// Page-cache hits without waiting, then io_uring for what is left; a batch that io_uring would
/// not take even cold goes to `pread` without the probe.
fn read_auto(requests: &mut [Request<'_>]) -> io::Result<()> {
    if !uring_worthy(requests) {
        // A non-blocking read that misses starts readahead it cannot wait for, and the
        // blocking read after it streamed 0.7–0.8× as fast as `pread` alone (docs/io.md); on a
        // hit, `pread` makes the same copy.
        return read_pread(requests);
    }
    let cached = |r: &mut Request<'_>| read_cached(r.blob, r.offset, r.buf);
    let done: Vec<usize> = if parallel(requests) {
        requests
            .par_iter_mut()
            .map(cached)
            .collect::<io::Result<_>>()?
    } else {
        requests.iter_mut().map(cached).collect::<io::Result<_>>()?
    };
    let cold = requests.iter().zip(&done).any(|(r, &d)| d < r.buf.len());
    if !cold {
        return Ok(());
    }
    let mut rest: Vec<Request<'_>> = requests
        .iter_mut()
        .zip(&done)
        .filter(|(r, &d)| d < r.buf.len())
        .map(|(r, &d)| Request {
            blob: r.blob,
            offset: r.offset + d as u64,
            buf: &mut r.buf[d..],
        })
        .collect();
    if uring_worthy(&rest) {
        read_uring(&mut rest, false)
    } else {
        read_pread(&mut rest)
    }
}

/// Whether cold `requests` go to io_uring: many small ranges, which it puts before the device
/// at once (larger ranges stream as fast through `pread` and its readahead).
fn uring_worthy(requests: &[Request<'_>]) -> bool {
    let bytes: usize = requests.iter().map(|r| r.buf.len()).sum();
    requests.len() >= URING_MIN_REQUESTS && bytes / requests.len() < URING_MAX_AVERAGE
}

/// [`Backend::Auto`] sends cold requests to io_uring when a batch holds at least this many …
const URING_MIN_REQUESTS: usize = 4;
/// … of less than this many bytes on average.
const URING_MAX_AVERAGE: usize = 128 << 10;

/// Copies what the page cache holds of the range, never waiting for the disk; returns how many
/// bytes from the start it filled.
fn read_cached(blob: &Blob, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let iov = libc::iovec {
            iov_base: buf[done..].as_mut_ptr().cast(),
            iov_len: buf.len() - done,
        };
        // SAFETY: one valid iovec over memory we own mutably; the descriptor is open.
        let n = unsafe {
            libc::preadv2(
                blob.file.as_raw_fd(),
                &iov,
                1,
                (offset + done as u64) as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(blob.past_end(offset + done as u64, buf.len() - done)),
            _ => {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EOPNOTSUPP) => Ok(done),
                    Some(libc::EINTR) => continue,
                    _ => Err(io::Error::new(
                        e.kind(),
                        format!("{}: {e}", blob.path.display()),
                    )),
                };
            }
        }
    }
    Ok(done)
}

/// A page-aligned buffer.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, ALIGN).expect("a valid layout");
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory for {len} bytes");
        Aligned { ptr, len }
    }

    fn slice(&self, len: usize) -> &[u8] {
        // SAFETY: `len` ≤ the allocation, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, len.min(self.len)) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, ALIGN).expect("a valid layout");
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

/// A thread's ring and its registered bounce buffers.
struct Ring {
    ring: io_uring::IoUring,
    bounce: Vec<Aligned>,
    registered: bool,
}

thread_local! {
    static RING: RefCell<Option<Ring>> = const { RefCell::new(None) };
}

/// Largest read that adjacent ranges are coalesced into: larger spans go as several reads,
/// which a cold page cache serves in parallel.
const COALESCE_MAX_BYTES: usize = 1 << 20;

/// Buffered reads of at least this many bytes are announced with `POSIX_FADV_WILLNEED` first.
const WILLNEED_MIN_BYTES: usize = 512 << 10;

/// Asks the kernel to start reading `len` bytes of `blob` from `offset` into the page cache,
/// without waiting. io_uring serves a buffered read that misses the page cache a readahead
/// window at a time, while the advice queues the whole range to the device at once: cold
/// batches of 1 MiB requests went from 0.6× to 1.0× `pread` on a thread pool (docs/io.md).
/// Advice is a hint: a failure changes nothing but speed, so it is not reported.
fn will_need(blob: &Blob, offset: u64, len: usize) {
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return;
    };
    // SAFETY: advice on an open descriptor; no memory is passed.
    unsafe {
        libc::posix_fadvise(
            blob.file.as_raw_fd(),
            offset,
            len,
            libc::POSIX_FADV_WILLNEED,
        )
    };
}

/// Ring entries: the most reads in flight per submission.
const RING_ENTRIES: u32 = 64;

impl Ring {
    fn new() -> io::Result<Ring> {
        let ring = io_uring::IoUring::new(RING_ENTRIES)?;
        let bounce: Vec<Aligned> = (0..BOUNCE_COUNT)
            .map(|_| Aligned::new(BOUNCE_BYTES))
            .collect();
        let iovecs: Vec<libc::iovec> = bounce
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.ptr.cast(),
                iov_len: b.len,
            })
            .collect();
        // SAFETY: the buffers live as long as the ring (both dropped together, ring first).
        let registered = unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        Ok(Ring {
            ring,
            bounce,
            registered,
        })
    }
}

/// A read to submit: `len` bytes of request `blob`'s blob from `offset`, landing in the caller
/// buffers `segs` (request, offset in its buffer, length) in order, or through a bounce buffer.
struct Piece {
    blob: usize,
    offset: u64,
    segs: Vec<(usize, usize, usize)>,
    direct: bool,
}

impl Piece {
    fn len(&self) -> usize {
        self.segs.iter().map(|s| s.2).sum()
    }

    /// The piece without its first `n` bytes.
    fn skip(&self, mut n: usize) -> Piece {
        let mut segs = Vec::new();
        for &(r, at, len) in &self.segs {
            if n >= len {
                n -= len;
            } else {
                segs.push((r, at + n, len - n));
                n = 0;
            }
        }
        Piece {
            blob: self.blob,
            offset: self.offset + (self.len() - segs.iter().map(|s| s.2).sum::<usize>()) as u64,
            segs,
            direct: false,
        }
    }
}

/// The pieces of a batch: buffered ranges that continue each other in one blob coalesced
/// (one vectored read), O_DIRECT ranges split to the bounce buffers' size.
fn pieces(requests: &[Request<'_>], direct: bool) -> Vec<Piece> {
    let mut order: Vec<usize> = (0..requests.len())
        .filter(|&i| !requests[i].buf.is_empty())
        .collect();
    order.sort_by_key(|&i| (requests[i].blob as *const Blob as usize, requests[i].offset));
    let mut out: Vec<Piece> = Vec::new();
    for i in order {
        let r = &requests[i];
        let use_direct = direct && r.blob.direct().is_some();
        if use_direct {
            let mut at = 0;
            while at < r.buf.len() {
                let len = (r.buf.len() - at).min(BOUNCE_BYTES - ALIGN);
                out.push(Piece {
                    blob: i,
                    offset: r.offset + at as u64,
                    segs: vec![(i, at, len)],
                    direct: true,
                });
                at += len;
            }
            continue;
        }
        if let Some(last) = out.last_mut() {
            let same = std::ptr::eq(requests[last.blob].blob, r.blob);
            if !last.direct
                && same
                && last.offset + last.len() as u64 == r.offset
                && last.segs.len() < 1024
                && last.len() + r.buf.len() <= COALESCE_MAX_BYTES
            {
                last.segs.push((i, 0, r.buf.len()));
                continue;
            }
        }
        out.push(Piece {
            blob: i,
            offset: r.offset,
            segs: vec![(i, 0, r.buf.len())],
            direct: false,
        });
    }
    out
}

/// Reads every request with io_uring in batches of up to [`RING_ENTRIES`] reads: buffered
/// vectored reads into the caller's memory (adjacent ranges of one blob as one read), or with
/// `direct`, O_DIRECT reads of each range's aligned superset into registered bounce buffers,
/// copied out. Falls back to `pread` where io_uring is not available.
fn read_uring(requests: &mut [Request<'_>], direct: bool) -> io::Result<()> {
    let result = RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Ring::new()?);
        }
        let ring = slot.as_mut().expect("just made");
        uring_batch(ring, requests, direct && ring.registered)
    });
    match result {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
            read_pread(requests)
        }
        other => other,
    }
}

fn uring_batch(ring: &mut Ring, requests: &mut [Request<'_>], direct: bool) -> io::Result<()> {
    let mut todo: std::collections::VecDeque<Piece> = pieces(requests, direct).into();
    for piece in todo
        .iter()
        .filter(|p| !p.direct && p.len() >= WILLNEED_MIN_BYTES)
    {
        will_need(requests[piece.blob].blob, piece.offset, piece.len());
    }
    // Vectors of the buffered reads in flight, kept alive until their completions.
    let mut iovecs: Vec<Vec<libc::iovec>> = Vec::new();
    while !todo.is_empty() {
        let mut flight: Vec<(Piece, Option<usize>)> = Vec::new(); // piece, bounce buffer
        iovecs.clear();
        let mut free_bounce: Vec<usize> = (0..ring.bounce.len()).collect();
        {
            let mut sq = ring.ring.submission();
            while let Some(piece) = todo.pop_front() {
                if sq.is_full() {
                    todo.push_front(piece);
                    break;
                }
                let r = &requests[piece.blob];
                let id = flight.len() as u64;
                let (entry, bounce) = if piece.direct {
                    let Some(b) = free_bounce.pop() else {
                        todo.push_front(piece);
                        break;
                    };
                    let fd = r.blob.direct().expect("checked when split");
                    let aligned = piece.offset & !(ALIGN as u64 - 1);
                    let skip = (piece.offset - aligned) as usize;
                    let span = (skip + piece.len()).div_ceil(ALIGN) * ALIGN;
                    let entry = io_uring::opcode::ReadFixed::new(
                        io_uring::types::Fd(fd.as_raw_fd()),
                        ring.bounce[b].ptr,
                        span as u32,
                        b as u16,
                    )
                    .offset(aligned)
                    .build();
                    (entry, Some(b))
                } else {
                    let vec: Vec<libc::iovec> = piece
                        .segs
                        .iter()
                        .map(|&(i, at, len)| libc::iovec {
                            iov_base: requests[i].buf[at..].as_ptr() as *mut libc::c_void,
                            iov_len: len,
                        })
                        .collect();
                    iovecs.push(vec);
                    let vec = iovecs.last().expect("just pushed");
                    let entry = io_uring::opcode::Readv::new(
                        io_uring::types::Fd(r.blob.file.as_raw_fd()),
                        vec.as_ptr(),
                        vec.len() as u32,
                    )
                    .offset(piece.offset)
                    .build();
                    (entry, None)
                };
                // SAFETY: the memory the entry names (caller buffers through `iovecs`, or a
                // bounce buffer) stays valid and is not otherwise touched until the entry's
                // completion is reaped below, before this function returns.
                unsafe { sq.push(&entry.user_data(id)) }.expect("checked not full");
                flight.push((piece, bounce));
            }
        }
        let n = flight.len();
        ring.ring.submit_and_wait(n)?;
        let mut reaped = 0;
        while reaped < n {
            let done: Vec<(u64, i32)> = ring
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            if done.is_empty() {
                ring.ring.submit_and_wait(1)?;
                continue;
            }
            for (id, result) in done {
                reaped += 1;
                let (piece, bounce) = &flight[id as usize];
                let blob = requests[piece.blob].blob;
                if result < 0 {
                    if piece.direct && -result == libc::EINVAL {
                        // The filesystem refuses this O_DIRECT read: read it buffered.
                        todo.push_back(piece.skip(0));
                        continue;
                    }
                    let e = io::Error::from_raw_os_error(-result);
                    return Err(io::Error::new(
                        e.kind(),
                        format!("{}: {e}", blob.path.display()),
                    ));
                }
                let mut got = result as usize;
                if let Some(b) = *bounce {
                    let skip = (piece.offset & (ALIGN as u64 - 1)) as usize;
                    got = got.saturating_sub(skip).min(piece.len());
                    let (i, at, _) = piece.segs[0];
                    requests[i].buf[at..at + got]
                        .copy_from_slice(&ring.bounce[b].slice(skip + got)[skip..]);
                } else if got == 0 {
                    return Err(blob.past_end(piece.offset, piece.len()));
                }
                if got < piece.len() {
                    todo.push_back(piece.skip(got));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
