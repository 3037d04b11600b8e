//! Laying tensors into chunks (spec §10) and writing the chunks.
//!
//! The planner is pure: parts in header order in, chunk lengths and locations out.
//! - A part of 16 MiB or more is standalone: its own chunks, split every 64 MiB from its first
//!   byte, so an unchanged large tensor has the same objects in every model that holds it.
//! - Smaller parts are packed in order at 4 KiB-aligned offsets. The open pack closes before a
//!   part of another component, before a part that would end past 64 MiB, and, once it holds
//!   16 MiB, before a part of another block (the key up to its last all-digit segment:
//!   `encoder.layer.3.attention.self.query.weight` → `encoder.layer.3`). A pack's index is
//!   taken when it opens; standalone parts do not close it.
//! - Zero-length parts take no space (`[0, 0, 0]`).
//!
//! Chunks never span components, so a component planned alone gives the same chunks as within
//! its model; an import plans each component once and reuses them across lanes.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::ImportError;
use crate::format::Location;
use crate::store::{Staged, Store};
use crate::sync::lock;

/// Parts this long or longer are standalone.
pub const STANDALONE_BYTES: u64 = 16 << 20;
/// Standalone parts split, and packs end, at this many bytes.
pub const CHUNK_MAX_BYTES: u64 = 64 << 20;
/// A pack holding this much closes at the next block boundary.
pub const BLOCK_CLOSE_BYTES: u64 = 16 << 20;
/// Packed parts start at multiples of this.
pub const ALIGN_BYTES: u64 = 4096;

/// One part to place: its key (for blocks) and length.
#[derive(Clone, Copy, Debug)]
pub struct Item<'a> {
    /// The tensor key.
    pub key: &'a str,
    /// Byte length.
    pub length: u64,
}

/// Chunk lengths and each item's location, for one component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Chunk lengths in index order.
    pub chunks: Vec<u64>,
    /// Each item's location, in item order.
    pub places: Vec<Location>,
}

/// The key up to and including its last all-digit dot-separated segment (`""` if none).
pub fn block_of(key: &str) -> &str {
    let mut end = 0;
    let mut at = 0;
    for segment in key.split('.') {
        at += segment.len();
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            end = at;
        }
        at += 1;
    }
    &key[..end]
}

/// The §10 rule applied one part at a time: each part's place depends only on the parts
/// before it, so a writer can place parts as it produces them.
#[derive(Clone, Debug, Default)]
pub struct Planner {
    /// Chunk lengths so far, in index order.
    chunks: Vec<u64>,
    /// The open pack: its index and the block of its last part.
    pack: Option<(usize, String)>,
}

impl Planner {
    /// A planner with no chunk yet.
    pub fn new() -> Planner {
        Planner::default()
    }

    /// Places a part of `length` bytes of tensor `key`; the location's chunk index counts from
    /// this planner's first chunk.
    pub fn place(&mut self, key: &str, length: u64) -> Location {
        if length == 0 {
            return Location::default();
        }
        if length >= STANDALONE_BYTES {
            let place = Location {
                chunk: self.chunks.len() as u64,
                offset: 0,
                length,
            };
            let mut left = length;
            while left > 0 {
                let take = left.min(CHUNK_MAX_BYTES);
                self.chunks.push(take);
                left -= take;
            }
            return place;
        }
        let block = block_of(key);
        let open = self.pack.as_ref().and_then(|(c, last)| {
            let start = self.chunks[*c].next_multiple_of(ALIGN_BYTES);
            let full = self.chunks[*c] >= BLOCK_CLOSE_BYTES && last != block;
            (!full && start + length <= CHUNK_MAX_BYTES).then_some((*c, start))
        });
        let (c, offset) = open.unwrap_or_else(|| {
            self.chunks.push(0);
            (self.chunks.len() - 1, 0)
        });
        self.chunks[c] = offset + length;
        self.pack = Some((c, block.to_owned()));
        Location {
            chunk: c as u64,
            offset,
            length,
        }
    }

    /// The open pack's index, if any (a part placed in it may still follow).
    pub fn open_pack(&self) -> Option<usize> {
        self.pack.as_ref().map(|(c, _)| *c)
    }

    /// Chunk lengths, in index order.
    pub fn chunks(&self) -> &[u64] {
        &self.chunks
    }
}

/// Plans one component's parts, in order.
pub fn plan(items: &[Item<'_>]) -> Plan {
    let mut planner = Planner::new();
    let places = items
        .iter()
        .map(|i| planner.place(i.key, i.length))
        .collect();
    Plan {
        chunks: planner.chunks,
        places,
    }
}

/// Where an item's bytes come from.
#[derive(Clone, Debug)]
pub(crate) enum ItemSource {
    /// Source file `.0` from offset `.1`.
    File(usize, u64),
    /// These bytes (a part a convention states outside the arrays).
    Bytes(Arc<[u8]>),
}

/// Bytes of a source to copy into a chunk.
#[derive(Clone, Debug)]
pub(crate) struct Piece {
    /// Offset in the chunk.
    pub chunk_offset: u64,
    /// The source, and the offset in it.
    pub from: ItemSource,
    pub length: u64,
}

/// One chunk to write: its length and the pieces that fill it (gaps are zeros).
#[derive(Clone, Debug, Default)]
pub(crate) struct ChunkJob {
    pub length: u64,
    pub pieces: Vec<Piece>,
}

/// The chunk jobs of a plan whose item `i` comes from `sources[i]`.
pub(crate) fn jobs(plan: &Plan, sources: &[ItemSource]) -> Vec<ChunkJob> {
    let mut jobs: Vec<ChunkJob> = plan
        .chunks
        .iter()
        .map(|&length| ChunkJob {
            length,
            pieces: Vec::new(),
        })
        .collect();
    for (place, source) in plan.places.iter().zip(sources) {
        let (mut chunk, mut offset, mut left, mut from) = (
            place.chunk as usize,
            place.offset,
            place.length,
            source.clone(),
        );
        while left > 0 {
            let take = left.min(jobs[chunk].length - offset);
            jobs[chunk].pieces.push(Piece {
                chunk_offset: offset,
                from: from.clone(),
                length: take,
            });
            from = match from {
                ItemSource::File(file, at) => ItemSource::File(file, at + take),
                ItemSource::Bytes(bytes) => ItemSource::Bytes(bytes[take as usize..].into()),
            };
            (chunk, offset, left) = (chunk + 1, 0, left - take);
        }
    }
    for job in &mut jobs {
        job.pieces.sort_by_key(|p| p.chunk_offset);
    }
    jobs
}

/// Bytes read from a source at a time.
const READ_BYTES: usize = 8 << 20;

/// Writes `jobs` (chunks of source files `files`) as staged objects, in parallel over
/// `threads` workers; `progress` gets each chunk's byte count as it completes.
///
/// Sources are read with `pread`, not mapped: a source truncated or rewritten during the import
/// then gives a short read or changed metadata, which are refused, where a mapping would fault.
///
/// # Errors
/// A source cannot be read or changed while it was read, or the store cannot be written.
pub(crate) fn write(
    store: &Store,
    files: &[(PathBuf, SourceStamp)],
    jobs: &[ChunkJob],
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
    cancel: Option<&AtomicBool>,
) -> Result<Vec<Staged>, ImportError> {
    let changed = |path: &Path| ImportError::source(path, "the file changed while it was imported");
    let opened = files
        .iter()
        .map(|(path, read)| {
            let file = File::open(path)
                .map_err(|e| ImportError::source(path, format!("cannot open: {e}")))?;
            if stamp(&file, path)? != *read {
                return Err(changed(path));
            }
            Ok(file)
        })
        .collect::<Result<Vec<_>, ImportError>>()?;
    let next = AtomicU64::new(0);
    let results: Mutex<Vec<Option<Result<Staged, ImportError>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1).min(jobs.len().max(1)) {
            scope.spawn(|| {
                let mut buf = vec![0u8; READ_BYTES];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(job) = jobs.get(i) else { break };
                    let result = write_one(store, files, &opened, job, &mut buf, cancel);
                    if result.is_ok() {
                        progress(job.length);
                    }
                    let failed = result.is_err();
                    lock(&results)[i] = Some(result);
                    if failed {
                        // Stop handing out work: the import fails anyway.
                        next.store(u64::MAX / 2, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let mut staged = Vec::with_capacity(jobs.len());
    for result in results.into_inner().unwrap_or_else(|e| e.into_inner()) {
        match result {
            Some(Ok(s)) => staged.push(s),
            Some(Err(e)) => return Err(e),
            None => {}
        }
    }
    for (file, (path, read)) in opened.iter().zip(files) {
        if stamp(file, path)? != *read {
            return Err(changed(path));
        }
    }
    Ok(staged)
}

/// A source's length and modification time, to tell that it did not change since its header
/// was read.
pub(crate) type SourceStamp = (u64, SystemTime);

/// The [`SourceStamp`] of an open source.
pub(crate) fn stamp(file: &File, path: &Path) -> Result<SourceStamp, ImportError> {
    let meta = file
        .metadata()
        .map_err(|e| ImportError::source(path, format!("cannot stat: {e}")))?;
    let modified = meta
        .modified()
        .map_err(|e| ImportError::source(path, format!("cannot stat: {e}")))?;
    Ok((meta.len(), modified))
}

fn write_one(
    store: &Store,
    files: &[(PathBuf, SourceStamp)],
    opened: &[File],
    job: &ChunkJob,
    buf: &mut [u8],
    cancel: Option<&AtomicBool>,
) -> Result<Staged, ImportError> {
    let mut writer = store.writer()?;
    let store_io = |e| {
        ImportError::Store(crate::store::StoreError::Io {
            op: "write",
            path: store.root().join("tmp"),
            source: e,
        })
    };
    let mut at = 0;
    for piece in &job.pieces {
        writer
            .write_zeros(piece.chunk_offset - at)
            .map_err(store_io)?;
        let (index, file_offset) = match &piece.from {
            ItemSource::Bytes(bytes) => {
                writer
                    .write_all(&bytes[..piece.length as usize])
                    .map_err(store_io)?;
                at = piece.chunk_offset + piece.length;
                continue;
            }
            ItemSource::File(index, offset) => (*index, *offset),
        };
        let file = &opened[index];
        let mut done = 0;
        while done < piece.length {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Err(ImportError::Interrupted);
            }
            let n = (piece.length - done).min(buf.len() as u64) as usize;
            file.read_exact_at(&mut buf[..n], file_offset + done)
                .map_err(|e| {
                    let why = match e.kind() {
                        std::io::ErrorKind::UnexpectedEof => {
                            "the file shrank while it was imported".to_owned()
                        }
                        _ => format!("cannot read: {e}"),
                    };
                    ImportError::source(&files[index].0, why)
                })?;
            writer.write_all(&buf[..n]).map_err(store_io)?;
            done += n as u64;
        }
        at = piece.chunk_offset + piece.length;
    }
    debug_assert_eq!(at, job.length);
    Ok(writer.finish_staged()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn items<'a>(spec: &'a [(&'a str, u64)]) -> Vec<Item<'a>> {
        spec.iter()
            .map(|&(key, length)| Item { key, length })
            .collect()
    }

    #[test]
    fn block_is_the_key_up_to_its_last_numeric_segment() {
        assert_eq!(
            block_of("transformer_blocks.12.attn.to_q.weight"),
            "transformer_blocks.12"
        );
        assert_eq!(block_of("down.1.attn.0.proj"), "down.1.attn.0");
        assert_eq!(block_of("conv_in.weight"), "");
        assert_eq!(block_of("a.1x.b"), "");
    }

    #[test]
    fn small_parts_pack_at_aligned_offsets() {
        let p = plan(&items(&[("a", 10), ("b", 5000), ("c", 0), ("d", 1)]));
        assert_eq!(p.chunks, vec![12289]);
        let offsets: Vec<_> = p
            .places
            .iter()
            .map(|l| (l.chunk, l.offset, l.length))
            .collect();
        assert_eq!(
            offsets,
            vec![(0, 0, 10), (0, 4096, 5000), (0, 0, 0), (0, 12288, 1)]
        );
    }

    #[test]
    fn standalone_parts_split_every_64_mib_and_leave_the_pack_open() {
        let p = plan(&items(&[
            ("a", 10),
            ("big", 130 * MIB),
            ("b", 10),
            ("edge", 16 * MIB),
            ("below", 16 * MIB - 1),
        ]));
        assert_eq!(
            p.chunks,
            vec![8192 + 16 * MIB - 1, 64 * MIB, 64 * MIB, 2 * MIB, 16 * MIB]
        );
        assert_eq!(
            p.places[1],
            Location {
                chunk: 1,
                offset: 0,
                length: 130 * MIB
            }
        );
        assert_eq!(
            p.places[2],
            Location {
                chunk: 0,
                offset: 4096,
                length: 10
            }
        );
        assert_eq!(
            p.places[3],
            Location {
                chunk: 4,
                offset: 0,
                length: 16 * MIB
            }
        );
        assert_eq!(
            p.places[4],
            Location {
                chunk: 0,
                offset: 8192,
                length: 16 * MIB - 1
            }
        );
    }

    #[test]
    fn a_full_pack_closes_at_a_new_block_only() {
        let p = plan(&items(&[
            ("l.0.a", 15 * MIB),
            ("l.0.b", 2 * MIB),
            ("l.0.c", 1),
            ("l.1.a", 1),
        ]));
        assert_eq!(p.chunks.len(), 2);
        assert_eq!(p.places[2].chunk, 0);
        assert_eq!(
            p.places[3],
            Location {
                chunk: 1,
                offset: 0,
                length: 1
            }
        );
    }

    #[test]
    fn a_pack_never_grows_past_64_mib() {
        let p = plan(&items(&[
            ("x.a", 15 * MIB),
            ("x.b", 15 * MIB),
            ("x.c", 15 * MIB),
            ("x.d", 15 * MIB),
            ("x.e", 5 * MIB),
        ]));
        assert_eq!(p.chunks.len(), 2);
        assert_eq!(p.places[4].chunk, 1);
        assert!(p.chunks.iter().all(|&c| c <= 64 * MIB));
    }

    #[test]
    fn jobs_cover_each_chunk_with_pieces_in_order() {
        let p = plan(&items(&[("a", 10), ("big", 70 * MIB), ("b", 3), ("c", 4)]));
        let sources = [
            ItemSource::File(0, 100),
            ItemSource::File(0, 200),
            ItemSource::File(1, 0),
            ItemSource::Bytes(Arc::from(&[1u8, 2, 3, 4][..])),
        ];
        let j = jobs(&p, &sources);
        assert_eq!(j.len(), 3);
        let from = |p: &Piece| match &p.from {
            ItemSource::File(file, offset) => (p.chunk_offset, *file, *offset, p.length),
            ItemSource::Bytes(b) => (p.chunk_offset, usize::MAX, b[0] as u64, p.length),
        };
        assert_eq!(
            j[0].pieces.iter().map(from).collect::<Vec<_>>(),
            vec![(0, 0, 100, 10), (4096, 1, 0, 3), (8192, usize::MAX, 1, 4)]
        );
        assert_eq!(j[1].pieces[0].length, 64 * MIB);
        assert_eq!(from(&j[2].pieces[0]).2, 200 + 64 * MIB);
    }
}
