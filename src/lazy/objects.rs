//! [`FetchingSource`]: the lazy mount's object source. A read first makes its objects present
//! (fetching the missing ones through the [`Fetcher`], all of a batch at once), then reads
//! them through a [`BlobReader`], which proves each blob as it proves any other.

use std::collections::HashSet;
use std::io;
use std::sync::{Arc, RwLock};

use super::{Cache, Fetcher, LazyError};
use crate::format::{ObjectRef, Sha256};
use crate::io::{BlobReader, BlobReaderConfig};
use crate::io::{Kept, ObjectRead, ObjectSource};
use crate::store::verified::Stamp;
use crate::store::Store;
use crate::sync::{read, write};

/// Reads objects from the store, fetching the missing ones from the endpoint first.
#[derive(Debug)]
pub struct FetchingSource {
    reader: Arc<BlobReader>,
    fetcher: Arc<Fetcher>,
    /// Objects seen present, so a read costs no `stat` per object.
    present: Arc<RwLock<HashSet<Sha256>>>,
}

impl FetchingSource {
    /// A source over `store` fetching through a fetcher [`FetchingSource::fetcher`] makes;
    /// the fetcher's cache is kept within `budget` bytes (`None`: the disk's reserve alone).
    ///
    /// # Errors
    /// The store's records cannot be read (to size its cache), or `fetcher` fails.
    pub fn new(
        store: Store,
        budget: Option<u64>,
        fetcher: impl FnOnce(Arc<Cache>) -> Result<Arc<Fetcher>, LazyError>,
    ) -> Result<FetchingSource, LazyError> {
        let reader = Arc::new(BlobReader::new(store.clone(), BlobReaderConfig::default()));
        let present: Arc<RwLock<HashSet<Sha256>>> = Arc::default();
        // An evicted object is closed and no longer known present: a read fetches it again.
        let release = {
            let (reader, present) = (reader.clone(), present.clone());
            Box::new(move |digest: &Sha256| {
                write(&present).remove(digest);
                reader.close(std::slice::from_ref(digest));
            })
        };
        let cache = Arc::new(Cache::new(store, budget, release).map_err(LazyError::Cache)?);
        Ok(FetchingSource {
            reader,
            fetcher: fetcher(cache)?,
            present,
        })
    }

    /// The fetcher.
    pub fn fetcher(&self) -> &Arc<Fetcher> {
        &self.fetcher
    }

    /// Fetches those of `objects` not known present.
    fn ensure(&self, objects: &[ObjectRef]) -> io::Result<()> {
        let missing: Vec<ObjectRef> = {
            let present = read(&self.present);
            let mut missing: Vec<ObjectRef> = Vec::new();
            for object in objects {
                if !present.contains(&object.sha256) && !missing.contains(object) {
                    missing.push(*object);
                }
            }
            missing
        };
        if missing.is_empty() {
            return Ok(());
        }
        self.fetcher.ensure(&missing).map_err(|e| e.to_io())?;
        let mut present = write(&self.present);
        present.extend(missing.iter().map(|o| o.sha256));
        Ok(())
    }

    fn forget(&self, objects: &[ObjectRef]) {
        let mut present = write(&self.present);
        for object in objects {
            present.remove(&object.sha256);
        }
    }
}

impl ObjectSource for FetchingSource {
    fn stats(&self) -> crate::io::SourceStats {
        self.reader.stats()
    }

    fn proven_stamp(&self, object: &ObjectRef) -> Option<Stamp> {
        self.reader.proven_stamp(object)
    }

    /// Pins `objects` first (an eviction that makes room for one never takes another), then
    /// fetches the missing ones; over the budget, if they do not fit it, while they are kept.
    fn keep(&self, objects: &[ObjectRef]) -> io::Result<Kept> {
        let kept = self.fetcher.cache().keep(objects.to_vec());
        self.ensure(objects)?;
        Ok(Kept(Box::new(kept)))
    }

    fn close(&self, digests: &[Sha256]) {
        self.reader.close(digests);
    }

    fn read_object(&self, object: &ObjectRef, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_objects(&mut [ObjectRead {
            object,
            offset,
            buf,
        }])
    }

    fn read_objects(&self, reads: &mut [ObjectRead<'_>]) -> io::Result<()> {
        let objects: Vec<ObjectRef> = reads.iter().map(|r| *r.object).collect();
        let _pin = self.fetcher.cache().pin(&objects);
        self.ensure(&objects)?;
        match self.reader.read_objects(reads) {
            // Removed since it was seen (a repair): fetched again.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.forget(&objects);
                self.ensure(&objects)?;
                self.reader.read_objects(reads)
            }
            result => result,
        }
    }

    fn prefetch(&self, objects: &[ObjectRef]) {
        let present = read(&self.present);
        let wanted: Vec<ObjectRef> = objects
            .iter()
            .filter(|o| !present.contains(&o.sha256))
            .copied()
            .collect();
        drop(present);
        if !wanted.is_empty() {
            self.fetcher.prefetch(&wanted);
        }
    }
}
