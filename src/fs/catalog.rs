//! What the namespace needs from a store, behind a trait so tests use an in-memory catalog.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{CommitError, LaneRef};
use crate::format::{ObjectRef, Repo, Sha256};
use crate::layout::LaneView;
use crate::store::hub::HubRecord;
use crate::store::retention::Hold;
use crate::store::{Store, StoreError};

/// A repo document and when its ref last changed.
#[derive(Clone, Debug)]
pub struct RepoEntry {
    /// The document.
    pub repo: Repo,
    /// The ref file's modification time (the upper folders' mtime).
    pub mtime: SystemTime,
}

/// A commit's lane label, read from its tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitLane {
    /// The tree's `lane`; `None` shows as [`super::UNLABELLED_LANE`].
    pub lane: Option<String>,
    /// When the tree blob was made (its birth time, else its mtime): the lane folder's mtime.
    pub mtime: SystemTime,
    /// Whether its header has encoded tensors (and so a decoded view).
    pub encoded: bool,
    /// Whether it is a single-file checkpoint's (and so has a Diffusers face).
    pub single_file: bool,
    /// Whether its Diffusers components make a single file (and so it has a single-file face).
    pub single_face: bool,
}

/// A commit laid out as a lane folder.
#[derive(Clone, Debug)]
pub struct LaneContents {
    /// The files.
    pub view: LaneView,
    /// When the tree blob was made (its birth time, else its mtime): every file's mtime.
    pub mtime: SystemTime,
}

pub use crate::store::Capacity;

/// The store as the namespace sees it. Implementations are called from many threads.
pub trait Catalog: Send + Sync {
    /// A cheap value that changes whenever any ref changes (names, sizes, mtimes of
    /// `refs/*/*.json`).
    ///
    /// # Errors
    /// The refs cannot be listed.
    fn refs_signature(&self) -> Result<u64, StoreError>;

    /// Every repo, sorted by name.
    ///
    /// # Errors
    /// The refs cannot be listed.
    fn repos(&self) -> Result<Vec<RepoEntry>, StoreError>;

    /// The hub records of the repos ([`crate::store::hub`]), which lay out the hub cache view.
    /// A change to them changes [`Catalog::refs_signature`] too.
    ///
    /// # Errors
    /// The records cannot be listed.
    fn hub_records(&self) -> Result<Vec<HubRecord>, StoreError> {
        Ok(Vec::new())
    }

    /// The lane label of commit `commit`, and whether it has encoded tensors (reads its tree and
    /// header).
    ///
    /// # Errors
    /// The tree is absent, damaged or malformed.
    fn commit_lane(&self, commit: &ObjectRef) -> Result<CommitLane, CommitError>;

    /// Commit `lane.commit` laid out as a lane folder, or as its decoded view.
    ///
    /// # Errors
    /// The tree or header is absent, damaged or malformed, or cannot be laid out.
    fn lane(&self, lane: &LaneRef) -> Result<LaneContents, CommitError>;

    /// Size of the filesystem holding the store: total, free and available blocks, and the
    /// block unit in bytes.
    fn capacity(&self) -> Option<Capacity> {
        None
    }

    /// The store's root folder, under which blobs lie (`blobs/<aa>/<bb>/<sha256>`); `None`
    /// when the catalog has no folder.
    fn store_root(&self) -> Option<&Path> {
        None
    }

    /// Keeps commit `commit`'s closure in the store while the returned hold lives (no
    /// collection, ours or the reference's, sweeps it) and records its use, which keeps a
    /// commit no `local/` repo names for a week after ([`crate::store::retention`]). `None`
    /// when the catalog has no store.
    ///
    /// # Errors
    /// The commit's documents cannot be read, or the hold or use cannot be written.
    fn retain(&self, _commit: &ObjectRef) -> Result<Option<Hold>, CommitError> {
        Ok(None)
    }
}

/// The [`Catalog`] of a store on disk.
#[derive(Clone, Debug)]
pub struct StoreCatalog {
    store: Store,
    /// Each commit's closure, read once: a commit never changes, and every first open of one
    /// of its files holds the closure ([`Catalog::retain`]), which would otherwise read, hash
    /// and decode the commit's header again.
    closures: Arc<Mutex<HashMap<Sha256, Arc<[ObjectRef]>>>>,
}

/// At most this many closures are kept; past it the cache starts again.
const CLOSURES_KEPT: usize = 256;

impl StoreCatalog {
    /// The catalog of `store`.
    pub fn new(store: Store) -> StoreCatalog {
        StoreCatalog {
            store,
            closures: Default::default(),
        }
    }

    /// `commit`'s closure: the commit, its tree's files and its header's objects.
    fn closure(&self, commit: &ObjectRef) -> Result<Arc<[ObjectRef]>, CommitError> {
        let lock = || self.closures.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(closure) = lock().get(&commit.sha256) {
            return Ok(closure.clone());
        }
        let closure: Arc<[ObjectRef]> = self.store.commit(commit)?.closure().into();
        let mut closures = lock();
        if closures.len() >= CLOSURES_KEPT {
            closures.clear();
        }
        closures.insert(commit.sha256, closure.clone());
        Ok(closure)
    }

    /// When `object`'s blob was made: its birth time where the filesystem keeps one (`statx`),
    /// which retention never moves (the reference's writers touch the mtime of every blob they
    /// reuse, to renew its grace), else its mtime.
    fn blob_mtime(&self, object: &ObjectRef) -> SystemTime {
        fs::metadata(self.store.object_path(object))
            .and_then(|m| m.created().or_else(|_| m.modified()))
            .unwrap_or(UNIX_EPOCH)
    }
}

impl Catalog for StoreCatalog {
    fn refs_signature(&self) -> Result<u64, StoreError> {
        let refs = self.store.root().join("refs");
        let signature = refs_signature(&refs).map_err(crate::store::io_err("list", &refs))?;
        // Hub records are written after the refs they describe: they count too.
        let hub = self.store.root().join("hub");
        let records = match refs_signature(&hub) {
            Ok(records) => records,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(crate::store::io_err("list", &hub)(e)),
        };
        let mut hasher = DefaultHasher::new();
        (signature, records).hash(&mut hasher);
        Ok(hasher.finish())
    }

    fn hub_records(&self) -> Result<Vec<HubRecord>, StoreError> {
        self.store.hub_records()
    }

    fn repos(&self) -> Result<Vec<RepoEntry>, StoreError> {
        let repos = self.store.repos()?;
        Ok(repos
            .into_iter()
            .map(|repo| {
                let mtime = self
                    .store
                    .ref_path(&repo.name)
                    .ok()
                    .and_then(|p| fs::metadata(p).ok())
                    .and_then(|m| m.modified().ok())
                    .unwrap_or(UNIX_EPOCH);
                RepoEntry { repo, mtime }
            })
            .collect())
    }

    fn commit_lane(&self, commit: &ObjectRef) -> Result<CommitLane, CommitError> {
        let c = self.store.commit(commit)?;
        Ok(CommitLane {
            lane: c.tree.lane,
            mtime: self.blob_mtime(commit),
            encoded: LaneView::has_encoded(&c.header),
            single_file: LaneView::is_single_file(&c.header),
            single_face: LaneView::has_single_face(&c.header),
        })
    }

    fn lane(&self, lane: &LaneRef) -> Result<LaneContents, CommitError> {
        let c = self.store.commit(&lane.commit)?;
        let view = LaneView::build_face(&lane.commit, &c.tree, &c.header, lane.face)?;
        Ok(LaneContents {
            view,
            mtime: self.blob_mtime(&lane.commit),
        })
    }

    fn store_root(&self) -> Option<&Path> {
        Some(self.store.root())
    }

    fn retain(&self, commit: &ObjectRef) -> Result<Option<Hold>, CommitError> {
        let closure = self.closure(commit)?;
        self.store.record_use(&commit.sha256, closure.iter())?;
        Ok(Some(self.store.hold(closure.iter())?))
    }

    fn capacity(&self) -> Option<Capacity> {
        Capacity::of(self.store.root()).ok()
    }
}

/// A hash of the names, sizes, inodes and mtimes of `<dir>/*/*.json` (`refs/`, `hub/`). Both
/// are replaced by rename, so any change moves at least the inode and the mtime.
///
/// # Errors
/// `refs` cannot be listed.
pub fn refs_signature(refs: &Path) -> io::Result<u64> {
    let mut rows = Vec::new();
    for org in fs::read_dir(refs)? {
        let org = org?;
        if !org.file_type()?.is_dir() {
            continue;
        }
        let entries = match fs::read_dir(org.path()) {
            Ok(entries) => entries,
            // An org folder removed while listing: its refs are gone.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            if !name.as_encoded_bytes().ends_with(b".json") {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            rows.push((
                org.file_name(),
                name,
                meta.len(),
                meta.ino(),
                meta.mtime(),
                meta.mtime_nsec(),
            ));
        }
    }
    rows.sort();
    let mut hasher = DefaultHasher::new();
    rows.hash(&mut hasher);
    Ok(hasher.finish())
}
