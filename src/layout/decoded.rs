//! The decoded view's tensor bytes: an encoded tensor decoded to its logical dtype on its
//! first read, kept in a process-wide cache bounded in bytes, so sequential reads of a tensor
//! (a loader's) decode it once, on every core.
//!
//! A tensor decodes whole (the parts of most schemes are laid out for whole rows and blocks).
//! The cache holds at most [`cache_budget_bytes`] of decoded tensors, least recently used out
//! first; a tensor larger than the budget is decoded for each read that needs it and not kept.

use std::collections::HashMap;
use std::io;
use std::num::NonZeroUsize;
use std::sync::{Arc, LazyLock, Mutex};

use lru::LruCache;

use crate::decode::{self, Encoded, Part};
use crate::format::{Body, Header, ObjectRef, Sha256};
use crate::io::ObjectSource;
use crate::sync::lock;

/// How a computed segment's tensor is made from stored bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compute {
    /// An encoded tensor's logical bytes, decoded (a decoded view).
    Decode,
    /// A plain 2-D tensor transposed (a single file's array that the import stored the other
    /// way, OpenCLIP's `text_projection`).
    Transpose,
}

/// A computed tensor: (header, component, tensor, how).
type Key = (Sha256, usize, usize, Compute);

/// Decoded tensors by key, and their total bytes.
type Entries = (LruCache<Key, Arc<Vec<u8>>>, u64);

struct Cache {
    entries: Mutex<Entries>,
    /// One lock per tensor being decoded, so concurrent readers decode it once.
    decoding: Mutex<HashMap<Key, Arc<Mutex<()>>>>,
}

static CACHE: LazyLock<Cache> = LazyLock::new(|| Cache {
    entries: Mutex::new((
        LruCache::new(NonZeroUsize::new(1 << 20).expect("nonzero")),
        0,
    )),
    decoding: Mutex::default(),
});

/// The most bytes of decoded tensors kept: `$TENSORFS_DECODE_CACHE_MIB` MiB, else 1 GiB.
pub fn cache_budget_bytes() -> u64 {
    static BUDGET: LazyLock<u64> = LazyLock::new(|| {
        std::env::var("TENSORFS_DECODE_CACHE_MIB")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1024)
            << 20
    });
    *BUDGET
}

/// Fills `buf` with the bytes of tensor `at` = (component, tensor) of `header` computed by
/// `how` (decoded, or transposed), from `offset`.
///
/// # Errors
/// A part cannot be read, or the computation is refused (`InvalidData`, naming the component,
/// the tensor and why: a decode the scheme refuses, a transpose of what is not a plain 2-D
/// tensor).
pub(crate) fn read(
    source: &dyn ObjectSource,
    header: &Header,
    header_ref: &ObjectRef,
    how: Compute,
    at: (usize, usize),
    offset: u64,
    buf: &mut [u8],
) -> io::Result<()> {
    let key = (header_ref.sha256, at.0, at.1, how);
    let bytes = cached(key, || match how {
        Compute::Decode => decode_tensor(source, header, at.0, at.1),
        Compute::Transpose => transpose_tensor(source, header, at.0, at.1),
    })?;
    copy_out(&bytes, offset, buf)
}

fn copy_out(bytes: &[u8], offset: u64, buf: &mut [u8]) -> io::Result<()> {
    let start = offset as usize;
    let end = start + buf.len();
    if end > bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "read past a decoded tensor",
        ));
    }
    buf.copy_from_slice(&bytes[start..end]);
    Ok(())
}

fn cached(key: Key, decode: impl FnOnce() -> io::Result<Vec<u8>>) -> io::Result<Arc<Vec<u8>>> {
    if let Some(hit) = lock(&CACHE.entries).0.get(&key) {
        return Ok(hit.clone());
    }
    let gate = lock(&CACHE.decoding).entry(key).or_default().clone();
    let _gate = lock(&gate);
    if let Some(hit) = lock(&CACHE.entries).0.get(&key) {
        return Ok(hit.clone());
    }
    let decoded = decode();
    lock(&CACHE.decoding).remove(&key);
    let bytes = Arc::new(decoded?);
    let size = bytes.len() as u64;
    let budget = cache_budget_bytes();
    if size <= budget {
        let mut entries = lock(&CACHE.entries);
        let (lru, total) = &mut *entries;
        while *total + size > budget {
            let Some((_, old)) = lru.pop_lru() else { break };
            *total -= old.len() as u64;
        }
        lru.put(key, bytes.clone());
        *total += size;
    }
    Ok(bytes)
}

/// Reads plain 2-D tensor `tensor` of component `component` and transposes it.
fn transpose_tensor(
    source: &dyn ObjectSource,
    header: &Header,
    component: usize,
    tensor: usize,
) -> io::Result<Vec<u8>> {
    let c = &header.components[component];
    let t = &c.tensors[tensor];
    let refuse = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("component {:?} tensor {:?}: {why}", c.name, t.key),
        )
    };
    let Body::Plain(location) = t.body else {
        return Err(refuse("is encoded, so it is not transposed"));
    };
    let ([rows, cols], Some(bits)) = (t.shape.as_slice(), t.dtype.bits()) else {
        return Err(refuse("is not a 2-D tensor of a known dtype"));
    };
    let width = (bits / 8) as usize;
    let (rows, cols) = (*rows as usize, *cols as usize);
    if bits % 8 != 0 || rows * cols * width != location.length as usize {
        return Err(refuse(
            "is not of whole bytes, or its length is not its shape's",
        ));
    }
    let stored = read_location(source, header, location)?;
    Ok(decode::elem::transpose(&stored, rows, cols, width))
}

/// The bytes at `location` of `header`'s chunks.
fn read_location(
    source: &dyn ObjectSource,
    header: &Header,
    location: crate::format::Location,
) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; location.length as usize];
    let mut at = 0;
    for (chunk, offset, length) in header.pieces(location) {
        source.read_object(
            &header.chunks[chunk],
            offset,
            &mut buf[at..at + length as usize],
        )?;
        at += length as usize;
    }
    Ok(buf)
}

/// Reads the parts of tensor `tensor` of component `component` and decodes it whole.
///
/// # Errors
/// As reading a decoded range does: the scheme or its parts refuse the decode (`InvalidData`), or
/// a chunk cannot be read.
pub fn decode_tensor(
    source: &dyn ObjectSource,
    header: &Header,
    component: usize,
    tensor: usize,
) -> io::Result<Vec<u8>> {
    let c = &header.components[component];
    let t = &c.tensors[tensor];
    let refuse = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("component {:?} tensor {:?}: {why}", c.name, t.key),
        )
    };
    let Body::Encoded { encoding, parts } = &t.body else {
        return Err(refuse("is not encoded".into()));
    };
    let mut bytes = Vec::with_capacity(parts.len());
    for part in parts {
        bytes.push(read_location(source, header, part.location)?);
    }
    let e = &header.encodings[*encoding];
    let encoded = Encoded {
        scheme: &e.scheme,
        params: &e.params,
        dtype: &t.dtype,
        shape: &t.shape,
        parts: parts
            .iter()
            .zip(&bytes)
            .map(|(p, b)| Part {
                role: &p.role,
                dtype: &p.dtype,
                shape: &p.shape,
                bytes: b,
            })
            .collect(),
    };
    let size = t
        .dtype
        .byte_len(&t.shape)
        .map_err(|e| refuse(e.to_string()))?
        .ok_or_else(|| refuse(format!("the logical dtype {} has no size", t.dtype)))?;
    let mut out = vec![0u8; size as usize];
    decode::decode(&encoded, &mut out).map_err(|e| refuse(e.to_string()))?;
    Ok(out)
}
