//! Reading a located tensor's bytes straight from its chunk blobs, with io_uring, into a few
//! reusable host buffers that a [`StageSink`] drains: the host half of GPU-direct loading
//! (`crate::gpu` copies each filled buffer to device memory), testable without a GPU.
//!
//! ```text
//! Located extents ──plan──▶ fills: buffer-sized runs of the parts' bytes, buffer k mod N
//!                           each fill: reads of ≤ read_bytes (blob, offset) → (buffer, offset)
//!                                      segments: (part, offset in part) ← (buffer, offset)
//! loop: start fill k once the sink reclaimed its buffer (fill k−N's consumer is done)
//!       keep ≤ queue_depth reads in flight (ReadFixed on registered buffers)
//!       short read → resubmit the rest; EOF before the extent's end → error naming the blob
//!       fills complete in order → sink.consume(buffer, segments), which may work asynchronously
//! ```
//!
//! So while the sink copies buffer k (a DMA on a CUDA stream), the reads of buffers k+1 … k+N−1
//! proceed. The buffers are anonymous, page-aligned mappings ([`memmap2::MmapMut::map_anon`]):
//! io_uring can register them as fixed buffers on every kernel (memory of `cuMemHostAlloc` is
//! backed by the driver's device file, which older kernels refuse to register), and CUDA can
//! page-lock them in place with `cuMemHostRegister`. When the kernel refuses the registration
//! (`RLIMIT_MEMLOCK`, an old kernel) the same reads go as plain `Read`s.
//!
//! Non-goals: decoding (a sink receives the stored bytes of each part), and verifying blob
//! hashes (the mount proves blobs before serving them; a direct reader does not: run
//! `tensorfs verify` first, see `docs/extents.md`).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::Located;
use crate::io::uring::{Batch, Buffers, Ring, MAX_BUFFERS};

/// Settings of a [`Stager`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageConfig {
    /// Host buffers (default 4; at least 1, and 2 or more for reads to overlap the sink's work).
    pub buffers: usize,
    /// Bytes of each buffer (default 8 MiB; rounded up to the page size).
    pub buffer_bytes: usize,
    /// Largest single read in bytes (default 1 MiB): a buffer's fill is cut into reads of this
    /// size, so several are in flight at once.
    pub read_bytes: usize,
    /// Most reads in flight, and the io_uring submission queue's size (default 64).
    pub queue_depth: u32,
    /// Register the buffers with io_uring as fixed buffers and read with `ReadFixed` (default
    /// true); plain `Read`s when false or when the kernel refuses the registration.
    pub fixed_buffers: bool,
    /// Hand every read to the kernel's worker threads (`IOSQE_ASYNC`, default true), so reads
    /// of cached blobs copy on several cores at once instead of one after the other on the
    /// loading thread.
    pub async_reads: bool,
}

impl Default for StageConfig {
    fn default() -> Self {
        StageConfig {
            buffers: 4,
            buffer_bytes: 8 << 20,
            read_bytes: 1 << 20,
            queue_depth: 64,
            fixed_buffers: true,
            async_reads: true,
        }
    }
}

/// The environment variable [`StageConfig::from_env`] reads.
pub const STAGE_ENV: &str = "TENSORFS_STAGE";

impl StageConfig {
    /// The default settings, changed by `$TENSORFS_STAGE` where it is set: comma-separated
    /// `name=value` pairs among `buffers`, `buffer_mib`, `read_kib`, `depth` (numbers) and
    /// `fixed`, `async` (`0` or `1`), e.g. `buffers=8,buffer_mib=16`.
    ///
    /// # Errors
    /// [`StageError::Config`] naming the pair that is not one of these.
    pub fn from_env() -> Result<StageConfig, StageError> {
        match std::env::var(STAGE_ENV) {
            Ok(text) => StageConfig::parse(&text),
            Err(_) => Ok(StageConfig::default()),
        }
    }

    /// The default settings changed by `text`, as [`StageConfig::from_env`] reads it.
    ///
    /// # Errors
    /// As [`StageConfig::from_env`].
    pub fn parse(text: &str) -> Result<StageConfig, StageError> {
        let mut config = StageConfig::default();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || StageError::Config {
                why: format!(
                    "{STAGE_ENV}: {pair:?} is not one of buffers=N, buffer_mib=N, read_kib=N, \
                     depth=N, fixed=0|1, async=0|1"
                ),
            };
            let (name, value) = pair.split_once('=').ok_or_else(bad)?;
            let n: usize = value.trim().parse().map_err(|_| bad())?;
            let mib = |n: usize| n.checked_mul(1 << 20).ok_or_else(bad);
            match (name.trim(), n) {
                ("buffers", n) => config.buffers = n,
                ("buffer_mib", n) => config.buffer_bytes = mib(n)?,
                ("read_kib", n) => config.read_bytes = n.checked_mul(1 << 10).ok_or_else(bad)?,
                ("depth", n) => config.queue_depth = u32::try_from(n).map_err(|_| bad())?,
                ("fixed", 0 | 1) => config.fixed_buffers = n == 1,
                ("async", 0 | 1) => config.async_reads = n == 1,
                _ => return Err(bad()),
            }
        }
        Ok(config)
    }
}

/// A run of one part's bytes in a filled buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The part (index into [`Located::parts`]).
    pub part: usize,
    /// Where the bytes go in the part: byte offset from the part's start.
    pub part_offset: u64,
    /// Where they are in the buffer.
    pub buffer_offset: usize,
    /// Bytes (never 0).
    pub length: usize,
}

/// The error a [`StageSink`] reports; [`StageError::Sink`] keeps it as its source.
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// Where filled buffers go: a device copy, or host memory ([`HostParts`]).
pub trait StageSink {
    /// Buffer `slot` is filled; `segments` say which parts' bytes it holds. The sink may start
    /// asynchronous work that reads `buffer` (a DMA) and return at once: the stager writes that
    /// buffer again only after [`StageSink::reclaim`] for `slot` has returned, and keeps it
    /// allocated for as long as the stager lives.
    ///
    /// # Errors
    /// Whatever the sink fails with; the stager stops and returns it.
    fn consume(
        &mut self,
        slot: usize,
        buffer: &[u8],
        segments: &[Segment],
    ) -> Result<(), SinkError>;

    /// Waits until work started by [`StageSink::consume`] on buffer `slot` no longer reads it.
    ///
    /// # Errors
    /// Whatever the sink fails with.
    fn reclaim(&mut self, slot: usize) -> Result<(), SinkError>;
}

/// Why a tensor's bytes could not be staged. Errors of one tensor name its file, key and,
/// where one is at fault, the blob.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// The io_uring instance could not be set up or driven.
    #[error("io_uring: {what}: {source}")]
    Ring {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The settings could not be read ([`StageConfig::from_env`]).
    #[error("{why}")]
    Config {
        /// What is wrong.
        why: String,
    },
    /// The host buffers could not be allocated.
    #[error("allocating {count} host buffers of {bytes} bytes: {source}")]
    Alloc {
        /// Buffers asked for.
        count: usize,
        /// Bytes each.
        bytes: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A blob could not be opened.
    #[error("{file}: tensor {tensor:?}: opening blob {}: {source}", path.display())]
    Open {
        /// The lane file.
        file: String,
        /// The tensor's key.
        tensor: String,
        /// The blob file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A read of a blob failed.
    #[error(
        "{file}: tensor {tensor:?}: reading {length} bytes at offset {offset} of blob {}: {source}",
        path.display()
    )]
    Read {
        /// The lane file.
        file: String,
        /// The tensor's key.
        tensor: String,
        /// The blob file.
        path: PathBuf,
        /// Where the read started in the blob.
        offset: u64,
        /// Bytes asked for.
        length: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A blob ended before an extent's end: it is truncated or not the object it names.
    #[error(
        "{file}: tensor {tensor:?}: blob {} ends at byte {at}, before the extent's end at {end}; \
         the blob is truncated or damaged: run `tensorfs verify --repair`",
        path.display()
    )]
    Eof {
        /// The lane file.
        file: String,
        /// The tensor's key.
        tensor: String,
        /// The blob file.
        path: PathBuf,
        /// Where the read found the end of the file.
        at: u64,
        /// Where the extent ends in the blob.
        end: u64,
    },
    /// The extents do not tile the parts (a hand-made or inconsistent [`Located`]).
    #[error("{file}: tensor {tensor:?}: {why}")]
    Invalid {
        /// The lane file.
        file: String,
        /// The tensor's key.
        tensor: String,
        /// What is wrong.
        why: String,
    },
    /// The sink failed.
    #[error("{file}: tensor {tensor:?}: {source}")]
    Sink {
        /// The lane file.
        file: String,
        /// The tensor's key.
        tensor: String,
        /// The sink's error.
        #[source]
        source: SinkError,
    },
}

/// What one [`Stager::stage`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StageStats {
    /// Bytes read (the parts' bytes).
    pub bytes: u64,
    /// Buffer fills handed to the sink.
    pub fills: usize,
    /// Reads completed, resubmissions of short reads included.
    pub reads: usize,
    /// Reads resubmitted for the rest of a short read (or after `EINTR`/`EAGAIN`).
    pub resubmitted: usize,
}

/// Reads located tensors into its host buffers with io_uring, for a [`StageSink`].
pub struct Stager {
    /// The ring owns the buffers (registered with it where the kernel agrees).
    ring: Ring,
    config: StageConfig,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("buffers", &self.ring.buffer_count())
            .field("fixed", &self.ring.fixed())
            .field("config", &self.config)
            .finish()
    }
}

/// One read: `length` bytes at `offset` of blob `file` into `buffer_offset` of buffer `slot`.
#[derive(Debug)]
struct ReadOp {
    file: usize,
    offset: u64,
    slot: usize,
    buffer_offset: usize,
    length: usize,
    /// Bytes already read (a short read resubmits the rest).
    done: usize,
    fill: usize,
    /// Where its extent ends in the blob (for the error when the blob ends first).
    extent_end: u64,
}

/// One use of a buffer.
#[derive(Debug)]
struct Fill {
    slot: usize,
    /// Bytes of the buffer it fills.
    used: usize,
    segments: Vec<Segment>,
    reads: std::ops::Range<usize>,
}

/// What [`Stager::stage`] reads: the fills, their reads and the blobs they open.
struct Plan {
    fills: Vec<Fill>,
    ops: Vec<ReadOp>,
    files: Vec<(PathBuf, File)>,
}

impl Stager {
    /// Allocates the buffers and sets up the ring.
    ///
    /// # Errors
    /// [`StageError::Alloc`] or [`StageError::Ring`].
    pub fn new(config: StageConfig) -> Result<Stager, StageError> {
        let page = page_size();
        let config = StageConfig {
            buffers: config.buffers.clamp(1, MAX_BUFFERS),
            buffer_bytes: config.buffer_bytes.max(1).div_ceil(page) * page,
            read_bytes: config.read_bytes.clamp(1, 1 << 30),
            queue_depth: config.queue_depth.clamp(1, 4096),
            fixed_buffers: config.fixed_buffers,
            async_reads: config.async_reads,
        };
        let buffers = Buffers::new(config.buffers, config.buffer_bytes).map_err(|source| {
            StageError::Alloc {
                count: config.buffers,
                bytes: config.buffer_bytes,
                source,
            }
        })?;
        let mut ring =
            Ring::new(config.queue_depth, buffers, config.fixed_buffers).map_err(|source| {
                StageError::Ring {
                    what: "setting up the ring",
                    source,
                }
            })?;
        ring.set_async_reads(config.async_reads);
        Ok(Stager { ring, config })
    }

    /// The settings in force (sizes rounded as [`StageConfig`] says).
    pub fn config(&self) -> &StageConfig {
        &self.config
    }

    /// Whether the buffers are registered with io_uring (reads are `ReadFixed`).
    pub fn fixed(&self) -> bool {
        self.ring.fixed()
    }

    /// Buffer `slot`'s memory: page-aligned, [`StageConfig::buffer_bytes`] long, at a fixed
    /// address for the stager's life (so a device driver may page-lock it).
    ///
    /// # Panics
    /// `slot` is not below [`StageConfig::buffers`].
    pub fn buffer(&self, slot: usize) -> &[u8] {
        self.ring.buffer(slot)
    }

    /// Reads every part of `located` from its blobs, handing each filled buffer to `sink`. On
    /// return (also with an error) no read is in flight and the sink has reclaimed every
    /// buffer it was given.
    ///
    /// # Errors
    /// [`StageError::Open`], [`StageError::Read`], [`StageError::Eof`] name the blob;
    /// [`StageError::Sink`] keeps the sink's error; [`StageError::Invalid`] when the extents
    /// do not tile the parts; [`StageError::Ring`].
    pub fn stage(
        &mut self,
        located: &Located,
        sink: &mut dyn StageSink,
    ) -> Result<StageStats, StageError> {
        let plan = self.plan(located)?;
        let buffers = self.ring.buffer_count();
        let mut run = Run {
            batch: self.ring.batch(),
            remaining: plan.fills.iter().map(|f| f.reads.len()).collect(),
            located,
            plan,
            buffers,
            queue: VecDeque::new(),
            stats: StageStats::default(),
        };
        let result = run.drive(sink);
        let used = run.plan.fills.len().min(buffers);
        let stats = std::mem::take(&mut run.stats);
        // Dropping the run drops its batch, which waits for every read still in flight.
        drop(run);
        // Every buffer handed over is reclaimed, so none is read after this returns.
        let mut reclaimed = Ok(());
        for slot in 0..used {
            if let Err(source) = sink.reclaim(slot) {
                reclaimed = reclaimed.and(Err(sink_error(located, source)));
            }
        }
        result.and(reclaimed).map(|()| stats)
    }

    /// Cuts `located`'s extents into fills of the buffers and reads of at most `read_bytes`,
    /// and opens each blob once.
    fn plan(&self, located: &Located) -> Result<Plan, StageError> {
        let invalid = |why: String| StageError::Invalid {
            file: located.file.clone(),
            tensor: located.key.clone(),
            why,
        };
        let (n, size, read) = (
            self.ring.buffer_count(),
            self.config.buffer_bytes,
            self.config.read_bytes,
        );
        let mut plan = Plan {
            fills: Vec::new(),
            ops: Vec::new(),
            files: Vec::new(),
        };
        let mut opened: HashMap<&Path, usize> = HashMap::new();
        let mut covered = vec![0u64; located.parts.len()];
        for x in &located.extents {
            let part = located
                .parts
                .get(x.part)
                .ok_or_else(|| invalid(format!("an extent names part {}", x.part)))?;
            let part_offset = x
                .file_offset
                .checked_sub(part.file_range.start)
                .filter(|&o| o == covered[x.part])
                .ok_or_else(|| {
                    invalid(format!(
                        "extents of part {} are not consecutive at file offset {}",
                        x.part, x.file_offset
                    ))
                })?;
            covered[x.part] += x.length;
            let file = match opened.get(x.path.as_path()) {
                Some(&i) => i,
                None => {
                    let f = File::open(&x.path).map_err(|source| StageError::Open {
                        file: located.file.clone(),
                        tensor: located.key.clone(),
                        path: x.path.clone(),
                        source,
                    })?;
                    plan.files.push((x.path.clone(), f));
                    opened.insert(&x.path, plan.files.len() - 1);
                    plan.files.len() - 1
                }
            };
            let length = usize::try_from(x.length)
                .map_err(|_| invalid(format!("an extent of {} bytes", x.length)))?;
            let mut done = 0usize;
            while done < length {
                let full = plan.fills.last().is_none_or(|f| f.used == size);
                if full {
                    let at = plan.ops.len();
                    plan.fills.push(Fill {
                        slot: plan.fills.len() % n,
                        used: 0,
                        segments: Vec::new(),
                        reads: at..at,
                    });
                }
                let index = plan.fills.len() - 1;
                let fill = plan.fills.last_mut().expect("a fill");
                let take = (length - done).min(size - fill.used);
                let segment_offset = part_offset + done as u64;
                match fill.segments.last_mut() {
                    Some(s)
                        if s.part == x.part
                            && s.buffer_offset + s.length == fill.used
                            && s.part_offset + s.length as u64 == segment_offset =>
                    {
                        s.length += take
                    }
                    _ => fill.segments.push(Segment {
                        part: x.part,
                        part_offset: segment_offset,
                        buffer_offset: fill.used,
                        length: take,
                    }),
                }
                let mut piece = 0;
                while piece < take {
                    let length = (take - piece).min(read);
                    plan.ops.push(ReadOp {
                        file,
                        offset: x.offset + (done + piece) as u64,
                        slot: fill.slot,
                        buffer_offset: fill.used + piece,
                        length,
                        done: 0,
                        fill: index,
                        extent_end: x.offset + x.length,
                    });
                    piece += length;
                }
                fill.used += take;
                fill.reads.end = plan.ops.len();
                done += take;
            }
        }
        for (i, part) in located.parts.iter().enumerate() {
            let want = part.file_range.end.saturating_sub(part.file_range.start);
            if covered[i] != want {
                return Err(invalid(format!(
                    "the extents of part {i} ({}) hold {} bytes, the part {want}",
                    part.role, covered[i]
                )));
            }
        }
        Ok(plan)
    }
}

/// One [`Stager::stage`] in progress.
struct Run<'a> {
    // Dropped first: the batch waits for its reads before the plan closes their blobs.
    batch: Batch<'a>,
    located: &'a Located,
    plan: Plan,
    buffers: usize,
    /// Reads of each fill not yet complete.
    remaining: Vec<usize>,
    /// Reads to submit (indices into the plan's reads), the rest of short reads first.
    queue: VecDeque<usize>,
    stats: StageStats,
}

impl Run<'_> {
    fn drive(&mut self, sink: &mut dyn StageSink) -> Result<(), StageError> {
        let n = self.buffers;
        let total = self.plan.fills.len();
        let (mut started, mut consumed) = (0, 0);
        loop {
            // Hand over filled buffers, in order.
            while consumed < started && self.remaining[consumed] == 0 {
                let fill = &self.plan.fills[consumed];
                let buffer = self
                    .batch
                    .buffer(fill.slot)
                    .expect("every read of a complete fill has completed");
                if let Err(e) = sink.consume(fill.slot, &buffer[..fill.used], &fill.segments) {
                    return Err(sink_error(self.located, e));
                }
                self.stats.fills += 1;
                self.stats.bytes += fill.used as u64;
                consumed += 1;
            }
            if consumed == total {
                return Ok(());
            }
            // Start fills whose buffer the sink has given back.
            while started < total && started < consumed + n {
                let fill = &self.plan.fills[started];
                if started >= n {
                    if let Err(e) = sink.reclaim(fill.slot) {
                        return Err(sink_error(self.located, e));
                    }
                }
                self.queue.extend(fill.reads.clone());
                started += 1;
            }
            if self.remaining[consumed] == 0 {
                continue;
            }
            self.submit()?;
            self.reap()?;
        }
    }

    /// Pushes queued reads while fewer than `queue_depth` are in flight (the ring's size).
    fn submit(&mut self) -> Result<(), StageError> {
        while self.batch.has_room() {
            let Some(&i) = self.queue.front() else { break };
            let op = &self.plan.ops[i];
            let rest = (op.length - op.done) as u32;
            let id = u32::try_from(i)
                .map_err(|_| ring_error("submitting reads", io::Error::other("over 2^32 reads")))?;
            // The plan cuts reads inside their fill, so the range lies in buffer `slot`, which
            // the sink gave back before the fill started and gets again only once every read
            // of the fill has completed.
            self.batch
                .read_buffer(
                    self.plan.files[op.file].1.as_fd(),
                    op.slot,
                    op.buffer_offset + op.done,
                    rest,
                    op.offset + op.done as u64,
                    id,
                )
                .map_err(|source| ring_error("submitting reads", source))?;
            self.queue.pop_front();
        }
        Ok(())
    }

    /// Waits for completions and takes them: a read whole, short (its rest queued again), or
    /// failed.
    fn reap(&mut self) -> Result<(), StageError> {
        let completions = self
            .batch
            .wait()
            .map_err(|source| ring_error("waiting for reads", source))?;
        let mut first_error = None;
        for c in completions {
            let i = c.id as usize;
            self.stats.reads += 1;
            let op = &mut self.plan.ops[i];
            let path = &self.plan.files[op.file].0;
            match c.result {
                _ if c.retry() => {
                    self.stats.resubmitted += 1;
                    self.queue.push_front(i);
                }
                r if r < 0 => {
                    first_error.get_or_insert(StageError::Read {
                        file: self.located.file.clone(),
                        tensor: self.located.key.clone(),
                        path: path.clone(),
                        offset: op.offset + op.done as u64,
                        length: op.length - op.done,
                        source: io::Error::from_raw_os_error(-r),
                    });
                }
                0 => {
                    first_error.get_or_insert(StageError::Eof {
                        file: self.located.file.clone(),
                        tensor: self.located.key.clone(),
                        path: path.clone(),
                        at: op.offset + op.done as u64,
                        end: op.extent_end,
                    });
                }
                r => {
                    op.done += r as usize;
                    if op.done < op.length {
                        self.stats.resubmitted += 1;
                        self.queue.push_front(i);
                    } else {
                        self.remaining[op.fill] -= 1;
                    }
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

fn sink_error(located: &Located, source: SinkError) -> StageError {
    StageError::Sink {
        file: located.file.clone(),
        tensor: located.key.clone(),
        source,
    }
}

fn ring_error(what: &'static str, source: io::Error) -> StageError {
    StageError::Ring { what, source }
}

/// The system's page size in bytes (`sysconf(_SC_PAGESIZE)`; 4096 where it cannot say): the
/// unit of mappings, `madvise` and `mincore`.
pub fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// A [`StageSink`] that copies each part's bytes into host memory: the same pipeline without a
/// device (tests, and a CPU loader).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostParts {
    /// Each part's bytes, in the order of [`Located::parts`].
    pub parts: Vec<Vec<u8>>,
}

impl HostParts {
    /// Zeroed memory for each part of `located` (its length in the file).
    pub fn for_located(located: &Located) -> HostParts {
        HostParts {
            parts: located
                .parts
                .iter()
                .map(|p| vec![0; (p.file_range.end.saturating_sub(p.file_range.start)) as usize])
                .collect(),
        }
    }
}

impl StageSink for HostParts {
    fn consume(
        &mut self,
        _slot: usize,
        buffer: &[u8],
        segments: &[Segment],
    ) -> Result<(), SinkError> {
        for s in segments {
            let part = self
                .parts
                .get_mut(s.part)
                .ok_or_else(|| format!("no part {}", s.part))?;
            let at = s.part_offset as usize;
            let dst = part
                .get_mut(at..at + s.length)
                .ok_or_else(|| format!("bytes {at}..{} past part {}", at + s.length, s.part))?;
            dst.copy_from_slice(&buffer[s.buffer_offset..s.buffer_offset + s.length]);
        }
        Ok(())
    }

    fn reclaim(&mut self, _slot: usize) -> Result<(), SinkError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_settings_read_from_the_environment_text() {
        let config =
            StageConfig::parse(" buffers=8, buffer_mib=16,read_kib=512,depth=128,fixed=0,async=0 ")
                .unwrap();
        assert_eq!(
            config,
            StageConfig {
                buffers: 8,
                buffer_bytes: 16 << 20,
                read_bytes: 512 << 10,
                queue_depth: 128,
                fixed_buffers: false,
                async_reads: false,
            }
        );
        assert_eq!(StageConfig::parse("").unwrap(), StageConfig::default());
        for bad in [
            "buffers",
            "buffers=x",
            "speed=3",
            "async=2",
            "depth=99999999999",
            "buffer_mib=-1",
        ] {
            let err = StageConfig::parse(bad).unwrap_err().to_string();
            assert!(
                err.starts_with(STAGE_ENV) && err.contains(bad),
                "{bad}: {err}"
            );
        }
    }
}
