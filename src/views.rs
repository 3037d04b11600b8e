//! Views: local files holding a mounted file's bytes, so the kernel reads them itself.
//!
//! Every read of a FUSE file costs the daemon two copies and the reader a copy out of a page
//! cache of 4 KiB pages (the kernels we run on give FUSE files no large folios), so even a
//! second read through the mount runs at about 0.6× a local file's speed. FUSE passthrough
//! (Linux 6.9+, `FUSE_PASSTHROUGH`) lets an open hand the kernel a local file whose bytes are
//! the FUSE file's: reads, `mmap` and readahead then run as on that file, with no request to
//! the daemon. This module finds such files:
//!
//! - a file that is one whole object (a repo file, an asset) passes through to its blob, once
//!   the [`ObjectSource`] has proven the blob ([`ObjectSource::backing_file`]);
//! - a synthesized safetensors file has no local file with its bytes. The [`ViewCache`] makes
//!   one, `DIR/<digest>`, named by the plan's [`digest`](crate::layout::SafetensorsPlan::digest),
//!   from the bytes the mount's reads serve: once reads have served an eighth of a file (a loader
//!   at work, not a scanner reading headers), every read's bytes are also written at their place
//!   in a sparse temporary file, and a background thread fills the holes, in file order, through
//!   the same [`ObjectSource`]. Loaders read tensors out of file order, and a file read whole
//!   costs no second pass (a second pass read 2.4 s per GiB here): the build reads only what the
//!   reads had served before the view started, and what they skip. Opens after that pass through
//!   to it.
//!
//! A view is written from verified reads (proven blobs) into a temporary file, `fsync`ed, made
//! read-only and renamed: it is whole or absent. The cache keeps at most `capacity_bytes` of
//! views and views being built, dropping the least recently opened before a build starts, and
//! starts none that would leave the filesystem with less than the store's disk reserve free
//! ([`reserve`]: 2 % of the disk, 1–10 GiB). Views cost disk space (a copy of each file read,
//! up to the capacity), which is why the cache is off unless asked for. The store counts them
//! too: a write that would cross the store's disk reserve drops views in the store's own
//! `views/` first ([`crate::store::Store::make_room`]); a mount finds a dropped view gone and
//! serves the file itself until it is built again.
//!
//! Trust: from its build on, a view (like a passed-through blob) is read by the kernel without
//! the per-read checks of [`crate::io::BlobReader`]; a view whose size is not its file's is
//! removed, but changed bytes of the same size would be served. Views live in a folder only
//! the daemon's user can write.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use crate::format::Sha256;
use crate::io::ObjectSource;
use crate::layout::Content;
use crate::store::retention::{reserve, shortfall};
use crate::store::{Capacity, VIEWS_MARKER as MARKER};
use crate::sync::lock;

/// Bytes a build reads and writes at once (8 MiB).
const BUILD_BLOCK_BYTES: usize = 8 << 20;

/// A file's view starts once reads have served `1 / START_SHARE` of its bytes: a loader is at
/// work. A scanner reading headers (ComfyUI lists every model's) serves far less, and what a
/// build reads again is at most this share of a file read whole.
const START_SHARE: u64 = 8;

/// A build fills holes only once the file's reads have paused this long: while a loader is at
/// work, its reads fill the view, and a build racing ahead would read its bytes a second time.
const QUIET: Duration = Duration::from_millis(250);

/// Prefix of a view being written; the name goes on with the writer's pid and the digest.
const TEMP_PREFIX: &str = ".building-";

/// Where views go and how much of them to keep.
#[derive(Clone, Debug)]
pub struct ViewConfig {
    /// The folder of the views (created, mode 0700, if missing).
    pub dir: PathBuf,
    /// Most bytes of views kept, those being built included; the least recently opened go
    /// first.
    pub capacity_bytes: u64,
    /// Smaller files get no view (default 1 MiB): their reads cost little.
    pub min_file_bytes: u64,
}

impl ViewConfig {
    /// Views in `dir`, at most `capacity_bytes` of them, of files of 1 MiB or more.
    pub fn new(dir: impl Into<PathBuf>, capacity_bytes: u64) -> ViewConfig {
        ViewConfig {
            dir: dir.into(),
            capacity_bytes,
            min_file_bytes: 1 << 20,
        }
    }
}

/// A tenth of the filesystem: the views' budget of a mount that may pass files through and was
/// given none (`tensorfs mount` without `--view-cache`, docs/views.md says why).
pub fn default_capacity(disk: &Capacity) -> u64 {
    disk.total_bytes() / 10
}

/// Where a file's view stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewState {
    /// Built: opens pass through to it.
    Ready,
    /// Being written: reads' bytes go into it, and the build fills the rest.
    Building,
    /// None, and none started yet (or the build failed; see the log).
    Absent,
}

impl ViewState {
    /// The word the `user.tensorfs.view` attribute shows.
    pub fn as_str(self) -> &'static str {
        match self {
            ViewState::Ready => "ready",
            ViewState::Building => "building",
            ViewState::Absent => "absent",
        }
    }
}

#[derive(Debug, Default)]
struct Index {
    /// Built views: size in bytes and when last opened (a counter).
    ready: HashMap<Sha256, (u64, u64)>,
    /// Views being built.
    filling: HashMap<Sha256, Arc<Filling>>,
    /// Bytes reads have served of files with no view yet, since the mount started.
    served: HashMap<Sha256, u64>,
    /// Builds that failed, not tried again until the next mount.
    failed: HashSet<Sha256>,
    clock: u64,
}

impl Index {
    fn touch(&mut self, key: &Sha256) {
        self.clock += 1;
        let now = self.clock;
        if let Some(entry) = self.ready.get_mut(key) {
            entry.1 = now;
        }
    }

    fn building_bytes(&self) -> u64 {
        self.filling.values().map(|f| f.content.size()).sum()
    }

    /// Removes the least recently opened views until the rest take at most `room` bytes. An
    /// open view stays readable through its descriptor.
    fn evict(&mut self, dir: &Path, room: u64) {
        let mut total: u64 = self.ready.values().map(|(size, _)| size).sum();
        while total > room {
            let Some((&key, &(size, _))) = self.ready.iter().min_by_key(|(_, (_, used))| *used)
            else {
                break;
            };
            let path = dir.join(key.hex());
            if let Err(e) = fs::remove_file(&path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("removing view {}: {e}", path.display());
                }
            }
            self.ready.remove(&key);
            total -= size;
        }
    }
}

/// Byte ranges `[start, end)` of a file, disjoint and merged: what a view being built holds.
#[derive(Debug, Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    /// Adds `[start, end)`, merging it with the ranges it touches.
    fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        // The range starting at or before `start`, if it reaches it.
        if let Some((&s, &e)) = self.0.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.0.remove(&s);
            }
        }
        // Ranges starting inside the new one.
        while let Some((&s, &e)) = self.0.range(start..=end).next() {
            end = end.max(e);
            self.0.remove(&s);
        }
        self.0.insert(start, end);
    }

    /// The first range of `[from, size)` that no range covers, at most `most` bytes long.
    fn hole(&self, from: u64, size: u64, most: u64) -> Option<(u64, u64)> {
        let mut at = from;
        if let Some((_, &e)) = self.0.range(..=at).next_back() {
            at = at.max(e);
        }
        if at >= size {
            return None;
        }
        let next = self.0.range(at..).next().map_or(size, |(&s, _)| s);
        Some((at, next.min(size).min(at.saturating_add(most))))
    }

    fn covered(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s).sum()
    }
}

/// What a view being built holds, and when a read last added to it.
#[derive(Debug)]
struct Filled {
    ranges: Ranges,
    last_read: Instant,
    /// Where the build goes on, and the bytes it has read itself.
    build_at: u64,
    read_again: u64,
}

/// A view being built: a sparse temporary file that reads' bytes and the build fill.
#[derive(Debug)]
struct Filling {
    key: Sha256,
    content: Content,
    /// What the file is, for the log.
    label: String,
    /// The temporary file's name.
    path: PathBuf,
    file: File,
    filled: Mutex<Filled>,
    /// Why the first write of a read's bytes failed: the build gives the view up.
    broken: OnceLock<String>,
}

impl Filling {
    /// Writes the file's bytes `bytes` at `offset`, served by a read or (`by_read` false) read
    /// by the build. They are the file's, so two writers of one range write the same bytes.
    fn write(&self, offset: u64, bytes: &[u8], by_read: bool) -> io::Result<()> {
        self.file.write_all_at(bytes, offset)?;
        let mut filled = lock(&self.filled);
        filled.ranges.insert(offset, offset + bytes.len() as u64);
        if by_read {
            filled.last_read = Instant::now();
        }
        Ok(())
    }
}

/// The views of one mount: looks them up, and builds them from reads and one background thread.
pub struct ViewCache {
    config: ViewConfig,
    index: Arc<Mutex<Index>>,
    /// `None` once dropping.
    jobs: Option<Sender<Arc<Filling>>>,
    /// The build thread, joined on drop: its block under way ends, and with it its hold on the
    /// object source (a lazy mount's fetcher says what it fetched as it is dropped).
    builder: Option<std::thread::JoinHandle<()>>,
    /// Set when the cache is dropped or [`ViewCache::stop_building`] is called: builds under
    /// way stop and remove their files, and no other starts.
    stop: Arc<AtomicBool>,
}

impl Drop for ViewCache {
    fn drop(&mut self) {
        self.stop_building();
        self.jobs = None;
        if let Some(builder) = self.builder.take() {
            let _ = builder.join();
        }
    }
}

impl std::fmt::Debug for ViewCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewCache")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ViewCache {
    /// The views in `config.dir`, built from `source`'s bytes. Removes what dead builds left
    /// and indexes the views there, oldest first by modification time.
    ///
    /// # Errors
    /// The folder cannot be created or listed.
    pub fn open(config: ViewConfig, source: Arc<dyn ObjectSource>) -> io::Result<ViewCache> {
        claim(&config.dir)?;
        let mut found = Vec::new();
        for entry in fs::read_dir(&config.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(TEMP_PREFIX) {
                // A dead build's: nobody holds its lock.
                let orphan = OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                    .open(entry.path())
                    .is_ok_and(|f| try_lock(&f).is_ok());
                if orphan {
                    let _ = fs::remove_file(entry.path());
                }
                continue;
            }
            let (Ok(key), Ok(meta)) = (name.parse::<Sha256>(), entry.metadata()) else {
                continue;
            };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            found.push((modified, key, meta.len()));
        }
        found.sort();
        let mut index = Index::default();
        for (_, key, size) in found {
            index.clock += 1;
            index.ready.insert(key, (size, index.clock));
        }
        // A smaller capacity than last time takes effect now.
        index.evict(&config.dir, config.capacity_bytes);
        let builder = Builder {
            config: config.clone(),
            index: Arc::new(Mutex::new(index)),
            source,
            stop: Arc::default(),
        };
        let (index, stop) = (builder.index.clone(), builder.stop.clone());
        let (jobs, queue) = mpsc::channel::<Arc<Filling>>();
        let builder = std::thread::Builder::new()
            .name("tensorfs-views".into())
            .spawn(move || {
                builder.run(&queue);
            })?;
        Ok(ViewCache {
            config,
            index,
            jobs: Some(jobs),
            builder: Some(builder),
            stop,
        })
    }

    /// How many views are built, and their bytes.
    pub fn usage(&self) -> (usize, u64) {
        let index = lock(&self.index);
        (
            index.ready.len(),
            index.ready.values().map(|(size, _)| size).sum(),
        )
    }

    /// How many views are being built, and the bytes they will hold.
    pub fn building(&self) -> (usize, u64) {
        let index = lock(&self.index);
        (index.filling.len(), index.building_bytes())
    }

    /// The settings.
    pub fn config(&self) -> &ViewConfig {
        &self.config
    }

    /// The built view `key` of a file of `size` bytes, open to read; `None` when there is none
    /// (a view of another size is removed).
    pub fn file(&self, key: &Sha256, size: u64) -> Option<File> {
        lock(&self.index).ready.get(key)?;
        // Opened without the lock, so a slow folder stalls this open alone; not following a
        // link and not waiting on a FIFO someone put there.
        let path = self.config.dir.join(key.hex());
        let opened = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .and_then(|f| Ok((f.metadata()?, f)));
        let mut index = lock(&self.index);
        match opened {
            Ok((meta, file)) if meta.is_file() && meta.len() == size && trusted(&meta) => {
                index.touch(key);
                Some(file)
            }
            Ok((meta, _)) if !trusted(&meta) => {
                tracing::warn!(
                    "not serving view {}: it is not this user's alone (uid {}, mode {:o})",
                    path.display(),
                    std::os::unix::fs::MetadataExt::uid(&meta),
                    std::os::unix::fs::MetadataExt::mode(&meta)
                );
                index.ready.remove(key);
                None
            }
            Ok((meta, _)) => {
                tracing::warn!(
                    "removing view {}: not a file of {size} bytes ({} bytes)",
                    path.display(),
                    meta.len()
                );
                if meta.is_file() {
                    let _ = fs::remove_file(&path);
                }
                index.ready.remove(key);
                None
            }
            Err(e) => {
                tracing::debug!("view {} is gone: {e}", path.display());
                index.ready.remove(key);
                None
            }
        }
    }

    /// Where view `key` stands.
    pub fn state(&self, key: &Sha256) -> ViewState {
        let mut index = lock(&self.index);
        if let Some(&(size, _)) = index.ready.get(key) {
            // Another mount sharing the folder may have evicted it.
            let path = self.config.dir.join(key.hex());
            match fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_file() && meta.len() == size => return ViewState::Ready,
                _ => {
                    index.ready.remove(key);
                }
            }
        }
        if index.filling.contains_key(key) {
            ViewState::Building
        } else {
            ViewState::Absent
        }
    }

    /// Builds no view from now on, and drops those under way: for a mount whose kernel refuses
    /// passthrough, where no view would ever be read, and for the end of a mount. Built views
    /// stay, for a later mount that can pass files through to them.
    pub fn stop_building(&self) {
        self.stop.store(true, Ordering::Relaxed);
        for (_, filling) in lock(&self.index).filling.drain() {
            let _ = fs::remove_file(&filling.path);
        }
    }

    /// Takes the bytes `bytes` that a read served at `offset` of file `content`, whose view is
    /// `key` (`label` names the file for the log): they go into the view being built, or
    /// count toward starting one. A file gets none when it is smaller than
    /// [`ViewConfig::min_file_bytes`], has a view, failed one before, or building has stopped.
    /// Never waits for a build; a failed write only gives the view up.
    pub fn served(
        &self,
        key: Sha256,
        content: &Content,
        offset: u64,
        bytes: &[u8],
        label: impl FnOnce() -> String,
    ) {
        let size = content.size();
        if bytes.is_empty()
            || size < self.config.min_file_bytes
            || self.stop.load(Ordering::Relaxed)
        {
            return;
        }
        let filling = {
            let mut index = lock(&self.index);
            match index.filling.get(&key) {
                Some(filling) => filling.clone(),
                None => {
                    if index.ready.contains_key(&key) || index.failed.contains(&key) {
                        return;
                    }
                    let served = index.served.entry(key).or_default();
                    *served += bytes.len() as u64;
                    if *served < size.div_ceil(START_SHARE) {
                        return;
                    }
                    match self.start(&mut index, key, content, label) {
                        Ok(Some(filling)) => filling,
                        // Waits for the builds under way; a later read tries again.
                        Ok(None) => return,
                        Err((label, e)) => {
                            tracing::warn!(
                                "no view of {label} ({size} bytes) in {}: {e}",
                                self.config.dir.display()
                            );
                            index.served.remove(&key);
                            index.failed.insert(key);
                            return;
                        }
                    }
                }
            }
        };
        if let Err(e) = filling.write(offset, bytes, true) {
            let _ = filling
                .broken
                .set(format!("writing a read's bytes at {offset}: {e}"));
        }
    }

    /// Starts the view `key` of `content`: makes room, makes its temporary file and hands it
    /// to the build. `None` while the builds under way leave no room for it.
    fn start(
        &self,
        index: &mut Index,
        key: Sha256,
        content: &Content,
        label: impl FnOnce() -> String,
    ) -> Result<Option<Arc<Filling>>, (String, io::Error)> {
        let size = content.size();
        let capacity = self.config.capacity_bytes;
        if size > capacity {
            let e = io::Error::other(format!(
                "the file is larger than the cache ({capacity} bytes)"
            ));
            return Err((label(), e));
        }
        let building = index.building_bytes();
        if building + size > capacity {
            return Ok(None);
        }
        index.evict(&self.config.dir, capacity - building - size);
        let label = label();
        let made = (|| {
            // Views under way are sparse: what they will still write counts too.
            let disk = Capacity::of(&self.config.dir)?;
            if shortfall(&disk, size + building) > 0 {
                return Err(io::Error::other(format!(
                    "{} bytes free ({building} bytes of it promised to views under way); a view \
                     must leave the disk's reserve of {} bytes",
                    disk.available_bytes(),
                    reserve(&disk)
                )));
            }
            let path =
                self.config
                    .dir
                    .join(format!("{TEMP_PREFIX}{}-{}", std::process::id(), key.hex()));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            // Held while the build lives: how a later mount, in any pid namespace, tells a
            // live build's file from one a dead build left.
            if let Err(e) = try_lock(&file) {
                let _ = fs::remove_file(&path);
                return Err(e);
            }
            // Sparse: blocks come as bytes are written.
            if let Err(e) = file.set_len(size) {
                let _ = fs::remove_file(&path);
                return Err(e);
            }
            Ok((path, file))
        })();
        let (path, file) = match made {
            Ok(made) => made,
            Err(e) => return Err((label, e)),
        };
        let filling = Arc::new(Filling {
            key,
            content: content.clone(),
            label,
            path,
            file,
            filled: Mutex::new(Filled {
                ranges: Ranges::default(),
                last_read: Instant::now(),
                build_at: 0,
                read_again: 0,
            }),
            broken: OnceLock::new(),
        });
        let sent = self.jobs.as_ref().map(|jobs| jobs.send(filling.clone()));
        if !matches!(sent, Some(Ok(()))) {
            let _ = fs::remove_file(&filling.path);
            return Ok(None);
        }
        index.served.remove(&key);
        index.filling.insert(key, filling.clone());
        Ok(Some(filling))
    }
}

/// The background half of a [`ViewCache`].
struct Builder {
    config: ViewConfig,
    index: Arc<Mutex<Index>>,
    source: Arc<dyn ObjectSource>,
    stop: Arc<AtomicBool>,
}

/// What one step of a build did.
enum Step {
    /// It filled a block.
    Filled,
    /// The file's reads have not paused for [`QUIET`]: try again after this long.
    Busy(Duration),
    /// The view is built (with the bytes the build read), or given up.
    Done(io::Result<u64>),
}

impl Builder {
    /// Builds the views handed over on `queue`, a block at a time, taking turns among those
    /// whose reads have paused: a file a loader keeps reading delays no other. Ends when the
    /// cache (the sender) is dropped and the builds under way have stopped.
    fn run(&self, queue: &mpsc::Receiver<Arc<Filling>>) {
        let mut active: Vec<Arc<Filling>> = Vec::new();
        let mut buf = vec![0u8; BUILD_BLOCK_BYTES];
        loop {
            if active.is_empty() {
                match queue.recv() {
                    Ok(filling) => active.push(filling),
                    Err(_) => return,
                }
            }
            active.extend(queue.try_iter());
            let mut worked = false;
            let mut wait = QUIET;
            let mut i = 0;
            while i < active.len() {
                match self.step(&active[i], &mut buf) {
                    Step::Filled => worked = true,
                    Step::Busy(left) => wait = wait.min(left),
                    Step::Done(result) => {
                        let filling = active.swap_remove(i);
                        self.finish(&filling, result);
                        worked = true;
                        continue;
                    }
                }
                i += 1;
            }
            if !worked {
                // Until a file's reads have paused long enough, or a new view starts.
                match queue.recv_timeout(wait) {
                    Ok(filling) => active.push(filling),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    // Dropped: the stop flag ends the builds under way at their next step.
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        self.stop.store(true, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// Fills the next hole of `filling` in file order, at most a block, when its reads have
    /// paused for [`QUIET`]; with no hole left, flushes it, makes it read-only and gives it its
    /// name.
    fn step(&self, filling: &Filling, buf: &mut [u8]) -> Step {
        if self.stop.load(Ordering::Relaxed) {
            return Step::Done(Err(io::Error::other("the mount ended")));
        }
        if let Some(why) = filling.broken.get() {
            return Step::Done(Err(io::Error::other(why.clone())));
        }
        let size = filling.content.size();
        let (hole, since_read, read) = {
            let filled = lock(&filling.filled);
            let hole = filled
                .ranges
                .hole(filled.build_at, size, BUILD_BLOCK_BYTES as u64);
            (hole, filled.last_read.elapsed(), filled.read_again)
        };
        let Some((start, end)) = hole else {
            return Step::Done(self.seal(filling).map(|()| read));
        };
        if since_read < QUIET {
            return Step::Busy(QUIET - since_read);
        }
        let buf = &mut buf[..(end - start) as usize];
        let result = filling
            .content
            .read_at(self.source.as_ref(), start, buf)
            .and_then(|n| {
                if n < buf.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the file ended at {} of {size} bytes", start + n as u64),
                    ));
                }
                filling.write(start, buf, false)
            });
        if let Err(e) = result {
            return Step::Done(Err(e));
        }
        let mut filled = lock(&filling.filled);
        filled.build_at = end;
        filled.read_again += end - start;
        Step::Filled
    }

    /// Flushes a whole view, makes it read-only and gives it its name.
    fn seal(&self, filling: &Filling) -> io::Result<()> {
        debug_assert_eq!(
            lock(&filling.filled).ranges.covered(),
            filling.content.size()
        );
        filling.file.sync_all()?;
        filling
            .file
            .set_permissions(fs::Permissions::from_mode(0o400))?;
        fs::rename(&filling.path, self.config.dir.join(filling.key.hex()))
    }

    /// Records how the build of `filling` ended: a view, or a failure not tried again.
    fn finish(&self, filling: &Filling, result: io::Result<u64>) {
        // The build read its holes after the file's last close, maybe: the source would keep
        // those blobs open, and their shared locks would keep a collection from a model
        // removed meanwhile for as long as the mount runs. A file still open opens them again.
        self.source.close(
            &filling
                .content
                .chunks_from(0, usize::MAX)
                .iter()
                .map(|c| c.sha256)
                .collect::<Vec<_>>(),
        );
        let size = filling.content.size();
        let mut index = lock(&self.index);
        // Absent when building stopped: its file is gone already.
        if index.filling.remove(&filling.key).is_none() {
            return;
        }
        match result {
            Ok(read) => {
                index.ready.insert(filling.key, (size, 0));
                index.touch(&filling.key);
                tracing::debug!(
                    "built view {} of {} ({size} bytes, {read} read again by the build)",
                    filling.key,
                    filling.label
                );
            }
            Err(e) => {
                let _ = fs::remove_file(&filling.path);
                if !self.stop.load(Ordering::Relaxed) {
                    tracing::warn!(
                        "no view of {} ({size} bytes) in {}: {e}",
                        filling.label,
                        self.config.dir.display()
                    );
                    index.failed.insert(filling.key);
                }
            }
        }
    }
}

/// Makes `dir` a views folder: a new one (mode 0700) or an empty one gets the marker; an
/// existing one must hold it already. [`ViewCache::open`] does this; a command may do it first
/// to refuse a folder before it mounts.
///
/// # Errors
/// The folder cannot be made or listed, or it holds other files.
pub fn claim(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            use std::os::unix::fs::MetadataExt;
            let meta = fs::symlink_metadata(dir)?;
            if !meta.is_dir() {
                return Err(io::Error::other("not a folder"));
            }
            // The kernel reads views without checks: nobody else may put files there.
            if meta.uid() != euid() {
                return Err(io::Error::other(format!(
                    "the folder belongs to another user (uid {}); views need a folder only the \
                     mount's user can write",
                    meta.uid()
                )));
            }
            let marked = dir.join(MARKER).is_file();
            if !marked && fs::read_dir(dir)?.next().is_some() {
                return Err(io::Error::other(
                    "the folder holds other files; give views a folder of their own",
                ));
            }
            if meta.mode() & 0o022 != 0 {
                if marked && fs::read_dir(dir)?.count() > 1 {
                    return Err(io::Error::other(
                        "others may write into the folder, so its views cannot be trusted; \
                         remove them or give views another folder",
                    ));
                }
                fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
            }
        }
        Err(e) => return Err(e),
    }
    fs::write(
        dir.join(MARKER),
        b"views of a TensorFS mount (tensorfs mount --view-cache)\n",
    )
}

/// Takes `file`'s exclusive `flock` without waiting (`EWOULDBLOCK` when another holds it).
fn try_lock(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own; it only reads its arguments.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether a view's metadata shows a file only this user wrote: owned by it, and writable by
/// no one else.
fn trusted(meta: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    meta.uid() == euid() && meta.mode() & 0o022 == 0
}

/// This process's effective user: the owner views and their folder must have.
fn euid() -> u32 {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;
    use crate::format::ObjectRef;

    #[test]
    fn ranges_merge_and_show_their_holes() {
        let mut r = Ranges::default();
        r.insert(10, 20);
        r.insert(30, 40);
        assert_eq!(r.hole(0, 50, 100), Some((0, 10)));
        assert_eq!(r.hole(10, 50, 100), Some((20, 30)));
        assert_eq!(r.hole(15, 50, 4), Some((20, 24)));
        r.insert(20, 30);
        assert_eq!(r.0.len(), 1, "touching ranges merge: {r:?}");
        r.insert(5, 12);
        r.insert(35, 60);
        assert_eq!(r.0.iter().collect::<Vec<_>>(), [(&5, &60)]);
        assert_eq!(r.hole(0, 60, 100), Some((0, 5)));
        assert_eq!(r.hole(5, 60, 100), None);
        r.insert(0, 5);
        assert_eq!(r.covered(), 60);
        assert_eq!(r.hole(0, 60, 100), None);
        r.insert(3, 3);
        assert_eq!(r.covered(), 60, "an empty range adds nothing");
    }

    /// One object's bytes, counting what is read of them.
    struct Counting {
        bytes: Vec<u8>,
        read: AtomicU64,
    }

    impl ObjectSource for Counting {
        fn read_object(&self, _: &ObjectRef, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            let start = offset as usize;
            buf.copy_from_slice(&self.bytes[start..start + buf.len()]);
            self.read.fetch_add(buf.len() as u64, Ordering::Relaxed);
            Ok(())
        }
    }

    fn cache(dir: &Path, bytes: Vec<u8>) -> (ViewCache, Arc<Counting>, Content) {
        let content = Content::Object(ObjectRef::of(&bytes));
        let source = Arc::new(Counting {
            bytes,
            read: AtomicU64::new(0),
        });
        let views = ViewCache::open(ViewConfig::new(dir, 64 << 20), source.clone()).unwrap();
        (views, source, content)
    }

    fn wait_ready(views: &ViewCache, key: &Sha256) {
        let until = Instant::now() + Duration::from_secs(30);
        while views.state(key) != ViewState::Ready {
            assert!(Instant::now() < until, "the view was not built");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A loader's reads, served out of file order: the view is the file, and the build read
    /// again only what the reads served before the view started.
    #[test]
    fn a_view_is_built_from_the_bytes_reads_served() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("views");
        let size = 8 << 20;
        let bytes: Vec<u8> = (0..size).map(|i: usize| (i * 7 + i / 4093) as u8).collect();
        let (views, source, content) = cache(&dir, bytes.clone());
        let key = Sha256([7; 32]);
        let block = 128 << 10;
        // Back to front, as a loader whose tensors' order is not the file's may read.
        let mut offsets: Vec<usize> = (0..size).step_by(block).collect();
        offsets.reverse();
        for &at in &offsets {
            let end = (at + block).min(size);
            views.served(key, &content, at as u64, &bytes[at..end], || "x".into());
        }
        wait_ready(&views, &key);
        assert_eq!(fs::read(dir.join(key.hex())).unwrap(), bytes);
        let read = source.read.load(Ordering::Relaxed);
        assert!(
            read <= size as u64 / START_SHARE + block as u64,
            "the build read {read} bytes of {size}: a second pass"
        );
        assert_eq!(views_left(&dir), [key.hex()], "no temporary file left");
    }

    /// A loader still at work fills the view itself: the build waits for its reads to pause.
    #[test]
    fn the_build_waits_while_reads_go_on() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("views");
        let size = 4 << 20;
        let bytes: Vec<u8> = (0..size).map(|i: usize| (i / 3) as u8).collect();
        let (views, source, content) = cache(&dir, bytes.clone());
        let key = Sha256([5; 32]);
        let block = 64 << 10;
        for at in (0..size).step_by(block) {
            views.served(key, &content, at as u64, &bytes[at..at + block], || {
                "x".into()
            });
            std::thread::sleep(Duration::from_millis(3));
        }
        wait_ready(&views, &key);
        assert_eq!(fs::read(dir.join(key.hex())).unwrap(), bytes);
        let read = source.read.load(Ordering::Relaxed);
        assert!(
            read <= size as u64 / START_SHARE + block as u64,
            "the build read {read} bytes of {size} while the reads went on"
        );
    }

    /// A file read in part is finished by the build; a read of its head starts nothing.
    #[test]
    fn the_build_fills_what_reads_skipped_and_a_head_read_starts_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("views");
        let size = 4 << 20;
        let bytes: Vec<u8> = (0..size).map(|i: usize| (i % 251) as u8).collect();
        let (views, source, content) = cache(&dir, bytes.clone());
        let key = Sha256([9; 32]);
        views.served(key, &content, 0, &bytes[..64 << 10], || "x".into());
        assert_eq!(views.state(&key), ViewState::Absent, "a head read");
        let mid = size / 2;
        views.served(
            key,
            &content,
            mid as u64,
            &bytes[mid..mid + (1 << 20)],
            || "x".into(),
        );
        wait_ready(&views, &key);
        assert_eq!(fs::read(dir.join(key.hex())).unwrap(), bytes);
        let read = source.read.load(Ordering::Relaxed);
        assert_eq!(
            read,
            size as u64 - (1 << 20),
            "the build read the rest once"
        );
    }

    /// The end of a mount drops the views under way with their temporary files.
    #[test]
    fn stopping_removes_the_views_being_built() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("views");
        let bytes = vec![1u8; 4 << 20];
        let content = Content::Object(ObjectRef::of(&bytes));
        // A source that never answers keeps the build under way.
        struct Stalled;
        impl ObjectSource for Stalled {
            fn read_object(&self, _: &ObjectRef, _: u64, _: &mut [u8]) -> io::Result<()> {
                std::thread::sleep(Duration::from_millis(200));
                Err(io::Error::other("stalled"))
            }
        }
        let views = ViewCache::open(ViewConfig::new(&dir, 64 << 20), Arc::new(Stalled)).unwrap();
        let key = Sha256([3; 32]);
        views.served(key, &content, 1 << 20, &bytes[..1 << 20], || "x".into());
        assert_eq!(views.state(&key), ViewState::Building);
        assert_eq!(views.building(), (1, 4 << 20));
        assert_eq!(views_left(&dir).len(), 1, "the temporary file");
        drop(views);
        assert!(views_left(&dir).is_empty(), "{:?}", views_left(&dir));
    }

    /// A file a loader keeps reading delays no other file's view.
    #[test]
    fn a_file_still_being_read_does_not_hold_back_another_view() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("views");
        let size = 2 << 20;
        let busy_bytes: Vec<u8> = (0..size).map(|i: usize| (i % 13) as u8).collect();
        let (views, _, busy) = cache(&dir, busy_bytes.clone());
        let (busy_key, other_key) = (Sha256([1; 32]), Sha256([2; 32]));
        // The busy file starts first and its reads never pause for long.
        views.served(busy_key, &busy, 0, &busy_bytes[..1 << 20], || "busy".into());
        let other = busy.clone();
        views.served(other_key, &other, 0, &busy_bytes[..1 << 20], || {
            "other".into()
        });
        let until = Instant::now() + Duration::from_secs(20);
        while views.state(&other_key) != ViewState::Ready {
            assert!(
                Instant::now() < until,
                "the other view waited for the busy file"
            );
            views.served(busy_key, &busy, 0, &busy_bytes[..4096], || "busy".into());
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(views.state(&busy_key), ViewState::Building);
    }

    /// Views must be this user's alone: a folder others may write is made private (or refused
    /// when it holds views already), and a view another user owns is never served.
    #[test]
    fn views_others_could_write_are_not_served() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("shared");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).unwrap();
        claim(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
        let (views, _, _) = cache(&dir, vec![0u8; 8]);
        drop(views);
        let key = Sha256([4; 32]);
        let planted = dir.join(key.hex());
        fs::write(&planted, vec![0u8; 4096]).unwrap();
        fs::set_permissions(&planted, fs::Permissions::from_mode(0o666)).unwrap();
        let (views, _, _) = cache(&dir, vec![0u8; 8]);
        assert!(views.file(&key, 4096).is_none(), "a view others may write");
        // Writable by others, holding views: refused.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let err = claim(&dir).unwrap_err();
        assert!(err.to_string().contains("cannot be trusted"), "{err}");
        // Another user's folder: refused (the tests run as root, who can make one).
        if euid() == 0 {
            let theirs = tmp.path().join("theirs");
            fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let err = claim(&theirs).unwrap_err();
            assert!(err.to_string().contains("another user"), "{err}");
        }
        let file = tmp.path().join("file");
        fs::write(&file, b"x").unwrap();
        assert!(claim(&file)
            .unwrap_err()
            .to_string()
            .contains("not a folder"));
    }

    /// A temporary file is a dead build's when nobody holds its lock, whatever process id
    /// its name shows (pid 1 is alive, in another namespace it is another process).
    #[test]
    fn leftovers_of_dead_builds_go_and_live_builds_files_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("views");
        claim(&dir).unwrap();
        let dead = dir.join(format!("{TEMP_PREFIX}1-{}", Sha256([5; 32]).hex()));
        fs::write(&dead, b"partial").unwrap();
        let live = dir.join(format!("{TEMP_PREFIX}999999-{}", Sha256([6; 32]).hex()));
        fs::write(&live, b"partial").unwrap();
        let held = File::open(&live).unwrap();
        try_lock(&held).unwrap();
        let (views, _, _) = cache(&dir, vec![0u8; 8]);
        assert!(!dead.exists(), "a dead build's file is removed");
        assert!(live.exists(), "a live build's file stays");
        drop((views, held));
    }

    fn views_left(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != MARKER)
            .collect();
        names.sort();
        names
    }
}
