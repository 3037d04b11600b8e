//! Chunk I/O: reading byte ranges of store objects, each verified before its first use.
//!
//! [`BlobReader`] is the [`ObjectSource`] of mounts and exports. The first read of an object
//! opens its blob and proves it holds the admitted bytes: either the verification ledger
//! ([`crate::store::verified`]) shows the inode unchanged since it was hashed, or the whole blob
//! is hashed now (and noted). A blob that fails is never served: the read fails with
//! `InvalidData` (EIO through FUSE) and one error log line names the blob and the repair. Open
//! descriptors stay in an LRU; one reopened later is re-proven against its inode stamp.
//!
//! Reads are positioned (`pread`), so any number of threads read one descriptor at once.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::num::NonZeroUsize;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use lru::LruCache;

use crate::format::{Hasher, ObjectRef, Sha256};
use crate::layout::ObjectSource;
use crate::store::verified::{Ledger, Stamp};
use crate::store::{Store, StoreError};

/// Settings of a [`BlobReader`].
#[derive(Clone, Debug)]
pub struct BlobReaderConfig {
    /// Most blob descriptors kept open at once (default 1024).
    pub max_open_files: usize,
}

impl Default for BlobReaderConfig {
    fn default() -> Self {
        BlobReaderConfig {
            max_open_files: 1024,
        }
    }
}

/// An open, proven blob.
#[derive(Debug)]
struct Open {
    file: File,
}

/// Reads verified object bytes from a store.
#[derive(Debug)]
pub struct BlobReader {
    store: Store,
    ledger: Ledger,
    open: Mutex<LruCache<Sha256, Arc<Open>>>,
    /// One lock per object being opened, so concurrent first reads hash a blob once.
    opening: Mutex<HashMap<Sha256, Arc<Mutex<()>>>>,
    /// Stamps of blobs proven by this reader.
    proven: Mutex<HashMap<Sha256, Stamp>>,
}

impl BlobReader {
    /// A reader over `store`.
    pub fn new(store: Store, config: BlobReaderConfig) -> BlobReader {
        let capacity = NonZeroUsize::new(config.max_open_files.max(1)).expect("at least one");
        BlobReader {
            ledger: Ledger::load(&store),
            store,
            open: Mutex::new(LruCache::new(capacity)),
            opening: Mutex::default(),
            proven: Mutex::default(),
        }
    }

    /// The store read from.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The open, proven blob of `object`.
    fn get(&self, object: &ObjectRef) -> io::Result<Arc<Open>> {
        if let Some(open) = self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&object.sha256)
        {
            return Ok(open.clone());
        }
        let gate = self
            .opening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(object.sha256)
            .or_default()
            .clone();
        let _gate = gate.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(open) = self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&object.sha256)
        {
            return Ok(open.clone());
        }
        let open = Arc::new(self.prove(object)?);
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(object.sha256, open.clone());
        self.opening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&object.sha256);
        Ok(open)
    }

    /// Opens `object`'s blob and proves its bytes.
    fn prove(&self, object: &ObjectRef) -> io::Result<Open> {
        let path = self.store.object_path(object);
        let file = self.store.open_object(object).map_err(to_io)?;
        let meta = file.metadata()?;
        let stamp = Stamp::of(&meta);
        let known = self
            .proven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&object.sha256)
            == Some(&stamp);
        if !known && !self.ledger.proves(object, &meta) {
            let found = hash_file(&file)?;
            if found != *object {
                tracing::error!(
                    blob = %path.display(),
                    "blob {} holds sha256 {} ({} bytes), not the object it names: refusing to serve it; \
                     run `tensorfs verify --repair` to remove it, then import or download the model again",
                    object.sha256, found.sha256, found.length
                );
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: damaged blob (sha256 mismatch)", path.display()),
                ));
            }
            if let Err(e) = self.ledger.note(object, &meta) {
                tracing::debug!("could not note verified blob {}: {e}", path.display());
            }
        }
        self.proven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(object.sha256, stamp);
        Ok(Open { file })
    }
}

impl ObjectSource for BlobReader {
    fn read_object(&self, object: &ObjectRef, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|end| end > object.length) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at {offset} is past the end of {object}",
                    buf.len()
                ),
            ));
        }
        let open = self.get(object)?;
        open.file.read_exact_at(buf, offset)
    }
}

/// The object reference of a whole file's bytes.
///
/// # Errors
/// Reading fails.
pub fn hash_file(file: &File) -> io::Result<ObjectRef> {
    let mut hasher = Hasher::new();
    let mut buf = vec![0u8; 4 << 20];
    let mut reader = file;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finish())
}

fn to_io(e: StoreError) -> io::Error {
    let kind = match &e {
        StoreError::Absent { .. } => io::ErrorKind::NotFound,
        StoreError::Mismatch { .. } => io::ErrorKind::InvalidData,
        StoreError::Io { source, .. } => source.kind(),
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e.to_string())
}
