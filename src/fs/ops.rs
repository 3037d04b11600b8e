//! [`TensorFs`]: the operations of the mount.
//!
//! Locks (all `std::sync`), each held only for a lookup or an insert: `refresh` then
//! `snapshot` (the only nesting: a refresh swaps the snapshot while holding `refresh`); the
//! inode table, the lane cache, `commit_lanes`, `handles` and `reported` are never held
//! together with another lock. No lock is held while the catalog reads the store, except
//! `refresh` while the refs are re-read (other refreshes wait; lookups in lanes do not).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime};

use super::catalog::{Catalog, CommitLane, StoreCatalog};
use super::comfyui::COMFYUI_VIEW;
use super::hub::HUB_VIEW;
use super::inodes::{Inode, InodeTable, Node};
use super::lanes::{self, ChildKind, Description, FileIndex, Lane, LaneCache};
use super::namespace::Snapshot;
use super::{
    Attr, DirEntry, Entry, FsConfig, FsError, FsResult, FsStats, Kind, LaneRef, Opened, XattrReply,
    ROOT_INO, SEQUENTIAL_SLACK_BYTES,
};
use crate::extents::ioctl::{describe, Command, IoctlError, Query};
use crate::extents::{FileTensor, FileTensors, LocateError};
use crate::format::{ObjectRef, Sha256};
use crate::io::{BlobReader, BlobReaderConfig};
use crate::io::{Kept, ObjectSource};
use crate::layout::{attrs, Content, LaneView};
use crate::revisions;
use crate::store::retention::Hold;
use crate::store::Store;
use crate::sync::{lock, read};
use crate::views::{ViewCache, ViewState};

use super::status::{Counters, StatusExtra, STATUS};

/// [`OpenFile::read_end`] before the handle's first read.
const NO_READ: u64 = u64::MAX;

#[derive(Debug, Default)]
pub(super) struct RefreshState {
    pub(super) checked: Option<Instant>,
    pub(super) signature: Option<u64>,
}

#[derive(Debug)]
struct OpenFile {
    lane: LaneRef,
    path: String,
    content: Content,
    /// Where the handle's last read ended ([`NO_READ`] before the first): a read starting
    /// near it goes through the file in order, and its next chunks are prefetched.
    read_end: AtomicU64,
    /// The file's tensors, its lane's index of them taken on the first extents query.
    index: OnceLock<Arc<FileIndex>>,
    /// The file's whole-file answer (ABI 2), made on its first query, and what keeps the blobs
    /// it names present while the handle is open: the reader reads them itself. A failed
    /// query (a lazy mount's fetch) is not kept; the next tries again.
    described: OnceLock<(Arc<Description>, Kept)>,
}

#[derive(Debug, Clone)]
enum Handle {
    File(Arc<OpenFile>),
    /// A made file's bytes (a hub view ref or listing).
    Bytes(Arc<[u8]>),
    /// A folder's listing taken at `opendir`, so offsets stay valid while refs change.
    Dir(Arc<[DirEntry]>),
}

/// What [`TensorFs::on_hold`] calls with each hold taken.
pub type HoldHook = Box<dyn Fn(&Hold) + Send + Sync>;

/// The read-only TensorFS namespace over a [`Catalog`] and an [`ObjectSource`].
pub struct TensorFs {
    pub(super) catalog: Arc<dyn Catalog>,
    pub(super) objects: Arc<dyn ObjectSource>,
    pub(super) config: FsConfig,
    pub(super) mounted_at: SystemTime,
    pub(super) inodes: InodeTable,
    pub(super) lanes: LaneCache,
    /// Hub view snapshot folders built lately.
    pub(super) hub_trees: super::hub::SnapshotTrees,
    /// The ComfyUI view's index and folder mtimes.
    pub(super) comfy: super::comfyui::ComfyView,
    /// Lane labels of commits (trees never change).
    pub(super) commit_lanes: Mutex<HashMap<Sha256, CommitLane>>,
    pub(super) snapshot: RwLock<Arc<Snapshot>>,
    pub(super) refresh: Mutex<RefreshState>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_handle: AtomicU64,
    /// Handles below this number were given out by a daemon this one took over from
    /// ([`TensorFs::hand_out_from`]): the kernel still uses them, and [`TensorFs::adopt`]
    /// opens them again.
    adoptable_below: AtomicU64,
    /// Held while a handle is adopted, so two first reads of one do not both open it.
    adopting: Mutex<()>,
    /// Told of each hold taken on the store for open files ([`TensorFs::on_hold`]).
    hold_hook: OnceLock<HoldHook>,
    /// The commits of open files, each held in the store once ([`Catalog::retain`]) with how
    /// many open files need it.
    pub(super) retained: Mutex<HashMap<Sha256, (usize, Option<Hold>)>>,
    /// When each failing commit or file was last logged.
    pub(super) reported: Mutex<HashMap<String, Instant>>,
    /// Views for passthrough, with [`FsConfig::views`].
    pub(super) views: Option<ViewCache>,
    /// What the status counts.
    pub(super) counters: Counters,
    /// What a layer above adds to the status.
    pub(super) status_extra: OnceLock<StatusExtra>,
    /// The FUSE protocol version (major, minor) the kernel spoke at `INIT`.
    pub(super) protocol: OnceLock<(u32, u32)>,
}

impl std::fmt::Debug for TensorFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorFs")
            .field("config", &self.config)
            .field("inodes", &self.inodes.len())
            .field("cached_lanes", &self.lanes.len())
            .finish_non_exhaustive()
    }
}

impl TensorFs {
    /// A namespace over `catalog`, reading file bytes from `objects`.
    pub fn new(
        catalog: Arc<dyn Catalog>,
        objects: Arc<dyn ObjectSource>,
        config: FsConfig,
    ) -> TensorFs {
        let views = config.views.clone().and_then(|views| {
            let dir = views.dir.clone();
            ViewCache::open(views, objects.clone())
                .map_err(|e| tracing::warn!("no views in {}: {e}", dir.display()))
                .ok()
        });
        TensorFs {
            views,
            catalog,
            objects,
            lanes: LaneCache::new(config.max_cached_lanes),
            hub_trees: super::hub::snapshot_trees(config.max_cached_lanes),
            comfy: Default::default(),
            config,
            mounted_at: SystemTime::now(),
            inodes: InodeTable::default(),
            commit_lanes: Mutex::default(),
            snapshot: RwLock::default(),
            refresh: Mutex::default(),
            handles: Mutex::default(),
            next_handle: AtomicU64::new(1),
            adoptable_below: AtomicU64::new(0),
            adopting: Mutex::default(),
            hold_hook: OnceLock::new(),
            retained: Mutex::default(),
            reported: Mutex::default(),
            counters: Counters::default(),
            status_extra: OnceLock::new(),
            protocol: OnceLock::new(),
        }
    }

    /// Handles open to files.
    pub(super) fn open_files(&self) -> usize {
        lock(&self.handles)
            .values()
            .filter(|h| !matches!(h, Handle::Dir(_)))
            .count()
    }

    /// The namespace of `store`, its bytes read through a verifying [`BlobReader`].
    pub fn over_store(store: Store, config: FsConfig) -> TensorFs {
        let objects = Arc::new(BlobReader::new(store.clone(), BlobReaderConfig::default()));
        TensorFs::new(Arc::new(StoreCatalog::new(store)), objects, config)
    }

    /// The settings.
    pub fn config(&self) -> &FsConfig {
        &self.config
    }

    /// Looks up `name` in folder `parent`.
    ///
    /// # Errors
    /// `ENOENT` when absent, `ENOTDIR` when `parent` is a file, `EIO` when refs or the commit
    /// cannot be read.
    pub fn lookup(&self, parent: u64, name: &str) -> FsResult<Entry> {
        self.counters.request();
        let dir = self.dir_inode(parent)?;
        let not_found = || FsError::NotFound {
            parent,
            name: name.to_owned(),
        };
        let child = match &dir.node {
            Node::Root if name == HUB_VIEW => self.inodes.dir(parent, name, Node::HubRoot),
            Node::Root if name == COMFYUI_VIEW => {
                let node = Node::ComfyDir {
                    path: String::new(),
                };
                self.inodes.dir(parent, name, node)
            }
            Node::Root => {
                let snapshot = self.snapshot()?;
                snapshot.orgs.get(name).ok_or_else(not_found)?;
                self.inodes.dir(
                    parent,
                    name,
                    Node::Org {
                        org: name.to_owned(),
                    },
                )
            }
            Node::Org { org } => {
                self.snapshot()?.repo(org, name).ok_or_else(not_found)?;
                let node = Node::Repo {
                    org: org.clone(),
                    name: name.to_owned(),
                };
                self.inodes.dir(parent, name, node)
            }
            Node::Repo { org, name: repo } => {
                let snapshot = self.snapshot()?;
                let entry = snapshot.repo(org, repo).ok_or_else(not_found)?;
                revisions::revision(&entry.repo, name).ok_or_else(not_found)?;
                let node = Node::Revision {
                    org: org.clone(),
                    name: repo.clone(),
                    rev: name.to_owned(),
                };
                self.inodes.dir(parent, name, node)
            }
            Node::Revision {
                org,
                name: repo,
                rev,
            } => {
                let lanes = self.revision_lanes(org, repo, rev)?.ok_or_else(not_found)?;
                let (_, lane) = lanes
                    .iter()
                    .find(|(lane, _)| lane == name)
                    .ok_or_else(not_found)?;
                let node = Node::LaneDir {
                    lane: *lane,
                    path: String::new(),
                };
                self.inodes.dir(parent, name, node)
            }
            Node::LaneDir { lane, path } => {
                let lane = self.lane(lane)?;
                let child = lane.child(path, name).ok_or_else(not_found)?;
                self.lane_child(&lane, parent, path, &child.name, child.kind)
            }
            Node::HubRoot | Node::HubRepo { .. } | Node::HubSnapshot { .. } => {
                self.hub_lookup(&dir, name)?.ok_or_else(not_found)?
            }
            Node::ComfyDir { .. } => self.comfy_lookup(&dir, name)?.ok_or_else(not_found)?,
            Node::File { .. } | Node::Generated { .. } => {
                unreachable!("dir_inode refuses files")
            }
        };
        let ttl = self.ttl(&dir.node);
        Ok(Entry {
            attr: self.attr(&child)?,
            ttl,
        })
    }

    /// The attributes of `ino`.
    ///
    /// # Errors
    /// `ENOENT` for an unknown inode, `EIO` when a lane folder's commit cannot be read.
    pub fn getattr(&self, ino: u64) -> FsResult<Entry> {
        self.counters.request();
        let inode = self.inode(ino)?;
        Ok(Entry {
            attr: self.attr(&inode)?,
            ttl: self.ttl(&inode.node),
        })
    }

    /// Opens folder `ino`: its listing is taken now and read by [`TensorFs::readdir`].
    ///
    /// # Errors
    /// As [`TensorFs::lookup`].
    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        self.counters.request();
        let listing = self.list(ino)?;
        Ok(self.add_handle(Handle::Dir(listing.into())))
    }

    /// Gives the entries of folder `ino` from `offset` (0 at first, then the `next_offset` of
    /// the last entry taken) to `add`, until `add` returns `true` (the reply is full).
    /// `fh` is the handle of [`TensorFs::opendir`]; an unknown one lists afresh.
    ///
    /// # Errors
    /// As [`TensorFs::lookup`].
    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(&DirEntry) -> bool,
    ) -> FsResult<()> {
        self.counters.request();
        let listing = match self.handle(fh) {
            Some(Handle::Dir(listing)) => listing,
            _ => self.list(ino)?.into(),
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for entry in listing.iter().skip(start) {
            if add(entry) {
                break;
            }
        }
        Ok(())
    }

    /// Closes a handle of [`TensorFs::opendir`] or [`TensorFs::open`].
    pub fn release(&self, fh: u64) {
        self.counters.request();
        if let Some(Handle::File(file)) = lock(&self.handles).remove(&fh) {
            let mut retained = lock(&self.retained);
            let commit = file.lane.commit.sha256;
            if let Some((count, _)) = retained.get_mut(&commit) {
                *count -= 1;
                if *count == 0 {
                    // Its blobs are closed too: their shared locks would keep a collection
                    // from freeing a model removed meanwhile for as long as the mount runs.
                    if let Some((_, Some(hold))) = retained.remove(&commit) {
                        let digests: Vec<Sha256> = hold.digests().copied().collect();
                        self.objects.close(&digests);
                    }
                }
            }
        }
    }

    /// Holds `commit`'s closure in the store while a file of it is open, so no collection
    /// sweeps what the file reads; a hold that cannot be taken is logged, and reads go on.
    fn retain(&self, commit: &ObjectRef) {
        let mut retained = lock(&self.retained);
        if let Some((count, _)) = retained.get_mut(&commit.sha256) {
            *count += 1;
            return;
        }
        let hold = self.catalog.retain(commit).unwrap_or_else(|e| {
            tracing::warn!(
                "commit {}: its objects are not held against collections while open: {e}",
                commit.id()
            );
            None
        });
        if let (Some(hook), Some(hold)) = (self.hold_hook.get(), &hold) {
            hook(hold);
        }
        retained.insert(commit.sha256, (1, hold));
    }

    /// Has `hook` told of each hold this namespace takes on the store for open files, as it is
    /// taken (before the open is answered): a supervisor keeps a descriptor of each, so the
    /// holds outlive a daemon that dies ([`Hold::file`]). Set once; later calls are ignored.
    pub fn on_hold(&self, hook: HoldHook) {
        let _ = self.hold_hook.set(hook);
    }

    /// Opens file `ino` to read.
    ///
    /// # Errors
    /// `EROFS` when `write` (any write access, truncation), `EISDIR` on a folder, `EIO` when
    /// the commit cannot be laid out.
    pub fn open(&self, ino: u64, write: bool) -> FsResult<Opened> {
        self.counters.request();
        self.counters.open();
        if write {
            return Err(FsError::ReadOnly);
        }
        let (handle, backing) = self.open_handle(ino)?;
        Ok(Opened {
            // A ref's inode changes with its bytes, but a reader may hold the old one.
            keep_cache: matches!(handle, Handle::File(_)),
            fh: self.add_handle(handle),
            backing,
        })
    }

    /// The inodes given out after `ino`, in the order they were: what a daemon taking over
    /// this mount must [`TensorFs::restore_inodes`] before it answers the kernel.
    pub fn inodes_after(&self, ino: u64) -> Vec<Arc<Inode>> {
        self.inodes.after(ino)
    }

    /// Gives out again the inodes a daemon this one took over from gave the kernel.
    ///
    /// # Errors
    /// See [`InodeTable::restore`].
    pub fn restore_inodes(
        &self,
        inodes: impl IntoIterator<Item = Inode>,
    ) -> Result<(), super::inodes::RestoreError> {
        self.inodes.restore(inodes)
    }

    /// Hands out handles from `first` on: a daemon taking over a mount gives numbers above
    /// every one its predecessors gave, which [`TensorFs::adopt`] then takes as theirs.
    pub fn hand_out_from(&self, first: u64) {
        self.next_handle.fetch_max(first, Ordering::Relaxed);
        self.adoptable_below.fetch_max(first, Ordering::Relaxed);
    }

    /// Opens file `ino` again as handle `fh`, which a daemon this one took over from gave the
    /// kernel (see [`TensorFs::hand_out_from`]), holding its commit against collections
    /// again; returns whether `fh` is open now. A handle this daemon gave, or one it has
    /// already adopted, is left as it is. One that cannot be opened is logged once, and
    /// reads of it fail with EIO ([`FsError::NotReopened`]).
    pub fn adopt(&self, ino: u64, fh: u64) -> bool {
        if fh >= self.adoptable_below.load(Ordering::Relaxed) {
            return false;
        }
        let _adopting = lock(&self.adopting);
        if self.handle(fh).is_some() {
            return true;
        }
        match self.open_handle(ino) {
            Ok((handle, _)) => {
                lock(&self.handles).insert(fh, handle);
                true
            }
            Err(e) => {
                let consequence = "it was opened before the daemon restarted; its reads fail (EIO)";
                self.report(format!("handle {fh}"), &e, consequence);
                false
            }
        }
    }

    /// Whether open handle `fh` keeps the page cache between opens (a lane file's, which
    /// never changes); `false` for a made file's, or a handle not open.
    pub fn keeps_cache(&self, fh: u64) -> bool {
        matches!(self.handle(fh), Some(Handle::File(_)))
    }

    /// The error for handle `fh`, which is not open: one an earlier daemon opened and this
    /// one could not open again is EIO, any other EBADF.
    fn not_open(&self, fh: u64) -> FsError {
        match fh < self.adoptable_below.load(Ordering::Relaxed) {
            true => FsError::NotReopened(fh),
            false => FsError::BadHandle(fh),
        }
    }

    /// A handle open to file `ino`, and the local file the kernel may read in its place.
    fn open_handle(&self, ino: u64) -> FsResult<(Handle, Option<std::fs::File>)> {
        let inode = self.inode(ino)?;
        if let Node::Generated { bytes, .. } = &inode.node {
            return Ok((Handle::Bytes(bytes.clone()), None));
        }
        let Node::File { lane, path, .. } = &inode.node else {
            return Err(FsError::IsADirectory(ino));
        };
        let lane_ref = *lane;
        let lane = self.lane(lane)?;
        let file = lane
            .contents
            .view
            .file(path)
            .ok_or_else(|| FsError::NotFound {
                parent: inode.parent,
                name: path.clone(),
            })?;
        let open = OpenFile {
            lane: lane_ref,
            path: path.clone(),
            content: file.content.clone(),
            read_end: AtomicU64::new(NO_READ),
            index: OnceLock::new(),
            described: OnceLock::new(),
        };
        let backing = self.backing(&open.content);
        self.retain(&lane_ref.commit);
        Ok((Handle::File(Arc::new(open)), backing))
    }

    /// A local file with exactly `content`'s bytes, with views on: a proven blob or a built
    /// view.
    fn backing(&self, content: &Content) -> Option<std::fs::File> {
        let views = self.views.as_ref()?;
        match content {
            Content::Object(object) => self.objects.backing_file(object),
            Content::Safetensors(plan) => views.file(&plan.digest(), plan.size()),
            Content::Inline(_) => None,
        }
    }

    /// Builds no more views (see [`ViewCache::stop_building`]): the kernel will not pass files
    /// through to them. Does nothing without views.
    pub fn stop_views(&self) {
        if let Some(views) = &self.views {
            views.stop_building();
        }
    }

    /// Where the view of file `ino` stands; `None` without views, or for a file that needs
    /// none (one held in memory, or one object, passed through to its blob).
    pub fn view_state(&self, ino: u64) -> FsResult<Option<ViewState>> {
        let Some(views) = &self.views else {
            return Ok(None);
        };
        let inode = self.inode(ino)?;
        let state = self.with_item(&inode.node, |_, item| match item {
            attrs::Item::File(file) => match &file.content {
                Content::Safetensors(plan) => Some(views.state(&plan.digest())),
                _ => None,
            },
            attrs::Item::Folder(_) => None,
        })?;
        Ok(state.flatten())
    }

    /// Reads up to `buf.len()` bytes at `offset` of open file `fh`; returns how many (fewer
    /// only at the end of the file).
    ///
    /// # Errors
    /// `EBADF` for a handle not open to a file; `EIO` when a blob is absent or damaged (one
    /// log line names the commit, the file and the repair).
    pub fn read(&self, fh: u64, offset: u64, buf: &mut [u8]) -> FsResult<usize> {
        self.counters.request();
        let result = self.read_handle(fh, offset, buf);
        self.counters
            .read(result.as_ref().map(|n| *n).map_err(|_| ()));
        result
    }

    fn read_handle(&self, fh: u64, offset: u64, buf: &mut [u8]) -> FsResult<usize> {
        let file = match self.handle(fh) {
            Some(Handle::File(file)) => file,
            Some(Handle::Bytes(bytes)) => {
                let start = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                let n = buf.len().min(bytes.len() - start);
                buf[..n].copy_from_slice(&bytes[start..start + n]);
                return Ok(n);
            }
            _ => return Err(self.not_open(fh)),
        };
        self.prefetch_ahead(&file, offset, buf.len() as u64);
        file.content
            .read_at(self.objects.as_ref(), offset, buf)
            .map_err(|source| {
                let err = FsError::Read {
                    commit: file.lane.commit.id(),
                    path: file.path.clone(),
                    source,
                };
                self.report(
                    format!("{} {}", file.lane.commit.id(), file.path),
                    &err,
                    super::resolve::ANSWERED,
                );
                err
            })
    }

    /// Takes the bytes a read of open file `fh` at `offset` gave its reader, once the reply is
    /// sent (so the reader does not wait for this): with views on, they build the file's view
    /// ([`ViewCache::served`]). The page cache hides later handles' reads, so reads count, not
    /// opens or releases. Does nothing for other handles or files.
    pub fn served(&self, fh: u64, offset: u64, bytes: &[u8]) {
        let Some(views) = &self.views else { return };
        let Some(Handle::File(file)) = self.handle(fh) else {
            return;
        };
        if let Content::Safetensors(plan) = &file.content {
            let label = || format!("{} {}", file.lane.commit.id(), file.path);
            views.served(plan.digest(), &file.content, offset, bytes, label);
        }
    }

    /// Tells the object source which chunks come next when this read continues the handle's
    /// previous one (see [`FsConfig::prefetch_chunks`]): the chunks from the read's end on,
    /// so the fetch of the next chunk starts while this one is read.
    fn prefetch_ahead(&self, file: &OpenFile, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        let previous = file.read_end.swap(end, Ordering::Relaxed);
        let count = self.config.prefetch_chunks;
        if count == 0 || previous == NO_READ || offset.abs_diff(previous) > SEQUENTIAL_SLACK_BYTES {
            return;
        }
        // The chunk the read ends in, then `count` more.
        let ahead = file.content.chunks_from(end, count + 1);
        if !ahead.is_empty() {
            self.objects.prefetch(&ahead);
        }
    }

    /// The value of extended attribute `name` of `ino`: its size when `size` is 0.
    ///
    /// # Errors
    /// `ENODATA` for an attribute the inode lacks, `ERANGE` when `size` is too small.
    pub fn getxattr(&self, ino: u64, name: &str, size: u32) -> FsResult<XattrReply> {
        self.counters.request();
        let no_attribute = || FsError::NoAttribute(name.to_owned());
        if ino == ROOT_INO && name == STATUS {
            let mut bytes = serde_json::to_vec(&self.status()).expect("JSON values serialize");
            bytes.push(b'\n');
            return sized(bytes, size);
        }
        if name == attrs::VIEW {
            let state = self.view_state(ino)?.ok_or_else(no_attribute)?;
            return sized(state.as_str().as_bytes().to_vec(), size);
        }
        let inode = self.inode(ino)?;
        let value = self
            .with_item(&inode.node, |view, item| attrs::value(view, item, name))?
            .flatten()
            .ok_or_else(no_attribute)?;
        sized(value, size)
    }

    /// The names of `ino`'s extended attributes, each followed by NUL; their size when `size`
    /// is 0.
    ///
    /// # Errors
    /// `ERANGE` when `size` is too small.
    pub fn listxattr(&self, ino: u64, size: u32) -> FsResult<XattrReply> {
        self.counters.request();
        let inode = self.inode(ino)?;
        let mut list = Vec::new();
        if ino == ROOT_INO {
            list.extend_from_slice(STATUS.as_bytes());
            list.push(0);
        }
        for name in self
            .with_item(&inode.node, attrs::names)?
            .unwrap_or_default()
        {
            list.extend_from_slice(name.as_bytes());
            list.push(0);
        }
        if self.view_state(ino)?.is_some() {
            list.extend_from_slice(attrs::VIEW.as_bytes());
            list.push(0);
        }
        sized(list, size)
    }

    /// Calls `f` with the lane view and the folder or file of an inode in a lane; `None` for
    /// inodes above the lanes.
    fn with_item<R>(
        &self,
        node: &Node,
        f: impl FnOnce(&LaneView, attrs::Item<'_>) -> R,
    ) -> FsResult<Option<R>> {
        let (lane, path, dir) = match node {
            Node::LaneDir { lane, path } => (lane, path, true),
            Node::File { lane, path, .. } => (lane, path, false),
            _ => return Ok(None),
        };
        let lane = self.lane(lane)?;
        let view = &lane.contents.view;
        let item = match dir {
            true => attrs::Item::Folder(path),
            false => attrs::Item::File(
                view.file(path)
                    .ok_or_else(|| FsError::NoAttribute(path.clone()))?,
            ),
        };
        Ok(Some(f(view, item)))
    }

    /// An ioctl on open handle `fh`: the extents commands of [`crate::extents::ioctl`] on a
    /// safetensors file of a lane; `input` is the struct the caller passed and `out_size` the
    /// bytes it takes back. Returns the struct to hand back.
    ///
    /// # Errors
    /// `ENOTTY` for any other command (Python's `open` sends `TCGETS` to learn the file is not
    /// a terminal); the errnos of [`IoctlError::errno`] for a refused query; `EIO` when the
    /// commit cannot be read.
    pub fn ioctl(&self, fh: u64, cmd: u32, input: &[u8], out_size: u32) -> FsResult<Vec<u8>> {
        self.counters.request();
        let Some(command) = Command::of(cmd) else {
            return Err(FsError::NoIoctl(cmd));
        };
        let query = Query::parse(command, input, out_size)?;
        let Some(Handle::File(file)) = self.handle(fh) else {
            let file = format!("handle {fh}");
            return Err(IoctlError::from(LocateError::NotSafetensors { file }).into());
        };
        let index = match file.index.get() {
            Some(index) => index,
            None => {
                let lane = self.lane(&file.lane)?;
                file.index.get_or_init(|| lane.index(&file.path))
            }
        };
        let tensors = index
            .tensors
            .as_ref()
            .map_err(|e| IoctlError::from(e.clone()))?;
        let root = self
            .catalog
            .store_root()
            .unwrap_or(std::path::Path::new(""));
        if command == Command::File {
            if let Some((description, _)) = file.described.get() {
                return Ok(query.answer_file(&description.text));
            }
            let described = self.describe(&file, index, tensors, root)?;
            let description = &file.described.get_or_init(|| described).0;
            return Ok(query.answer_file(&description.text));
        }
        let located = tensors
            .locate(root, &query.name)
            .map_err(IoctlError::from)?;
        let root = root.to_str().ok_or_else(|| {
            IoctlError::Overflow(format!("the store root {} is not UTF-8", root.display()))
        })?;
        Ok(query.answer(&located, root)?)
    }

    /// The whole-file answer of open `file` (ABI 2), once every blob it names is present and
    /// kept so while the handle is open: the one its lane's `index` keeps while the blobs'
    /// proven stamps are unchanged, else a new one (kept for the next open).
    fn describe(
        &self,
        file: &OpenFile,
        index: &FileIndex,
        tensors: &FileTensors,
        root: &std::path::Path,
    ) -> FsResult<(Arc<Description>, Kept)> {
        let keep = |blobs: &[ObjectRef]| {
            self.objects.keep(blobs).map_err(|source| FsError::Read {
                commit: file.lane.commit.id(),
                path: file.path.clone(),
                source,
            })
        };
        let stamp = |object: &ObjectRef| self.objects.proven_stamp(object).map(|s| s.fields());
        // A file's blobs never change; their proofs may.
        let mut kept = None;
        if let Some(last) = index.description() {
            let held = keep(&last.blobs)?;
            if last.blobs.iter().map(stamp).eq(last.stamps.iter().copied()) {
                return Ok((last, held));
            }
            kept = Some(held);
        }
        let all = tensors.locate_all(root).map_err(IoctlError::from)?;
        let mut blobs: Vec<ObjectRef> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for tensor in &all {
            if let FileTensor::Stored(located) = tensor {
                for extent in &located.extents {
                    if seen.insert(extent.blob.sha256) {
                        blobs.push(extent.blob);
                    }
                }
            }
        }
        let kept = match kept {
            Some(kept) => kept,
            None => keep(&blobs)?,
        };
        let root = root.to_str().ok_or_else(|| {
            IoctlError::Overflow(format!("the store root {} is not UTF-8", root.display()))
        })?;
        let stamps: Vec<_> = blobs.iter().map(stamp).collect();
        let by_blob: HashMap<Sha256, Option<[i128; 5]>> = blobs
            .iter()
            .map(|b| b.sha256)
            .zip(stamps.iter().copied())
            .collect();
        let text = describe(&all, root, &|object: &ObjectRef| {
            by_blob.get(&object.sha256).copied().flatten()
        });
        let description = Arc::new(Description {
            text,
            blobs,
            stamps,
        });
        index.set_description(description.clone());
        Ok((description, kept))
    }

    /// Checks access `mask` (`R_OK`, `W_OK`, `X_OK` bits) to `ino`.
    ///
    /// # Errors
    /// `ENOENT` for an unknown inode, `EROFS` when asking to write.
    pub fn access(&self, ino: u64, mask: i32) -> FsResult<()> {
        self.counters.request();
        self.inode(ino)?;
        if mask & libc::W_OK != 0 {
            return Err(FsError::ReadOnly);
        }
        Ok(())
    }

    /// The mount's totals: the store's filesystem sizes and the inodes given out.
    pub fn statfs(&self) -> FsStats {
        self.counters.request();
        let capacity = self.catalog.capacity();
        FsStats {
            blocks: capacity.map_or(0, |c| c.blocks),
            free_blocks: capacity.map_or(0, |c| c.free_blocks),
            available_blocks: capacity.map_or(0, |c| c.available_blocks),
            files: self.inodes.len(),
            block_size: self.config.blksize_bytes,
            fragment_size: capacity.map_or(4096, |c| c.block_bytes),
            name_max: 255,
        }
    }

    fn inode(&self, ino: u64) -> FsResult<Arc<Inode>> {
        self.inodes.get(ino).ok_or(FsError::UnknownInode(ino))
    }

    fn dir_inode(&self, ino: u64) -> FsResult<Arc<Inode>> {
        let inode = self.inode(ino)?;
        if !inode.node.is_dir() {
            return Err(FsError::NotADirectory(ino));
        }
        Ok(inode)
    }

    fn ttl(&self, node: &Node) -> Duration {
        if node.immutable() {
            self.config.lane_ttl
        } else {
            self.config.upper_ttl
        }
    }

    fn attr(&self, inode: &Inode) -> FsResult<Attr> {
        let snapshot = || read(&self.snapshot).clone();
        let (kind, size, mtime) = match &inode.node {
            Node::Root => (Kind::Directory, 0, self.mounted_at),
            Node::Org { org } => {
                let mtime = snapshot().orgs.get(org).map(|o| o.mtime);
                (Kind::Directory, 0, mtime.unwrap_or(self.mounted_at))
            }
            Node::Repo { org, name } | Node::Revision { org, name, .. } => {
                let mtime = snapshot().repo(org, name).map(|r| r.mtime);
                (Kind::Directory, 0, mtime.unwrap_or(self.mounted_at))
            }
            Node::LaneDir { lane, .. } => {
                (Kind::Directory, 0, self.commit_lane(&lane.commit)?.mtime)
            }
            Node::File { size, mtime, .. } => (Kind::File, *size, *mtime),
            Node::HubRoot => {
                let newest = snapshot().hub.values().map(|r| r.entry.mtime).max();
                (Kind::Directory, 0, newest.unwrap_or(self.mounted_at))
            }
            Node::HubRepo { folder, .. } => {
                let mtime = snapshot().hub.get(folder).map(|r| r.entry.mtime);
                (Kind::Directory, 0, mtime.unwrap_or(self.mounted_at))
            }
            Node::HubSnapshot { group, .. } => {
                let newest = group.commits.first().expect("groups hold commits");
                (Kind::Directory, 0, self.commit_lane(newest)?.mtime)
            }
            Node::Generated { bytes, mtime, .. } => (Kind::File, bytes.len() as u64, *mtime),
            Node::ComfyDir { path } => (Kind::Directory, 0, self.comfy_mtime(path)?),
        };
        let dir = kind == Kind::Directory;
        Ok(Attr {
            ino: inode.ino,
            kind,
            size,
            perm: if dir { 0o555 } else { 0o444 },
            nlink: if dir { 2 } else { 1 },
            uid: self.config.uid,
            gid: self.config.gid,
            mtime,
            blksize: self.config.blksize_bytes,
        })
    }

    /// The listing of folder `ino`: `.`, `..`, then its children.
    fn list(&self, ino: u64) -> FsResult<Vec<DirEntry>> {
        let dir = self.dir_inode(ino)?;
        let mut children: Vec<(Arc<Inode>, String)> = Vec::new();
        match &dir.node {
            Node::Root => {
                for org in self.snapshot()?.orgs.keys() {
                    if org == HUB_VIEW || org == COMFYUI_VIEW {
                        continue;
                    }
                    let node = Node::Org { org: org.clone() };
                    children.push((self.inodes.dir(ino, org, node), org.clone()));
                }
                let hub = self.inodes.dir(ino, HUB_VIEW, Node::HubRoot);
                children.push((hub, HUB_VIEW.to_owned()));
                let comfy = Node::ComfyDir {
                    path: String::new(),
                };
                let comfy = self.inodes.dir(ino, COMFYUI_VIEW, comfy);
                children.push((comfy, COMFYUI_VIEW.to_owned()));
            }
            Node::Org { org } => {
                let snapshot = self.snapshot()?;
                for name in snapshot
                    .orgs
                    .get(org)
                    .into_iter()
                    .flat_map(|o| o.repos.keys())
                {
                    let node = Node::Repo {
                        org: org.clone(),
                        name: name.clone(),
                    };
                    children.push((self.inodes.dir(ino, name, node), name.clone()));
                }
            }
            Node::Repo { org, name } => {
                let snapshot = self.snapshot()?;
                if let Some(entry) = snapshot.repo(org, name) {
                    for rev in revisions::revision_names(&entry.repo) {
                        let node = Node::Revision {
                            org: org.clone(),
                            name: name.clone(),
                            rev: rev.clone(),
                        };
                        children.push((self.inodes.dir(ino, &rev, node), rev));
                    }
                }
            }
            Node::Revision { org, name, rev } => {
                for (folder, lane) in self.revision_lanes(org, name, rev)?.unwrap_or_default() {
                    let node = Node::LaneDir {
                        lane,
                        path: String::new(),
                    };
                    children.push((self.inodes.dir(ino, &folder, node), folder));
                }
            }
            Node::LaneDir { lane, path } => {
                let lane = self.lane(lane)?;
                for child in lane.children(path).unwrap_or_default() {
                    let inode = self.lane_child(&lane, ino, path, &child.name, child.kind);
                    children.push((inode, child.name.clone()));
                }
            }
            Node::HubRoot | Node::HubRepo { .. } | Node::HubSnapshot { .. } => {
                children = self.hub_list(&dir)?;
            }
            Node::ComfyDir { .. } => children = self.comfy_list(&dir)?,
            Node::File { .. } | Node::Generated { .. } => {
                unreachable!("dir_inode refuses files")
            }
        }
        let dots = [(ino, ".".to_owned()), (dir.parent, "..".to_owned())];
        let dots = dots
            .into_iter()
            .map(|(ino, name)| (ino, Kind::Directory, name));
        let rest = children.into_iter().map(|(inode, name)| {
            let kind = if inode.node.is_dir() {
                Kind::Directory
            } else {
                Kind::File
            };
            (inode.ino, kind, name)
        });
        Ok(dots
            .chain(rest)
            .enumerate()
            .map(|(i, (ino, kind, name))| DirEntry {
                ino,
                next_offset: i as u64 + 1,
                kind,
                name,
            })
            .collect())
    }

    /// The inode of child `name` (of `kind`) of folder `path` in `lane`.
    fn lane_child(
        &self,
        lane: &Lane,
        parent: u64,
        path: &str,
        name: &str,
        kind: ChildKind,
    ) -> Arc<Inode> {
        match kind {
            ChildKind::Dir => {
                let node = Node::LaneDir {
                    lane: lane.lane,
                    path: lanes::join(path, name),
                };
                self.inodes.dir(parent, name, node)
            }
            ChildKind::File(index) => {
                let file = lane.file(index);
                let size = file.content.size();
                self.inodes
                    .file(parent, &lane.lane, &file.path, size, lane.contents.mtime)
            }
        }
    }

    fn add_handle(&self, handle: Handle) -> u64 {
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(fh, handle);
        fh
    }

    fn handle(&self, fh: u64) -> Option<Handle> {
        lock(&self.handles).get(&fh).cloned()
    }
}

/// The xattr protocol: size 0 asks for the size; a smaller buffer is `ERANGE`.
fn sized(value: Vec<u8>, size: u32) -> FsResult<XattrReply> {
    if size == 0 {
        return Ok(XattrReply::Size(value.len() as u32));
    }
    if value.len() > size as usize {
        return Err(FsError::Range {
            needed: value.len(),
            capacity: size as usize,
        });
    }
    Ok(XattrReply::Data(value))
}
