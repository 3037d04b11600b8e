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
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::OnceLock;

use rayon::prelude::*;

use super::uring::{Buffers, Ring};

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

/// A name that is no backend (from `TENSORFS_IO`, or a benchmark's argument).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{origin}{name:?} is not an I/O backend (pread, mmap, uring, uring-direct, auto)")]
pub struct UnknownBackend {
    /// Where the name came from (`"TENSORFS_IO: "`), or empty.
    pub origin: &'static str,
    /// The name.
    pub name: String,
}

impl FromStr for Backend {
    type Err = UnknownBackend;

    fn from_str(s: &str) -> Result<Backend, UnknownBackend> {
        match s {
            "pread" => Ok(Backend::Pread),
            "mmap" => Ok(Backend::Mmap),
            "uring" | "io_uring" => Ok(Backend::Uring),
            "uring-direct" => Ok(Backend::UringDirect),
            "auto" => Ok(Backend::Auto),
            other => Err(UnknownBackend {
                origin: "",
                name: other.to_owned(),
            }),
        }
    }
}

impl Backend {
    /// The backend `TENSORFS_IO` names (`pread`, `mmap`, `uring`, `auto`), else `Auto`.
    ///
    /// # Errors
    /// The variable names no backend.
    pub fn from_env() -> Result<Backend, UnknownBackend> {
        match std::env::var("TENSORFS_IO") {
            Ok(v) if !v.is_empty() => v.parse().map_err(|e: UnknownBackend| UnknownBackend {
                origin: "TENSORFS_IO: ",
                ..e
            }),
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
    requests.len() >= PARALLEL_MIN
        && bytes / requests.len() >= PARALLEL_MIN_BYTES
        && crate::sync::pool_usable()
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

thread_local! {
    /// Each thread's ring, with its bounce buffers; dropped (after draining) at thread exit.
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

/// Ring entries: the most reads in flight per thread.
const RING_ENTRIES: u32 = 64;

/// A thread's ring: [`BOUNCE_COUNT`] registered bounce buffers for O_DIRECT reads.
fn new_ring() -> io::Result<Ring> {
    Ring::new(
        RING_ENTRIES,
        Buffers::new(BOUNCE_COUNT, BOUNCE_BYTES)?,
        true,
    )
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

    /// The piece without its first `n` bytes, read buffered.
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

/// Reads every request with io_uring, up to [`RING_ENTRIES`] reads in flight: buffered
/// vectored reads into the caller's memory (adjacent ranges of one blob as one read), or with
/// `direct`, O_DIRECT reads of each range's aligned superset into the ring's bounce buffers,
/// copied out. Falls back to `pread` where io_uring is not available.
fn read_uring(requests: &mut [Request<'_>], direct: bool) -> io::Result<()> {
    let result = RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_some_and(Ring::inherited) {
            // The parent's ring, copied by fork(): its queues and registered buffers are the
            // parent's, so reads through it would land in the parent's memory. Left alone
            // (its fd and mappings only), never drained or used.
            std::mem::forget(slot.take());
        }
        if slot.is_none() {
            *slot = Some(new_ring()?);
        }
        uring_batch(slot.as_mut().expect("just made"), requests, direct)
    });
    match result {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
            read_pread(requests)
        }
        other => other,
    }
}

/// One batch of `requests` on `ring`. Every exit (an error, a panic) drops the batch, which
/// waits for the reads still in flight before the caller's buffers are handed back.
fn uring_batch(ring: &mut Ring, requests: &mut [Request<'_>], direct: bool) -> io::Result<()> {
    let mut pieces = pieces(requests, direct);
    for piece in pieces
        .iter()
        .filter(|p| !p.direct && p.len() >= WILLNEED_MIN_BYTES)
    {
        will_need(requests[piece.blob].blob, piece.offset, piece.len());
    }
    // The caller's buffers, by their addresses taken once: the kernel and the copies out of the
    // bounce buffers write through these, never through a new borrow of a buffer while a read
    // into it is in flight.
    let bases: Vec<*mut u8> = requests.iter_mut().map(|r| r.buf.as_mut_ptr()).collect();
    let blobs: Vec<&Blob> = requests.iter().map(|r| r.blob).collect();
    // The vectors of buffered reads, one per read pushed: declared before the batch, so they
    // are freed after it has drained.
    let mut iovecs: Vec<Vec<libc::iovec>> = Vec::new();
    let mut todo: std::collections::VecDeque<usize> = (0..pieces.len()).collect();
    let mut free_bounce: Vec<usize> = (0..ring.buffer_count()).collect();
    let mut bounce_of: Vec<Option<usize>> = vec![None; pieces.len()];
    let mut batch = ring.batch();
    loop {
        while batch.has_room() {
            let Some(&p) = todo.front() else { break };
            let piece = &pieces[p];
            let blob = blobs[piece.blob];
            let id = u32::try_from(p).map_err(|_| io::Error::other("too many reads"))?;
            if piece.direct {
                let Some(b) = free_bounce.pop() else { break };
                let fd = blob.direct().expect("checked when split");
                let aligned = piece.offset & !(ALIGN as u64 - 1);
                let skip = (piece.offset - aligned) as usize;
                let span = (skip + piece.len()).div_ceil(ALIGN) * ALIGN;
                batch.read_buffer(fd.as_fd(), b, 0, span as u32, aligned, id)?;
                bounce_of[p] = Some(b);
            } else {
                let vec: Vec<libc::iovec> = piece
                    .segs
                    .iter()
                    .map(|&(i, at, len)| libc::iovec {
                        // SAFETY: `at + len` is within request `i`'s buffer (pieces cut inside
                        // their requests).
                        iov_base: unsafe { bases[i].add(at) }.cast(),
                        iov_len: len,
                    })
                    .collect();
                iovecs.push(vec);
                let vec = iovecs.last().expect("just pushed");
                // SAFETY: the iovecs live in `iovecs` until after the batch drains, and span
                // disjoint ranges of the caller's buffers (pieces never overlap), which nothing
                // touches until this read's completion: a piece's rest is pushed only after it.
                unsafe {
                    batch.readv(
                        blob.file.as_fd(),
                        vec.as_ptr(),
                        vec.len() as u32,
                        piece.offset,
                        id,
                    )
                }?;
            }
            todo.pop_front();
        }
        if todo.is_empty() && batch.idle() {
            return Ok(());
        }
        for c in batch.wait()? {
            let p = c.id as usize;
            let blob = blobs[pieces[p].blob];
            let bounce = bounce_of[p].take();
            if c.retry() {
                free_bounce.extend(bounce);
                todo.push_front(p);
                continue;
            }
            if c.result < 0 {
                free_bounce.extend(bounce);
                if pieces[p].direct && -c.result == libc::EINVAL {
                    // The filesystem refuses this O_DIRECT read: read it buffered.
                    let rest = pieces[p].skip(0);
                    bounce_of.push(None);
                    pieces.push(rest);
                    todo.push_back(pieces.len() - 1);
                    continue;
                }
                let e = io::Error::from_raw_os_error(-c.result);
                return Err(io::Error::new(
                    e.kind(),
                    format!("{}: {e}", blob.path.display()),
                ));
            }
            let piece = &pieces[p];
            let mut got = c.result as usize;
            if let Some(b) = bounce {
                let skip = (piece.offset & (ALIGN as u64 - 1)) as usize;
                got = got.saturating_sub(skip).min(piece.len());
                let (i, at, _) = piece.segs[0];
                let src = &batch.buffer(b).expect("its read completed")[skip..skip + got];
                // SAFETY: `at + got` is within request `i`'s buffer, which no read in flight
                // targets in this range (this piece's read has completed).
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), bases[i].add(at), got) };
                free_bounce.push(b);
            } else if got == 0 {
                return Err(blob.past_end(piece.offset, piece.len()));
            }
            if got < piece.len() {
                let rest = piece.skip(got);
                bounce_of.push(None);
                pieces.push(rest);
                todo.push_back(pieces.len() - 1);
            }
        }
    }
}

#[cfg(test)]
mod tests;
