//! The FUSE adapter: [`FuseAdapter`] implements `fuser::Filesystem` by calling
//! [`crate::fs::TensorFs`], converting its answers to `fuser` types and replying. Nothing here
//! decides what the mount shows; errors become errnos through
//! [`FsError::errno`](crate::fs::FsError::errno) in one helper, `fail`.
//!
//! [`session`] mounts, serves, handles signals and unmounts.

mod mountinfo;
pub mod session;
pub mod supervise;
pub mod takeover;

use std::cell::RefCell;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use fuser::{
    AccessFlags, BackingId, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenAccMode,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};

pub use session::{mount, spawn, unmount, MountConfig, MountError, MountHandle};

use crate::fs::{Attr, FsError, Kind, TensorFs, XattrReply};
use crate::sync::lock;
use takeover::{Journal, Offer, Replay, RESENT};

/// Largest read request asked of the kernel (and the readahead window), in bytes.
pub const MAX_READ_BYTES: u32 = 1 << 20;

/// Serves a [`TensorFs`] to the kernel.
#[derive(Debug, Clone)]
pub struct FuseAdapter {
    fs: Arc<TensorFs>,
    passthrough: Arc<Passthrough>,
    /// What a daemon taking over this mount must know, when one may ([`takeover`]).
    journal: Option<Arc<Journal>>,
    /// The kernel's offer at `INIT`.
    pub(crate) offer: Arc<Mutex<Option<Offer>>>,
    /// Requests the kernel sent again after a takeover ([`takeover::resend`]).
    resent: Arc<AtomicU64>,
    /// The handles an earlier daemon opened (and journaled) by the `unique` of their `OPEN`:
    /// the kernel sends that `OPEN` again when the daemon died before answering it, and it
    /// is answered with the same handle, which would otherwise stay open for ever.
    reopened: Arc<Mutex<std::collections::HashMap<u64, u64>>>,
}

impl FuseAdapter {
    /// The adapter of `fs`.
    pub fn new(fs: Arc<TensorFs>) -> FuseAdapter {
        FuseAdapter {
            fs,
            passthrough: Arc::default(),
            journal: None,
            offer: Arc::default(),
            resent: Arc::default(),
            reopened: Arc::default(),
        }
    }

    /// The adapter of `fs` for a mount a later daemon may take over: it writes what the
    /// kernel is told to `journal`, and starts from what an earlier daemon's `replay` says
    /// the kernel holds: its inodes, and its open handles, opened again now (so their
    /// commits are held against collections again at once; see [`TensorFs::adopt`], after
    /// [`TensorFs::hand_out_from`]) with their passthrough backing files.
    ///
    /// # Errors
    /// The replayed inodes contradict each other.
    pub fn resuming(
        fs: Arc<TensorFs>,
        journal: Arc<Journal>,
        replay: Replay,
    ) -> Result<FuseAdapter, crate::fs::inodes::RestoreError> {
        fs.restore_inodes(replay.inodes)?;
        let adapter = FuseAdapter {
            journal: Some(journal),
            ..FuseAdapter::new(fs.clone())
        };
        for (fh, handle) in &replay.open {
            if fs.adopt(handle.ino, *fh) {
                lock(&adapter.reopened).insert(handle.unique, *fh);
            }
        }
        let mut inodes = lock(&adapter.passthrough.inodes);
        for handle in replay.open.values() {
            let mode = inodes.entry(handle.ino).or_insert(match handle.backing {
                Some(id) => IoMode::Inherited(0, id),
                None => IoMode::Cached(0),
            });
            match mode {
                IoMode::Cached(n) | IoMode::Passthrough(n, ..) | IoMode::Inherited(n, _) => *n += 1,
            }
        }
        drop(inodes);
        Ok(adapter)
    }

    /// How many requests the kernel sent again after this daemon took the mount over.
    pub fn resent(&self) -> Arc<AtomicU64> {
        self.resent.clone()
    }

    /// Tells the adapter the `/dev/fuse` descriptor it serves, on which it registers
    /// passthrough backing files (before serving starts).
    pub fn serve_on(&self, device: RawFd) {
        self.passthrough.device.store(device, Ordering::Relaxed);
    }

    /// Counts a request the kernel sent again ([`RESENT`] in its `unique`).
    fn seen(&self, req: &Request) {
        if req.unique().0 & RESENT != 0 {
            self.resent.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The choices made at `INIT` from the kernel's `config`, the same for every daemon of a mount
/// (a daemon taking over is shown the first one's [`Offer`]): large reads and readahead,
/// parallel lookups, and passthrough when `passthrough` asks and the kernel offers it. Returns
/// the offer and whether passthrough was agreed.
fn negotiate(config: &mut KernelConfig, passthrough: bool) -> (Offer, bool) {
    let abi = config.kernel_abi();
    let mut offer = Offer {
        major: abi.0,
        minor: abi.1,
        flags: config.capabilities().bits(),
        max_readahead: MAX_READ_BYTES,
    };
    // Large reads: `max_write` also sets `max_pages` (fuser derives it from the larger of
    // max_write and max_readahead), which caps every request, reads included. 1 MiB is the
    // kernel's default `max_pages_limit`. The kernel refuses readahead above what it
    // offered (128 KiB); the session raises the bdi's `read_ahead_kb` after mounting.
    let _ = config.set_max_write(MAX_READ_BYTES);
    if let Err(max) = config.set_max_readahead(MAX_READ_BYTES) {
        offer.max_readahead = max;
        let _ = config.set_max_readahead(max);
    }
    // Readahead requests are background requests: let enough be in flight to keep every
    // worker thread busy.
    let _ = config.set_max_background(64);
    // Lookups and listings in one folder may run in parallel: nothing here needs the
    // kernel to serialize them.
    if let Err(missing) = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS) {
        tracing::debug!("kernel lacks {missing:?}");
    }
    // Passthrough, only with views (they are what it reads): backing files on a local
    // filesystem, so one level of stacking.
    let agreed = passthrough
        && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        && config.set_max_stack_depth(1).is_ok();
    // Deliberately not requested: FUSE_AUTO_INVAL_DATA (files never change, so the page
    // cache never needs dropping on an mtime change), FUSE_WRITEBACK_CACHE (read-only),
    // and no file is opened with FOPEN_DIRECT_IO, which would break mmap (ENODEV) for
    // safetensors loaders unless FUSE_DIRECT_IO_ALLOW_MMAP is negotiated, and would
    // bypass the page cache that FOPEN_KEEP_CACHE shares between opens.
    (offer, agreed)
}

/// The filesystem a supervisor mounts with ([`supervise`]): it answers `INIT` as a serving
/// daemon would and records the kernel's offer; it never serves a request (the supervisor
/// reads none).
#[derive(Debug)]
pub struct Handshake {
    /// Whether to ask for passthrough (views are on).
    pub passthrough: bool,
    /// The offer, once made.
    pub offer: Arc<Mutex<Option<Offer>>>,
}

impl Filesystem for Handshake {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let (offer, _) = negotiate(config, self.passthrough);
        *lock(&self.offer) = Some(offer);
        Ok(())
    }
}

/// FUSE passthrough bookkeeping (Linux 6.9+): the kernel refuses (`ETXTBSY`) to open an inode
/// for passthrough while it is open through the page cache, and the reverse, and wants every
/// passthrough open of an inode to name one backing file. So an inode's first open picks its
/// mode, later opens follow it while any is open, and the backing file is registered once and
/// unregistered after the last release.
#[derive(Debug, Default)]
struct Passthrough {
    /// Whether the kernel agreed to passthrough at `init`.
    enabled: std::sync::atomic::AtomicBool,
    /// Whether registering a backing file failed once (no CAP_SYS_ADMIN, a stacked filesystem):
    /// no inode enters passthrough after that, while those already in it stay.
    refused: std::sync::atomic::AtomicBool,
    /// The open inodes' modes.
    inodes: std::sync::Mutex<std::collections::HashMap<u64, IoMode>>,
    /// The `/dev/fuse` descriptor backing files are registered on (-1 until serving).
    device: AtomicI32,
}

/// How an inode's open handles read, and how many there are.
#[derive(Debug)]
enum IoMode {
    Cached(usize),
    /// Passed through to a backing file registered here: its owner, and its id.
    Passthrough(usize, BackingId, u32),
    /// Passed through to a backing file an earlier daemon of the mount registered (its id).
    Inherited(usize, u32),
}

impl IoMode {
    /// Takes a backing file an earlier daemon registered over: from now on a `BackingId`
    /// owns it (and unregisters it after the last release).
    fn own(&mut self, reply: &ReplyOpen) {
        if let IoMode::Inherited(n, raw) = *self {
            // SAFETY: the id is registered on this connection (an earlier daemon did it, and
            // the journal says a file of it is still open); the BackingId made is its owner.
            *self = IoMode::Passthrough(n, unsafe { reply.wrap_backing(raw) }, raw);
        }
    }
}

impl Passthrough {
    fn enabled(&self) -> bool {
        self.enabled.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn refused(&self) -> bool {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Answers the open of `ino` as handle `fh`, passing it through to `backing` when the
    /// inode's mode allows; `record` is told the backing file's id (if any) before the reply.
    fn reply(
        &self,
        ino: u64,
        fh: FileHandle,
        flags: FopenFlags,
        backing: Option<std::fs::File>,
        reply: ReplyOpen,
        record: impl FnOnce(Option<u32>),
    ) {
        let mut inodes = lock(&self.inodes);
        let mode = inodes.entry(ino).or_insert_with(|| {
            let id = backing.filter(|_| !self.refused()).and_then(|file| {
                let device = self.device.load(Ordering::Relaxed);
                // SAFETY: the session's descriptor stays open while it serves this request.
                let device = unsafe { BorrowedFd::borrow_raw(device) };
                BackingId::create_raw(device, &file)
                    // SAFETY: the id was just registered on this connection; the BackingId
                    // made of it is its one owner.
                    .map(|id| (unsafe { reply.wrap_backing(id) }, id))
                    .map_err(|e| {
                        // Refused once (no CAP_SYS_ADMIN, a stacked filesystem under the
                        // store or the views: ELOOP), refused always: say so once.
                        tracing::warn!(
                            "the kernel refuses passthrough ({e}); files are served by the \
                                 daemon from now on (views need a local filesystem and root)"
                        );
                        self.refused
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                    })
                    .ok()
            });
            match id {
                Some((id, raw)) => IoMode::Passthrough(0, id, raw),
                None => IoMode::Cached(0),
            }
        });
        mode.own(&reply);
        match mode {
            IoMode::Cached(n) => {
                *n += 1;
                drop(inodes);
                record(None);
                reply.opened(fh, flags);
            }
            IoMode::Passthrough(n, id, raw) => {
                *n += 1;
                record(Some(*raw));
                // The kernel fails (EIO) a passthrough open with flags beyond its short list
                // (FOPEN_PASSTHROUGH_MASK), FOPEN_KEEP_CACHE among them; it has no use here.
                let flags = flags - FopenFlags::FOPEN_KEEP_CACHE;
                reply.opened_passthrough(fh, flags, id);
            }
            IoMode::Inherited(..) => unreachable!("made a Passthrough above"),
        }
    }

    /// Answers an `OPEN` the kernel sent again with handle `fh`, which the daemon before this
    /// one opened for it and this one opened again (so the inode's mode counts it already).
    fn reply_again(&self, ino: u64, fh: u64, keep_cache: bool, reply: ReplyOpen) {
        let flags = open_flags(keep_cache);
        let mut inodes = lock(&self.inodes);
        if let Some(mode) = inodes.get_mut(&ino) {
            mode.own(&reply);
        }
        match inodes.get(&ino) {
            Some(IoMode::Passthrough(_, id, _)) => {
                let flags = flags - FopenFlags::FOPEN_KEEP_CACHE;
                reply.opened_passthrough(FileHandle(fh), flags, id);
            }
            _ => {
                drop(inodes);
                reply.opened(FileHandle(fh), flags);
            }
        }
    }

    /// Notes the release of one handle of `ino`; the last one unregisters its backing file.
    fn release(&self, ino: u64) {
        let mut inodes = lock(&self.inodes);
        let last = match inodes.get_mut(&ino) {
            Some(IoMode::Cached(n) | IoMode::Passthrough(n, ..) | IoMode::Inherited(n, _)) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
            None => false,
        };
        if last {
            if let Some(IoMode::Inherited(_, id)) = inodes.remove(&ino) {
                let device = self.device.load(Ordering::Relaxed);
                if let Err(e) = takeover::close_backing(device, id) {
                    tracing::debug!("closing backing file {id}: {e}");
                }
            }
        }
    }
}

/// How a file opens: never flushed, and its page cache kept between opens when `keep_cache`.
fn open_flags(keep_cache: bool) -> FopenFlags {
    // Nothing is ever dirty, so a close needs no FLUSH round trip; and one would wait for a
    // free worker: a forked child's exec closing the descriptors it inherited hung while every
    // worker waited on a fetch, which waited on the store's fence that the child's copy of a
    // descriptor held (FOPEN_NOFLUSH, Linux 5.17; older kernels ignore it).
    let mut flags = FopenFlags::FOPEN_NOFLUSH;
    if keep_cache {
        flags |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    flags
}

/// A reply that can carry an errno; every `fuser` reply can.
trait ErrorReply {
    fn error(self, errno: Errno);
}

macro_rules! error_reply {
    ($($reply:ty),* $(,)?) => {
        $(impl ErrorReply for $reply {
            fn error(self, errno: Errno) {
                <$reply>::error(self, errno)
            }
        })*
    };
}

error_reply!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyEmpty,
    ReplyEntry,
    ReplyIoctl,
    ReplyLseek,
    ReplyOpen,
    ReplyPoll,
    ReplyStatfs,
    ReplyWrite,
    ReplyXattr,
);

/// Answers `reply` with `err`'s errno. Failures worth an operator's attention (EIO) were logged
/// once by the `fs` layer, inside the request's span (warn level, so on in the default log:
/// the line carries the operation, the request id and the inode); the rest (ENOENT from
/// probing lookups, ENOTTY, ERANGE) are routine.
fn fail(reply: impl ErrorReply, op: &'static str, err: FsError) {
    tracing::debug!(op, errno = err.errno(), "{err}");
    reply.error(Errno::from_i32(err.errno()));
}

/// Answers a write attempt; the mount is read-only.
fn read_only(reply: impl ErrorReply, op: &'static str) {
    fail(reply, op, FsError::ReadOnly);
}

/// Answers an operation the mount leaves to the kernel (ENOSYS, which the kernel remembers),
/// without `fuser`'s "not implemented" warning.
fn unsupported(reply: impl ErrorReply, op: &'static str) {
    fail(reply, op, FsError::Unsupported(op));
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.size.div_ceil(512),
        atime: attr.mtime,
        mtime: attr.mtime,
        ctime: attr.mtime,
        crtime: attr.mtime,
        kind: file_type(attr.kind),
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: 0,
        blksize: attr.blksize,
        flags: 0,
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::Directory => FileType::Directory,
        Kind::File => FileType::RegularFile,
    }
}

/// Names the kernel passes are bytes; the namespace holds only UTF-8 names.
fn utf8(name: &OsStr) -> Option<&str> {
    name.to_str()
}

thread_local! {
    /// Each worker's read buffer, reused so a 1 MiB read allocates nothing.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let (offer, agreed) = negotiate(config, self.fs.config().views.is_some());
        self.fs.set_protocol(offer.major, offer.minor);
        *lock(&self.offer) = Some(offer);
        if agreed {
            self.passthrough.enabled.store(true, Ordering::Relaxed);
        } else if self.fs.config().views.is_some() {
            tracing::warn!("the kernel offers no FUSE passthrough (Linux 6.9+): views unused");
            self.fs.stop_views();
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _span =
            tracing::warn_span!("lookup", req = req.unique().0, parent = parent.0, ?name).entered();
        let Some(name) = utf8(name) else {
            return fail(
                reply,
                "lookup",
                FsError::NotFound {
                    parent: parent.0,
                    name: name.to_string_lossy().into_owned(),
                },
            );
        };
        self.seen(req);
        match self.fs.lookup(parent.0, name) {
            Ok(entry) => {
                if let Some(journal) = &self.journal {
                    journal.keep_inodes(&self.fs, entry.attr.ino);
                }
                reply.entry(&entry.ttl, &file_attr(&entry.attr), Generation(0))
            }
            Err(err) => fail(reply, "lookup", err),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _span = tracing::warn_span!("getattr", req = req.unique().0, ino = ino.0).entered();
        match self.fs.getattr(ino.0) {
            Ok(entry) => reply.attr(&entry.ttl, &file_attr(&entry.attr)),
            Err(err) => fail(reply, "getattr", err),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _span = tracing::warn_span!("open", req = req.unique().0, ino = ino.0).entered();
        self.seen(req);
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0;
        let unique = req.unique().0;
        if unique & RESENT != 0 {
            let again = lock(&self.reopened).remove(&(unique & !RESENT));
            if let Some(fh) = again {
                let keep_cache = self.fs.keeps_cache(fh);
                return self.passthrough.reply_again(ino.0, fh, keep_cache, reply);
            }
        }
        match self.fs.open(ino.0, write) {
            Ok(opened) => {
                let fopen = open_flags(opened.keep_cache);
                let fh = FileHandle(opened.fh);
                // Before the reply: a daemon taking over opens the handle again at once.
                let record = |backing| {
                    if let Some(journal) = &self.journal {
                        journal.opened(&self.fs, opened.fh, ino.0, backing, unique);
                    }
                };
                if self.passthrough.enabled() {
                    self.passthrough
                        .reply(ino.0, fh, fopen, opened.backing, reply, record);
                    if self.passthrough.refused() {
                        self.fs.stop_views();
                    }
                } else {
                    record(None);
                    reply.opened(fh, fopen)
                }
            }
            Err(err) => fail(reply, "open", err),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _span =
            tracing::warn_span!("read", req = req.unique().0, ino = ino.0, offset, size).entered();
        self.seen(req);
        READ_BUF.with_borrow_mut(|buf| {
            let size = size as usize;
            if buf.len() < size {
                buf.resize(size, 0);
            }
            // A handle an earlier daemon of the mount opened is opened again here first.
            self.fs.adopt(ino.0, fh.0);
            match self.fs.read(fh.0, offset, &mut buf[..size]) {
                Ok(n) => {
                    reply.data(&buf[..n]);
                    self.fs.served(fh.0, offset, &buf[..n]);
                }
                Err(err) => fail(reply, "read", err),
            }
        })
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Journaled before a last release unregisters the inode's backing file: a daemon
        // taking over must never take an id the kernel has let go of (and may give to
        // another file) for the backing file of a handle still open. A RELEASE sent again
        // after a takeover, which the daemon before had journaled, was counted out already.
        let open = self
            .journal
            .as_ref()
            .is_none_or(|journal| journal.released(&self.fs, fh.0));
        if self.passthrough.enabled() && open {
            self.passthrough.release(ino.0);
        }
        self.fs.release(fh.0);
        reply.ok();
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _span = tracing::warn_span!("opendir", req = req.unique().0, ino = ino.0).entered();
        match self.fs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(err) => fail(reply, "opendir", err),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _span =
            tracing::warn_span!("readdir", req = req.unique().0, ino = ino.0, offset).entered();
        let result = self.fs.readdir(ino.0, fh.0, offset, |e| {
            reply.add(INodeNo(e.ino), e.next_offset, file_type(e.kind), &e.name)
        });
        match result {
            Ok(()) => reply.ok(),
            Err(err) => fail(reply, "readdir", err),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.release(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks,
            s.free_blocks,
            s.available_blocks,
            s.files,
            0,
            s.block_size,
            s.name_max,
            s.fragment_size,
        );
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _span =
            tracing::warn_span!("getxattr", req = req.unique().0, ino = ino.0, ?name).entered();
        let Some(name) = utf8(name) else {
            return fail(
                reply,
                "getxattr",
                FsError::NoAttribute(name.to_string_lossy().into_owned()),
            );
        };
        match self.fs.getxattr(ino.0, name, size) {
            Ok(XattrReply::Size(n)) => reply.size(n),
            Ok(XattrReply::Data(bytes)) => reply.data(&bytes),
            Err(err) => fail(reply, "getxattr", err),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _span = tracing::warn_span!("listxattr", req = req.unique().0, ino = ino.0).entered();
        match self.fs.listxattr(ino.0, size) {
            Ok(XattrReply::Size(n)) => reply.size(n),
            Ok(XattrReply::Data(bytes)) => reply.data(&bytes),
            Err(err) => fail(reply, "listxattr", err),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _span = tracing::warn_span!("ioctl", req = req.unique().0, ino = ino.0, cmd).entered();
        self.seen(req);
        self.fs.adopt(ino.0, fh.0);
        match self.fs.ioctl(fh.0, cmd, in_data, out_size) {
            Ok(out) => reply.ioctl(0, &out),
            Err(err) => fail(reply, "ioctl", err),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        match self.fs.access(ino.0, mask.bits()) {
            Ok(()) => reply.ok(),
            Err(err) => fail(reply, "access", err),
        }
    }

    // Nothing is ever dirty: flushing and syncing succeed at once.

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        unsupported(reply, "lseek");
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: fuser::PollNotifier,
        _events: fuser::PollEvents,
        _flags: fuser::PollFlags,
        reply: ReplyPoll,
    ) {
        unsupported(reply, "poll");
    }

    // Every write gets EROFS (the `ro` mount flag stops most before they reach us).

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        read_only(reply, "setattr");
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        read_only(reply, "mknod");
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        read_only(reply, "mkdir");
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        read_only(reply, "unlink");
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        read_only(reply, "rmdir");
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        read_only(reply, "symlink");
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        read_only(reply, "rename");
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        read_only(reply, "link");
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        read_only(reply, "write");
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        read_only(reply, "create");
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        read_only(reply, "setxattr");
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        read_only(reply, "removexattr");
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        read_only(reply, "fallocate");
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        read_only(reply, "copy_file_range");
    }
}
