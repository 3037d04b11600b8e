//! The mounted namespace and its operations, as plain Rust: no `fuser` types here, so every
//! operation is tested without a kernel ([`crate::fuse`] only converts and replies).
//!
//! ```text
//! MOUNT/<org>/<name>/<revision>/<lane>/<files of the lane's LaneView>
//!       \___ refs/<org>/<name>.json ___/   \___ one commit, immutable ___/
//! ```
//!
//! Parts:
//! - [`catalog`]: the [`Catalog`] trait (repos, a commit's lane label, a commit's lane view) and
//!   [`StoreCatalog`], its implementation over a [`Store`](crate::store::Store).
//! - [`namespace`]: a snapshot of the refs, grouped by org; a revision (`latest`, a version, a
//!   commit's hex) resolves to lane folders through [`crate::revisions`].
//! - [`inodes`]: the inode table; numbers are stable for the mount's lifetime.
//! - [`lanes`]: lane views indexed as folders, cached per commit in a bounded LRU.
//! - `ops`: [`TensorFs`], the operations (lookup, getattr, readdir, open, read, xattrs, …);
//!   `resolve`: its refs snapshot, lane labels, lane views and rate-limited error logs.
//!
//! Data flow of a read: the kernel's `open` of a lane file becomes [`TensorFs::open`], which
//! takes the file's [`Content`](crate::layout::Content) from the commit's cached view into a
//! handle; each `read` is [`TensorFs::read`] → `Content::read_at` → the
//! [`ObjectSource`](crate::io::ObjectSource) (a verifying
//! [`BlobReader`](crate::io::BlobReader) in a mount) → `pread` on chunk blobs.
//!
//! Freshness: the upper levels follow the store's refs (re-read at most every
//! [`FsConfig::refs_check_interval`] when a signature of `refs/*/*.json` changes) and carry short
//! kernel TTLs; a lane folder's inode is tied to its commit, so everything inside it is immutable
//! and carries long TTLs.
//!
//! Non-goals: writing (every write gets `EROFS`), symlinks, hard-link counts.

pub mod catalog;
pub mod comfyui;
pub mod hub;
pub mod inodes;
pub mod lanes;
pub mod namespace;
mod ops;
mod resolve;
pub mod status;
#[cfg(test)]
mod tests;

use std::io;
use std::time::{Duration, SystemTime};

pub use catalog::{Capacity, Catalog, CommitLane, LaneContents, RepoEntry, StoreCatalog};
pub use ops::TensorFs;

use crate::extents::ioctl::IoctlError;
use crate::layout::LayoutError;
use crate::store::StoreError;

/// Inode number of the mount's root.
pub const ROOT_INO: u64 = 1;

pub use crate::revisions::{LATEST, NO_LANE as UNLABELLED_LANE};

/// The suffix of a lane's decoded view: `<lane>@decoded` beside `<lane>` in a revision folder,
/// for a commit with encoded tensors. `@` is in no label, so it never collides with a lane.
pub const DECODED_SUFFIX: &str = "@decoded";

/// The suffix of a single-file checkpoint's Diffusers face: `<lane>@diffusers` beside
/// `<lane>` (which shows the file itself).
pub const DIFFUSERS_SUFFIX: &str = "@diffusers";

/// The suffix of a Diffusers lane's single-file face: `<lane>@single` beside `<lane>`, for a
/// pipeline a converter of `fs-layout/single_file.json` writes as one file.
pub const SINGLE_SUFFIX: &str = "@single";

/// A lane folder's contents: a face of a commit (as imported, decoded, or a single file's
/// Diffusers folder).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct LaneRef {
    /// The commit.
    pub commit: crate::format::ObjectRef,
    /// Which face of it.
    pub face: crate::layout::Face,
}

pub use crate::layout::attrs::{COMMIT as XATTR_COMMIT, HEADER as XATTR_HEADER};

/// Settings of the namespace.
#[derive(Clone, Debug)]
pub struct FsConfig {
    /// Kernel entry and attribute TTL for the upper levels (root, org, repo, revision), which
    /// change when refs change. Default 1 s.
    pub upper_ttl: Duration,
    /// Kernel entry and attribute TTL inside lane folders, which never change. Default 1 h.
    pub lane_ttl: Duration,
    /// How often, at most, the refs are checked for changes. Default 1 s.
    pub refs_check_interval: Duration,
    /// Lane views kept built (one per commit). Default 256.
    pub max_cached_lanes: usize,
    /// `st_blksize` of every file and folder in bytes; readers (Python's `open`) size their
    /// buffers by it. Default 1 MiB.
    pub blksize_bytes: u32,
    /// Chunks fetched ahead of a reader going through a file in order: when a read starts
    /// where the handle's previous read ended (within [`SEQUENTIAL_SLACK_BYTES`]), the
    /// [`ObjectSource`](crate::io::ObjectSource) hears of the next this many distinct
    /// chunks of the file's plan. 0 turns it off. Default 2. Only a source that fetches from
    /// far away (the lazy mount) acts on it.
    pub prefetch_chunks: usize,
    /// Owner of every file and folder. Default: the process's effective uid.
    pub uid: u32,
    /// Group of every file and folder. Default: the process's effective gid.
    pub gid: u32,
    /// Views for FUSE passthrough ([`crate::views`]); `None` (the default): every read goes
    /// through the daemon.
    pub views: Option<crate::views::ViewConfig>,
}

impl Default for FsConfig {
    fn default() -> Self {
        // SAFETY: geteuid and getegid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        FsConfig {
            upper_ttl: Duration::from_secs(1),
            lane_ttl: Duration::from_secs(3600),
            refs_check_interval: Duration::from_secs(1),
            max_cached_lanes: 256,
            blksize_bytes: 1 << 20,
            prefetch_chunks: 2,
            uid,
            gid,
            views: None,
        }
    }
}

/// How far a read may start from where the handle's previous read ended and still count as
/// going through the file in order: the kernel sends a readahead window's requests together
/// and the worker threads take them in any order, so one window (the mount's default
/// `read_ahead_kb`, 16 MiB).
pub const SEQUENTIAL_SLACK_BYTES: u64 = 16 << 20;

/// Why a commit cannot be shown.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// Its tree or header is absent, damaged or malformed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Its lane view cannot be laid out.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Its tree or header could not be fetched from where the catalog fetches them (a lazy
    /// mount's endpoint).
    #[error(transparent)]
    Fetch(Box<dyn std::error::Error + Send + Sync>),
}

/// Why an operation failed. The errno is decided in one place, [`FsError::errno`].
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// No entry of that name.
    #[error("no entry {name:?} in inode {parent}")]
    NotFound {
        /// The folder looked in.
        parent: u64,
        /// The name looked up.
        name: String,
    },
    /// The inode number was never given out.
    #[error("unknown inode {0}")]
    UnknownInode(u64),
    /// A folder operation on a file.
    #[error("inode {0} is not a folder")]
    NotADirectory(u64),
    /// A file operation on a folder.
    #[error("inode {0} is a folder")]
    IsADirectory(u64),
    /// Any attempt to change the mount.
    #[error("the mount is read-only")]
    ReadOnly,
    /// A handle that is not open.
    #[error("handle {0} is not open")]
    BadHandle(u64),
    /// A handle a daemon before this one opened, which could not be opened again (see
    /// [`TensorFs::adopt`]).
    #[error("handle {0} was opened before the daemon restarted and cannot be opened again (its log says why)")]
    NotReopened(u64),
    /// The store's refs cannot be listed.
    #[error("reading the store's refs: {0}")]
    Refs(#[source] StoreError),
    /// A commit's tree, header or layout cannot be read.
    #[error("commit {commit}: {source}")]
    Commit {
        /// The commit's id (`sha256:<hex>`).
        commit: String,
        /// What failed.
        #[source]
        source: CommitError,
    },
    /// Reading a file's bytes failed (an absent or damaged blob).
    #[error("commit {commit}: reading {path}: {source}")]
    Read {
        /// The commit's id.
        commit: String,
        /// The file's path in the lane folder.
        path: String,
        /// The object source's error (`InvalidData` for a damaged blob).
        #[source]
        source: io::Error,
    },
    /// An extended attribute the inode does not have.
    #[error("no attribute {0:?}")]
    NoAttribute(String),
    /// The caller's buffer cannot hold the attribute value or list.
    #[error("{needed} bytes do not fit a {capacity}-byte buffer")]
    Range {
        /// Bytes of the value.
        needed: usize,
        /// Bytes offered.
        capacity: usize,
    },
    /// An ioctl command that is not one of the extents commands (Python's `open` sends
    /// `TCGETS` to every file).
    #[error("ioctl {0:#x} is not supported")]
    NoIoctl(u32),
    /// An extents query refused (`docs/extents.md`); its errno is [`IoctlError::errno`].
    #[error(transparent)]
    Extents(#[from] IoctlError),
    /// An operation the mount does not implement; the kernel then falls back to its own
    /// (`lseek` with `SEEK_DATA`, `poll`).
    #[error("{0} is not implemented")]
    Unsupported(&'static str),
}

/// Result of the `fs` layer.
pub type FsResult<T> = Result<T, FsError>;

impl FsError {
    /// Whether the local store is at fault (an absent or damaged blob, a broken document), so
    /// the log names the repair; a failure to fetch from an endpoint names its own cause.
    pub fn is_local_damage(&self) -> bool {
        match self {
            FsError::Read { source, .. } => matches!(
                source.kind(),
                io::ErrorKind::InvalidData | io::ErrorKind::NotFound | io::ErrorKind::UnexpectedEof
            ),
            FsError::Commit { source, .. } => !matches!(source, CommitError::Fetch(_)),
            _ => false,
        }
    }

    /// Whether the failure is an object missing from the store (nothing to repair).
    pub fn is_missing_object(&self) -> bool {
        matches!(self, FsError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// The errno the kernel is answered with.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound { .. } | FsError::UnknownInode(_) => libc::ENOENT,
            FsError::NotADirectory(_) => libc::ENOTDIR,
            FsError::IsADirectory(_) => libc::EISDIR,
            FsError::ReadOnly => libc::EROFS,
            FsError::BadHandle(_) => libc::EBADF,
            FsError::Refs(_)
            | FsError::Commit { .. }
            | FsError::Read { .. }
            | FsError::NotReopened(_) => libc::EIO,
            FsError::NoAttribute(_) => libc::ENODATA,
            FsError::Range { .. } => libc::ERANGE,
            FsError::NoIoctl(_) => libc::ENOTTY,
            FsError::Extents(e) => e.errno(),
            FsError::Unsupported(_) => libc::ENOSYS,
        }
    }
}

/// Whether an inode is a folder or a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A folder (mode 0555).
    Directory,
    /// A regular read-only file (mode 0444).
    File,
}

/// The attributes of an inode, as `stat` shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Folder or file.
    pub kind: Kind,
    /// Size in bytes (0 for folders).
    pub size: u64,
    /// Permission bits (0o555 or 0o444).
    pub perm: u16,
    /// Link count (2 for folders, 1 for files).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification (and change, access) time.
    pub mtime: SystemTime,
    /// Preferred I/O size in bytes.
    pub blksize: u32,
}

/// A looked-up inode with how long the kernel may cache the entry and its attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its attributes.
    pub attr: Attr,
    /// Entry and attribute TTL.
    pub ttl: Duration,
}

/// One entry of a folder listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode number.
    pub ino: u64,
    /// Offset of the entry after this one (what a later `readdir` passes to continue).
    pub next_offset: u64,
    /// Folder or file.
    pub kind: Kind,
    /// Its name (`.` and `..` included).
    pub name: String,
}

/// What `open` answers.
#[derive(Debug)]
pub struct Opened {
    /// The handle later reads and the release pass.
    pub fh: u64,
    /// Keep the page cache between opens (lane files never change).
    pub keep_cache: bool,
    /// A local file holding exactly the file's bytes, for the kernel to read in its place
    /// (FUSE passthrough): the blob of a one-object file or a built view. Only with
    /// [`FsConfig::views`].
    pub backing: Option<std::fs::File>,
}

/// What an xattr query answers: the size when probed with size 0, else the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XattrReply {
    /// The value's (or list's) size in bytes.
    Size(u32),
    /// The value (or the NUL-separated names).
    Data(Vec<u8>),
}

/// Totals `statfs` reports: the sizes of the store's filesystem, so `df` on the mount shows
/// how much room the store has left for imports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsStats {
    /// Blocks of `fragment_size` bytes on the store's filesystem.
    pub blocks: u64,
    /// Free blocks on the store's filesystem.
    pub free_blocks: u64,
    /// Free blocks unprivileged users may use.
    pub available_blocks: u64,
    /// Inodes given out so far.
    pub files: u64,
    /// Preferred I/O size in bytes.
    pub block_size: u32,
    /// Unit of `blocks` in bytes.
    pub fragment_size: u32,
    /// Longest name in bytes.
    pub name_max: u32,
}
