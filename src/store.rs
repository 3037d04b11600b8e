//! The store: a directory in the `tensorfs.store/3` layout that the reference `tfs` also reads
//! and writes.
//!
//! ```text
//! <root>/format                      {"format":"tensorfs.store/3"}
//! <root>/blobs/<aa>/<bb>/<sha256>    objects (spec §1), read-only once admitted
//! <root>/refs/<org>/<name>.json      cozytensors.repo/1 documents (spec §7)
//! <root>/holds/ files/ uses/         the reference's retention records (holds/gc.lock fences GC)
//! <root>/tmp/                        objects being written, never named until whole
//! <root>/verified                    this implementation's ledger of blobs proven intact
//! <root>/hub/<org>/<name>.json       this implementation's hub identities of local repos
//! <root>/views/<digest>              this implementation's views: copies of mounted files
//!                                    (crate::views), dropped first when the disk is short
//! ```
//!
//! - One door admits objects (`objects`): bytes stream into `tmp/`, are hashed, flushed
//!   (`fsync`), made read-only and renamed to their digest's path. A torn write never has a
//!   name; a killed writer leaves only `tmp/` files, which the next writer reaps.
//! - Refs change under an exclusive `flock` on `refs/` and a shared one on `holds/gc.lock`, as
//!   the reference's writers and collector expect (`refs`); a `local/` ref roots its commits'
//!   closures against the reference's GC.
//! - [`retention`] is the reference's retention regime: holds, uses and the collector that
//!   sweeps what nothing keeps.
//! - [`hub`] records which Hugging Face repo and revision a local repo's commits came from,
//!   outside the repo documents (the reference rewrites those, dropping unknown fields).
//! - [`verified`] records which blobs were hashed and their inode stamps, so a mount can prove a
//!   blob unchanged since its verification instead of hashing it again.

pub mod hub;
mod objects;
mod refs;
pub mod retention;
pub mod verified;

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

pub use objects::{hash_file, release_writer_locks, ObjectWriter, Staged};
pub use refs::{ref_key, Lock};

use crate::format::{FormatError, Header, ObjectRef, Tree};

/// The store format this implementation reads and writes (the `format` record).
pub const STORE_FORMAT: &str = "tensorfs.store/3";

/// The folders of a store.
const LAYOUT: [&str; 6] = ["blobs", "refs", "holds", "files", "uses", "tmp"];

/// What this implementation keeps in a store beside the reference's layout: the verification
/// ledger and the hub records.
const OURS: [&str; 2] = ["verified", "hub"];

/// The file that marks a folder as views' (`<root>/views/` or a mount's `--view-dir`), so
/// nothing else is ever removed from it.
pub const VIEWS_MARKER: &str = ".tensorfs-views";

/// Documents (trees, headers, repos) larger than this are refused before reading.
pub const MAX_DOCUMENT_BYTES: u64 = 256 << 20;

/// Why a store operation failed; every variant names the path or object involved.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A filesystem call failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done (`open`, `rename`, …).
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The directory is not a store this implementation can use.
    #[error("{}: {why}", path.display())]
    NotAStore {
        /// The store root or its format record.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// Writing would leave the store's disk with less free space than its reserve
    /// ([`retention::reserve`]), even after evicting what only uses kept.
    #[error(
        "no space: {} more in {} would leave less than the reserve of {} free ({} is free); \
         remove models (`tensorfs rm`, then `tensorfs gc`) or free space on that disk",
        indicatif::BinaryBytes(*needed),
        path.display(),
        indicatif::BinaryBytes(*reserve),
        indicatif::BinaryBytes(*available)
    )]
    NoSpace {
        /// The bytes to write.
        needed: u64,
        /// The disk's reserve.
        reserve: u64,
        /// The bytes free to unprivileged users now.
        available: u64,
        /// The store.
        path: PathBuf,
    },
    /// An object the operation needs is not in the store.
    #[error("object {object} is not in the store at {}", path.display())]
    Absent {
        /// The missing object.
        object: ObjectRef,
        /// Where it should be.
        path: PathBuf,
    },
    /// A blob's bytes are not the object its name promises.
    #[error("{}: expected {expected}, found {found}; run `tensorfs verify --repair` to remove it, then import or download the model again", path.display())]
    Mismatch {
        /// The object the path names.
        expected: ObjectRef,
        /// What is there (`… bytes`, or the digest found).
        found: String,
        /// The blob.
        path: PathBuf,
    },
    /// A document in the store breaks the format.
    #[error("{}: {source}", path.display())]
    Format {
        /// The document's path.
        path: PathBuf,
        /// The rule broken.
        #[source]
        source: FormatError,
    },
    /// A repo name or ref the store cannot take.
    #[error("{0}")]
    Ref(String),
}

/// Result of store operations.
pub type StoreResult<T> = Result<T, StoreError>;

/// A closure for `map_err` that wraps an `io::Error` with the operation and path.
pub(crate) fn io_err(
    op: &'static str,
    path: impl AsRef<Path>,
) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.as_ref().to_path_buf();
    move |source| StoreError::Io { op, path, source }
}

/// A store on disk. Cheap to clone; every handle works on the same directory.
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
}

/// A commit read from the store: its tree, its header's object and bytes, and the decoded
/// header. Both documents were verified against their object refs when read.
#[derive(Clone, Debug)]
pub struct Commit {
    /// The commit's id (the tree's object ref).
    pub id: ObjectRef,
    /// The tree.
    pub tree: Tree,
    /// The header's object ref.
    pub header_ref: ObjectRef,
    /// The decoded header.
    pub header: Header,
}

/// The store a command uses when none is named: `$TENSORFS_HOME` when set and not empty, else
/// `$HOME/.cache/tensorfs`; `None` when neither variable is set. The command line's `--store`,
/// and the Python package's `store=`, override it.
pub fn default_root() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TENSORFS_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME").filter(|d| !d.is_empty())?;
    Some(PathBuf::from(home).join(".cache").join("tensorfs"))
}

impl Store {
    /// Opens the store at `root`, creating it when `root` is absent or empty.
    ///
    /// # Errors
    /// `root` holds something that is not a store, or a store of another format.
    pub fn open(root: impl Into<PathBuf>) -> StoreResult<Store> {
        let root = root.into();
        not_a_folder(&root)?;
        fs::create_dir_all(&root).map_err(io_err("create", &root))?;
        let root = fs::canonicalize(&root).map_err(io_err("resolve", &root))?;
        let record = root.join("format");
        match fs::read(&record) {
            Ok(bytes) => {
                check_format(&record, &bytes)?;
                create_layout(&root)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                for entry in fs::read_dir(&root).map_err(io_err("list", &root))? {
                    let name = entry.map_err(io_err("list", &root))?.file_name();
                    let name = name.to_string_lossy();
                    if !LAYOUT.contains(&&*name) && !OURS.contains(&&*name) {
                        return Err(StoreError::NotAStore {
                            path: root.clone(),
                            why: format!("is neither empty nor a store (it holds {name:?})"),
                        });
                    }
                }
                // The folders first, the record last: a store is one once its record is there.
                create_layout(&root)?;
                let text = format!("{{\"format\":\"{STORE_FORMAT}\"}}");
                objects::replace_file(&root.join("tmp"), &record, text.as_bytes(), 0o644)?;
            }
            Err(e) => return Err(io_err("read", &record)(e)),
        }
        Ok(Store { root })
    }

    /// Opens an existing store without creating anything.
    ///
    /// # Errors
    /// `root` has no format record, or one of another format.
    pub fn open_existing(root: impl Into<PathBuf>) -> StoreResult<Store> {
        let root = root.into();
        not_a_folder(&root)?;
        if fs::symlink_metadata(&root).is_err_and(|e| e.kind() == io::ErrorKind::NotFound) {
            return Err(StoreError::NotAStore {
                path: root,
                why: "is not a store: the folder does not exist".into(),
            });
        }
        let record = root.join("format");
        let bytes = fs::read(&record).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => StoreError::NotAStore {
                path: root.clone(),
                why: format!("is not a store ({}: {e})", record.display()),
            },
            // A record that cannot be read now (out of descriptors, no permission) says
            // nothing of what the folder is: the OS error, with its errno.
            _ => io_err("read", &record)(e),
        })?;
        check_format(&record, &bytes)?;
        let root = fs::canonicalize(&root).map_err(io_err("resolve", &root))?;
        Ok(Store { root })
    }

    /// Removes the store when it holds nothing but its empty layout and format record (what
    /// [`Store::open`] made of an absent or empty folder): a command that created the store and
    /// then failed leaves no store behind. The collector's fence (`holds/gc.lock`, made by
    /// the first write) counts as nothing while it is empty and no process holds it. A store
    /// holding any other file (a blob, a ref, an object another process is staging, the ledger)
    /// is kept. Returns whether it was removed.
    ///
    /// # Errors
    /// The store cannot be listed or removed.
    pub fn remove_if_unused(self) -> StoreResult<bool> {
        // No content: this process's own writer lock (taken to write the format record), and
        // the collector's fence while empty and unlocked (nobody writes or collects).
        let own_lock = objects::own_lock_name();
        let no_content = |path: &Path| {
            let name = path.file_name().unwrap_or_default();
            if name == &*own_lock {
                return true;
            }
            name == "gc.lock"
                && File::open(path)
                    .is_ok_and(|f| f.metadata().is_ok_and(|m| m.len() == 0) && f.try_lock().is_ok())
        };
        fn holds_files(dir: &Path, no_content: &dyn Fn(&Path) -> bool) -> StoreResult<bool> {
            for entry in fs::read_dir(dir).map_err(io_err("list", dir))? {
                let entry = entry.map_err(io_err("list", dir))?;
                let kind = entry.file_type().map_err(io_err("stat", &entry.path()))?;
                if kind.is_file() && no_content(&entry.path()) {
                    continue;
                }
                if !kind.is_dir() || holds_files(&entry.path(), no_content)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        for entry in fs::read_dir(&self.root).map_err(io_err("list", &self.root))? {
            let entry = entry.map_err(io_err("list", &self.root))?;
            let name = entry.file_name();
            let layout = LAYOUT.contains(&&*name.to_string_lossy());
            let kind = entry.file_type().map_err(io_err("stat", &entry.path()))?;
            let empty_layout = layout && kind.is_dir() && !holds_files(&entry.path(), &no_content)?;
            if !(empty_layout || name == "format") {
                return Ok(false);
            }
        }
        fs::remove_dir_all(&self.root).map_err(io_err("remove", &self.root))?;
        Ok(true)
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where `object` lives: `<root>/blobs/<aa>/<bb>/<sha256>`.
    pub fn object_path(&self, object: &ObjectRef) -> PathBuf {
        self.root.join(object.blob_path())
    }

    /// Whether `object` is present with its full length (its bytes are not re-hashed).
    pub fn contains(&self, object: &ObjectRef) -> bool {
        fs::metadata(self.object_path(object))
            .is_ok_and(|m| m.is_file() && m.len() == object.length)
    }

    /// Opens `object` to read, checking its length (spec §1: lengths are checked on every
    /// open). Holds a shared `flock` on the blob while the file is open, which the reference's
    /// collector honours.
    ///
    /// # Errors
    /// [`StoreError::Absent`], or [`StoreError::Mismatch`] when the length differs.
    pub fn open_object(&self, object: &ObjectRef) -> StoreResult<File> {
        let path = self.object_path(object);
        let file = match open_blob(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::Absent {
                    object: *object,
                    path,
                })
            }
            Err(e) => return Err(io_err("open", &path)(e)),
        };
        file.lock_shared().map_err(io_err("lock", &path))?;
        let length = file.metadata().map_err(io_err("stat", &path))?.len();
        if length != object.length {
            return Err(StoreError::Mismatch {
                expected: *object,
                found: format!("{length} bytes"),
                path,
            });
        }
        Ok(file)
    }

    /// Reads a whole object and verifies its SHA-256 (for documents: trees, headers, small
    /// files).
    ///
    /// # Errors
    /// Absent, too large (over [`MAX_DOCUMENT_BYTES`]), or not the bytes `object` names.
    pub fn read_verified(&self, object: &ObjectRef) -> StoreResult<Vec<u8>> {
        let path = self.object_path(object);
        if object.length > MAX_DOCUMENT_BYTES {
            return Err(StoreError::Format {
                path,
                source: FormatError::Invalid(format!(
                    "{} bytes is over the {MAX_DOCUMENT_BYTES}-byte document limit",
                    object.length
                )),
            });
        }
        let mut file = self.open_object(object)?;
        let mut bytes = Vec::with_capacity(object.length as usize);
        io::Read::read_to_end(&mut file, &mut bytes).map_err(io_err("read", &path))?;
        let found = ObjectRef::of(&bytes);
        if found != *object {
            return Err(StoreError::Mismatch {
                expected: *object,
                found: format!("sha256 {} ({} bytes)", found.sha256, found.length),
                path,
            });
        }
        Ok(bytes)
    }

    /// Reads the tree of commit `id`, verified and validated.
    ///
    /// # Errors
    /// The tree is absent, damaged or malformed.
    pub fn tree(&self, id: &ObjectRef) -> StoreResult<Tree> {
        let bytes = self.read_verified(id)?;
        Tree::from_json(&bytes).map_err(|source| StoreError::Format {
            path: self.object_path(id),
            source,
        })
    }

    /// Reads commit `id`: its tree and header, both verified and validated.
    ///
    /// # Errors
    /// Either document is absent, damaged or malformed.
    pub fn commit(&self, id: &ObjectRef) -> StoreResult<Commit> {
        let tree = self.tree(id)?;
        let header_ref = *tree.header().1;
        let header_bytes = self.read_verified(&header_ref)?;
        let header = Header::from_cbor(&header_bytes).map_err(|source| StoreError::Format {
            path: self.object_path(&header_ref),
            source,
        })?;
        Ok(Commit {
            id: *id,
            tree,
            header_ref,
            header,
        })
    }
}

impl Commit {
    /// The commit's closure (spec §7): the tree, its files (the header among them), and the
    /// header's chunks and assets.
    pub fn closure(&self) -> Vec<ObjectRef> {
        let mut out = vec![self.id];
        out.extend(self.tree.files.values().copied());
        out.extend(self.header.objects().copied());
        out
    }
}

/// Opens the blob file at `path` to read, refusing anything but a regular file: a FIFO put in
/// a blob's place would block the opener forever (a mount's request thread, `verify`), and a
/// link to a device (`/dev/zero`) would never end. The open does not wait (`O_NONBLOCK`),
/// and the flag is cleared before the descriptor is used: io_uring would answer `EAGAIN`
/// for reads of a non-blocking descriptor instead of waiting for the disk.
///
/// # Errors
/// The open fails, or the file is not a regular one (`InvalidData`, naming its kind).
pub fn open_blob(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the blob is {what}, not a regular file"),
        ));
    }
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own; no memory is passed.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(file)
}

/// Refuses a store path that is something other than a folder (a file, say), with the same
/// words for every verb.
fn not_a_folder(root: &Path) -> StoreResult<()> {
    match fs::metadata(root) {
        Ok(meta) if !meta.is_dir() => Err(StoreError::NotAStore {
            path: root.to_path_buf(),
            why: "is a file, not a store folder".into(),
        }),
        _ => Ok(()),
    }
}

/// Creates the store's folders that are missing.
fn create_layout(root: &Path) -> StoreResult<()> {
    for dir in LAYOUT {
        let path = root.join(dir);
        fs::create_dir_all(&path).map_err(io_err("create", &path))?;
    }
    Ok(())
}

fn check_format(record: &Path, bytes: &[u8]) -> StoreResult<()> {
    let found = serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| v.get("format")?.as_str().map(str::to_owned));
    match found {
        Some(format) if format == STORE_FORMAT => Ok(()),
        Some(format) => Err(StoreError::NotAStore {
            path: record.to_path_buf(),
            why: format!("is a {format} store; this build reads {STORE_FORMAT}"),
        }),
        None => Err(StoreError::NotAStore {
            path: record.to_path_buf(),
            why: format!(
                "is not a store format record: {:?}",
                String::from_utf8_lossy(bytes)
            ),
        }),
    }
}

/// The size of a filesystem (the one holding the store, or the mount's views), in blocks of
/// `block_bytes`, as `statvfs(2)` gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// All blocks.
    pub blocks: u64,
    /// Free blocks.
    pub free_blocks: u64,
    /// Free blocks unprivileged users may use.
    pub available_blocks: u64,
    /// Bytes per block.
    pub block_bytes: u32,
}

impl Capacity {
    /// The filesystem holding `path`.
    ///
    /// # Errors
    /// `statvfs` fails (the path is missing, or holds a NUL).
    pub fn of(path: &Path) -> io::Result<Capacity> {
        let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
        // SAFETY: statvfs writes into the zeroed struct we own; `path` is NUL-terminated.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Capacity {
            blocks: st.f_blocks,
            free_blocks: st.f_bfree,
            available_blocks: st.f_bavail,
            block_bytes: st.f_frsize as u32,
        })
    }

    /// The filesystem's size in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_bytes))
    }

    /// Bytes unprivileged users may still write.
    pub fn available_bytes(&self) -> u64 {
        self.available_blocks
            .saturating_mul(u64::from(self.block_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_store_gets_its_folders_and_record_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("s");
        Store::open(&root).unwrap();
        for name in LAYOUT {
            assert!(root.join(name).is_dir(), "{name}");
        }
        assert_eq!(
            fs::read_to_string(root.join("format")).unwrap(),
            r#"{"format":"tensorfs.store/3"}"#
        );
        Store::open(&root).unwrap();
        Store::open_existing(&root).unwrap();
    }

    /// The format record of a new store is written under this process's writer lock, so a
    /// process killed while writing it leaves a temp file the next writer reaps (it was left
    /// behind for good before).
    #[test]
    fn records_are_written_under_the_writer_lock() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("s");
        let store = Store::open(&root).unwrap();
        assert!(root.join("tmp").join(objects::own_lock_name()).is_file());
        // Only its own lock and empty folders: an unused store, removed whole.
        assert!(store.clone().remove_if_unused().unwrap());
        assert!(!root.exists());
        // Its fence made (a refused download's collection takes it): unused while free.
        let store = Store::open(&root).unwrap();
        let fence = store.fence().unwrap();
        assert!(root.join("holds/gc.lock").is_file());
        assert!(
            !store.clone().remove_if_unused().unwrap(),
            "kept while held"
        );
        drop(fence);
        assert!(store.remove_if_unused().unwrap(), "removed once free");
        // Made again at the same path, it is locked again.
        let store = Store::open(&root).unwrap();
        assert!(root.join("tmp").join(objects::own_lock_name()).is_file());
        store.put_bytes(b"held").unwrap();
        assert!(
            !store.remove_if_unused().unwrap(),
            "a store with a blob is kept"
        );
        assert!(root.join("format").is_file());
    }

    #[test]
    fn folders_that_are_not_stores_are_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("other");
        fs::create_dir(&other).unwrap();
        fs::write(other.join("notes.txt"), b"mine").unwrap();
        assert!(matches!(
            Store::open(&other),
            Err(StoreError::NotAStore { .. })
        ));
        assert_eq!(
            fs::read_dir(&other).unwrap().count(),
            1,
            "nothing was created"
        );
        let older = dir.path().join("older");
        fs::create_dir(&older).unwrap();
        fs::write(older.join("format"), br#"{"format":"tensorfs.store/2"}"#).unwrap();
        let err = Store::open(&older).unwrap_err();
        assert!(err.to_string().contains("tensorfs.store/2"), "{err}");
        assert!(Store::open_existing(dir.path().join("absent")).is_err());
    }

    /// A format record that cannot be read now (a process out of descriptors: EMFILE) is an
    /// I/O error with its errno, not "not a store": the folder may well be one.
    #[test]
    fn a_format_record_that_cannot_be_read_is_an_io_error_with_its_errno() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        Store::open(&root).unwrap();
        fs::remove_file(root.join("format")).unwrap();
        fs::create_dir(root.join("format")).unwrap();
        match Store::open_existing(&root) {
            Err(StoreError::Io { source, .. }) => {
                assert_eq!(source.raw_os_error(), Some(libc::EISDIR))
            }
            other => panic!("{other:?}"),
        }
        fs::remove_dir(root.join("format")).unwrap();
        assert!(matches!(
            Store::open_existing(&root),
            Err(StoreError::NotAStore { .. })
        ));
    }
}
