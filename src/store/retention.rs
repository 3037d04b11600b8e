//! Retention: what keeps an object in the store, and the collector that removes the rest.
//!
//! One regime for every writer of a store, the reference's (`tensorfs` 0.17.2), so either
//! implementation's collection keeps the other's live data. Its records:
//!
//! ```text
//! holds/<pid>-<n>      a live process's objects: digests, one per line, under an exclusive flock
//! holds/gc.lock        the collector's fence: writers take it shared, a collection exclusive
//! files/<sha256(path)> a header file outside the store: {"path", "header": {"sha256", "length"}}
//! uses/<digest>        a use: the digests it keeps, sorted, one per line; its mtime is its last use
//! uses/.swept          the mtime of the last collection
//! tmp/gc/<digest>      an object being swept (put back by the next collection)
//! ```
//!
//! **Roots** are the digests of live holds (one whose flock cannot be taken), of `files/`
//! records whose file still hashes to the header they name (with that header's chunks and
//! assets), and the closures of the commits `local/` repos name (spec §7: tree, tree files,
//! header chunks and assets). Everything else is **cache**, kept by uses: a use is dropped
//! [`TTL`] after its last use, or earlier, least recently used first, while the disk has less
//! free than [`reserve`]. An object that no root or kept use names and that is older than the
//! grace ([`GRACE`], by its mtime) is swept: renamed into `tmp/gc/`, then removed unless it
//! became young meanwhile. An object a reader holds a shared `flock` on is never swept.
//!
//! The rules are the reference's (its sdist, `crates/tensorfs/src/store/retention.rs` and
//! `gc.rs`); this module is written from their description, not from that code. Where the
//! reference only logs (a local repo's commit that cannot be read), this collector stops: a
//! closure it cannot read is one it cannot keep.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::refs::Lock;
use super::{io_err, Capacity, Store, StoreError, StoreResult};
use crate::format::{Header, ObjectRef, Repo, Sha256};

mod evict;
pub use evict::{CacheObject, Evict, Evicted};

/// How long a use keeps its objects after its last use: 7 days.
pub const TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// How young an object (by its blob's mtime) is never swept: 1 hour.
pub const GRACE: Duration = Duration::from_secs(3600);

/// The free space a collection keeps on the store's disk: 2 % of it, at least 1 GiB and at most
/// 10 GiB (binary), from `statvfs` (`f_blocks × f_frsize`).
pub fn reserve(capacity: &Capacity) -> u64 {
    let total = capacity
        .blocks
        .saturating_mul(u64::from(capacity.block_bytes.max(1)));
    (total / 50).clamp(1 << 30, 10 << 30)
}

/// What a run under the collector's fence reports: whether it did nothing because another
/// collection or a writer held the fence.
pub trait Fenced {
    /// The fence was held: nothing was done.
    fn skipped(&self) -> bool;
}

impl Fenced for Collected {
    fn skipped(&self) -> bool {
        self.skipped
    }
}

impl Fenced for Evicted {
    fn skipped(&self) -> bool {
        self.skipped
    }
}

/// Runs `attempt` (a collection or an eviction) again, 20 ms apart, while it skips for the
/// fence, for `patience` at most: writers hold the fence for a moment (an open's hold, a use
/// recorded). Returns the last report, still skipped when the fence stayed held.
///
/// # Errors
/// The first error of an attempt.
pub fn patiently<T: Fenced>(
    patience: Duration,
    mut attempt: impl FnMut() -> StoreResult<T>,
) -> StoreResult<T> {
    const STEP: Duration = Duration::from_millis(20);
    let start = std::time::Instant::now();
    loop {
        let report = attempt()?;
        if !report.skipped() || start.elapsed() + STEP > patience {
            return Ok(report);
        }
        std::thread::sleep(STEP);
    }
}

/// How many bytes must be freed before `incoming` more fit above the reserve (0: they fit).
pub fn shortfall(capacity: &Capacity, incoming: u64) -> u64 {
    (reserve(capacity) + incoming.max(1)).saturating_sub(capacity.available_bytes())
}

impl Store {
    /// Makes room for `incoming` bytes above the disk's [`reserve`]: when they would not fit,
    /// a collection first evicts what only uses keep (least recently used first, objects past
    /// the grace), as the reference does before it writes. Call it before staging, without
    /// the fence held (a collection would skip).
    ///
    /// # Errors
    /// [`StoreError::NoSpace`] when they still do not fit; the collection's errors.
    pub fn make_room(&self, incoming: u64) -> StoreResult<()> {
        let capacity =
            |store: &Store| Capacity::of(&store.root).map_err(io_err("statvfs", &store.root));
        let short = shortfall(&capacity(self)?, incoming);
        if short == 0 {
            return Ok(());
        }
        // Views are copies the mount makes again: they go before any cache.
        if self.drop_views(short)? >= short {
            return Ok(());
        }
        self.collect(&Collect {
            incoming,
            ..Collect::default()
        })?;
        let now = capacity(self)?;
        if shortfall(&now, incoming) == 0 {
            return Ok(());
        }
        Err(StoreError::NoSpace {
            needed: incoming,
            reserve: reserve(&now),
            available: now.available_bytes(),
            path: self.root.clone(),
        })
    }
}

impl Store {
    /// The store's own views (`views/<digest>`, see [`crate::views`]): each view's digest,
    /// bytes and mtime; none when the folder is absent or not a views folder.
    ///
    /// # Errors
    /// The folder cannot be listed.
    pub fn views(&self) -> StoreResult<Vec<(Sha256, u64, SystemTime)>> {
        let dir = self.root.join("views");
        if !dir.join(super::VIEWS_MARKER).exists() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err("list", &dir))? {
            let entry = entry.map_err(io_err("list", &dir))?;
            let Some(name) = digest_name(&entry.file_name()) else {
                continue;
            };
            if let Ok(meta) = entry.metadata() {
                if meta.is_file() {
                    out.push((name, meta.len(), meta.modified().unwrap_or(UNIX_EPOCH)));
                }
            }
        }
        Ok(out)
    }

    /// Removes the store's views, oldest built first, until `need` bytes are freed; returns the
    /// bytes freed. A view open in a mount keeps its bytes until closed; the mount serves the
    /// file itself from then on, until it builds the view again.
    fn drop_views(&self, need: u64) -> StoreResult<u64> {
        let mut views = self.views()?;
        views.sort_by_key(|(name, _, mtime)| (*mtime, *name));
        let mut freed = 0;
        for (name, bytes, _) in views {
            if freed >= need {
                break;
            }
            let path = self.root.join("views").join(name.hex());
            match fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!("dropped view {} ({bytes} bytes) for room", path.display());
                    freed += bytes;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &path)(e)),
            }
        }
        Ok(freed)
    }
}

/// A hold: the objects a live process needs, which no collection sweeps while it lives.
/// Dropping it removes its file (a process killed with it leaves the file unlocked, which the
/// next collection removes).
#[derive(Debug)]
pub struct Hold {
    file: File,
    path: PathBuf,
    listed: HashSet<Sha256>,
}

impl Store {
    /// Holds `objects` (and whatever is added later) until the hold is dropped:
    /// `holds/<pid>-<n>`, under an exclusive `flock` and the shared fence.
    ///
    /// # Errors
    /// The hold file cannot be created, locked or written.
    pub fn hold<'a>(&self, objects: impl IntoIterator<Item = &'a ObjectRef>) -> StoreResult<Hold> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let _fence = self.fence()?;
        let dir = self.root.join("holds");
        let (path, file) = loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("{}-{n}", std::process::id()));
            match OpenOptions::new()
                .read(true)
                .append(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("create", &path)(e)),
            }
        };
        file.lock().map_err(io_err("lock", &path))?;
        let mut hold = Hold {
            file,
            path,
            listed: HashSet::new(),
        };
        hold.append(objects)?;
        Ok(hold)
    }
}

impl Hold {
    /// Adds `objects` to the hold.
    ///
    /// # Errors
    /// Writing the hold file fails.
    pub fn add<'a>(
        &mut self,
        store: &Store,
        objects: impl IntoIterator<Item = &'a ObjectRef>,
    ) -> StoreResult<()> {
        let _fence = store.fence()?;
        self.append(objects)
    }

    fn append<'a>(&mut self, objects: impl IntoIterator<Item = &'a ObjectRef>) -> StoreResult<()> {
        let mut lines = String::new();
        for object in objects {
            if self.listed.insert(object.sha256) {
                lines.push_str(&format!("{}\n", object.sha256));
            }
        }
        if !lines.is_empty() {
            self.file
                .write_all(lines.as_bytes())
                .map_err(io_err("write", &self.path))?;
        }
        Ok(())
    }

    /// The hold's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The digests it holds.
    pub fn digests(&self) -> impl Iterator<Item = &Sha256> {
        self.listed.iter()
    }
}

impl Hold {
    /// The hold file, under the hold's exclusive `flock`. The lock is its open file
    /// description's: another descriptor of it (a process that received it over a socket)
    /// keeps the hold for as long as it is open, even past this process (the file is
    /// removed when the hold is dropped, which ends it for every descriptor).
    pub fn file(&self) -> &File {
        &self.file
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // Still locked while it goes, so no collection reads it as a dead hold's half.
        let _ = fs::remove_file(&self.path);
    }
}

impl Store {
    /// `uses/`, and its exclusive `flock` (held while the returned file is), under which uses
    /// are written and removed.
    ///
    /// # Errors
    /// The folder cannot be opened or locked.
    fn uses_locked(&self) -> StoreResult<(PathBuf, File)> {
        let dir = self.root.join("uses");
        let lock = File::open(&dir).map_err(io_err("open", &dir))?;
        lock.lock().map_err(io_err("lock", &dir))?;
        Ok((dir, lock))
    }

    /// Records a use of `objects` named `name` (a commit's or header's digest), now:
    /// `uses/<name>` becomes the union of what it listed and `objects`, and its mtime now.
    /// Under the shared fence and an exclusive `flock` on `uses/`.
    ///
    /// # Errors
    /// The record cannot be read, written or touched.
    pub fn record_use<'a>(
        &self,
        name: &Sha256,
        objects: impl IntoIterator<Item = &'a ObjectRef>,
    ) -> StoreResult<()> {
        let _fence = self.fence()?;
        let (dir, _lock) = self.uses_locked()?;
        let path = dir.join(name.to_string());
        let old = read_digests(&path)?.unwrap_or_default();
        let mut new = old.clone();
        new.extend(objects.into_iter().map(|o| o.sha256));
        if new == old && path.exists() {
            return touch(&path);
        }
        let text: String = new.iter().map(|d| format!("{d}\n")).collect();
        super::objects::replace_record(&self.root.join("tmp"), &path, text.as_bytes())
    }

    /// Drops the uses named `names` (what `rm` unreferences: a commit no repo names any more
    /// and its header), under the shared fence and the `uses/` lock; returns how many there were.
    ///
    /// # Errors
    /// Removing a record fails.
    pub fn drop_uses(&self, names: &[Sha256]) -> StoreResult<usize> {
        let _fence = self.fence()?;
        let (dir, _lock) = self.uses_locked()?;
        let mut dropped = 0;
        for name in names {
            let path = dir.join(name.to_string());
            match fs::remove_file(&path) {
                Ok(()) => dropped += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &path)(e)),
            }
        }
        Ok(dropped)
    }

    /// When the use named `name` was last used (its record's mtime), if it has one.
    pub fn last_use(&self, name: &Sha256) -> Option<SystemTime> {
        fs::metadata(self.root.join("uses").join(name.to_string()))
            .and_then(|m| m.modified())
            .ok()
    }

    /// Records a use of commit `commit`'s closure (named by the commit), reading its documents.
    ///
    /// # Errors
    /// The commit cannot be read, or the record written.
    pub fn record_commit_use(&self, commit: &ObjectRef) -> StoreResult<()> {
        let closure = self.commit(commit)?.closure();
        self.record_use(&commit.sha256, &closure)
    }

    /// Takes the collector's fence exclusively, without waiting: `None` while any writer or
    /// another collection holds it.
    fn fence_exclusive(&self) -> StoreResult<Option<Lock>> {
        let (path, file) = self.fence_file()?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Lock(file))),
            Err(fs::TryLockError::WouldBlock) => Ok(None),
            Err(fs::TryLockError::Error(e)) => Err(io_err("lock", &path)(e)),
        }
    }

    /// Runs a collection: puts back what a killed collection left in `tmp/gc/`, removes holds
    /// of dead processes and `files/` records of changed files, drops uses past `ttl` (and,
    /// with `keep_reserve`, the least recently used while the disk is short of [`reserve`]),
    /// then sweeps every object older than `grace` that no root or kept use names, `snapshots/`
    /// folders no use names, and stale temp files. With `dry_run` nothing is changed and the
    /// report says what would go. A collection another process is running (or a writer holding
    /// the fence) makes this one skip: [`Collected::skipped`].
    ///
    /// # Errors
    /// A record cannot be listed or read, a `local/` repo's commit cannot be read (its closure
    /// would be unknown; nothing is removed), or removing fails.
    pub fn collect(&self, options: &Collect) -> StoreResult<Collected> {
        let mut report = self.collect_fenced(options)?;
        if !options.dry_run && !report.removed.is_empty() {
            report.evicted = self.unname_evicted()?;
        }
        Ok(report)
    }

    /// Takes out of every repo outside `local/` the commits whose tree is gone (evicted
    /// cache), so listings do not show what cannot be read; a repo left naming nothing goes.
    /// `download` brings a commit back; a lazy mount shows it from its endpoint still. Runs
    /// after the sweep, without the exclusive fence (ref edits take it shared); a commit
    /// fetched again meanwhile is present, and stays.
    fn unname_evicted(&self) -> StoreResult<Vec<String>> {
        let mut evicted = Vec::new();
        for (name, repo) in self.ref_documents()? {
            if name.to_ascii_lowercase().starts_with("local/") {
                continue;
            }
            if repo.roots().all(|c| self.contains(c)) {
                continue;
            }
            let edited = self.edit_repo(&name, |repo| {
                let mut new = repo.clone();
                new.commits.retain(|c| self.contains(c));
                for release in &mut new.releases {
                    release.lanes.retain(|_, c| self.contains(c));
                }
                new.releases.retain(|r| !r.lanes.is_empty());
                let names_any = new.roots().next().is_some();
                Ok(names_any.then_some(new))
            })?;
            if let Some((old, new)) = edited {
                for c in old.roots() {
                    if new.as_ref().is_none_or(|n| !n.roots().any(|k| k == c)) {
                        evicted.push(format!("{name}@{}", c.id()));
                    }
                }
            }
        }
        evicted.sort();
        evicted.dedup();
        Ok(evicted)
    }

    fn collect_fenced(&self, options: &Collect) -> StoreResult<Collected> {
        let mut report = Collected::default();
        let Some(_fence) = self.fence_exclusive()? else {
            report.skipped = true;
            return Ok(report);
        };
        let cutoff = cutoff(options.now, options.grace);
        if !options.dry_run {
            report.restored = self.restore_swept()?;
        }
        let roots = self.roots(options.dry_run, true, &mut report)?;
        let mut uses = self.uses()?;
        let named: HashSet<Sha256> = uses
            .iter()
            .flat_map(|u| u.keeps.iter().chain(std::iter::once(&u.name)))
            .copied()
            .collect();
        // Held cache counts against a budget too: it cannot go now, but it is cache.
        let objects = self.objects_on_disk()?;
        let cache_bytes: u64 = objects
            .iter()
            .filter(|(o, _)| roots.is_cache(&o.sha256, |d| named.contains(d)))
            .map(|(o, _)| o.length)
            .sum();
        let Roots { all: roots, .. } = roots;
        // A use a root names counts as used now.
        for u in uses.iter_mut().filter(|u| roots.contains(&u.name)) {
            u.mtime = options.now;
            if !options.dry_run {
                touch(&u.path)?;
            }
        }
        let mut dropper = Dropper::new(&objects, &roots, &uses, cutoff);
        dropper.drop_uses(
            &mut uses,
            u64::MAX,
            options.now.checked_sub(options.ttl),
            &mut report,
        );
        if options.keep_reserve {
            if let Ok(capacity) = Capacity::of(&self.root) {
                // What a sweep frees comes off the shortfall.
                let need = shortfall(&capacity, options.incoming);
                if need > 0 {
                    report.reserve_short = need;
                    dropper.drop_uses(&mut uses, need, Some(options.now), &mut report);
                }
            }
        }
        if let Some(budget) = options.cache_budget {
            let need = (cache_bytes + options.incoming).saturating_sub(budget);
            if need > 0 {
                dropper.drop_uses(&mut uses, need, Some(options.now), &mut report);
            }
        }
        if !options.dry_run {
            for u in &report.dropped_uses {
                let path = self.root.join("uses").join(u.to_string());
                match fs::remove_file(&path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        return Err(io_err("remove", &path)(e))
                    }
                    _ => {}
                }
            }
        }
        let mut marked = roots;
        for u in &uses {
            marked.insert(u.name);
            marked.extend(u.keeps.iter().copied());
        }
        for (object, mtime) in &objects {
            if marked.contains(&object.sha256) {
                report.kept += 1;
                report.kept_bytes += object.length;
            } else if *mtime >= cutoff {
                report.young += 1;
                report.young_bytes += object.length;
            } else if options.dry_run {
                report.removed.push(*object);
                report.removed_bytes += object.length;
            } else {
                match self.sweep(object, &|mtime| mtime >= cutoff)? {
                    Swept::Removed => {
                        report.removed.push(*object);
                        report.removed_bytes += object.length;
                    }
                    Swept::Busy => report.busy += 1,
                    Swept::Young => {
                        report.young += 1;
                        report.young_bytes += object.length;
                    }
                }
            }
        }
        report.cache_bytes = cache_bytes - report.removed_bytes;
        report.snapshots_removed = self.sweep_snapshots(&marked, cutoff, options.dry_run)?;
        report.temps_removed = self.sweep_temps(cutoff, options.dry_run)?;
        if !options.dry_run {
            let _ = fs::remove_dir(self.root.join("tmp").join("gc"));
            let swept = self.root.join("uses").join(".swept");
            match File::create(&swept) {
                Ok(_) => {}
                // Only the reference's next write reads it (to collect again sooner).
                Err(e) if is_full(&e) => {
                    tracing::warn!("the disk is full: {} is not updated", swept.display())
                }
                Err(e) => return Err(io_err("create", &swept)(e)),
            }
        }
        Ok(report)
    }

    /// Puts every `tmp/gc/<digest>` back at its blob path; returns how many.
    fn restore_swept(&self) -> StoreResult<usize> {
        let trash = self.root.join("tmp").join("gc");
        let entries = match fs::read_dir(&trash) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_err("list", &trash)(e)),
        };
        let mut restored = 0;
        for entry in entries {
            let entry = entry.map_err(io_err("list", &trash))?;
            let Some(sha256) = digest_name(&entry.file_name()) else {
                continue;
            };
            let dest = self.object_path(&ObjectRef { sha256, length: 0 });
            let parent = dest.parent().expect("blob paths have parents");
            fs::create_dir_all(parent).map_err(io_err("create", parent))?;
            fs::rename(entry.path(), &dest).map_err(io_err("rename", &dest))?;
            restored += 1;
        }
        Ok(restored)
    }

    /// Every root digest; removes dead holds and stale `files/` records unless `dry_run`. With
    /// `own_holds` false, this process's holds (`holds/<pid>-*`) root nothing.
    fn roots(&self, dry_run: bool, own_holds: bool, report: &mut Collected) -> StoreResult<Roots> {
        let mut roots = Roots::default();
        let holds = self.root.join("holds");
        let own = format!("{}-", std::process::id());
        for entry in fs::read_dir(&holds).map_err(io_err("list", &holds))? {
            let entry = entry.map_err(io_err("list", &holds))?;
            let name = entry.file_name();
            if name == "gc.lock" || (!own_holds && name.to_string_lossy().starts_with(&own)) {
                continue;
            }
            let path = entry.path();
            let file = match File::open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("open", &path)(e)),
            };
            match file.try_lock() {
                // Its process is gone.
                Ok(()) => {
                    report.dead_holds += 1;
                    if !dry_run {
                        let _ = fs::remove_file(&path);
                    }
                }
                Err(fs::TryLockError::WouldBlock) => {
                    report.live_holds += 1;
                    roots.held.extend(read_digests(&path)?.unwrap_or_default());
                }
                Err(fs::TryLockError::Error(e)) => return Err(io_err("lock", &path)(e)),
            }
        }
        let files = self.root.join("files");
        for entry in fs::read_dir(&files).map_err(io_err("list", &files))? {
            let entry = entry.map_err(io_err("list", &files))?;
            let path = entry.path();
            match self.file_record(&path)? {
                FileRecord::Live(digests) => roots.durable.extend(digests),
                FileRecord::Stale => {
                    report.stale_records += 1;
                    if !dry_run {
                        let _ = fs::remove_file(&path);
                    }
                }
                FileRecord::Unknown => {}
            }
        }
        for (name, repo) in self.ref_documents()? {
            if !name.to_ascii_lowercase().starts_with("local/") {
                continue;
            }
            for commit in repo.roots() {
                let closure = self.commit(commit).map_err(|e| {
                    StoreError::Ref(format!(
                        "{name} names commit {} whose documents cannot be read ({e}): nothing \
                         was collected, since what it keeps is unknown; import it again, or \
                         remove it from the repo with `tensorfs rm {name}@{}`",
                        commit.id(),
                        commit.id()
                    ))
                })?;
                roots
                    .durable
                    .extend(closure.closure().iter().map(|o| o.sha256));
            }
        }
        roots.all = roots.durable.union(&roots.held).copied().collect();
        Ok(roots)
    }

    /// Every ref document by its name; unlike [`Store::repos`] a document that cannot be read
    /// is an error, since its commits may be roots.
    fn ref_documents(&self) -> StoreResult<Vec<(String, Repo)>> {
        let mut out = Vec::new();
        for path in self.ref_files()? {
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("read", &path)(e)),
            };
            let repo = Repo::from_json(&bytes).map_err(|source| StoreError::Format {
                path: path.clone(),
                source,
            })?;
            out.push((repo.name.clone(), repo));
        }
        Ok(out)
    }

    /// What a `files/` record keeps.
    fn file_record(&self, path: &Path) -> StoreResult<FileRecord> {
        #[derive(serde::Deserialize)]
        struct Record {
            path: PathBuf,
            header: RecordRef,
        }
        #[derive(serde::Deserialize)]
        struct RecordRef {
            sha256: String,
            length: u64,
        }
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(FileRecord::Unknown),
            Err(e) => return Err(io_err("read", path)(e)),
        };
        // A record of another shape is not ours to judge: left as it is.
        let Ok(record) = serde_json::from_slice::<Record>(&bytes) else {
            return Ok(FileRecord::Unknown);
        };
        let Ok(sha256) = record.header.sha256.parse::<Sha256>() else {
            return Ok(FileRecord::Unknown);
        };
        let header = ObjectRef {
            sha256,
            length: record.header.length,
        };
        let file = match File::open(&record.path) {
            Ok(file) => file,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                return Ok(FileRecord::Stale)
            }
            Err(_) => return Ok(FileRecord::Live(vec![sha256])),
        };
        let meta = file.metadata().map_err(io_err("stat", &record.path))?;
        if !meta.is_file() || meta.len() != header.length {
            return Ok(FileRecord::Stale);
        }
        match super::hash_file(&file) {
            Ok(found) if found == header => {}
            Ok(_) => return Ok(FileRecord::Stale),
            Err(_) => return Ok(FileRecord::Live(vec![sha256])),
        }
        let mut digests = vec![sha256];
        if let Ok(bytes) = fs::read(&record.path) {
            if let Ok(parsed) = Header::from_cbor(&bytes) {
                digests.extend(parsed.objects().map(|o| o.sha256));
            }
        }
        // A header inside `snapshots/<name>/` keeps that folder.
        if let Ok(rest) = record.path.strip_prefix(self.root.join("snapshots")) {
            if let Some(name) = rest.iter().next().and_then(digest_name) {
                digests.push(name);
            }
        }
        Ok(FileRecord::Live(digests))
    }

    /// Every use record.
    fn uses(&self) -> StoreResult<Vec<Use>> {
        let dir = self.root.join("uses");
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err("list", &dir))? {
            let entry = entry.map_err(io_err("list", &dir))?;
            let Some(name) = digest_name(&entry.file_name()) else {
                continue;
            };
            let path = entry.path();
            let mtime = match fs::metadata(&path).and_then(|m| m.modified()) {
                Ok(mtime) => mtime,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("stat", &path)(e)),
            };
            let Some(keeps) = read_digests(&path)? else {
                continue;
            };
            out.push(Use {
                name,
                path,
                mtime,
                keeps,
            });
        }
        Ok(out)
    }

    /// Every blob with its mtime.
    fn objects_on_disk(&self) -> StoreResult<Vec<(ObjectRef, SystemTime)>> {
        let mut out = Vec::new();
        for object in self.blobs()? {
            let path = self.object_path(&object);
            match fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_file() => {
                    let mtime = meta.modified().map_err(io_err("stat", &path))?;
                    out.push((object, mtime));
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("stat", &path)(e)),
            }
        }
        Ok(out)
    }

    /// Sweeps one object: unless a reader holds it, renamed into `tmp/gc/`, then removed
    /// unless its mtime says it is `young` (an import reused it meanwhile), which puts it back.
    fn sweep(&self, object: &ObjectRef, young: &dyn Fn(SystemTime) -> bool) -> StoreResult<Swept> {
        let path = self.object_path(object);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Swept::Young),
            Err(e) => return Err(io_err("open", &path)(e)),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Ok(Swept::Busy),
            Err(fs::TryLockError::Error(e)) => return Err(io_err("lock", &path)(e)),
        }
        // A full disk may have no room for `tmp/gc/` or its entry, and a collection is how it
        // gets some: checked and removed in place, still under the exclusive fence. Once one
        // object has gone, the next sweeps through `tmp/gc/` again.
        let in_place = || {
            let mtime = file
                .metadata()
                .and_then(|m| m.modified())
                .map_err(io_err("stat", &path))?;
            if young(mtime) {
                return Ok(Swept::Young);
            }
            fs::remove_file(&path).map_err(io_err("remove", &path))?;
            Ok(Swept::Removed)
        };
        let trash = self.root.join("tmp").join("gc");
        if let Err(e) = fs::create_dir_all(&trash) {
            if !is_full(&e) {
                return Err(io_err("create", &trash)(e));
            }
            return in_place();
        }
        let swept = trash.join(object.sha256.to_string());
        match fs::rename(&path, &swept) {
            Ok(()) => {}
            Err(e) if is_full(&e) => return in_place(),
            // Gone meanwhile: nothing to remove.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Swept::Young),
            Err(e) => return Err(io_err("rename", &path)(e)),
        }
        let mtime = fs::metadata(&swept)
            .and_then(|m| m.modified())
            .map_err(io_err("stat", &swept))?;
        if young(mtime) {
            fs::rename(&swept, &path).map_err(io_err("rename", &path))?;
            return Ok(Swept::Young);
        }
        fs::remove_file(&swept).map_err(io_err("remove", &swept))?;
        Ok(Swept::Removed)
    }

    /// Removes `snapshots/<digest>/` folders nothing marks, older than `cutoff`.
    fn sweep_snapshots(
        &self,
        marked: &HashSet<Sha256>,
        cutoff: SystemTime,
        dry_run: bool,
    ) -> StoreResult<usize> {
        let dir = self.root.join("snapshots");
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_err("list", &dir)(e)),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(io_err("list", &dir))?;
            let Some(name) = digest_name(&entry.file_name()) else {
                continue;
            };
            let path = entry.path();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.is_dir()
                || marked.contains(&name)
                || meta.modified().is_ok_and(|m| m >= cutoff)
            {
                continue;
            }
            removed += 1;
            if !dry_run {
                fs::remove_dir_all(&path).map_err(io_err("remove", &path))?;
            }
        }
        Ok(removed)
    }

    /// Removes regular files directly in `tmp/` older than `cutoff` whose lock is free and
    /// whose writer is gone.
    fn sweep_temps(&self, cutoff: SystemTime, dry_run: bool) -> StoreResult<usize> {
        let dir = self.root.join("tmp");
        let mut removed = 0;
        for entry in fs::read_dir(&dir).map_err(io_err("list", &dir))? {
            let entry = entry.map_err(io_err("list", &dir))?;
            let path = entry.path();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.is_file() || meta.modified().is_ok_and(|m| m >= cutoff) {
                continue;
            }
            // A running import's staged objects (unlocked, told live by its writer's lock).
            let name = entry.file_name();
            if super::objects::writer_alive(&dir, &name.to_string_lossy()) {
                continue;
            }
            let Ok(file) = File::open(&path) else {
                continue;
            };
            if file.try_lock().is_err() {
                continue;
            }
            removed += 1;
            if !dry_run {
                let _ = fs::remove_file(&path);
            }
        }
        Ok(removed)
    }
}

/// Settings of [`Store::collect`].
#[derive(Clone, Debug)]
pub struct Collect {
    /// Objects younger than this (by mtime) are kept: [`GRACE`] by default.
    pub grace: Duration,
    /// Uses unused this long are dropped: [`TTL`] by default.
    pub ttl: Duration,
    /// Drop the least recently used uses while the disk is short of [`reserve`].
    pub keep_reserve: bool,
    /// Bytes about to be written, which must fit above the reserve (and the budget) too.
    pub incoming: u64,
    /// The most bytes the cache (what no root keeps) may hold once `incoming` more are in:
    /// the least recently used uses are dropped until it would (`None`: no budget).
    pub cache_budget: Option<u64>,
    /// The time to judge ages by (tests set a later one).
    pub now: SystemTime,
    /// Change nothing; report what would go.
    pub dry_run: bool,
}

impl Default for Collect {
    fn default() -> Self {
        Collect {
            grace: GRACE,
            ttl: TTL,
            keep_reserve: true,
            incoming: 0,
            cache_budget: None,
            now: SystemTime::now(),
            dry_run: false,
        }
    }
}

/// What a collection did (or, dry, would do).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Collected {
    /// Another collection or a writer held the fence: nothing was done.
    pub skipped: bool,
    /// Objects put back from `tmp/gc/` (a killed collection's).
    pub restored: usize,
    /// Holds of live processes.
    pub live_holds: usize,
    /// Holds of processes that are gone, removed.
    pub dead_holds: usize,
    /// `files/` records whose file changed or went, removed.
    pub stale_records: usize,
    /// Uses dropped (past the TTL, or for the reserve).
    #[serde(serialize_with = "digests")]
    pub dropped_uses: Vec<Sha256>,
    /// Bytes the disk was short of its reserve before the sweep.
    pub reserve_short: u64,
    /// The cache's bytes (objects on disk no root keeps) after the sweep.
    pub cache_bytes: u64,
    /// Objects a root or use keeps, and their bytes.
    pub kept: usize,
    /// Bytes of `kept`.
    pub kept_bytes: u64,
    /// Unkept objects younger than the grace, and their bytes.
    pub young: usize,
    /// Bytes of `young`.
    pub young_bytes: u64,
    /// Unkept objects a reader holds open, left for a later collection.
    pub busy: usize,
    /// Objects removed.
    #[serde(serialize_with = "objects")]
    pub removed: Vec<ObjectRef>,
    /// Bytes of `removed`.
    pub removed_bytes: u64,
    /// `snapshots/` folders removed.
    pub snapshots_removed: usize,
    /// Stale temp files removed.
    pub temps_removed: usize,
    /// Commits of repos outside `local/` whose objects were evicted, taken out of their repos
    /// (`ORG/NAME@sha256:<hex>`).
    pub evicted: Vec<String>,
}

fn digests<S: serde::Serializer>(d: &[Sha256], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(d.iter().map(|d| d.to_string()))
}

fn objects<S: serde::Serializer>(o: &[ObjectRef], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(o.iter().map(|o| o.id()))
}

/// A use record.
struct Use {
    name: Sha256,
    path: PathBuf,
    mtime: SystemTime,
    keeps: BTreeSet<Sha256>,
}

enum FileRecord {
    /// The file still has the header: these digests are roots.
    Live(Vec<Sha256>),
    /// The file went or changed: the record goes.
    Stale,
    /// Not a record this collector can judge: kept, rooting nothing.
    Unknown,
}

enum Swept {
    Removed,
    Busy,
    Young,
}

/// What the roots keep, by kind.
#[derive(Default)]
struct Roots {
    /// Kept for good: `local/` closures and live `files/` records.
    durable: HashSet<Sha256>,
    /// Kept while a live process holds them.
    held: HashSet<Sha256>,
    /// Both.
    all: HashSet<Sha256>,
}

impl Roots {
    /// Whether `object` is cache: no durable root keeps it, and a hold keeps it only as part
    /// of what a use names (a cached model a mount has open), not as a write in flight (an
    /// import's objects before its commit is named). `named` tells whether a use names it.
    fn is_cache(&self, object: &Sha256, named: impl Fn(&Sha256) -> bool) -> bool {
        !self.durable.contains(object) && (!self.held.contains(object) || named(object))
    }
}

/// Drops uses as the reference does: least recently used first (then by name), counting what
/// a sweep would free, until that covers the need.
struct Dropper<'a> {
    size: HashMap<Sha256, u64>,
    old: HashSet<Sha256>,
    roots: &'a HashSet<Sha256>,
    /// How many kept uses name each digest.
    named: HashMap<Sha256, usize>,
    freeable: u64,
}

impl<'a> Dropper<'a> {
    fn new(
        objects: &[(ObjectRef, SystemTime)],
        roots: &'a HashSet<Sha256>,
        uses: &[Use],
        cutoff: SystemTime,
    ) -> Dropper<'a> {
        let size = objects.iter().map(|(o, _)| (o.sha256, o.length)).collect();
        let old = objects
            .iter()
            .filter(|(_, m)| *m < cutoff)
            .map(|(o, _)| o.sha256)
            .collect();
        let mut named: HashMap<Sha256, usize> = HashMap::new();
        for u in uses {
            for d in u.keeps.iter().chain(std::iter::once(&u.name)) {
                *named.entry(*d).or_default() += 1;
            }
        }
        let mut dropper = Dropper {
            size,
            old,
            roots,
            named,
            freeable: 0,
        };
        dropper.freeable = objects
            .iter()
            .filter(|(o, _)| dropper.sweepable(&o.sha256) && !dropper.named.contains_key(&o.sha256))
            .map(|(o, _)| o.length)
            .sum();
        dropper
    }

    fn sweepable(&self, d: &Sha256) -> bool {
        self.old.contains(d) && !self.roots.contains(d)
    }

    /// Drops uses last used at or before `older_than` (none when `None`) until `need` bytes
    /// would be freed.
    fn drop_uses(
        &mut self,
        uses: &mut Vec<Use>,
        need: u64,
        older_than: Option<SystemTime>,
        report: &mut Collected,
    ) {
        let Some(older_than) = older_than else {
            return;
        };
        uses.sort_by_key(|u| (u.mtime, u.name));
        let mut kept = Vec::with_capacity(uses.len());
        for u in uses.drain(..) {
            let candidate = u.mtime <= older_than && !self.roots.contains(&u.name);
            if !candidate || self.freeable >= need {
                kept.push(u);
                continue;
            }
            for d in u.keeps.iter().chain(std::iter::once(&u.name)) {
                let count = self.named.entry(*d).or_default();
                *count = count.saturating_sub(1);
                if *count == 0 && self.sweepable(d) {
                    self.freeable += self.size.get(d).copied().unwrap_or(0);
                }
            }
            report.dropped_uses.push(u.name);
        }
        *uses = kept;
    }
}

/// The digests a hold or use file lists (`None` when it is gone); lines that are no digest
/// are skipped.
fn read_digests(path: &Path) -> StoreResult<Option<BTreeSet<Sha256>>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(
            text.lines().filter_map(|l| l.trim().parse().ok()).collect(),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Ok(Some(BTreeSet::new())),
        Err(e) => Err(io_err("read", path)(e)),
    }
}

/// A file name that is a digest (64 lowercase hex digits).
fn digest_name(name: &std::ffi::OsStr) -> Option<Sha256> {
    name.to_str()?.parse().ok()
}

/// Whether `e` says the disk (or the user's quota) is full.
fn is_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// The mtime from which on an object is young: `now` less the grace.
fn cutoff(now: SystemTime, grace: Duration) -> SystemTime {
    now.checked_sub(grace).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Sets `path`'s mtime to now.
fn touch(path: &Path) -> StoreResult<()> {
    let file = File::open(path).map_err(io_err("open", path))?;
    file.set_modified(SystemTime::now())
        .map_err(io_err("touch", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(gib: u64, free_gib: u64) -> Capacity {
        Capacity {
            blocks: gib << 18,
            free_blocks: free_gib << 18,
            available_blocks: free_gib << 18,
            block_bytes: 4096,
        }
    }

    #[test]
    fn the_reserve_is_two_percent_of_the_disk_within_one_to_ten_gib() {
        assert_eq!(reserve(&disk(10, 5)), 1 << 30, "0.2 GiB is raised to 1 GiB");
        assert_eq!(reserve(&disk(100, 5)), 2 * (1 << 30));
        assert_eq!(
            reserve(&disk(2000, 5)),
            10 << 30,
            "40 GiB is capped at 10 GiB"
        );
        assert_eq!(shortfall(&disk(100, 5), 1 << 30), 0);
        assert_eq!(shortfall(&disk(100, 2), 1 << 30), 1 << 30);
    }

    fn digest(n: u8) -> Sha256 {
        Sha256([n; 32])
    }

    /// Uses are dropped least recently used first, then by name, until what a sweep would
    /// free covers the need; a use a root names, and objects shared with a kept use, free nothing.
    #[test]
    fn uses_are_dropped_least_recently_used_first_until_the_need_is_met() {
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let object = |n: u8, length: u64| {
            (
                ObjectRef {
                    sha256: digest(n),
                    length,
                },
                t(0),
            )
        };
        let objects = [
            object(1, 100),
            object(2, 200),
            object(3, 400),
            object(9, 50),
        ];
        let use_of = |name: u8, mtime: u64, keeps: &[u8]| Use {
            name: digest(name),
            path: PathBuf::new(),
            mtime: t(mtime),
            keeps: keeps.iter().map(|&k| digest(k)).collect(),
        };
        let roots: HashSet<Sha256> = [digest(30)].into();
        let mut uses = vec![
            use_of(20, 30, &[3]),
            use_of(10, 10, &[1, 9]),
            use_of(11, 10, &[2, 9]),
            use_of(30, 0, &[3]),
        ];
        let mut dropper = Dropper::new(&objects, &roots, &uses, t(1));
        assert_eq!(dropper.freeable, 0, "every object is named");
        let mut report = Collected::default();
        dropper.drop_uses(&mut uses, 150, Some(t(100)), &mut report);
        // 10 (the older name at t=10) frees object 1 (object 9 is still 11's): 100 < 150, so
        // 11 goes too, freeing 2 and 9: 350 ≥ 150. 20 and the root-named 30 stay.
        assert_eq!(report.dropped_uses, vec![digest(10), digest(11)]);
        assert_eq!(dropper.freeable, 350);
        let left: Vec<Sha256> = uses.iter().map(|u| u.name).collect();
        assert_eq!(
            left,
            vec![digest(30), digest(20)],
            "in the order of last use"
        );
        // Past the TTL everything goes but what a root names; object 3 stays named by 30.
        dropper.drop_uses(&mut uses, u64::MAX, Some(t(100)), &mut report);
        assert_eq!(report.dropped_uses.last(), Some(&digest(20)));
        assert_eq!(
            dropper.freeable, 350,
            "object 3 is still named by the root's use"
        );
    }
}
