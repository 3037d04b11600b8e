//! Chunk I/O: reading byte ranges of store objects, each verified before its first use.
//!
//! [`BlobReader`] is the [`ObjectSource`] of mounts and exports. The first read of an object
//! opens its blob and proves it holds the admitted bytes: either the verification ledger
//! ([`crate::store::verified`]) shows the inode unchanged since it was hashed, or the whole blob
//! is hashed now (and noted). Every read then checks that the inode's stamp is still the proven
//! one, so a blob rewritten or removed later is proven again before it serves another byte. A
//! blob that fails is never served: the read fails with `InvalidData` (EIO through FUSE) and an
//! error naming the blob and the repair, which the caller logs or prints; it is not hashed again
//! until it changes. Open descriptors stay in an LRU.
//!
//! Bytes are read by a chunk I/O [`backend`] (positioned reads, mmap or io_uring, chosen by
//! cache state and size unless `TENSORFS_IO` names one), any number of threads at once. Every
//! io_uring read of the crate goes through [`uring`], whose batches never outlive the memory
//! their reads write.

pub mod backend;
pub mod uring;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lru::LruCache;

use crate::format::{ObjectRef, Sha256};
use crate::store::verified::{Ledger, Stamp};
use crate::store::{hash_file, Store, StoreError};
use crate::sync::lock;
pub use backend::{Backend, Blob};

/// Reads byte ranges of objects, verified: the port through which layouts, the mount, views and
/// exports read bytes. Implemented here over a store ([`BlobReader`]), by the lazy mount over an
/// endpoint, and by in-memory maps in tests.
pub trait ObjectSource: Send + Sync {
    /// Fills `buf` with the bytes of `object` from `offset`.
    ///
    /// # Errors
    /// The object is absent, damaged (`InvalidData`) or shorter than `offset + buf.len()`.
    fn read_object(&self, object: &ObjectRef, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Fills every read's buffer, as [`ObjectSource::read_object`] would one by one; a source
    /// may batch them (one io_uring submission for a whole FUSE request).
    ///
    /// # Errors
    /// As [`ObjectSource::read_object`], for the first read that fails.
    fn read_objects(&self, reads: &mut [ObjectRead<'_>]) -> io::Result<()> {
        reads
            .iter_mut()
            .try_for_each(|r| self.read_object(r.object, r.offset, r.buf))
    }

    /// A file holding exactly `object`'s bytes, proven as a read would prove them, for the
    /// kernel to read directly (FUSE passthrough, [`crate::views`]). From then on the kernel
    /// reads it without this source's per-read checks. `None` (the default) when the source
    /// has no such file, e.g. a remote object not fetched yet, or cannot prove it now.
    fn backing_file(&self, object: &ObjectRef) -> Option<std::fs::File> {
        let _ = object;
        None
    }

    /// A hint that `objects` will be read soon, in this order (a reader going through a file
    /// in order). A source whose objects come from far away may start fetching them; the
    /// default does nothing. Never fails and never waits.
    fn prefetch(&self, objects: &[ObjectRef]) {
        let _ = objects;
    }

    /// No open file reads the objects of `digests` any more: a source may close what it keeps
    /// open of them, whose shared `flock`s would keep a collection from removing them (the
    /// default keeps nothing open). A later read opens them again.
    fn close(&self, digests: &[Sha256]) {
        let _ = digests;
    }

    /// What the source did since it started (`tensorfs status`; the default did nothing).
    fn stats(&self) -> SourceStats {
        SourceStats::default()
    }

    /// The inode stamp of `object`'s blob when its bytes are known proven now (the
    /// verification ledger shows the inode unchanged since it was hashed), without hashing
    /// anything; `None` when not known (the default), absent, or changed.
    fn proven_stamp(&self, object: &ObjectRef) -> Option<Stamp> {
        let _ = object;
        None
    }

    /// Makes `objects` present and keeps them so until the returned guard is dropped: for a
    /// reader that reads their blobs itself, outside this source (the extents ioctl's ABI 2).
    /// A source over a store that keeps every object keeps nothing more (the default).
    ///
    /// # Errors
    /// An object cannot be made present (a lazy mount's fetch failed).
    fn keep(&self, objects: &[ObjectRef]) -> io::Result<Kept> {
        let _ = objects;
        Ok(Kept(Box::new(())))
    }
}

/// What [`ObjectSource::keep`] keeps: dropping it lets the objects go again.
pub struct Kept(pub Box<dyn Send + Sync>);

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Kept")
    }
}

/// What an [`ObjectSource`] did since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SourceStats {
    /// Blobs opened and proven to hold their object's bytes (by the ledger, or hashed).
    pub proven: u64,
    /// Of those, blobs hashed to prove them.
    pub hashed: u64,
    /// Blobs found damaged (not the bytes their name promises).
    pub damaged: u64,
}

/// One range of an object to read.
#[derive(Debug)]
pub struct ObjectRead<'a> {
    /// The object.
    pub object: &'a ObjectRef,
    /// Offset in the object.
    pub offset: u64,
    /// Where the bytes go; filled whole.
    pub buf: &'a mut [u8],
}

/// Settings of a [`BlobReader`]. The default backend is the one `TENSORFS_IO` names, else
/// [`Backend::Auto`].
#[derive(Clone, Debug)]
pub struct BlobReaderConfig {
    /// Most blob descriptors kept open at once (default 1024).
    pub max_open_files: usize,
    /// How bytes are read (default [`Backend::Auto`]).
    pub backend: Backend,
}

impl Default for BlobReaderConfig {
    fn default() -> Self {
        BlobReaderConfig {
            max_open_files: 1024,
            backend: Backend::from_env().unwrap_or_default(),
        }
    }
}

/// An open blob and the stamp its inode had when its bytes were proven.
#[derive(Debug)]
struct Open {
    blob: Blob,
    stamp: Stamp,
}

/// Reads verified object bytes from a store.
#[derive(Debug)]
pub struct BlobReader {
    store: Store,
    backend: Backend,
    ledger: Ledger,
    open: Mutex<LruCache<Sha256, Arc<Open>>>,
    /// One lock per object being opened, so concurrent first reads hash a blob once.
    opening: Mutex<HashMap<Sha256, Arc<Mutex<()>>>>,
    /// Blobs found damaged, with their stamp then: refused without hashing until they change.
    damaged: Mutex<HashMap<Sha256, Stamp>>,
    /// Blobs proven, hashed and found damaged.
    counts: [AtomicU64; 3],
}

impl BlobReader {
    /// A reader over `store`.
    pub fn new(store: Store, config: BlobReaderConfig) -> BlobReader {
        let capacity = NonZeroUsize::new(config.max_open_files.max(1)).expect("at least one");
        BlobReader {
            backend: config.backend,
            ledger: Ledger::load(&store),
            store,
            open: Mutex::new(LruCache::new(capacity)),
            opening: Mutex::default(),
            damaged: Mutex::default(),
            counts: Default::default(),
        }
    }

    /// The store read from.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The open, proven blob of `object`.
    fn get(&self, object: &ObjectRef) -> io::Result<Arc<Open>> {
        if let Some(open) = lock(&self.open).get(&object.sha256) {
            return Ok(open.clone());
        }
        let gate = lock(&self.opening)
            .entry(object.sha256)
            .or_default()
            .clone();
        let _gate = lock(&gate);
        if let Some(open) = lock(&self.open).get(&object.sha256) {
            return Ok(open.clone());
        }
        let proven = self.prove(object);
        lock(&self.opening).remove(&object.sha256);
        let open = Arc::new(proven?);
        lock(&self.open).put(object.sha256, open.clone());
        Ok(open)
    }

    /// A descriptor of `object`'s blob, its bytes proven (the ledger shows the inode unchanged
    /// since it was hashed, or it is hashed now), for a caller that maps or reads the blob
    /// itself.
    ///
    /// # Errors
    /// The blob is absent, unreadable, damaged (`InvalidData`, naming the blob and what to
    /// run), or changed since its proof and damaged now.
    pub fn proven_file(&self, object: &ObjectRef) -> io::Result<File> {
        let mut open = self.get(object)?;
        if !self.unchanged(object, &open)? {
            open = self.get(object)?;
        }
        open.blob.file().try_clone()
    }

    /// Whether `open`'s blob still has the inode stamp it was proven with; when not, it is
    /// dropped from the open blobs, so the next use opens and proves it again.
    ///
    /// # Errors
    /// The blob's metadata cannot be read.
    fn unchanged(&self, object: &ObjectRef, open: &Open) -> io::Result<bool> {
        let same = Stamp::of(&open.blob.file().metadata()?) == open.stamp;
        if !same {
            lock(&self.open).pop(&object.sha256);
        }
        Ok(same)
    }

    /// Opens `object`'s blob and proves its bytes: the ledger shows the inode unchanged since it
    /// was hashed, or it is hashed now.
    fn prove(&self, object: &ObjectRef) -> io::Result<Open> {
        let path = self.store.object_path(object);
        let file = self.store.open_object(object).map_err(to_io)?;
        let meta = file.metadata()?;
        let stamp = Stamp::of(&meta);
        if lock(&self.damaged).get(&object.sha256) == Some(&stamp) {
            return Err(damaged(&path, None));
        }
        if !self.ledger.proves(object, &meta) {
            self.counts[1].fetch_add(1, Ordering::Relaxed);
            let found = hash_file(&file)?;
            if found != *object {
                self.counts[2].fetch_add(1, Ordering::Relaxed);
                lock(&self.damaged).insert(object.sha256, stamp);
                return Err(damaged(&path, Some(&found)));
            }
            if let Err(e) = self.ledger.note(object, &meta) {
                tracing::debug!("could not note verified blob {}: {e}", path.display());
            }
        }
        self.counts[0].fetch_add(1, Ordering::Relaxed);
        Ok(Open {
            blob: Blob::new(file, path, object.length),
            stamp,
        })
    }
}

/// The error for a blob whose bytes are not its object's.
fn damaged(path: &std::path::Path, found: Option<&ObjectRef>) -> io::Error {
    let holds = found.map_or_else(String::new, |f| {
        format!(" (it holds sha256 {}, {} bytes)", f.sha256, f.length)
    });
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{}: damaged blob{holds}: its bytes are not the object its name promises; run \
             `tensorfs verify --repair`, then import or download the model again",
            path.display()
        ),
    )
}

impl ObjectSource for BlobReader {
    fn proven_stamp(&self, object: &ObjectRef) -> Option<Stamp> {
        let open = lock(&self.open).peek(&object.sha256).cloned();
        if let Some(open) = open {
            let meta = open.blob.file().metadata().ok()?;
            return (Stamp::of(&meta) == open.stamp).then_some(open.stamp);
        }
        let meta = std::fs::symlink_metadata(self.store.object_path(object)).ok()?;
        (meta.is_file() && self.ledger.proves(object, &meta)).then(|| Stamp::of(&meta))
    }

    fn stats(&self) -> SourceStats {
        let get = |i: usize| self.counts[i].load(Ordering::Relaxed);
        SourceStats {
            proven: get(0),
            hashed: get(1),
            damaged: get(2),
        }
    }

    fn close(&self, digests: &[Sha256]) {
        let mut open = lock(&self.open);
        for d in digests {
            // A read in flight keeps its `Arc` until it is done.
            open.pop(d);
        }
    }

    fn read_object(&self, object: &ObjectRef, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_objects(&mut [ObjectRead {
            object,
            offset,
            buf,
        }])
    }

    fn backing_file(&self, object: &ObjectRef) -> Option<File> {
        self.proven_file(object).ok()
    }

    fn read_objects(&self, reads: &mut [ObjectRead<'_>]) -> io::Result<()> {
        for r in reads.iter() {
            let end = r.offset.checked_add(r.buf.len() as u64);
            if end.is_none_or(|end| end > r.object.length) {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "read of {} bytes at {} is past the end of {}",
                        r.buf.len(),
                        r.offset,
                        r.object
                    ),
                ));
            }
        }
        // A blob changed after its proof (rewritten in place, or unlinked by a repair) moves its
        // inode's ctime before any new byte lands, so a stamp still equal after the read proves
        // the bytes read are the proven ones. Otherwise it is opened and proven again, and the
        // batch read again.
        for _ in 0..2 {
            let opens: Vec<Arc<Open>> = reads
                .iter()
                .map(|r| self.get(r.object))
                .collect::<io::Result<_>>()?;
            let mut requests: Vec<backend::Request<'_>> = reads
                .iter_mut()
                .zip(&opens)
                .map(|(r, open)| backend::Request {
                    blob: &open.blob,
                    offset: r.offset,
                    buf: &mut *r.buf,
                })
                .collect();
            backend::read(self.backend, &mut requests)?;
            // One stamp check per blob, however many of the batch's ranges it holds (a FUSE
            // read often takes several ranges of one chunk).
            let mut changed = false;
            for (k, (r, open)) in reads.iter().zip(&opens).enumerate() {
                if opens[..k].iter().any(|o| Arc::ptr_eq(o, open)) {
                    continue;
                }
                if !self.unchanged(r.object, open)? {
                    changed = true;
                }
            }
            if !changed {
                return Ok(());
            }
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: a blob keeps changing while it is read",
                self.store.root().display()
            ),
        ))
    }
}

/// `e` as an `io::Error` of its kind, keeping `e` as its inner error, so a caller that wants
/// the OS error number (`EMFILE`, `EACCES`) finds it in the chain of sources.
fn to_io(e: StoreError) -> io::Error {
    let kind = match &e {
        StoreError::Absent { .. } => io::ErrorKind::NotFound,
        StoreError::Mismatch { .. } => io::ErrorKind::InvalidData,
        StoreError::Io { source, .. } => source.kind(),
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}
