//! The one io_uring engine: a ring, the buffers registered with it, and batches of reads that
//! never outlive the memory they write.
//!
//! A read handed to the kernel writes its buffer whenever it completes. So a batch that is left
//! while reads are in flight (an error, a zero-length completion, a panic) lets the kernel write
//! into memory its owner has since reused, and leaves completions on the ring that the next
//! batch would take for its own. [`Batch`] rules that out:
//! - whatever way a batch is left, dropping it waits until every read it pushed has completed.
//!   Reads of regular files always complete, so waiting is enough and nothing is cancelled;
//! - a wait interrupted by a signal (`EINTR`) is retried, never returned;
//! - each read's `user_data` carries its batch's generation, so no completion of one batch is
//!   taken for another's, and a batch drains whatever an earlier one left before it starts;
//! - at most [`Ring::entries`] reads are in flight, so the completion queue never overflows;
//! - a [`Ring`] dropped (at thread exit, at unmount) drains first, then unregisters its buffers
//!   before they are unmapped.
//!
//! Users: `io::backend` (per-thread rings with bounce buffers for O_DIRECT, and reads into the
//! caller's memory) and `extents::stage` (a ring whose registered buffers feed a sink).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{opcode, squeue, types, IoUring};
use memmap2::MmapMut;

/// Bits of `user_data`: the batch's generation (16), the ring buffer a read fills (16; all ones
/// for the caller's memory), the read's id (32).
const NO_SLOT: u64 = 0xFFFF;

/// The most buffers a ring registers: `ReadFixed` names a buffer by a `u16`, and one value
/// marks reads into the caller's memory.
pub const MAX_BUFFERS: usize = 0xFFFF;

/// Page-aligned, zeroed anonymous mappings to register with a ring: io_uring registers such
/// memory as fixed buffers on every kernel, and a device driver can page-lock it in place.
#[derive(Debug)]
pub struct Buffers {
    maps: Vec<Mapping>,
}

/// One mapping, and its address taken once: the kernel writes through that address, and every
/// Rust view of the bytes is made from it, never from a new borrow of the mapping.
#[derive(Debug)]
struct Mapping {
    ptr: *mut u8,
    len: usize,
    _map: MmapMut,
}

impl Buffers {
    /// `count` (at most [`MAX_BUFFERS`]) mappings of `bytes` bytes each.
    ///
    /// # Errors
    /// A mapping cannot be made (out of memory or address space), or `count` is too large.
    pub fn new(count: usize, bytes: usize) -> io::Result<Buffers> {
        if count > MAX_BUFFERS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{count} io_uring buffers: at most {MAX_BUFFERS}"),
            ));
        }
        let maps = (0..count)
            .map(|_| {
                let mut map = MmapMut::map_anon(bytes.max(1))?;
                Ok(Mapping {
                    ptr: map.as_mut_ptr(),
                    len: bytes,
                    _map: map,
                })
            })
            .collect::<io::Result<_>>()?;
        Ok(Buffers { maps })
    }

    /// No buffers (a ring that reads only into its callers' memory).
    pub fn none() -> Buffers {
        Buffers { maps: Vec::new() }
    }
}

/// An io_uring instance with its registered buffers and the count of reads still in the kernel.
pub struct Ring {
    // Field order: the ring is closed (unregistering the buffers) before they are unmapped;
    // `Drop` has drained every read first.
    uring: IoUring,
    buffers: Buffers,
    fixed: bool,
    entries: usize,
    /// Reads pushed and not yet reaped, of any batch.
    in_flight: usize,
    generation: u16,
    /// Reads into the buffers go to the kernel's worker threads (`IOSQE_ASYNC`).
    async_reads: bool,
    /// The process that made the ring: a child forked from it shares the ring's queues and
    /// its registered buffers' pages.
    pid: u32,
}

// SAFETY: the raw pointers are addresses of mappings the ring owns; nothing else aliases them,
// and moving the ring to another thread moves the mappings with it.
unsafe impl Send for Ring {}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("entries", &self.entries)
            .field("buffers", &self.buffers.maps.len())
            .field("fixed", &self.fixed)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl Ring {
    /// A ring of `entries` submission entries (the most reads in flight) owning `buffers`,
    /// registered with the kernel as fixed buffers when `register` and the kernel agrees
    /// (`RLIMIT_MEMLOCK` or an old kernel may refuse: reads then go as plain `Read`s into the
    /// same memory).
    ///
    /// # Errors
    /// The ring cannot be set up (`ENOSYS` without io_uring, `EPERM` where it is disabled).
    pub fn new(entries: u32, buffers: Buffers, register: bool) -> io::Result<Ring> {
        let uring = IoUring::new(entries.max(1))?;
        // The kernel rounds the queue up to a power of two; the bound is what was asked for.
        let entries = (entries.max(1) as usize).min(uring.params().sq_entries() as usize);
        let mut ring = Ring {
            uring,
            buffers,
            fixed: false,
            entries,
            in_flight: 0,
            generation: 0,
            async_reads: false,
            pid: std::process::id(),
        };
        if register && !ring.buffers.maps.is_empty() {
            let iovecs: Vec<libc::iovec> = ring
                .buffers
                .maps
                .iter()
                .map(|m| libc::iovec {
                    iov_base: m.ptr.cast(),
                    iov_len: m.len,
                })
                .collect();
            // SAFETY: each iovec spans a mapping the ring owns, which stays mapped until after
            // the ring is closed (field order) and is never remapped.
            match unsafe { ring.uring.submitter().register_buffers(&iovecs) } {
                Ok(()) => ring.fixed = true,
                Err(e) => tracing::debug!("io_uring refused fixed buffers ({e}); plain reads"),
            }
        }
        Ok(ring)
    }

    /// Sends reads into the buffers ([`Batch::read_buffer`]) to the kernel's worker threads
    /// (`IOSQE_ASYNC`) instead of trying each inline first: a read of cached pages is then a
    /// copy on a worker, so the reads in flight copy on several cores at once rather than one
    /// after the other on the submitting thread (off by default).
    pub fn set_async_reads(&mut self, on: bool) {
        self.async_reads = on;
    }

    /// The most reads in flight at once (the `entries` asked for; the submission queue holds
    /// at least as many).
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Whether the buffers are registered (reads into them are `ReadFixed`).
    pub fn fixed(&self) -> bool {
        self.fixed
    }

    /// Whether this process got the ring by `fork()` from the one that made it: the queues
    /// and the registered buffers' pages are the maker's, so the ring must not be used here
    /// (nor drained: the reads in it are the maker's).
    pub fn inherited(&self) -> bool {
        self.pid != std::process::id()
    }

    /// How many buffers the ring owns.
    pub fn buffer_count(&self) -> usize {
        self.buffers.maps.len()
    }

    /// Buffer `slot`'s bytes. No read is in flight into it: a batch, the only way to read, holds
    /// the ring mutably and drains before it lets go.
    ///
    /// # Panics
    /// `slot` is not below [`Ring::buffer_count`].
    pub fn buffer(&self, slot: usize) -> &[u8] {
        let m = &self.buffers.maps[slot];
        // SAFETY: the mapping is `len` bytes, lives as long as `self`, and no read writes it
        // while `self` is borrowed shared (see above).
        unsafe { std::slice::from_raw_parts(m.ptr, m.len) }
    }

    /// A batch of reads on this ring. Whatever an earlier batch left in flight (one that was
    /// leaked rather than dropped) is drained first.
    pub fn batch(&mut self) -> Batch<'_> {
        self.drain();
        self.generation = self.generation.wrapping_add(1);
        let busy = vec![0; self.buffers.maps.len()];
        Batch { ring: self, busy }
    }

    /// Submits what is queued and waits for at least one completion; a signal's `EINTR` is
    /// retried, and so are the transient `EAGAIN` and `EBUSY`.
    fn submit_and_wait(&mut self) -> io::Result<()> {
        loop {
            match self.uring.submit_and_wait(1) {
                Ok(_) => return Ok(()),
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN | libc::EBUSY) => std::thread::yield_now(),
                    _ => return Err(e),
                },
            }
        }
    }

    /// Waits until no read is in the kernel, dropping the completions. If the ring can no
    /// longer be driven, reads may still write memory that is about to be reused, which this
    /// process must not survive: it aborts, after saying why.
    fn drain(&mut self) {
        while self.in_flight > 0 {
            if let Err(e) = self.submit_and_wait() {
                tracing::error!(
                    "io_uring: waiting for {} reads in flight failed ({e}); aborting rather \
                     than letting them write reused memory",
                    self.in_flight
                );
                eprintln!(
                    "tensorfs: io_uring: waiting for {} reads in flight failed ({e}); aborting",
                    self.in_flight
                );
                std::process::abort();
            }
            let n = self.uring.completion().count();
            self.in_flight -= n.min(self.in_flight);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.drain();
    }
}

/// A completed read: its id as pushed, and the kernel's result (bytes read, or `-errno`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The id given when the read was pushed.
    pub id: u32,
    /// Bytes read (0 at the end of the file), or a negated `errno`.
    pub result: i32,
}

impl Completion {
    /// Whether the read should simply be pushed again (`EINTR`, `EAGAIN`).
    pub fn retry(&self) -> bool {
        self.result == -libc::EINTR || self.result == -libc::EAGAIN
    }
}

/// Reads in progress on a [`Ring`]. Dropping the batch, on any path, waits for every read it
/// pushed, so the memory they write may be reused once it is gone.
pub struct Batch<'r> {
    ring: &'r mut Ring,
    /// Reads in flight into each ring buffer.
    busy: Vec<u32>,
}

impl Batch<'_> {
    /// Whether another read may be pushed now (fewer than [`Ring::entries`] in flight).
    pub fn has_room(&self) -> bool {
        self.ring.in_flight < self.ring.entries
    }

    /// Whether no read of this batch is in flight.
    pub fn idle(&self) -> bool {
        self.ring.in_flight == 0
    }

    /// Ring buffer `slot`'s bytes, or `None` while a read into it is in flight.
    ///
    /// # Panics
    /// `slot` is not below [`Ring::buffer_count`].
    pub fn buffer(&self, slot: usize) -> Option<&[u8]> {
        (self.busy[slot] == 0).then(|| self.ring.buffer(slot))
    }

    fn user_data(&self, slot: u64, id: u32) -> u64 {
        (u64::from(self.ring.generation) << 48) | (slot << 32) | u64::from(id)
    }

    fn push(&mut self, entry: io_uring::squeue::Entry) -> io::Result<()> {
        if !self.has_room() {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("io_uring: {} reads already in flight", self.ring.in_flight),
            ));
        }
        // SAFETY (of the memory the entry names): the callers' contracts below; the submission
        // queue has room, as it holds at most `entries` unreaped reads.
        let pushed = unsafe { self.ring.uring.submission().push(&entry) };
        if pushed.is_err() {
            // Entries queued but not yet submitted count in `in_flight`, so this is a bug.
            return Err(io::Error::other("io_uring: the submission queue is full"));
        }
        self.ring.in_flight += 1;
        Ok(())
    }

    /// Pushes a read of `len` bytes of `fd` at `offset` into ring buffer `slot` from byte `at`
    /// (`ReadFixed` when the buffers are registered, else `Read`). `fd` must stay open until
    /// the read completes or the batch is dropped.
    ///
    /// # Errors
    /// `InvalidInput` for a range outside the buffer or a slot the ring lacks; `WouldBlock`
    /// when [`Batch::has_room`] is false.
    pub fn read_buffer(
        &mut self,
        fd: BorrowedFd<'_>,
        slot: usize,
        at: usize,
        len: u32,
        offset: u64,
        id: u32,
    ) -> io::Result<()> {
        let Some(m) = self.ring.buffers.maps.get(slot) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("io_uring: no buffer {slot}"),
            ));
        };
        if at.checked_add(len as usize).is_none_or(|end| end > m.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "io_uring: {len} bytes at {at} do not fit buffer {slot} of {}",
                    m.len
                ),
            ));
        }
        // SAFETY: in bounds (checked above).
        let ptr = unsafe { m.ptr.add(at) };
        let fd = types::Fd(fd.as_raw_fd());
        let entry = match self.ring.fixed {
            true => opcode::ReadFixed::new(fd, ptr, len, slot as u16)
                .offset(offset)
                .build(),
            false => opcode::Read::new(fd, ptr, len).offset(offset).build(),
        }
        .user_data(self.user_data(slot as u64, id));
        let entry = match self.ring.async_reads {
            true => entry.flags(squeue::Flags::ASYNC),
            false => entry,
        };
        // The buffer is the ring's: `Batch::buffer` refuses it while this read is in flight,
        // and the ring is not otherwise reachable while the batch lives.
        self.push(entry)?;
        self.busy[slot] += 1;
        Ok(())
    }

    /// Pushes a vectored read of `fd` at `offset` into the `count` buffers that `iov` lists.
    ///
    /// # Errors
    /// `WouldBlock` when [`Batch::has_room`] is false.
    ///
    /// # Safety
    /// Until the read completes (its [`Completion`] is returned by [`Batch::wait`]) or the batch
    /// is dropped: the `count` iovecs at `iov` and the memory each one spans stay allocated,
    /// nothing else reads or writes that memory, and `fd` stays open.
    pub unsafe fn readv(
        &mut self,
        fd: BorrowedFd<'_>,
        iov: *const libc::iovec,
        count: u32,
        offset: u64,
        id: u32,
    ) -> io::Result<()> {
        let entry = opcode::Readv::new(types::Fd(fd.as_raw_fd()), iov, count)
            .offset(offset)
            .build()
            .user_data(self.user_data(NO_SLOT, id));
        self.push(entry)
    }

    /// Submits what is pushed and waits until at least one read of this batch completes;
    /// returns every completion now available (none when nothing is in flight).
    ///
    /// # Errors
    /// The ring cannot be driven (not `EINTR`, which is retried). The reads still in flight are
    /// waited for when the batch is dropped.
    pub fn wait(&mut self) -> io::Result<Vec<Completion>> {
        let mut done = Vec::new();
        while done.is_empty() && self.ring.in_flight > 0 {
            self.ring.submit_and_wait()?;
            let generation = self.ring.generation;
            let cqes: Vec<(u64, i32)> = self
                .ring
                .uring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (data, result) in cqes {
                self.ring.in_flight -= 1;
                if (data >> 48) as u16 != generation {
                    // A read of a batch that was leaked instead of dropped: `Ring::batch`
                    // drains those, so this is never reached; never take it for ours.
                    continue;
                }
                let slot = (data >> 32) & 0xFFFF;
                if slot != NO_SLOT {
                    self.busy[slot as usize] -= 1;
                }
                done.push(Completion {
                    id: data as u32,
                    result,
                });
            }
        }
        Ok(done)
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.ring.drain();
    }
}

#[cfg(test)]
mod tests;
