//! Admission: the one door by which bytes become objects.
//!
//! An [`ObjectWriter`] streams into `tmp/tensorfs-<pid>-<n>` while hashing; `finish` flushes the
//! file, makes it read-only and renames it to its digest's path. Each process holds an exclusive
//! `flock` on `tmp/tensorfs-<pid>.lock` while it writes, so the next writer can tell the temp
//! files of a killed process from those of a live one and reap only the former.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::verified::Ledger;
use super::{io_err, Store, StoreError, StoreResult};
use crate::format::{Hasher, ObjectRef};
use crate::sync::lock;

/// Streams bytes into a new object. Dropping it unfinished removes its temp file.
#[derive(Debug)]
pub struct ObjectWriter {
    store: Store,
    temp: PathBuf,
    file: Option<File>,
    hasher: Hasher,
}

impl Store {
    /// A writer for a new object in this store.
    ///
    /// # Errors
    /// The temp file cannot be created.
    pub fn writer(&self) -> StoreResult<ObjectWriter> {
        let (temp, file) = self.temp_file()?;
        Ok(ObjectWriter {
            store: self.clone(),
            temp,
            file: Some(file),
            hasher: Hasher::new(),
        })
    }

    /// Admits `bytes` as an object (a no-op when it is already here whole).
    ///
    /// # Errors
    /// Writing, flushing or renaming fails.
    pub fn put_bytes(&self, bytes: &[u8]) -> StoreResult<ObjectRef> {
        let object = ObjectRef::of(bytes);
        if self.contains(&object) {
            return Ok(object);
        }
        let mut writer = self.writer()?;
        writer
            .write_all(bytes)
            .map_err(io_err("write", &writer.temp))?;
        writer.finish(Some(&object))
    }

    /// Every blob under `blobs/<aa>/<bb>/`, named by its file name (a SHA-256 in hex) and sized
    /// by its length as the file is now (not hashed). Files of other names are not blobs.
    ///
    /// # Errors
    /// A folder of `blobs/` cannot be listed.
    pub fn blobs(&self) -> StoreResult<Vec<ObjectRef>> {
        let mut out = Vec::new();
        let list = |dir: &Path| -> StoreResult<Vec<fs::DirEntry>> {
            fs::read_dir(dir)
                .and_then(|entries| entries.collect::<io::Result<Vec<_>>>())
                .map_err(io_err("list", dir))
        };
        for a in list(&self.root.join("blobs"))? {
            for b in list(&a.path())? {
                for entry in list(&b.path())? {
                    let Some(sha256) = entry
                        .file_name()
                        .to_str()
                        .and_then(|n| n.parse::<crate::format::Sha256>().ok())
                    else {
                        continue;
                    };
                    let meta = entry.metadata().map_err(io_err("stat", &entry.path()))?;
                    out.push(ObjectRef {
                        sha256,
                        length: meta.len(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Removes `object`'s blob if its bytes are not the object (`verify --repair`): it is hashed
    /// again, under the collector's fence, and removed only when the damaged file is still the
    /// one at its path (an import that meanwhile re-admitted a good copy keeps it). Anything
    /// but a regular file at a blob's path (a FIFO, a link, a device) is removed unread.
    /// Returns whether something was removed (not when the blob is absent or intact).
    ///
    /// # Errors
    /// The blob cannot be read, or removing it fails.
    pub fn remove_damaged(&self, object: &ObjectRef) -> StoreResult<bool> {
        use std::os::unix::fs::MetadataExt;
        let _fence = self.fence()?;
        let path = self.object_path(object);
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_err("stat", &path)(e)),
            Ok(meta) if !meta.is_file() => {
                fs::remove_file(&path).map_err(io_err("remove", &path))?;
                return Ok(true);
            }
            Ok(_) => {}
        }
        let file = match super::open_blob(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_err("open", &path)(e)),
        };
        let found = hash_file(&file).map_err(io_err("read", &path))?;
        if found == *object {
            return Ok(false);
        }
        let open = file.metadata().map_err(io_err("stat", &path))?;
        let now = fs::symlink_metadata(&path).map_err(io_err("stat", &path))?;
        if (open.dev(), open.ino()) != (now.dev(), now.ino()) {
            return Ok(false);
        }
        fs::remove_file(&path).map_err(io_err("remove", &path))?;
        Ok(true)
    }

    /// Flushes everything written to the store's filesystem (`syncfs`), so that directory
    /// entries of new objects are durable before a ref names them.
    ///
    /// # Errors
    /// The store cannot be opened or synced.
    pub fn sync(&self) -> StoreResult<()> {
        let dir = File::open(&self.root).map_err(io_err("open", &self.root))?;
        // SAFETY: syncfs takes a descriptor we own for the duration of the call.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } != 0 {
            return Err(io_err("syncfs", &self.root)(io::Error::last_os_error()));
        }
        Ok(())
    }

    fn temp_file(&self) -> StoreResult<(PathBuf, File)> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tmp = self.root.join("tmp");
        claim_tmp(&tmp)?;
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = tmp.join(format!("tensorfs-{}-{n}", std::process::id()));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    // Held while it is written, so no collection (ours or the reference's,
                    // which sweep temp files past their grace whose lock is free) takes it.
                    // Staged files keep no descriptor (an import stages thousands); ours are
                    // told live by their writer's lock ([`writer_alive`]).
                    file.lock_shared().map_err(io_err("lock", &path))?;
                    return Ok((path, file));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("create", &path)(e)),
            }
        }
    }
}

/// Whether temp file `name` (`tensorfs-<pid>-…`) belongs to a writer that is still running:
/// its `tensorfs-<pid>.lock` is locked.
pub(crate) fn writer_alive(tmp: &Path, name: &str) -> bool {
    let Some(pid) = name
        .strip_prefix("tensorfs-")
        .and_then(|rest| rest.split('-').next())
        .filter(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
    else {
        return false;
    };
    if pid == std::process::id().to_string() {
        return true;
    }
    File::open(tmp.join(format!("tensorfs-{pid}.lock"))).is_ok_and(|lock| lock.try_lock().is_err())
}

/// The name of this process's writer lock in a store's `tmp/`.
pub(crate) fn own_lock_name() -> String {
    format!("tensorfs-{}.lock", std::process::id())
}

/// The `tmp/` folders this process holds its writer lock on, with the lock's descriptor.
static CLAIMED: OnceLock<std::sync::Mutex<Vec<(PathBuf, File)>>> = OnceLock::new();

/// Takes this process's writer lock on `tmp` once, reaping temp files of writers that died.
/// Every temp file a process writes (objects and records alike) is made after this, so a
/// killed writer's files are told by their free lock and reaped by the next writer.
fn claim_tmp(tmp: &Path) -> StoreResult<()> {
    let claimed = CLAIMED.get_or_init(Default::default);
    let mut claimed = lock(claimed);
    let path = tmp.join(own_lock_name());
    // A store removed and made again at the same path (`Store::remove_if_unused`) lost its lock.
    claimed.retain(|(dir, _)| dir != tmp || path.exists());
    if claimed.iter().any(|(dir, _)| dir == tmp) {
        return Ok(());
    }
    reap(tmp)?;
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_err("create", &path))?;
    file.lock().map_err(io_err("lock", &path))?;
    claimed.push((tmp.to_path_buf(), file));
    Ok(())
}

/// Removes this process's writer locks from the stores it wrote to, where it left no temp
/// file (those stay told by the lock, for the next writer to reap): called as the process
/// ends, so a clean exit leaves no `tmp/tensorfs-<pid>.lock` behind. Writing again afterwards
/// takes the lock again.
pub fn release_writer_locks() {
    let Some(claimed) = CLAIMED.get() else {
        return;
    };
    let own = format!("tensorfs-{}-", std::process::id());
    lock(claimed).retain(|(tmp, _)| {
        let temps = fs::read_dir(tmp)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&own)));
        if temps {
            return true;
        }
        let _ = fs::remove_file(tmp.join(own_lock_name()));
        false
    });
}

/// Removes the temp files of writers whose lock is free (they exited or were killed).
fn reap(tmp: &Path) -> StoreResult<()> {
    let entries = match fs::read_dir(tmp) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("list", tmp)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err("list", tmp))?;
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("tensorfs-")?.strip_suffix(".lock"))
        else {
            continue;
        };
        if pid == std::process::id().to_string() {
            continue;
        }
        let Ok(lock) = File::open(entry.path()) else {
            continue;
        };
        if lock.try_lock().is_err() {
            continue;
        }
        let prefix = format!("tensorfs-{pid}-");
        for temp in fs::read_dir(tmp).map_err(io_err("list", tmp))?.flatten() {
            if temp
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix))
            {
                let _ = fs::remove_file(temp.path());
            }
        }
        let _ = fs::remove_file(entry.path());
    }
    Ok(())
}

impl ObjectWriter {
    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.hasher.len()
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes `n` zero bytes (padding between parts of a chunk).
    ///
    /// # Errors
    /// The write fails.
    pub fn write_zeros(&mut self, mut n: u64) -> io::Result<()> {
        const ZEROS: [u8; 4096] = [0; 4096];
        while n > 0 {
            let take = n.min(ZEROS.len() as u64) as usize;
            self.write_all(&ZEROS[..take])?;
            n -= take as u64;
        }
        Ok(())
    }

    /// Flushes, seals and names the object; with `expect`, refuses other bytes. An object
    /// already present whole is kept and the new copy dropped.
    ///
    /// # Errors
    /// The bytes differ from `expect`, or flushing, `chmod` or `rename` fails.
    pub fn finish(self, expect: Option<&ObjectRef>) -> StoreResult<ObjectRef> {
        let staged = self.finish_staged()?;
        if let Some(expect) = expect {
            if *expect != staged.object {
                return Err(StoreError::Mismatch {
                    expected: *expect,
                    found: format!(
                        "sha256 {} ({} bytes)",
                        staged.object.sha256, staged.object.length
                    ),
                    path: staged.temp.clone(),
                });
            }
        }
        staged.publish()
    }

    /// Flushes and seals the bytes without naming them yet: the object appears in the store
    /// only when [`Staged::publish`] runs, and dropping the [`Staged`] removes it. An import
    /// stages everything, then publishes, so a failed import leaves the store as it was.
    ///
    /// # Errors
    /// Flushing or `chmod` fails.
    pub fn finish_staged(mut self) -> StoreResult<Staged> {
        let file = self.file.take().expect("finish runs once");
        let object = std::mem::take(&mut self.hasher).finish();
        file.sync_all().map_err(io_err("fsync", &self.temp))?;
        file.set_permissions(fs::Permissions::from_mode(0o444))
            .map_err(io_err("chmod", &self.temp))?;
        Ok(Staged {
            store: self.store.clone(),
            temp: std::mem::take(&mut self.temp),
            object,
        })
    }
}

/// A sealed object not yet in the store (see [`ObjectWriter::finish_staged`]).
#[derive(Debug)]
pub struct Staged {
    store: Store,
    temp: PathBuf,
    object: ObjectRef,
}

impl Staged {
    /// The object the bytes make.
    pub fn object(&self) -> &ObjectRef {
        &self.object
    }

    /// Names the object in the store (keeping an identical copy already there) and notes it in
    /// the verification ledger.
    ///
    /// # Errors
    /// Creating the blob's folder or the rename fails.
    pub fn publish(mut self) -> StoreResult<ObjectRef> {
        let temp = std::mem::take(&mut self.temp);
        let object = self.object;
        if self.store.contains(&object) {
            let _ = fs::remove_file(&temp);
            return Ok(object);
        }
        let dest = self.store.object_path(&object);
        let parent = dest.parent().expect("blob paths have parents");
        fs::create_dir_all(parent).map_err(io_err("create", parent))?;
        if let Err(e) = fs::rename(&temp, &dest) {
            let _ = fs::remove_file(&temp);
            return Err(io_err("rename", &dest)(e));
        }
        if let Ok(meta) = fs::metadata(&dest) {
            // The ledger only saves a later re-hash; failing to note it loses nothing.
            let _ = Ledger::append(&self.store, &[(object, meta)]);
        }
        Ok(object)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

impl Write for ObjectWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.as_mut().expect("open until finish").write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file
            .as_mut()
            .expect("open until finish")
            .write_all(buf)?;
        self.hasher.update(buf);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.as_mut().expect("open until finish").flush()
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// Replaces `dest` with `bytes` atomically: a temp file in `tmp`, flushed, then renamed.
pub(crate) fn replace_file(tmp: &Path, dest: &Path, bytes: &[u8], mode: u32) -> StoreResult<()> {
    replace(tmp, dest, bytes, mode, true)
}

/// [`replace_file`] without the flush, for records whose loss a crash may cost (a use's
/// last-use time), written where a flush per write would slow readers (a mount's opens).
pub(crate) fn replace_record(tmp: &Path, dest: &Path, bytes: &[u8]) -> StoreResult<()> {
    replace(tmp, dest, bytes, 0o644, false)
}

fn replace(tmp: &Path, dest: &Path, bytes: &[u8], mode: u32, flush: bool) -> StoreResult<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    claim_tmp(tmp)?;
    let temp = tmp.join(format!("tensorfs-{}-record-{n}", std::process::id()));
    let result = (|| {
        let mut file = File::create(&temp).map_err(io_err("create", &temp))?;
        file.write_all(bytes).map_err(io_err("write", &temp))?;
        if flush {
            file.sync_all().map_err(io_err("fsync", &temp))?;
        }
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io_err("chmod", &temp))?;
        fs::rename(&temp, dest).map_err(io_err("rename", dest))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
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
