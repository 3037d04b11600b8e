//! What a daemon needs to take over a live mount from one that died: the kernel's `INIT`
//! offer ([`Offer`]), so the new daemon makes the same choices without a handshake the kernel
//! will never send again; the resend notification ([`resend`]), so requests the dead daemon
//! had read but not answered are answered; and the [`Journal`] of what the kernel was told
//! (inode numbers, and with passthrough the handles and their backing files), kept in a
//! memory file the supervisor holds across daemons; and what a supervisor hands the daemon it
//! starts ([`Handoff`]), which a daemon's session starts from ([`session_on`]).
//!
//! The kernel keeps a connection, and every request on it, while any descriptor of its
//! `/dev/fuse` file is open (fs/fuse/dev.c: `fuse_dev_release` ends a device's requests with
//! `ECONNABORTED` only when its last descriptor closes). So a daemon that may be taken over
//! reads only from the descriptor the supervisor holds too, never from clones of its own.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use fuser::Session;

use super::FuseAdapter;

use crate::fs::inodes::Inode;
use crate::fs::TensorFs;
use crate::sync::lock;

/// What the kernel offered at `INIT`: the protocol version, its capability flags (the 64 bits
/// of `flags` and `flags2`, `FUSE_INIT_EXT` left out) and the readahead it allows, in bytes.
/// A daemon taking over answers an `INIT` made from this, so it negotiates as the first did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    /// The protocol's major version (7).
    pub major: u32,
    /// Its minor version (45 on Linux 6.18).
    pub minor: u32,
    /// The capabilities offered (`FUSE_*` init flags).
    pub flags: u64,
    /// The largest readahead allowed, in bytes.
    pub max_readahead: u32,
}

/// `FUSE_INIT`'s opcode (include/uapi/linux/fuse.h).
const FUSE_INIT: u32 = 26;
/// The init flag saying `flags2` holds the upper 32 flags.
const FUSE_INIT_EXT: u64 = 1 << 30;
/// `FUSE_NOTIFY_RESEND`'s code, protocol 7.40 (Linux 6.9).
const FUSE_NOTIFY_RESEND: i32 = 7;
/// The init flag by which the kernel says it takes [`FUSE_NOTIFY_RESEND`] (Linux 6.9).
const FUSE_HAS_RESEND: u64 = 1 << 39;
/// The bit the kernel sets in the `unique` of a resent request.
pub const RESENT: u64 = 1 << 63;

impl Offer {
    /// The offer as one environment value: `MAJOR.MINOR:FLAGS:MAX_READAHEAD`, flags in hex.
    pub fn to_env(&self) -> String {
        format!(
            "{}.{}:{:x}:{}",
            self.major, self.minor, self.flags, self.max_readahead
        )
    }

    /// Parses [`Offer::to_env`]'s form.
    pub fn from_env(value: &str) -> Option<Offer> {
        let mut fields = value.split(':');
        let (major, minor) = fields.next()?.split_once('.')?;
        let offer = Offer {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
            flags: u64::from_str_radix(fields.next()?, 16).ok()?,
            max_readahead: fields.next()?.parse().ok()?,
        };
        fields.next().is_none().then_some(offer)
    }

    /// The `FUSE_INIT` request the kernel sent with this offer: `fuse_in_header` (40 bytes)
    /// then `fuse_init_in` (64 bytes), native byte order.
    pub fn init_request(&self) -> Vec<u8> {
        let mut request = Vec::with_capacity(104);
        let mut put = |v: &[u8]| request.extend_from_slice(v);
        put(&104u32.to_ne_bytes()); // len
        put(&FUSE_INIT.to_ne_bytes()); // opcode
        put(&1u64.to_ne_bytes()); // unique
        put(&0u64.to_ne_bytes()); // nodeid
                                  // SAFETY: geteuid/getegid cannot fail and touch no memory.
        put(&unsafe { libc::geteuid() }.to_ne_bytes());
        put(&unsafe { libc::getegid() }.to_ne_bytes());
        put(&std::process::id().to_ne_bytes());
        put(&0u32.to_ne_bytes()); // total_extlen, padding
        put(&self.major.to_ne_bytes());
        put(&self.minor.to_ne_bytes());
        put(&self.max_readahead.to_ne_bytes());
        let flags = self.flags | FUSE_INIT_EXT;
        put(&(flags as u32).to_ne_bytes());
        put(&((flags >> 32) as u32).to_ne_bytes());
        put(&[0; 44]); // unused
        request
    }

    /// Whether the kernel resends unanswered requests when asked ([`resend`]).
    pub fn can_resend(&self) -> bool {
        self.flags & FUSE_HAS_RESEND != 0
    }
}

/// Asks the kernel to send again every request a daemon read from `device` and did not
/// answer (`FUSE_NOTIFY_RESEND`; they come back with [`RESENT`] set in their `unique`).
///
/// # Errors
/// The kernel refuses the notification (before Linux 6.9: `EINVAL`), or the write fails.
pub fn resend(device: RawFd) -> io::Result<()> {
    // fuse_out_header: len, error (the notification's code), unique (0: a notification).
    let mut header = [0u8; 16];
    header[..4].copy_from_slice(&16u32.to_ne_bytes());
    header[4..8].copy_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    // SAFETY: `header` is readable for its length; `device` is the caller's open descriptor.
    let n = unsafe { libc::write(device, header.as_ptr().cast(), header.len()) };
    match n {
        16 => Ok(()),
        -1 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::other("a short write of the resend notification")),
    }
}

/// Unregisters passthrough backing file `id` of the connection `device` belongs to
/// (`FUSE_DEV_IOC_BACKING_CLOSE`, `_IOW(229, 2, uint32_t)`): one a daemon before this one
/// registered, whose last open is released now.
pub fn close_backing(device: RawFd, id: u32) -> io::Result<()> {
    const FUSE_DEV_IOC_BACKING_CLOSE: libc::c_ulong = 0x4004_e502;
    // SAFETY: the ioctl reads one u32 from a pointer that lives across the call.
    match unsafe { libc::ioctl(device, FUSE_DEV_IOC_BACKING_CLOSE, &id as *const u32) } {
        -1 => Err(io::Error::last_os_error()),
        _ => Ok(()),
    }
}

/// A connected pair of `AF_UNIX` sequenced-packet sockets (one message a read), close-on-exec.
///
/// # Errors
/// `socketpair` fails.
pub fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into `fds`.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The room for one descriptor in a message's control data, in bytes.
fn one_fd_space() -> usize {
    // SAFETY: CMSG_SPACE only computes a size.
    unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize }
}

/// A message header over one buffer `data` and the control buffer `control`, which both
/// must outlive its use (it points at them).
fn message(iov: &mut libc::iovec, control: &mut [u8]) -> libc::msghdr {
    // SAFETY: a zeroed msghdr is valid; the pointers set below are the caller's to keep.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() as _;
    msg
}

/// Sends descriptor `fd` over the `AF_UNIX` socket `socket` (`SCM_RIGHTS`), with `tag` (8
/// bytes, native order) as the message. The receiver's copy shares `fd`'s open file
/// description, and so its `flock`s, even once this process has gone; a message not yet
/// received keeps it too.
///
/// # Errors
/// `sendmsg` fails.
pub fn send_fd(socket: RawFd, fd: RawFd, tag: u64) -> io::Result<()> {
    let mut data = tag.to_ne_bytes();
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut control = vec![0u8; one_fd_space()];
    let msg = message(&mut iov, &mut control);
    // SAFETY: the control buffer holds one cmsghdr and one descriptor (CMSG_SPACE).
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    }
    // SAFETY: `msg` and what it points to are valid for the call.
    match unsafe { libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL) } {
        -1 => Err(io::Error::last_os_error()),
        _ => Ok(()),
    }
}

/// Receives one message of [`send_fd`] from `socket`, waiting for it: the tag and the
/// descriptor (close-on-exec). `None` once the socket's other end is closed.
///
/// # Errors
/// `recvmsg` fails, or a message carries no descriptor.
pub fn recv_fd(socket: RawFd) -> io::Result<Option<(u64, OwnedFd)>> {
    let mut data = [0u8; 8];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut control = vec![0u8; one_fd_space()];
    let mut msg = message(&mut iov, &mut control);
    // SAFETY: `msg` and what it points to are valid for the call.
    let n = unsafe { libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    match n {
        -1 => return Err(io::Error::last_os_error()),
        0 => return Ok(None),
        _ => {}
    }
    // SAFETY: the kernel filled the control buffer; CMSG_FIRSTHDR checks its length.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: `cmsg` is checked for null before it is read.
    let fd = unsafe {
        (!cmsg.is_null()
            && (*cmsg).cmsg_level == libc::SOL_SOCKET
            && (*cmsg).cmsg_type == libc::SCM_RIGHTS)
            .then(|| std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>()))
    };
    let fd = fd.ok_or_else(|| io::Error::other("a message without a descriptor"))?;
    // SAFETY: SCM_RIGHTS gave this process a new descriptor, owned by nothing else.
    Ok(Some((u64::from_ne_bytes(data), unsafe {
        OwnedFd::from_raw_fd(fd)
    })))
}

/// One journal record, CBOR-encoded after its length (u32, little-endian).
#[derive(serde::Serialize)]
enum Record<'a> {
    /// An inode given to the kernel.
    Inode(&'a Inode),
    /// A file handle opened: its inode, its backing file's id when the kernel reads the file
    /// through it (passthrough), and the `unique` of the request that opened it (which a
    /// resent request carries again).
    Open {
        fh: u64,
        ino: u64,
        backing: Option<u32>,
        unique: u64,
    },
    /// A handle released.
    Release { fh: u64 },
}

/// [`Record`] as read back.
#[derive(serde::Deserialize)]
enum ReadRecord {
    Inode(Inode),
    Open {
        fh: u64,
        ino: u64,
        backing: Option<u32>,
        unique: u64,
    },
    Release {
        fh: u64,
    },
}

/// A handle the kernel holds, as the journal saw it opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenHandle {
    /// Its inode.
    pub ino: u64,
    /// Its passthrough backing file's id, when it has one.
    pub backing: Option<u32>,
    /// The `unique` of the `OPEN` that made it, without [`RESENT`].
    pub unique: u64,
}

/// What a journal held when a daemon took it over.
#[derive(Debug, Default)]
pub struct Replay {
    /// The inodes given out, in order.
    pub inodes: Vec<Inode>,
    /// The file handles open, by number.
    pub open: BTreeMap<u64, OpenHandle>,
}

/// Where the live records start: the journal's first 8 bytes (u64, little-endian).
const HEADER: u64 = 8;
/// Released handles' records are dropped (the live ones written again at the end) once they
/// pass this many bytes and twice the inodes' records.
const COMPACT_AFTER: u64 = 1 << 20;

#[derive(Debug)]
struct State {
    /// Where the next record goes.
    end: u64,
    /// The last inode written.
    kept: u64,
    /// Bytes of inode records since the live records' start.
    inode_bytes: u64,
    /// Bytes of open and release records since then.
    event_bytes: u64,
    /// The handles open, as recorded.
    open: BTreeMap<u64, OpenHandle>,
}

/// The journal of what the kernel was told that a daemon taking over must know: every inode
/// given out and every file handle opened (each written before the reply that gives it, a
/// handle with its passthrough backing file's id), and every handle released. Records follow an 8-byte header (the live records' offset),
/// each a length (u32, little-endian) and a CBOR [`Record`]; a record cut short by a crash
/// ends the journal. Replaying a record twice is harmless, so the handles still open are
/// written again at the end and the space before them punched out (`FALLOC_FL_PUNCH_HOLE`),
/// with no moment at which a crash loses them.
#[derive(Debug)]
pub struct Journal {
    file: File,
    state: Mutex<State>,
}

impl Journal {
    /// A new, empty journal in a memory file (`memfd_create`, close-on-exec: the supervisor
    /// passes it on by number).
    ///
    /// # Errors
    /// The memory file cannot be made or written.
    pub fn create() -> io::Result<Journal> {
        // SAFETY: the name is a NUL-terminated literal; the call returns a new descriptor.
        let fd = unsafe { libc::memfd_create(c"tensorfs-journal".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.write_all_at(&HEADER.to_le_bytes(), 0)?;
        Ok(Journal::at(file, HEADER, 0, BTreeMap::new()))
    }

    fn at(file: File, end: u64, kept: u64, open: BTreeMap<u64, OpenHandle>) -> Journal {
        Journal {
            file,
            state: Mutex::new(State {
                end,
                kept,
                inode_bytes: 0,
                event_bytes: 0,
                open,
            }),
        }
    }

    /// Opens the journal a daemon before this one wrote, and reads it back. A record cut
    /// short (the daemon died writing it) is dropped.
    ///
    /// # Errors
    /// The journal cannot be read or its header is damaged.
    pub fn resume(file: File) -> io::Result<(Journal, Replay)> {
        let size = file.metadata()?.len();
        let mut header = [0u8; 8];
        file.read_exact_at(&mut header, 0)?;
        let start = u64::from_le_bytes(header);
        if !(HEADER..=size).contains(&start) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the takeover journal's records start at {start}, past its {size} bytes"),
            ));
        }
        let mut bytes = vec![0; (size - start) as usize];
        file.read_exact_at(&mut bytes, start)?;
        let mut replay = Replay::default();
        let mut at = 0usize;
        while let Some(record) = next_record(&bytes, &mut at) {
            match record {
                ReadRecord::Inode(inode) => replay.inodes.push(inode),
                ReadRecord::Open {
                    fh,
                    ino,
                    backing,
                    unique,
                } => {
                    replay.open.insert(
                        fh,
                        OpenHandle {
                            ino,
                            backing,
                            unique,
                        },
                    );
                }
                ReadRecord::Release { fh } => {
                    replay.open.remove(&fh);
                }
            }
        }
        let end = start + at as u64;
        if end < size {
            tracing::warn!(
                "the takeover journal ends in {} bytes of a cut record; dropped",
                size - end
            );
            file.set_len(end)?;
        }
        let kept = replay.inodes.iter().map(|i| i.ino).max().unwrap_or(0);
        let journal = Journal::at(file, end, kept, replay.open.clone());
        Ok((journal, replay))
    }

    /// The memory file, for the supervisor to hand to the next daemon.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Writes every inode `fs` gave out up to `ino` not written yet, so the reply that gives
    /// `ino` to the kernel follows its record.
    pub fn keep_inodes(&self, fs: &TensorFs, ino: u64) {
        let mut state = lock(&self.state);
        if ino <= state.kept {
            return;
        }
        for inode in fs.inodes_after(state.kept) {
            if let Err(e) = self.append(&mut state, &Record::Inode(&inode)) {
                tracing::warn!(
                    "the takeover journal: {e}; a restart loses inode {}",
                    inode.ino
                );
                return;
            }
            state.kept = inode.ino;
        }
    }

    /// Records handle `fh` of inode `ino` opened, with its backing file's id if any, by the
    /// request `unique`.
    pub fn opened(&self, fs: &TensorFs, fh: u64, ino: u64, backing: Option<u32>, unique: u64) {
        let mut state = lock(&self.state);
        let unique = unique & !RESENT;
        let handle = OpenHandle {
            ino,
            backing,
            unique,
        };
        state.open.insert(fh, handle);
        let record = Record::Open {
            fh,
            ino,
            backing,
            unique,
        };
        self.event(&mut state, fs, &record);
    }

    /// Records handle `fh` released; returns whether it was open. A `RELEASE` the kernel sent
    /// again, which the daemon before had recorded, finds it closed already.
    pub fn released(&self, fs: &TensorFs, fh: u64) -> bool {
        let mut state = lock(&self.state);
        let open = state.open.remove(&fh).is_some();
        if open {
            self.event(&mut state, fs, &Record::Release { fh });
        }
        open
    }

    fn event(&self, state: &mut State, fs: &TensorFs, record: &Record) {
        let written = self.append(state, record).and_then(|n| {
            state.event_bytes += n;
            match state.event_bytes > COMPACT_AFTER.max(2 * state.inode_bytes) {
                true => self.compact(state, fs),
                false => Ok(()),
            }
        });
        if let Err(e) = written {
            tracing::warn!("the takeover journal: {e}; a restart may misjudge open files");
        }
    }

    /// Writes the live records again at the end, then moves the header to them and frees
    /// what lies before.
    fn compact(&self, state: &mut State, fs: &TensorFs) -> io::Result<()> {
        let start = state.end;
        state.inode_bytes = 0;
        state.event_bytes = 0;
        let kept = state.kept;
        for inode in fs.inodes_after(0).iter().filter(|i| i.ino <= kept) {
            let n = self.append(state, &Record::Inode(inode))?;
            state.inode_bytes += n;
        }
        let open: Vec<_> = state.open.iter().map(|(fh, h)| (*fh, *h)).collect();
        for (fh, h) in open {
            let record = Record::Open {
                fh,
                ino: h.ino,
                backing: h.backing,
                unique: h.unique,
            };
            state.event_bytes += self.append(state, &record)?;
        }
        self.file.write_all_at(&start.to_le_bytes(), 0)?;
        // SAFETY: fallocate on our own descriptor; it touches no memory of ours.
        let punched = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                HEADER as libc::off_t,
                (start - HEADER) as libc::off_t,
            )
        };
        if punched != 0 {
            tracing::debug!("the takeover journal: {}", io::Error::last_os_error());
        }
        Ok(())
    }

    /// Appends `record`; returns its size in bytes.
    fn append(&self, state: &mut State, record: &Record) -> io::Result<u64> {
        let mut bytes = vec![0; 4];
        ciborium::into_writer(record, &mut bytes).map_err(io::Error::other)?;
        let len = u32::try_from(bytes.len() - 4).map_err(io::Error::other)?;
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        self.file.write_all_at(&bytes, state.end)?;
        state.end += bytes.len() as u64;
        if matches!(record, Record::Inode(_)) {
            state.inode_bytes += bytes.len() as u64;
        }
        Ok(bytes.len() as u64)
    }
}

/// The record at `*at` in `bytes`, moving `*at` past it; `None` at the end or at a record cut
/// short or unreadable.
fn next_record(bytes: &[u8], at: &mut usize) -> Option<ReadRecord> {
    let len = bytes.get(*at..*at + 4)?;
    let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
    let body = bytes.get(*at + 4..*at + 4 + len)?;
    let record = ciborium::from_reader(body).ok()?;
    *at += 4 + len;
    Some(record)
}

/// Handles a daemon of generation `g` gives out start at [`first_handle`]`(g)`, above every
/// handle of the daemons before it: each may give out 2^40.
const HANDLE_BITS: u32 = 40;

/// The first handle daemon `generation` (from 1) of a mount gives out: `(generation - 1) <<
/// 40`, the generation taken modulo 2^24 so the number never overflows (a mount restarted
/// 16 million times starts again from the bottom, which only costs adopting old handles).
pub fn first_handle(generation: u64) -> u64 {
    (generation.saturating_sub(1) % (1 << (64 - HANDLE_BITS))) << HANDLE_BITS
}

/// The environment variable that makes `tensorfs mount --foreground` the daemon of a
/// supervisor's mount: [`Handoff::to_env`]'s value.
pub const HANDOFF_ENV: &str = "TENSORFS_HANDOFF";

/// The signal a daemon gets when its supervisor dies (`PR_SET_PDEATHSIG`): it unmounts.
pub const SUPERVISOR_DIED: libc::c_int = libc::SIGUSR1;

/// The exit status of a daemon that ends to be replaced (SIGTERM or SIGINT to it).
pub const REPLACE_ME: i32 = 75;

/// What a supervisor hands the daemon it starts: descriptors (inherited, by number), which
/// daemon of the mount it is, the kernel's offer, and the supervisor's pid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handoff {
    /// The mount's `/dev/fuse` descriptor.
    pub device: RawFd,
    /// The journal's memory file.
    pub journal: RawFd,
    /// Where the daemon writes its readiness line ([`super::session::READY_LINE`] or `error: …`).
    pub ready: RawFd,
    /// A socket on which the daemon sends the supervisor a descriptor of each hold it takes
    /// on the store ([`send_fd`], tagged with its generation), so the holds outlive it.
    pub holds: RawFd,
    /// Which daemon of the mount this is, from 1 (each start counts, failed ones too).
    pub generation: u64,
    /// How many daemons took over the mount before this one's start, this one included
    /// (0 for the first).
    pub restarts: u64,
    /// The kernel's `INIT` offer.
    pub offer: Offer,
    /// The supervisor's pid.
    pub supervisor: u32,
    /// The mount point, canonical: the daemon must not look at it (it would ask itself).
    pub mountpoint: PathBuf,
}

impl Handoff {
    /// The value of [`HANDOFF_ENV`]: `device=N journal=N ready=N holds=N generation=N
    /// restarts=N supervisor=PID offer=OFFER mountpoint=HEX` (the path's bytes in hex).
    pub fn to_env(&self) -> String {
        use std::fmt::Write;
        let mut hex = String::new();
        for b in self.mountpoint.as_os_str().as_encoded_bytes() {
            let _ = write!(hex, "{b:02x}");
        }
        format!(
            "device={} journal={} ready={} holds={} generation={} restarts={} supervisor={} \
             offer={} mountpoint={hex}",
            self.device,
            self.journal,
            self.ready,
            self.holds,
            self.generation,
            self.restarts,
            self.supervisor,
            self.offer.to_env()
        )
    }

    /// Parses [`Handoff::to_env`]'s form.
    pub fn parse(value: &str) -> Option<Handoff> {
        let mut fields = std::collections::HashMap::new();
        for field in value.split_whitespace() {
            let (key, value) = field.split_once('=')?;
            if fields.insert(key, value).is_some() {
                return None;
            }
        }
        let handoff = Handoff {
            device: fields.remove("device")?.parse().ok()?,
            journal: fields.remove("journal")?.parse().ok()?,
            ready: fields.remove("ready")?.parse().ok()?,
            holds: fields.remove("holds")?.parse().ok()?,
            generation: fields.remove("generation")?.parse().ok()?,
            restarts: fields.remove("restarts")?.parse().ok()?,
            supervisor: fields.remove("supervisor")?.parse().ok()?,
            offer: Offer::from_env(fields.remove("offer")?)?,
            mountpoint: unhex(fields.remove("mountpoint")?)?,
        };
        (fields.is_empty() && handoff.generation >= 1).then_some(handoff)
    }

    /// The handoff this process was started with, if any.
    ///
    /// # Errors
    /// [`HANDOFF_ENV`] is set but malformed.
    pub fn from_env() -> io::Result<Option<Handoff>> {
        let Some(value) = std::env::var_os(HANDOFF_ENV) else {
            return Ok(None);
        };
        let value = value.to_string_lossy();
        match Handoff::parse(&value) {
            Some(handoff) => Ok(Some(handoff)),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{HANDOFF_ENV}={value:?} is not a supervisor's handoff"),
            )),
        }
    }
}

/// The path whose bytes `hex` spells.
fn unhex(hex: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    (!bytes.is_empty()).then(|| PathBuf::from(OsString::from_vec(bytes)))
}

/// The daemons serving the mount at `mountpoint` (canonical) for a supervisor, each with the
/// handoff it was started with (which names the supervisor): the processes this user may read
/// the environment of whose [`HANDOFF_ENV`] names the mount. Found without asking the mount,
/// which a hung daemon would not answer.
pub fn daemons_of(mountpoint: &Path) -> Vec<(u32, Handoff)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let key = format!("{HANDOFF_ENV}=");
    let mut found: Vec<(u32, Handoff)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter_map(|pid: u32| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let handoff = environ
                .split(|&b| b == 0)
                .filter_map(|var| var.strip_prefix(key.as_bytes()))
                .find_map(|value| Handoff::parse(std::str::from_utf8(value).ok()?))?;
            (handoff.mountpoint == mountpoint).then_some((pid, handoff))
        })
        .collect();
    found.sort_unstable_by_key(|(pid, _)| *pid);
    found
}

/// A session on the supervisor's `/dev/fuse` descriptor that starts handshaken: `fuser`
/// always reads an `INIT` first, and the kernel sent its only one to the supervisor, so the
/// session reads one made of the handoff's offer from a socket, and the descriptor then
/// takes the socket's number (`dup3`), so every read after is the kernel's.
///
/// # Errors
/// The socket cannot be made, or the handshake fails.
pub fn session_on(
    adapter: FuseAdapter,
    handoff: &Handoff,
    config: fuser::Config,
) -> io::Result<Session<FuseAdapter>> {
    let (ours, kernels) = socket_pair()?;
    let kernels = File::from(kernels);
    let request = handoff.offer.init_request();
    // SAFETY: `request` is readable for its length.
    let sent = unsafe { libc::write(kernels.as_raw_fd(), request.as_ptr().cast(), request.len()) };
    if sent != request.len() as isize {
        return Err(io::Error::last_os_error());
    }
    let acl = config.acl;
    let session = Session::from_fd(adapter, ours, acl, config)?;
    // The reply to the made INIT lies unread in `kernels`, which closes here.
    drop(kernels);
    let fd = session.as_fd().as_raw_fd();
    // SAFETY: both descriptors are open; dup3 atomically makes `fd` the device.
    if unsafe { libc::dup3(handoff.device, fd, libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the handoff's descriptor is ours, and `fd` refers to the device now.
    unsafe { libc::close(handoff.device) };
    Ok(session)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::inodes::Node;

    #[test]
    fn an_offer_survives_its_environment_form_and_makes_an_init_request() {
        let offer = Offer {
            major: 7,
            minor: 45,
            flags: (1 << 39) | (1 << 37) | (1 << 18),
            max_readahead: 131072,
        };
        assert_eq!(Offer::from_env(&offer.to_env()), Some(offer));
        for bad in ["", "7.45", "7.45:zz:1", "7:1:1", "7.45:1:1:1"] {
            assert_eq!(Offer::from_env(bad), None, "{bad:?}");
        }
        let request = offer.init_request();
        assert_eq!(request.len(), 104);
        assert_eq!(&request[..4], &104u32.to_ne_bytes());
        assert_eq!(&request[4..8], &FUSE_INIT.to_ne_bytes());
        let word = |i: usize| u32::from_ne_bytes(request[i..i + 4].try_into().unwrap());
        assert_eq!((word(40), word(44), word(48)), (7, 45, 131072));
        assert_eq!(
            word(52),
            (1 << 18) | (1 << 30),
            "low flags with FUSE_INIT_EXT"
        );
        assert_eq!(word(56), (1 << 7) | (1 << 5), "high flags");
        assert!(offer.can_resend());
        let old = Offer {
            flags: 1 << 18,
            ..offer
        };
        assert!(!old.can_resend());
    }

    fn inode(ino: u64, name: &str) -> Inode {
        Inode {
            ino,
            parent: 1,
            name: name.into(),
            node: Node::Org { org: name.into() },
        }
    }

    fn write_inodes(journal: &Journal, inodes: &[Inode]) {
        let mut state = lock(&journal.state);
        for i in inodes {
            journal.append(&mut state, &Record::Inode(i)).unwrap();
            state.kept = i.ino;
        }
    }

    #[test]
    fn a_journal_reads_back_its_inodes_and_open_handles_and_drops_a_cut_record() {
        let journal = Journal::create().unwrap();
        write_inodes(&journal, &[inode(2, "a"), inode(3, "b")]);
        {
            let mut state = lock(&journal.state);
            for record in [
                Record::Open {
                    fh: 7,
                    ino: 2,
                    backing: Some(1),
                    unique: 40,
                },
                Record::Open {
                    fh: 8,
                    ino: 3,
                    backing: None,
                    unique: 42,
                },
                Record::Release { fh: 7 },
            ] {
                journal.append(&mut state, &record).unwrap();
            }
        }
        let size = journal.file.metadata().unwrap().len();
        // A record cut short: its length says more than follows.
        journal
            .file
            .write_all_at(&[200, 0, 0, 0, 1, 2], size)
            .unwrap();
        let file = journal.file.try_clone().unwrap();
        let (resumed, replay) = Journal::resume(file).unwrap();
        assert_eq!(replay.inodes, vec![inode(2, "a"), inode(3, "b")]);
        assert_eq!(
            replay.open,
            BTreeMap::from([(
                8,
                OpenHandle {
                    ino: 3,
                    backing: None,
                    unique: 42,
                }
            )])
        );
        assert_eq!(
            resumed.file.metadata().unwrap().len(),
            size,
            "the cut record is gone"
        );
        assert_eq!(lock(&resumed.state).kept, 3);
    }

    #[test]
    fn released_handles_are_compacted_away_and_the_open_ones_kept() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        let fs = TensorFs::over_store(store, crate::fs::FsConfig::default());
        let journal = Journal::create().unwrap();
        journal.keep_inodes(&fs, 1);
        // The kernel's resend bit is not kept: a resent OPEN is matched without it.
        journal.opened(&fs, 1, 1, Some(4), 10 | RESENT);
        // Far past the bytes that start a compaction.
        for fh in 2..300_000 {
            journal.opened(&fs, fh, 1, None, 2 * fh);
            journal.released(&fs, fh);
        }
        journal.opened(&fs, 300_000, 1, None, 12);
        let meta = journal.file.metadata().unwrap();
        assert!(meta.len() > 4 * COMPACT_AFTER, "{} bytes", meta.len());
        // At most the records since the last compaction are held, and the page they start in.
        assert!(
            meta.blocks() * 512 <= COMPACT_AFTER + (64 << 10),
            "what lies before the live records is freed: {} bytes held",
            meta.blocks() * 512
        );
        let (_, replay) = Journal::resume(journal.file.try_clone().unwrap()).unwrap();
        assert_eq!(replay.inodes.len(), 1, "the root, once");
        assert_eq!(
            replay.open,
            BTreeMap::from([
                (
                    1,
                    OpenHandle {
                        ino: 1,
                        backing: Some(4),
                        unique: 10,
                    }
                ),
                (
                    300_000,
                    OpenHandle {
                        ino: 1,
                        backing: None,
                        unique: 12,
                    }
                ),
            ])
        );
    }

    #[test]
    fn a_damaged_header_is_an_error() {
        let journal = Journal::create().unwrap();
        journal
            .file
            .write_all_at(&u64::MAX.to_le_bytes(), 0)
            .unwrap();
        let err = Journal::resume(journal.file.try_clone().unwrap()).unwrap_err();
        assert!(err.to_string().contains("start at"), "{err}");
    }

    #[test]
    fn a_handoff_survives_its_environment_form() {
        let handoff = Handoff {
            device: 5,
            journal: 6,
            ready: 9,
            holds: 10,
            generation: 3,
            restarts: 1,
            offer: Offer {
                major: 7,
                minor: 45,
                flags: 0x20_0004_0000,
                max_readahead: 1 << 20,
            },
            supervisor: 4242,
            mountpoint: PathBuf::from("/home/a b/models"),
        };
        assert_eq!(Handoff::parse(&handoff.to_env()), Some(handoff.clone()));
        let env = handoff.to_env();
        for bad in [
            String::new(),
            env.replace("generation=3", "generation=0"),
            env.replace("device=5", "device=x"),
            format!("{env} extra=1"),
            format!("{env} device=5"),
            env.replace(" ready=9", ""),
            env.replace("mountpoint=2f", "mountpoint=2"),
        ] {
            assert_eq!(Handoff::parse(&bad), None, "{bad:?}");
        }
    }
}
