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
//! - a synthesized safetensors file has no local file with its bytes. Once a handle has read
//!   it to its end, the [`ViewCache`] writes one in the background, `DIR/<digest>`, named by
//!   the plan's [`digest`](crate::layout::SafetensorsPlan::digest), and opens after that pass
//!   through to it.
//!
//! A view is written through the same [`ObjectSource`] reads serve (so from proven blobs) into a
//! temporary file, `fsync`ed, made read-only and renamed: it is whole or absent. The cache
//! keeps at most `capacity_bytes` of views, dropping the least recently opened after each
//! build, and builds nothing that would leave the filesystem with less than the store's disk
//! reserve free ([`reserve`]: 2 % of the disk, 1–10 GiB). Views cost disk space (a copy of each file read whole, up to the
//! capacity), which is why the cache is off unless asked for. The store counts them too: a
//! write that would cross the store's disk reserve drops views in the store's own `views/`
//! first ([`crate::store::Store::make_room`]); a mount finds a dropped view gone and serves the
//! file itself until it is built again.
//!
//! Trust: from its build on, a view (like a passed-through blob) is read by the kernel without
//! the per-read checks of [`crate::io::BlobReader`]; a view whose size is not its file's is
//! removed, but changed bytes of the same size would be served. Views live in a folder only
//! the daemon's user can write.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::format::Sha256;
use crate::io::ObjectSource;
use crate::layout::Content;
use crate::store::retention::{reserve, shortfall};
use crate::store::{Capacity, VIEWS_MARKER as MARKER};
use crate::sync::lock;

/// Bytes a build reads and writes at once (8 MiB).
const BUILD_BLOCK_BYTES: usize = 8 << 20;

/// Prefix of a view being written; the name goes on with the writer's pid and the digest.
const TEMP_PREFIX: &str = ".building-";

/// Where views go and how much of them to keep.
#[derive(Clone, Debug)]
pub struct ViewConfig {
    /// The folder of the views (created, mode 0700, if missing).
    pub dir: PathBuf,
    /// Most bytes of views kept; the least recently opened go first.
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

/// Where a file's view stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewState {
    /// Built: opens pass through to it.
    Ready,
    /// Being written (or waiting to be).
    Building,
    /// None, and none asked for yet (or the build failed; see the log).
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
    building: HashSet<Sha256>,
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
}

struct Job {
    key: Sha256,
    content: Content,
    /// What the file is, for the log.
    label: String,
}

/// The views of one mount: looks them up and builds them on one background thread.
pub struct ViewCache {
    config: ViewConfig,
    index: Arc<Mutex<Index>>,
    jobs: Sender<Job>,
    /// Set when the cache is dropped or [`ViewCache::stop_building`] is called: a build under
    /// way stops and removes its file, and no other starts.
    stop: Arc<AtomicBool>,
}

impl Drop for ViewCache {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
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
            if let Some(rest) = name.strip_prefix(TEMP_PREFIX) {
                let pid = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
                if pid.is_none_or(|pid| !alive(pid)) {
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
        let builder = Builder {
            config: config.clone(),
            index: Arc::new(Mutex::new(index)),
            source,
            stop: Arc::default(),
        };
        // A smaller capacity than last time takes effect now.
        builder.evict(&mut lock(&builder.index));
        let (index, stop) = (builder.index.clone(), builder.stop.clone());
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("tensorfs-views".into())
            .spawn(move || {
                // Ends when the cache (the sender) is dropped.
                for job in queue {
                    builder.build(job);
                }
            })?;
        Ok(ViewCache {
            config,
            index,
            jobs,
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
            Ok((meta, file)) if meta.is_file() && meta.len() == size => {
                index.touch(key);
                Some(file)
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
        if index.building.contains(key) {
            ViewState::Building
        } else {
            ViewState::Absent
        }
    }

    /// Builds no view from now on, and stops the one under way: for a mount whose kernel
    /// refuses passthrough, where no view would ever be read. Built views stay, for a later
    /// mount that can pass files through to them.
    pub fn stop_building(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Asks for view `key` of `content` (the file `label` names, for the log) to be built,
    /// unless it is built, being built, failed before, the file is smaller than
    /// [`ViewConfig::min_file_bytes`], or building has stopped. Never waits.
    pub fn request(&self, key: Sha256, content: &Content, label: &str) {
        if content.size() < self.config.min_file_bytes || self.stop.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut index = lock(&self.index);
            if index.ready.contains_key(&key)
                || index.failed.contains(&key)
                || !index.building.insert(key)
            {
                return;
            }
        }
        let job = Job {
            key,
            content: content.clone(),
            label: label.to_owned(),
        };
        if self.jobs.send(job).is_err() {
            lock(&self.index).building.remove(&key);
        }
    }
}

/// The background half of a [`ViewCache`].
struct Builder {
    config: ViewConfig,
    index: Arc<Mutex<Index>>,
    source: Arc<dyn ObjectSource>,
    stop: Arc<AtomicBool>,
}

impl Builder {
    fn build(&self, job: Job) {
        // Jobs still queued when building stops are dropped unannounced.
        if self.stop.load(Ordering::Relaxed) {
            lock(&self.index).building.remove(&job.key);
            return;
        }
        let size = job.content.size();
        let result = self.write(&job);
        let mut index = lock(&self.index);
        index.building.remove(&job.key);
        match result {
            Ok(()) => {
                index.ready.insert(job.key, (size, 0));
                index.touch(&job.key);
                tracing::debug!("built view {} of {} ({size} bytes)", job.key, job.label);
                self.evict(&mut index);
            }
            // Stopped: not a failure, the file may be built by a later mount.
            Err(_) if self.stop.load(Ordering::Relaxed) => {}
            Err(e) => {
                tracing::warn!(
                    "no view of {} ({size} bytes) in {}: {e}",
                    job.label,
                    self.config.dir.display()
                );
                index.failed.insert(job.key);
            }
        }
    }

    /// Writes the view of `job` whole under its name, or leaves nothing.
    fn write(&self, job: &Job) -> io::Result<()> {
        let size = job.content.size();
        if size > self.config.capacity_bytes {
            return Err(io::Error::other(format!(
                "the file is larger than the cache ({} bytes)",
                self.config.capacity_bytes
            )));
        }
        let capacity = Capacity::of(&self.config.dir)?;
        if shortfall(&capacity, size) > 0 {
            return Err(io::Error::other(format!(
                "{} bytes free; a view must leave the disk's reserve of {} bytes",
                capacity.available_bytes(),
                reserve(&capacity)
            )));
        }
        let temp = self.config.dir.join(format!(
            "{TEMP_PREFIX}{}-{}",
            std::process::id(),
            job.key.hex()
        ));
        let written = write_view(&temp, &job.content, self.source.as_ref(), &self.stop)
            .and_then(|()| fs::rename(&temp, self.config.dir.join(job.key.hex())));
        if written.is_err() {
            let _ = fs::remove_file(&temp);
        }
        written
    }

    /// Removes the least recently opened views until the rest fit the capacity. An open view
    /// stays readable through its descriptor.
    fn evict(&self, index: &mut Index) {
        let mut total: u64 = index.ready.values().map(|(size, _)| size).sum();
        while total > self.config.capacity_bytes {
            let Some((&key, &(size, _))) = index.ready.iter().min_by_key(|(_, (_, used))| *used)
            else {
                break;
            };
            let path = self.config.dir.join(key.hex());
            if let Err(e) = fs::remove_file(&path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("removing view {}: {e}", path.display());
                }
            }
            index.ready.remove(&key);
            total -= size;
        }
    }
}

/// Writes `content` to a new file at `path`, flushed to disk and read-only.
fn write_view(
    path: &Path,
    content: &Content,
    source: &dyn ObjectSource,
    stop: &AtomicBool,
) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    let size = content.size();
    let mut buf = vec![0u8; BUILD_BLOCK_BYTES];
    let mut offset = 0u64;
    while offset < size {
        if stop.load(Ordering::Relaxed) {
            return Err(io::Error::other("the mount ended"));
        }
        let n = content.read_at(source, offset, &mut buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the file ended at {offset} of {size} bytes"),
            ));
        }
        file.write_all(&buf[..n])?;
        offset += n as u64;
    }
    file.sync_all()?;
    file.set_permissions(fs::Permissions::from_mode(0o400))?;
    Ok(())
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
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {
            let marked = dir.join(MARKER).is_file();
            if !marked && fs::read_dir(dir)?.next().is_some() {
                return Err(io::Error::other(
                    "the folder holds other files; give views a folder of their own",
                ));
            }
        }
        Err(e) => return Err(e),
    }
    fs::write(
        dir.join(MARKER),
        b"views of a TensorFS mount (tensorfs mount --view-cache)\n",
    )
}

/// Whether process `pid` still runs (a temporary file of a live build is left alone).
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe {
        libc::kill(pid, 0) == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
}
