//! The plan of a synthesized safetensors file: a header prefix in memory, then tensor bytes as
//! segments, each a contiguous range of one chunk.

use std::io;
use std::sync::Arc;

use super::ObjectSource;
use crate::format::{Header, Location, ObjectRef};

/// A contiguous range of one chunk placed at `file_offset` in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Where the range starts in the synthesized file.
    pub file_offset: u64,
    /// Index into the plan's chunks.
    pub chunk: u32,
    /// Offset of the range within the chunk.
    pub chunk_offset: u64,
    /// Length of the range in bytes (never 0).
    pub length: u64,
}

/// A safetensors file as `prefix` (the 8-byte length and the header JSON) followed by
/// `segments`, which tile the rest of the file in order with no gap.
#[derive(Debug)]
pub struct SafetensorsPlan {
    prefix: Vec<u8>,
    segments: Vec<Segment>,
    chunks: Arc<[ObjectRef]>,
    size: u64,
}

/// Builds a plan by appending tensor locations in file order.
pub(crate) struct PlanBuilder<'h> {
    header: &'h Header,
    chunks: Arc<[ObjectRef]>,
    prefix: Vec<u8>,
    segments: Vec<Segment>,
    end: u64,
}

impl<'h> PlanBuilder<'h> {
    pub(crate) fn new(header: &'h Header, chunks: &Arc<[ObjectRef]>, prefix: Vec<u8>) -> Self {
        let end = prefix.len() as u64;
        PlanBuilder {
            header,
            chunks: chunks.clone(),
            prefix,
            segments: Vec::new(),
            end,
        }
    }

    /// Appends the bytes at `location` after everything so far.
    pub(crate) fn push(&mut self, location: Location) {
        for (chunk, chunk_offset, length) in self.header.pieces(location) {
            // Adjacent ranges of one chunk read as one.
            if let Some(last) = self.segments.last_mut() {
                if last.chunk as usize == chunk && last.chunk_offset + last.length == chunk_offset {
                    last.length += length;
                    self.end += length;
                    continue;
                }
            }
            self.segments.push(Segment {
                file_offset: self.end,
                chunk: chunk as u32,
                chunk_offset,
                length,
            });
            self.end += length;
        }
    }

    pub(crate) fn finish(self) -> SafetensorsPlan {
        SafetensorsPlan {
            prefix: self.prefix,
            segments: self.segments,
            chunks: self.chunks,
            size: self.end,
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
        while !out.is_empty() {
            let s = self.segments.get(i).ok_or_else(|| {
                io::Error::new(io::ErrorKind::UnexpectedEof, "read past the last segment")
            })?;
            let within = at - s.file_offset;
            let n = out.len().min((s.length - within) as usize);
            source.read_object(
                &self.chunks[s.chunk as usize],
                s.chunk_offset + within,
                &mut out[..n],
            )?;
            out = &mut out[n..];
            at += n as u64;
            i += 1;
        }
        Ok(())
    }
}
