//! The plan of a synthesized safetensors (or GGUF) file: a header prefix in memory, then tensor
//! bytes as segments, each a contiguous range of one chunk or of one decoded tensor, or a run of
//! zeros (a GGUF's padding).

use std::io;
use std::sync::{Arc, OnceLock};

use super::decoded::Compute;
use crate::format::{Hasher, Header, Location, ObjectRef, Sha256};
use crate::io::ObjectSource;

/// Where a segment's bytes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Bytes the plan holds (a recipe's marker arrays), from `offset` of its inline buffer.
    Inline {
        /// Offset within the plan's inline bytes.
        offset: u64,
    },
    /// A range of one chunk, from `offset`.
    Chunk {
        /// Index into the plan's chunks.
        chunk: u32,
        /// Offset of the range within the chunk.
        offset: u64,
    },
    /// Zero bytes (padding), held nowhere.
    Zeros,
    /// Bytes of tensor `tensor` of component `component` that are in no chunk, computed when
    /// read ([`Compute`]), from byte `offset` of the computed tensor.
    Computed {
        /// How they are computed.
        how: Compute,
        /// Index into the header's components.
        component: u32,
        /// Index into the component's tensors.
        tensor: u32,
        /// Offset within the computed tensor.
        offset: u64,
    },
}

/// A contiguous range of bytes placed at `file_offset` in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Where the range starts in the synthesized file.
    pub file_offset: u64,
    /// Length of the range in bytes (never 0).
    pub length: u64,
    /// Where its bytes come from.
    pub source: Source,
}

/// A safetensors file as `prefix` (the 8-byte length and the header JSON) followed by
/// `segments`, which tile the rest of the file in order with no gap.
#[derive(Debug)]
pub struct SafetensorsPlan {
    prefix: Vec<u8>,
    inline: Vec<u8>,
    segments: Vec<Segment>,
    chunks: Arc<[ObjectRef]>,
    /// The header and its object, when segments decode tensors.
    decoding: Option<(Arc<Header>, ObjectRef)>,
    size: u64,
    /// [`SafetensorsPlan::digest`], computed on first use.
    digest: OnceLock<Sha256>,
}

/// Builds a plan by appending tensor locations in file order.
pub(crate) struct PlanBuilder<'h> {
    header: &'h Header,
    chunks: Arc<[ObjectRef]>,
    prefix: Vec<u8>,
    inline: Vec<u8>,
    segments: Vec<Segment>,
    decoding: Option<(Arc<Header>, ObjectRef)>,
    end: u64,
}

impl<'h> PlanBuilder<'h> {
    pub(crate) fn new(header: &'h Header, chunks: &Arc<[ObjectRef]>, prefix: Vec<u8>) -> Self {
        let end = prefix.len() as u64;
        PlanBuilder {
            header,
            chunks: chunks.clone(),
            prefix,
            inline: Vec::new(),
            segments: Vec::new(),
            decoding: None,
            end,
        }
    }

    /// Appends the bytes at `location` after everything so far.
    pub(crate) fn push(&mut self, location: Location) {
        self.push_range(location, 0, location.length);
    }

    /// Appends `length` bytes of those at `location`, from its byte `skip` on, after
    /// everything so far. Assumes the range lies in the location.
    pub(crate) fn push_range(&mut self, location: Location, mut skip: u64, mut left: u64) {
        for (chunk, chunk_offset, length) in self.header.pieces(location) {
            if skip >= length {
                skip -= length;
                continue;
            }
            let (chunk_offset, length) = (chunk_offset + skip, (length - skip).min(left));
            skip = 0;
            left -= length;
            if length == 0 {
                break;
            }
            // Adjacent ranges of one chunk read as one.
            if let Some(last) = self.segments.last_mut() {
                if let Source::Chunk { chunk: c, offset } = last.source {
                    if c as usize == chunk && offset + last.length == chunk_offset {
                        last.length += length;
                        self.end += length;
                        continue;
                    }
                }
            }
            let source = Source::Chunk {
                chunk: chunk as u32,
                offset: chunk_offset,
            };
            self.segments.push(Segment {
                file_offset: self.end,
                length,
                source,
            });
            self.end += length;
        }
    }

    /// Appends `bytes`, which the plan keeps.
    pub(crate) fn push_inline(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let source = Source::Inline {
            offset: self.inline.len() as u64,
        };
        self.inline.extend_from_slice(bytes);
        self.segments.push(Segment {
            file_offset: self.end,
            length: bytes.len() as u64,
            source,
        });
        self.end += bytes.len() as u64;
    }

    /// Appends `length` zero bytes.
    pub(crate) fn push_zeros(&mut self, length: u64) {
        if length == 0 {
            return;
        }
        if let Some(last) = self.segments.last_mut() {
            if last.source == Source::Zeros {
                last.length += length;
                self.end += length;
                return;
            }
        }
        self.segments.push(Segment {
            file_offset: self.end,
            length,
            source: Source::Zeros,
        });
        self.end += length;
    }

    /// Appends tensor `tensor` of component `component` (`length` bytes) computed by `how`,
    /// which the plan does from `header` (object `header_ref`) when the bytes are read.
    pub(crate) fn push_computed(
        &mut self,
        computing: &(Arc<Header>, ObjectRef),
        how: Compute,
        component: usize,
        tensor: usize,
        length: u64,
    ) {
        self.decoding.get_or_insert_with(|| computing.clone());
        if length == 0 {
            return;
        }
        let source = Source::Computed {
            how,
            component: component as u32,
            tensor: tensor as u32,
            offset: 0,
        };
        self.segments.push(Segment {
            file_offset: self.end,
            length,
            source,
        });
        self.end += length;
    }

    pub(crate) fn finish(self) -> SafetensorsPlan {
        SafetensorsPlan {
            prefix: self.prefix,
            inline: self.inline,
            segments: self.segments,
            chunks: self.chunks,
            decoding: self.decoding,
            size: self.end,
            digest: OnceLock::new(),
        }
    }
}

impl SafetensorsPlan {
    /// The file's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The 8-byte length and header JSON.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The tensor byte ranges in file order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The chunk objects segments index.
    pub fn chunks(&self) -> &[ObjectRef] {
        &self.chunks
    }

    /// Whether the file computes tensors when read (a weights file of a decoded view whose
    /// component has encoded tensors, or a single file's transposed array): those tensors'
    /// bytes are in no chunk.
    pub fn decodes(&self) -> bool {
        self.decoding.is_some()
    }

    /// A digest naming the file's bytes: the SHA-256 of the prefix, the inline bytes and every
    /// segment (place, length, source with its chunk object). Two plans with one digest read the
    /// same bytes. A plan that decodes also names the decoding header and this build's version,
    /// since its bytes are the decoders' output. (Used as the name of a file's view, see
    /// [`crate::views`].)
    pub fn digest(&self) -> Sha256 {
        *self.digest.get_or_init(|| self.compute_digest())
    }

    fn compute_digest(&self) -> Sha256 {
        let mut h = Hasher::new();
        let mut field = |bytes: &[u8]| {
            h.update(&(bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(b"tensorfs plan/1");
        field(&self.prefix);
        field(&self.inline);
        if let Some((_, header)) = &self.decoding {
            field(&header.sha256.0);
            field(env!("CARGO_PKG_VERSION").as_bytes());
        }
        for s in &self.segments {
            let mut record = Vec::with_capacity(64);
            record.extend_from_slice(&s.file_offset.to_le_bytes());
            record.extend_from_slice(&s.length.to_le_bytes());
            match s.source {
                Source::Inline { offset } => {
                    record.push(0);
                    record.extend_from_slice(&offset.to_le_bytes());
                }
                Source::Chunk { chunk, offset } => {
                    let object = &self.chunks[chunk as usize];
                    record.push(1);
                    record.extend_from_slice(&object.sha256.0);
                    record.extend_from_slice(&object.length.to_le_bytes());
                    record.extend_from_slice(&offset.to_le_bytes());
                }
                Source::Zeros => record.push(2),
                Source::Computed {
                    how,
                    component,
                    tensor,
                    offset,
                } => {
                    record.push(match how {
                        Compute::Decode => 3,
                        Compute::Transpose => 4,
                    });
                    record.extend_from_slice(&component.to_le_bytes());
                    record.extend_from_slice(&tensor.to_le_bytes());
                    record.extend_from_slice(&offset.to_le_bytes());
                }
            }
            field(&record);
        }
        h.finish().sha256
    }

    /// The first `count` distinct chunks of the segments from file offset `offset` on, in file
    /// order (see [`super::Content::chunks_from`]).
    pub fn chunks_from(&self, offset: u64, count: usize) -> Vec<ObjectRef> {
        let first = self
            .segments
            .partition_point(|s| s.file_offset + s.length <= offset);
        let mut out: Vec<ObjectRef> = Vec::with_capacity(count.min(self.chunks.len()));
        for segment in &self.segments[first..] {
            if out.len() >= count {
                break;
            }
            if let Source::Chunk { chunk, .. } = segment.source {
                let chunk = self.chunks[chunk as usize];
                if !out.contains(&chunk) {
                    out.push(chunk);
                }
            }
        }
        out
    }

    /// Fills `buf` (which lies within the file) from `offset`.
    pub(crate) fn read_at(
        &self,
        source: &dyn ObjectSource,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<()> {
        let mut at = offset;
        let mut out = buf;
        let prefix_len = self.prefix.len() as u64;
        if at < prefix_len {
            let n = out.len().min((prefix_len - at) as usize);
            out[..n].copy_from_slice(&self.prefix[at as usize..at as usize + n]);
            out = &mut out[n..];
            at += n as u64;
        }
        // The first segment that ends after `at`.
        let mut i = self
            .segments
            .partition_point(|s| s.file_offset + s.length <= at);
        // Chunk ranges are read together at the end, in one batch.
        let mut reads: Vec<crate::io::ObjectRead<'_>> = Vec::new();
        while !out.is_empty() {
            let s = self.segments.get(i).ok_or_else(|| {
                io::Error::new(io::ErrorKind::UnexpectedEof, "read past the last segment")
            })?;
            let within = at - s.file_offset;
            let n = out.len().min((s.length - within) as usize);
            let (here, rest) = std::mem::take(&mut out).split_at_mut(n);
            match s.source {
                Source::Inline { offset } => {
                    let from = (offset + within) as usize;
                    here.copy_from_slice(&self.inline[from..from + n]);
                }
                Source::Zeros => here.fill(0),
                Source::Chunk { chunk, offset } => reads.push(crate::io::ObjectRead {
                    object: &self.chunks[chunk as usize],
                    offset: offset + within,
                    buf: here,
                }),
                Source::Computed {
                    how,
                    component,
                    tensor,
                    offset,
                } => {
                    let (header, header_ref) = self
                        .decoding
                        .as_ref()
                        .expect("computed segments carry their header");
                    let at = (component as usize, tensor as usize);
                    super::decoded::read(
                        source,
                        header,
                        header_ref,
                        how,
                        at,
                        offset + within,
                        here,
                    )?
                }
            }
            out = rest;
            at += n as u64;
            i += 1;
        }
        if !reads.is_empty() {
            source.read_objects(&mut reads)?;
        }
        Ok(())
    }
}
