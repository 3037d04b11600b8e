//! The extents ioctl: ABI version 1, the query of [`super::FileTensors::locate`] on an open
//! `.safetensors` file of the mount, and ABI version 2, [`FILE`]: every tensor of the file in
//! one answer ([`super::FileTensors::locate_all`], as JSON). Documented in `docs/extents.md`; C
//! declarations in `packaging/tensorfs_extents.h`.
//!
//! FUSE passes only restricted ioctls: the command number encodes its direction and payload
//! size (at most 16383 bytes each way), so every command is `_IOWR(0xE7, nr, struct)` on a
//! fixed-size struct that the caller fills with a [query](QUERY_BYTES) and the daemon returns
//! whole with its answer. Answers that may not fit are paged by the query's `index`:
//!
//! | command | `nr` | bytes | `index` | answer |
//! |---|---|---|---|---|
//! | [`TENSOR`] | 1 | [`TENSOR_BYTES`] | page of the params JSON | key, logical dtype and shape, counts, encoding, store root |
//! | [`PART`] | 2 | [`PART_BYTES`] | part | role, stored dtype and shape, file range, its extents' span |
//! | [`EXTENTS`] | 3 | [`EXTENTS_BYTES`] | page of extents | up to [`EXTENTS_PER_PAGE`] extents, and the total |
//! | [`FILE`] (ABI 2) | 4 | [`FILE_BYTES`] | page of the answer | up to [`FILE_PAGE_BYTES`] bytes of the file's JSON ([`describe`]), and its length |
//!
//! Integers are little-endian (the machine's order on every architecture this serves);
//! strings are UTF-8, NUL-padded in fixed fields. Command numbers use the asm-generic ioctl
//! layout (x86-64, AArch64, RISC-V): 2 direction bits, 14 size bits, 8 type bits, 8 number
//! bits.
//!
//! [`Query::parse`] and [`Query::answer`] are the daemon's side (the mount's `fs` layer calls
//! them); [`query`] is the client's, used by `tensorfs locate`.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use super::{Encoding, Extent, FileTensor, LocateError, Located, Part};
use crate::format::{Dtype, ObjectRef, Sha256};

/// The ABI version this build speaks; a query carrying another is refused with `EPROTO`.
pub const ABI_VERSION: u32 = 1;
/// The ioctl type byte of every command (unassigned in Linux's `ioctl-number.rst`).
pub const MAGIC: u8 = 0xE7;
/// Bytes of the query's name field; a name holds at most one less (NUL-terminated).
pub const NAME_BYTES: usize = 1024;
/// Most dimensions an answer carries; a tensor or part of higher rank gets `EOVERFLOW`.
pub const MAX_RANK: usize = 8;
/// Bytes of a dtype field (NUL-padded).
pub const DTYPE_BYTES: usize = 16;
/// Bytes of a scheme field (NUL-padded).
pub const SCHEME_BYTES: usize = 64;
/// Bytes of a role field (NUL-padded).
pub const ROLE_BYTES: usize = 64;
/// Bytes of the store root field (NUL-padded; `PATH_MAX`).
pub const STORE_BYTES: usize = 4096;
/// Bytes of the params JSON one [`TENSOR`] answer carries.
pub const PARAMS_PAGE_BYTES: usize = 4096;
/// Extents one [`EXTENTS`] answer carries at most.
pub const EXTENTS_PER_PAGE: usize = 128;
/// [`TENSOR`] answer flag: the tensor is encoded (its parts are not its logical bytes).
pub const FLAG_ENCODED: u32 = 1;
/// The ABI version of [`FILE`], put in its `abi_version`.
pub const FILE_ABI_VERSION: u32 = 2;
/// Bytes of the answer one [`FILE`] page carries.
pub const FILE_PAGE_BYTES: usize = 16320;

/// Size of the query that starts every command's struct.
pub const QUERY_BYTES: usize = 16 + NAME_BYTES;
/// Size of `struct tensorfs_tensor`.
pub const TENSOR_BYTES: usize = T_PARAMS + PARAMS_PAGE_BYTES;
/// Size of `struct tensorfs_part`.
pub const PART_BYTES: usize = P_N_EXTENTS + 8;
/// Size of `struct tensorfs_extent`.
pub const EXTENT_BYTES: usize = 104;
/// Size of `struct tensorfs_extents`.
pub const EXTENTS_BYTES: usize = E_LIST + EXTENTS_PER_PAGE * EXTENT_BYTES;
/// Size of `struct tensorfs_file`.
pub const FILE_BYTES: usize = F_BYTES + FILE_PAGE_BYTES;

/// `_IOWR(MAGIC, nr, size)` in the asm-generic layout.
const fn iowr(nr: u32, size: usize) -> u32 {
    (3 << 30) | ((size as u32) << 16) | ((MAGIC as u32) << 8) | nr
}

/// `TENSORFS_IOC_TENSOR`: the tensor's description.
pub const TENSOR: u32 = iowr(1, TENSOR_BYTES);
/// `TENSORFS_IOC_PART`: one part's description.
pub const PART: u32 = iowr(2, PART_BYTES);
/// `TENSORFS_IOC_EXTENTS`: a page of extents.
pub const EXTENTS: u32 = iowr(3, EXTENTS_BYTES);
/// `TENSORFS_IOC_FILE` (ABI 2): a page of the file's description.
pub const FILE: u32 = iowr(4, FILE_BYTES);

// Field offsets. The query: abi_version u32, index u32, reserved u64, name[NAME_BYTES].
const Q_VERSION: usize = 0;
const Q_INDEX: usize = 4;
const Q_RESERVED: usize = 8;
const Q_NAME: usize = 16;
// struct tensorfs_tensor, after the query.
const T_KEY: usize = QUERY_BYTES;
const T_DTYPE: usize = T_KEY + NAME_BYTES;
const T_RANK: usize = T_DTYPE + DTYPE_BYTES;
const T_N_PARTS: usize = T_RANK + 4;
const T_SHAPE: usize = T_N_PARTS + 4;
const T_N_EXTENTS: usize = T_SHAPE + 8 * MAX_RANK;
const T_FILE_BEGIN: usize = T_N_EXTENTS + 8;
const T_FILE_END: usize = T_FILE_BEGIN + 8;
const T_FLAGS: usize = T_FILE_END + 8;
const T_PARAMS_LEN: usize = T_FLAGS + 4;
const T_SCHEME: usize = T_PARAMS_LEN + 4;
const T_STORE: usize = T_SCHEME + SCHEME_BYTES;
const T_PARAMS: usize = T_STORE + STORE_BYTES;
// struct tensorfs_part, after the query.
const P_ROLE: usize = QUERY_BYTES;
const P_DTYPE: usize = P_ROLE + ROLE_BYTES;
const P_RANK: usize = P_DTYPE + DTYPE_BYTES;
const P_RESERVED: usize = P_RANK + 4;
const P_SHAPE: usize = P_RESERVED + 4;
const P_FILE_BEGIN: usize = P_SHAPE + 8 * MAX_RANK;
const P_FILE_END: usize = P_FILE_BEGIN + 8;
const P_FIRST_EXTENT: usize = P_FILE_END + 8;
const P_N_EXTENTS: usize = P_FIRST_EXTENT + 8;
// struct tensorfs_extents, after the query.
const E_TOTAL: usize = QUERY_BYTES;
const E_COUNT: usize = E_TOTAL + 8;
const E_LIST: usize = E_COUNT + 8;
// struct tensorfs_extent.
const X_PART: usize = 0;
const X_BLOB: usize = 8;
const X_BLOB_LENGTH: usize = 72;
const X_OFFSET: usize = 80;
const X_LENGTH: usize = 88;
const X_FILE_OFFSET: usize = 96;
// struct tensorfs_file: abi_version u32, page u32, reserved u64, total u64, count u32,
// reserved u32, bytes[FILE_PAGE_BYTES].
const F_PAGE: usize = 4;
const F_TOTAL: usize = 16;
const F_COUNT: usize = 24;
const F_BYTES: usize = 32;

const _: () = assert!(QUERY_BYTES == 1040);
const _: () = assert!(TENSOR_BYTES == 10440);
const _: () = assert!(PART_BYTES == 1224);
const _: () = assert!(EXTENTS_BYTES == 14368);
const _: () = assert!(X_FILE_OFFSET + 8 == EXTENT_BYTES);
const _: () = assert!(FILE_BYTES == 16352);
const _: () = assert!(
    FILE_BYTES < 1 << 14,
    "FUSE passes at most 16383 bytes each way"
);
const _: () = assert!(
    EXTENTS_BYTES < 1 << 14,
    "FUSE passes at most 16383 bytes each way"
);

/// One of the extents commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// [`TENSOR`].
    Tensor,
    /// [`PART`].
    Part,
    /// [`EXTENTS`].
    Extents,
    /// [`FILE`] (ABI 2).
    File,
}

impl Command {
    /// The command with number `cmd`; `None` for any other ioctl (which gets `ENOTTY`).
    pub fn of(cmd: u32) -> Option<Command> {
        match cmd {
            TENSOR => Some(Command::Tensor),
            PART => Some(Command::Part),
            EXTENTS => Some(Command::Extents),
            FILE => Some(Command::File),
            _ => None,
        }
    }

    /// Its number.
    pub fn number(self) -> u32 {
        match self {
            Command::Tensor => TENSOR,
            Command::Part => PART,
            Command::Extents => EXTENTS,
            Command::File => FILE,
        }
    }

    /// Its struct's size in bytes, both ways.
    pub fn size(self) -> usize {
        match self {
            Command::Tensor => TENSOR_BYTES,
            Command::Part => PART_BYTES,
            Command::Extents => EXTENTS_BYTES,
            Command::File => FILE_BYTES,
        }
    }
}

/// Why the daemon refuses a query; [`IoctlError::errno`] is what the caller's `ioctl` sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IoctlError {
    /// The struct is not the command's size, a reserved field is not 0, the name is empty,
    /// unterminated or not UTF-8, or the part index is past the last part (`EINVAL`).
    #[error("malformed extents query: {0}")]
    Malformed(String),
    /// The query carries another ABI version than its command's (`EPROTO`).
    #[error(
        "extents ABI version {0} is not supported by this command (this daemon speaks \
         {ABI_VERSION}, and {FILE_ABI_VERSION} for the whole-file query)"
    )]
    Version(u32),
    /// An answer field cannot hold the value: rank over [`MAX_RANK`], a long dtype, role,
    /// scheme, key or store root (`EOVERFLOW`).
    #[error("{0}")]
    Overflow(String),
    /// The tensor cannot be located.
    #[error(transparent)]
    Locate(#[from] LocateError),
}

impl IoctlError {
    /// The errno: `EINVAL`, `EPROTO`, `EOVERFLOW`, or [`LocateError::errno`].
    pub fn errno(&self) -> i32 {
        match self {
            IoctlError::Malformed(_) => libc::EINVAL,
            IoctlError::Version(_) => libc::EPROTO,
            IoctlError::Overflow(_) => libc::EOVERFLOW,
            IoctlError::Locate(e) => e.errno(),
        }
    }
}

/// A parsed query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// The command.
    pub command: Command,
    /// The page or part it asks for.
    pub index: u32,
    /// The tensor name (empty for [`Command::File`]).
    pub name: String,
    /// The struct as received, which the answer fills in.
    bytes: Vec<u8>,
}

impl Query {
    /// Parses the struct of `command` as the kernel passed it (`input`, and `out_size` bytes
    /// asked back).
    ///
    /// # Errors
    /// [`IoctlError::Malformed`] or [`IoctlError::Version`].
    pub fn parse(command: Command, input: &[u8], out_size: u32) -> Result<Query, IoctlError> {
        let size = command.size();
        if input.len() != size || out_size as usize != size {
            return Err(IoctlError::Malformed(format!(
                "{} bytes in and {out_size} out, not {size} both ways",
                input.len()
            )));
        }
        let version = get_u32(input, Q_VERSION);
        let speaks = match command {
            Command::File => FILE_ABI_VERSION,
            _ => ABI_VERSION,
        };
        if version != speaks {
            return Err(IoctlError::Version(version));
        }
        if get_u64(input, Q_RESERVED) != 0 {
            return Err(IoctlError::Malformed("the reserved field is not 0".into()));
        }
        if command == Command::File {
            if input[F_TOTAL..F_BYTES].iter().any(|&b| b != 0) {
                return Err(IoctlError::Malformed(
                    "the answer's fields are not 0".into(),
                ));
            }
            return Ok(Query {
                command,
                index: get_u32(input, F_PAGE),
                name: String::new(),
                bytes: input.to_vec(),
            });
        }
        let field = &input[Q_NAME..Q_NAME + NAME_BYTES];
        let end = field.iter().position(|&b| b == 0).ok_or_else(|| {
            IoctlError::Malformed(format!("the name has no NUL in its {NAME_BYTES} bytes"))
        })?;
        let name = std::str::from_utf8(&field[..end])
            .map_err(|_| IoctlError::Malformed("the name is not UTF-8".into()))?;
        if name.is_empty() {
            return Err(IoctlError::Malformed("the name is empty".into()));
        }
        Ok(Query {
            command,
            index: get_u32(input, Q_INDEX),
            name: name.to_owned(),
            bytes: input.to_vec(),
        })
    }

    /// The answer to this query about `located`, from a store at `store_root` (shown as given;
    /// empty when unknown): the whole struct, to return to the caller.
    ///
    /// # Errors
    /// [`IoctlError::Overflow`]; [`IoctlError::Malformed`] for a part index past the last.
    pub fn answer(&self, located: &Located, store_root: &str) -> Result<Vec<u8>, IoctlError> {
        if self.command == Command::File {
            return Err(IoctlError::Malformed(
                "the whole-file query is answered from the file's description".into(),
            ));
        }
        let mut out = self.bytes.clone();
        put_u32(&mut out, Q_VERSION, ABI_VERSION);
        let index = self.index as usize;
        match self.command {
            Command::Tensor => {
                put_str(&mut out, T_KEY, NAME_BYTES, &located.key, "the key")?;
                put_str(
                    &mut out,
                    T_DTYPE,
                    DTYPE_BYTES,
                    located.dtype.name(),
                    "the dtype",
                )?;
                put_shape(&mut out, T_RANK, T_SHAPE, &located.shape)?;
                put_u32(&mut out, T_N_PARTS, located.parts.len() as u32);
                put_u64(&mut out, T_N_EXTENTS, located.extents.len() as u64);
                match &located.encoding {
                    None => {
                        let range = located.parts.first().map_or(0..0, |p| p.file_range.clone());
                        put_u64(&mut out, T_FILE_BEGIN, range.start);
                        put_u64(&mut out, T_FILE_END, range.end);
                    }
                    Some(Encoding { scheme, params }) => {
                        put_u32(&mut out, T_FLAGS, FLAG_ENCODED);
                        put_str(&mut out, T_SCHEME, SCHEME_BYTES, scheme, "the scheme")?;
                        let params = params.as_bytes();
                        let len = u32::try_from(params.len()).map_err(|_| {
                            IoctlError::Overflow("the params JSON is over 4 GiB".into())
                        })?;
                        put_u32(&mut out, T_PARAMS_LEN, len);
                        let start = index.saturating_mul(PARAMS_PAGE_BYTES).min(params.len());
                        let page = &params[start..(start + PARAMS_PAGE_BYTES).min(params.len())];
                        out[T_PARAMS..T_PARAMS + page.len()].copy_from_slice(page);
                    }
                }
                put_str(&mut out, T_STORE, STORE_BYTES, store_root, "the store root")?;
            }
            Command::Part => {
                let part = located.parts.get(index).ok_or_else(|| {
                    IoctlError::Malformed(format!(
                        "part {index} asked of a tensor of {} parts",
                        located.parts.len()
                    ))
                })?;
                put_str(&mut out, P_ROLE, ROLE_BYTES, &part.role, "the role")?;
                put_str(
                    &mut out,
                    P_DTYPE,
                    DTYPE_BYTES,
                    part.dtype.name(),
                    "the dtype",
                )?;
                put_shape(&mut out, P_RANK, P_SHAPE, &part.shape)?;
                put_u64(&mut out, P_FILE_BEGIN, part.file_range.start);
                put_u64(&mut out, P_FILE_END, part.file_range.end);
                put_u64(&mut out, P_FIRST_EXTENT, part.extents.start as u64);
                put_u64(&mut out, P_N_EXTENTS, part.extents.len() as u64);
            }
            // Refused above.
            Command::File => {}
            Command::Extents => {
                let page = located.page(u64::from(self.index), EXTENTS_PER_PAGE);
                put_u64(&mut out, E_TOTAL, located.extents.len() as u64);
                put_u32(&mut out, E_COUNT, page.len() as u32);
                for (i, extent) in page.iter().enumerate() {
                    let at = E_LIST + i * EXTENT_BYTES;
                    put_u32(&mut out, at + X_PART, extent.part as u32);
                    let hex = extent.blob.sha256.hex();
                    out[at + X_BLOB..at + X_BLOB + 64].copy_from_slice(hex.as_bytes());
                    put_u64(&mut out, at + X_BLOB_LENGTH, extent.blob.length);
                    put_u64(&mut out, at + X_OFFSET, extent.offset);
                    put_u64(&mut out, at + X_LENGTH, extent.length);
                    put_u64(&mut out, at + X_FILE_OFFSET, extent.file_offset);
                }
            }
        }
        Ok(out)
    }

    /// The answer to this [`Command::File`] query: page `index` of `description` (the file's
    /// [`describe`] text) and its length; an empty page past the end.
    pub fn answer_file(&self, description: &[u8]) -> Vec<u8> {
        let mut out = self.bytes.clone();
        let start = (self.index as usize)
            .saturating_mul(FILE_PAGE_BYTES)
            .min(description.len());
        let page = &description[start..(start + FILE_PAGE_BYTES).min(description.len())];
        put_u64(&mut out, F_TOTAL, description.len() as u64);
        put_u32(&mut out, F_COUNT, page.len() as u32);
        out[F_BYTES..F_BYTES + page.len()].copy_from_slice(page);
        out
    }
}

/// The whole-file answer of ABI 2 ([`FILE`]), a JSON object (UTF-8, `docs/extents.md`):
///
/// - `abi`: 2; `store`: the store's root; `blobs`: every blob the extents name, once, as
///   `[sha256 hex, length, stamp]`, where the stamp is `[st_dev, st_ino, st_size, mtime ns,
///   ctime ns]` of the blob as the daemon proved it (`null` when it has not: hash the bytes);
/// - `tensors`, in the component's order: `key`, `dtype` and `shape` (logical), `encoding`
///   (`null`, or `{"scheme", "params"}`), and `parts`, each `role`, `dtype`, `shape`, `begin`
///   and `end` (absolute offsets in the file) and `extents`: `[blob index, offset in the blob,
///   length, offset in the file]`, in file order. A tensor a decoded view decodes, or a
///   single file's array made when read, has `"decoded": true`, its scheme (or `transposed`),
///   `begin` and `end`, and no parts: read it from the file.
///
/// `stamp` gives a blob's proven stamp ([`crate::io::ObjectSource::proven_stamp`]).
pub fn describe(
    tensors: &[FileTensor],
    store_root: &str,
    stamp: &dyn Fn(&ObjectRef) -> Option<[i128; 5]>,
) -> Vec<u8> {
    use std::fmt::Write as _;
    // Written as text, not built as a `Value` tree: a model has thousands of tensors, and the
    // answer is made on the open that asks for it. Keys are in sorted order, as before.
    let string = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "null".into());
    fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
        let mut out = String::from("[");
        for (i, d) in items.into_iter().enumerate() {
            let _ = write!(out, "{}{d}", if i == 0 { "" } else { "," });
        }
        out.push(']');
        out
    }
    let mut blobs: Vec<String> = Vec::new();
    let mut index_of: std::collections::HashMap<Sha256, usize> = Default::default();
    let mut out = String::with_capacity(256 * tensors.len() + 256);
    for (n, tensor) in tensors.iter().enumerate() {
        out.push_str(if n == 0 { "" } else { "," });
        match tensor {
            FileTensor::Decoded {
                key,
                scheme,
                file_range,
            } => {
                let _ = write!(
                    out,
                    r#"{{"begin":{},"decoded":true,"end":{},"key":{},"scheme":{}}}"#,
                    file_range.start,
                    file_range.end,
                    string(key),
                    string(scheme)
                );
            }
            FileTensor::Stored(located) => {
                let _ = write!(out, r#"{{"dtype":"{}","encoding":"#, located.dtype.name());
                match &located.encoding {
                    None => out.push_str("null"),
                    Some(e) => {
                        // Canonical JSON text already; anything else is shown as null.
                        let params = serde_json::from_str::<serde::de::IgnoredAny>(&e.params)
                            .map_or("null", |_| e.params.as_str());
                        let _ = write!(
                            out,
                            r#"{{"params":{params},"scheme":{}}}"#,
                            string(&e.scheme)
                        );
                    }
                }
                let _ = write!(out, r#","key":{},"parts":["#, string(&located.key));
                for (i, part) in located.parts.iter().enumerate() {
                    let _ = write!(
                        out,
                        r#"{}{{"begin":{},"dtype":"{}","end":{},"extents":["#,
                        if i == 0 { "" } else { "," },
                        part.file_range.start,
                        part.dtype.name(),
                        part.file_range.end
                    );
                    for (j, e) in located.part_extents(i).iter().enumerate() {
                        let at = *index_of.entry(e.blob.sha256).or_insert_with(|| {
                            let stamp =
                                stamp(&e.blob).map_or("null".into(), |s| list(s.map(|v| v as i64)));
                            blobs.push(format!(
                                r#"["{}",{},{stamp}]"#,
                                e.blob.sha256.hex(),
                                e.blob.length
                            ));
                            blobs.len() - 1
                        });
                        let _ = write!(
                            out,
                            "{}[{at},{},{},{}]",
                            if j == 0 { "" } else { "," },
                            e.offset,
                            e.length,
                            e.file_offset
                        );
                    }
                    let _ = write!(
                        out,
                        r#"],"role":{},"shape":{}}}"#,
                        string(&part.role),
                        list(&part.shape)
                    );
                }
                let _ = write!(out, r#"],"shape":{}}}"#, list(&located.shape));
            }
        }
    }
    format!(
        r#"{{"abi":{FILE_ABI_VERSION},"blobs":[{}],"store":{},"tensors":[{out}]}}"#,
        blobs.join(","),
        string(store_root)
    )
    .into_bytes()
}

/// Why [`query`] failed; messages name the file and tensor.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The ioctl failed with `errno`.
    #[error("{file}: tensor {tensor:?}: {}", meaning(*errno))]
    Errno {
        /// The file queried.
        file: String,
        /// The tensor asked for.
        tensor: String,
        /// The error number.
        errno: i32,
    },
    /// The name cannot be sent: empty, holding a NUL, or [`NAME_BYTES`] bytes or more.
    #[error("{file}: tensor {tensor:?}: a name must be 1 to {} bytes without NUL", NAME_BYTES - 1)]
    Name {
        /// The file queried.
        file: String,
        /// The tensor asked for.
        tensor: String,
    },
    /// The whole-file query ([`query_file`]) failed with `errno`.
    #[error("{file}: {}", meaning(*errno))]
    File {
        /// The file queried.
        file: String,
        /// The error number.
        errno: i32,
    },
    /// The daemon's answer breaks the ABI.
    #[error("{file}: tensor {tensor:?}: malformed answer: {why}")]
    Malformed {
        /// The file queried.
        file: String,
        /// The tensor asked for.
        tensor: String,
        /// What is wrong.
        why: String,
    },
}

impl QueryError {
    /// The errno of a failed ioctl, if that is what failed.
    pub fn errno(&self) -> Option<i32> {
        match self {
            QueryError::Errno { errno, .. } | QueryError::File { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// The client's side of ABI 2: the [`describe`] text of `file`, an open file of a mount (named
/// `path` in errors), read page by page with [`FILE`].
///
/// # Errors
/// [`QueryError::File`] with the ioctl's errno (`ENOTTY`: not a TensorFS file, or a daemon
/// that speaks only ABI 1); [`QueryError::Malformed`] when the pages disagree.
pub fn query_file(file: &File, path: &str) -> Result<Vec<u8>, QueryError> {
    let mut text: Vec<u8> = Vec::new();
    let mut total = None;
    for page in 0u32.. {
        let mut buf = vec![0u8; FILE_BYTES];
        put_u32(&mut buf, Q_VERSION, FILE_ABI_VERSION);
        put_u32(&mut buf, F_PAGE, page);
        // SAFETY: the command's struct is `buf`, exactly the size its number encodes.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), FILE as _, buf.as_mut_ptr()) };
        if r != 0 {
            return Err(QueryError::File {
                file: path.to_owned(),
                errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            });
        }
        let length = get_u64(&buf, F_TOTAL);
        let count = (get_u32(&buf, F_COUNT) as usize).min(FILE_PAGE_BYTES);
        if *total.get_or_insert(length) != length || (count == 0 && (text.len() as u64) < length) {
            return Err(QueryError::Malformed {
                file: path.to_owned(),
                tensor: String::new(),
                why: format!("page {page} of the file's description disagrees with the first"),
            });
        }
        text.extend_from_slice(&buf[F_BYTES..F_BYTES + count]);
        if text.len() as u64 >= length {
            text.truncate(length as usize);
            return Ok(text);
        }
    }
    Err(QueryError::Malformed {
        file: path.to_owned(),
        tensor: String::new(),
        why: "the file's description does not end".into(),
    })
}

/// What an errno of an extents command means.
fn meaning(errno: i32) -> String {
    match errno {
        libc::ENOTTY => {
            "not a file of a TensorFS mount (or its daemon has no extents ioctl)".into()
        }
        libc::EOPNOTSUPP => "not a safetensors file of a lane".into(),
        libc::ENOENT => "no such tensor in the file".into(),
        libc::ENODATA => "made when read (decoded in a @decoded view, or a single file's \
                          transposed array), so no bytes of the store hold it as the file shows \
                          it; read it from the file, or locate an encoded tensor's parts in the \
                          lane's own folder"
            .into(),
        libc::EPROTO => format!("the daemon does not speak extents ABI version {ABI_VERSION}"),
        libc::EOVERFLOW => "the answer does not fit the ioctl's fields (rank over 8 or a long \
                            name); use `tensorfs locate REF FILE TENSOR` on the store"
            .into(),
        e => std::io::Error::from_raw_os_error(e).to_string(),
    }
}

/// The client's side: locates `tensor` in `file`, an open file of a mount, named `path` in
/// errors and in the answer's [`Located::file`]. Runs [`TENSOR`] (and its params pages),
/// [`PART`] for each part, and [`EXTENTS`] for each page; blob paths are under the store root
/// the daemon reports.
///
/// # Errors
/// [`QueryError`].
pub fn query(file: &File, path: &str, tensor: &str) -> Result<Located, QueryError> {
    let malformed = |why: String| QueryError::Malformed {
        file: path.to_owned(),
        tensor: tensor.to_owned(),
        why,
    };
    if tensor.is_empty() || tensor.len() >= NAME_BYTES || tensor.contains('\0') {
        return Err(QueryError::Name {
            file: path.to_owned(),
            tensor: tensor.to_owned(),
        });
    }
    let call = |command: Command, index: u32| -> Result<Vec<u8>, QueryError> {
        let mut buf = vec![0u8; command.size()];
        put_u32(&mut buf, Q_VERSION, ABI_VERSION);
        put_u32(&mut buf, Q_INDEX, index);
        buf[Q_NAME..Q_NAME + tensor.len()].copy_from_slice(tensor.as_bytes());
        // SAFETY: the command's struct is `buf`, exactly the size its number encodes, which is
        // all the kernel reads and writes.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), command.number() as _, buf.as_mut_ptr()) };
        if r != 0 {
            return Err(QueryError::Errno {
                file: path.to_owned(),
                tensor: tensor.to_owned(),
                errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            });
        }
        Ok(buf)
    };
    let t = call(Command::Tensor, 0)?;
    let text = |bytes: &[u8], at: usize, len: usize, what: &str| {
        get_str(bytes, at, len).ok_or_else(|| malformed(format!("{what} is not UTF-8")))
    };
    let dtype = |name: String| Dtype::parse(&name).map_err(|e| malformed(e.to_string()));
    let store_root = PathBuf::from(text(&t, T_STORE, STORE_BYTES, "the store root")?);
    let n_parts = get_u32(&t, T_N_PARTS);
    let encoding = match get_u32(&t, T_FLAGS) & FLAG_ENCODED {
        0 => None,
        _ => {
            let len = get_u32(&t, T_PARAMS_LEN) as usize;
            let mut params = Vec::with_capacity(len.min(1 << 20));
            let mut page = t.clone();
            for index in 0.. {
                let take = (len - params.len()).min(PARAMS_PAGE_BYTES);
                params.extend_from_slice(&page[T_PARAMS..T_PARAMS + take]);
                if params.len() == len {
                    break;
                }
                page = call(Command::Tensor, index + 1)?;
            }
            Some(Encoding {
                scheme: text(&t, T_SCHEME, SCHEME_BYTES, "the scheme")?,
                params: String::from_utf8(params)
                    .map_err(|_| malformed("the params are not UTF-8".into()))?,
            })
        }
    };
    let mut parts = Vec::new();
    for index in 0..n_parts {
        let p = call(Command::Part, index)?;
        let first = get_u64(&p, P_FIRST_EXTENT) as usize;
        parts.push(Part {
            role: text(&p, P_ROLE, ROLE_BYTES, "a role")?,
            dtype: dtype(text(&p, P_DTYPE, DTYPE_BYTES, "a dtype")?)?,
            shape: get_shape(&p, P_RANK, P_SHAPE).ok_or_else(|| malformed("a rank".into()))?,
            file_range: get_u64(&p, P_FILE_BEGIN)..get_u64(&p, P_FILE_END),
            extents: first..first.saturating_add(get_u64(&p, P_N_EXTENTS) as usize),
        });
    }
    let total = get_u64(&t, T_N_EXTENTS);
    let mut extents = Vec::new();
    let mut page = 0;
    while (extents.len() as u64) < total {
        let e = call(Command::Extents, page)?;
        let count = (get_u32(&e, E_COUNT) as usize).min(EXTENTS_PER_PAGE);
        if count == 0 || get_u64(&e, E_TOTAL) != total {
            return Err(malformed(format!(
                "page {page} holds {count} of {} extents, not the {total} announced",
                get_u64(&e, E_TOTAL)
            )));
        }
        for i in 0..count {
            let at = E_LIST + i * EXTENT_BYTES;
            let hex = std::str::from_utf8(&e[at + X_BLOB..at + X_BLOB + 64])
                .map_err(|_| malformed("a blob id is not hex".into()))?;
            let sha256: Sha256 = hex.parse().map_err(|err| malformed(format!("{err}")))?;
            let blob = ObjectRef {
                sha256,
                length: get_u64(&e, at + X_BLOB_LENGTH),
            };
            extents.push(Extent {
                part: get_u32(&e, at + X_PART) as usize,
                path: store_root.join(blob.blob_path()),
                blob,
                offset: get_u64(&e, at + X_OFFSET),
                length: get_u64(&e, at + X_LENGTH),
                file_offset: get_u64(&e, at + X_FILE_OFFSET),
            });
        }
        page += 1;
    }
    extents.truncate(total as usize);
    if parts.iter().any(|p| p.extents.end > extents.len()) {
        return Err(malformed(
            "a part's extents are past the last extent".into(),
        ));
    }
    Ok(Located {
        file: path.to_owned(),
        key: text(&t, T_KEY, NAME_BYTES, "the key")?,
        dtype: dtype(text(&t, T_DTYPE, DTYPE_BYTES, "the dtype")?)?,
        shape: get_shape(&t, T_RANK, T_SHAPE).ok_or_else(|| malformed("the rank".into()))?,
        encoding,
        parts,
        extents,
    })
}

fn put_u32(buf: &mut [u8], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(buf: &mut [u8], at: usize, value: u64) {
    buf[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// Writes `text` NUL-padded into the `len`-byte field at `at`; it must leave room for a NUL.
fn put_str(
    buf: &mut [u8],
    at: usize,
    len: usize,
    text: &str,
    what: &str,
) -> Result<(), IoctlError> {
    if text.len() >= len {
        return Err(IoctlError::Overflow(format!(
            "{what} ({} bytes) does not fit its {len}-byte field",
            text.len()
        )));
    }
    buf[at..at + text.len()].copy_from_slice(text.as_bytes());
    buf[at + text.len()..at + len].fill(0);
    Ok(())
}

fn put_shape(buf: &mut [u8], rank_at: usize, at: usize, shape: &[u64]) -> Result<(), IoctlError> {
    if shape.len() > MAX_RANK {
        return Err(IoctlError::Overflow(format!(
            "rank {} is over the ABI's {MAX_RANK}",
            shape.len()
        )));
    }
    put_u32(buf, rank_at, shape.len() as u32);
    for (i, &d) in shape.iter().enumerate() {
        put_u64(buf, at + 8 * i, d);
    }
    Ok(())
}

fn get_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

fn get_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

/// The NUL-padded string of the `len`-byte field at `at`.
fn get_str(buf: &[u8], at: usize, len: usize) -> Option<String> {
    let field = &buf[at..at + len];
    let end = field.iter().position(|&b| b == 0).unwrap_or(len);
    std::str::from_utf8(&field[..end]).ok().map(str::to_owned)
}

fn get_shape(buf: &[u8], rank_at: usize, at: usize) -> Option<Vec<u64>> {
    let rank = get_u32(buf, rank_at) as usize;
    (rank <= MAX_RANK).then(|| (0..rank).map(|i| get_u64(buf, at + 8 * i)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn located() -> Located {
        let blob = |b: u8, length| ObjectRef {
            sha256: Sha256([b; 32]),
            length,
        };
        let extent = |part, b, offset, length, file_offset| Extent {
            part,
            blob: blob(b, 8192),
            path: PathBuf::from("/s").join(blob(b, 8192).blob_path()),
            offset,
            length,
            file_offset,
        };
        Located {
            file: "model.safetensors".into(),
            key: "x.weight".into(),
            dtype: Dtype::BF16,
            shape: vec![4, 1024],
            encoding: Some(Encoding {
                scheme: "int8.rowwise".into(),
                params: format!("{{\"pad\":\"{}\"}}", "p".repeat(5000)),
            }),
            parts: vec![
                Part {
                    role: "weight".into(),
                    dtype: Dtype::I8,
                    shape: vec![4, 1024],
                    file_range: 100..4196,
                    extents: 0..2,
                },
                Part {
                    role: "scale".into(),
                    dtype: Dtype::F32,
                    shape: vec![4],
                    file_range: 4196..4212,
                    extents: 2..3,
                },
            ],
            extents: vec![
                extent(0, 1, 4096, 4096, 100),
                extent(0, 2, 0, 0, 4196),
                extent(1, 2, 0, 16, 4196),
            ],
        }
    }

    fn request(command: Command, index: u32, name: &str) -> Vec<u8> {
        let mut buf = vec![0u8; command.size()];
        put_u32(&mut buf, Q_VERSION, ABI_VERSION);
        put_u32(&mut buf, Q_INDEX, index);
        buf[Q_NAME..Q_NAME + name.len()].copy_from_slice(name.as_bytes());
        buf
    }

    #[test]
    fn command_numbers_are_the_documented_ones() {
        assert_eq!(TENSOR, 0xE8C8_E701);
        assert_eq!(PART, 0xC4C8_E702);
        assert_eq!(EXTENTS, 0xF820_E703);
        assert_eq!(Command::of(libc::TCGETS as u32), None);
        assert_eq!(Command::of(iowr(4, TENSOR_BYTES)), None);
    }

    #[test]
    fn answers_carry_the_fields_at_their_offsets() {
        let l = located();
        let q = Query::parse(
            Command::Tensor,
            &request(Command::Tensor, 1, "x.weight"),
            TENSOR_BYTES as u32,
        )
        .unwrap();
        let t = q.answer(&l, "/s").unwrap();
        assert_eq!(t.len(), TENSOR_BYTES);
        assert_eq!(get_str(&t, T_KEY, NAME_BYTES).unwrap(), "x.weight");
        assert_eq!(get_str(&t, T_DTYPE, DTYPE_BYTES).unwrap(), "BF16");
        assert_eq!(get_shape(&t, T_RANK, T_SHAPE).unwrap(), [4, 1024]);
        assert_eq!(get_u32(&t, T_N_PARTS), 2);
        assert_eq!(get_u64(&t, T_N_EXTENTS), 3);
        assert_eq!(get_u32(&t, T_FLAGS), FLAG_ENCODED);
        let params = l.encoding.as_ref().unwrap().params.as_bytes();
        assert_eq!(get_u32(&t, T_PARAMS_LEN) as usize, params.len());
        let tail = &params[PARAMS_PAGE_BYTES..];
        assert_eq!(
            &t[T_PARAMS..T_PARAMS + tail.len()],
            tail,
            "page 1 of the params"
        );
        assert!(t[T_PARAMS + tail.len()..].iter().all(|&b| b == 0));
        assert_eq!(get_str(&t, T_STORE, STORE_BYTES).unwrap(), "/s");

        let part = request(Command::Part, 1, "x.weight");
        let p = Query::parse(Command::Part, &part, PART_BYTES as u32)
            .unwrap()
            .answer(&l, "/s")
            .unwrap();
        assert_eq!(get_str(&p, P_ROLE, ROLE_BYTES).unwrap(), "scale");
        assert_eq!(get_u64(&p, P_FILE_BEGIN), 4196);
        assert_eq!(get_u64(&p, P_FIRST_EXTENT), 2);
        assert_eq!(get_u64(&p, P_N_EXTENTS), 1);
        let past = request(Command::Part, 2, "x.weight");
        let q = Query::parse(Command::Part, &past, PART_BYTES as u32).unwrap();
        assert_eq!(q.answer(&l, "/s").unwrap_err().errno(), libc::EINVAL);

        let e = Query::parse(
            Command::Extents,
            &request(Command::Extents, 0, "x.weight"),
            EXTENTS_BYTES as u32,
        )
        .unwrap()
        .answer(&l, "/s")
        .unwrap();
        assert_eq!(get_u64(&e, E_TOTAL), 3);
        assert_eq!(get_u32(&e, E_COUNT), 3);
        let second = E_LIST + EXTENT_BYTES;
        assert_eq!(
            &e[second + X_BLOB..second + X_BLOB + 64],
            "02".repeat(32).as_bytes()
        );
        assert_eq!(get_u64(&e, second + X_FILE_OFFSET), 4196);
        let past = request(Command::Extents, 1, "x.weight");
        let e = Query::parse(Command::Extents, &past, EXTENTS_BYTES as u32)
            .unwrap()
            .answer(&l, "/s")
            .unwrap();
        assert_eq!((get_u64(&e, E_TOTAL), get_u32(&e, E_COUNT)), (3, 0));
    }

    #[test]
    fn the_whole_file_answer_is_the_documented_json() {
        use serde_json::json;
        let mut plain = located();
        plain.key = "a \"quoted\" ünïcode\nkey".into();
        plain.encoding = None;
        plain.parts.truncate(1);
        plain.parts[0].extents = 0..1;
        plain.extents.truncate(1);
        let mut encoded = located();
        encoded.extents.remove(1); // extents are never empty
        encoded.parts[0].extents = 0..1;
        encoded.parts[1].extents = 1..2;
        encoded.encoding.as_mut().unwrap().params = r#"{"block":32,"scale":"F32"}"#.into();
        let tensors = [
            FileTensor::Stored(plain),
            FileTensor::Decoded {
                key: "t.text_projection".into(),
                scheme: "transposed".into(),
                file_range: 7..9,
            },
            FileTensor::Stored(encoded),
        ];
        let stamp = |o: &ObjectRef| (o.sha256.0[0] == 1).then_some([5, 6, 8192, -7, 1 << 62]);
        let text = describe(&tensors, "/st\"ore", &stamp);
        let got: serde_json::Value = serde_json::from_slice(&text).expect("valid JSON");
        let extents = json!([[0, 4096, 4096, 100]]);
        let expected = json!({
            "abi": 2,
            "store": "/st\"ore",
            "blobs": [
                ["01".repeat(32), 8192, [5, 6, 8192, -7, 1i64 << 62]],
                ["02".repeat(32), 8192, null],
            ],
            "tensors": [
                {"key": "a \"quoted\" ünïcode\nkey", "dtype": "BF16", "shape": [4, 1024],
                 "encoding": null,
                 "parts": [{"role": "weight", "dtype": "I8", "shape": [4, 1024],
                            "begin": 100, "end": 4196, "extents": extents}]},
                {"key": "t.text_projection", "decoded": true, "scheme": "transposed",
                 "begin": 7, "end": 9},
                {"key": "x.weight", "dtype": "BF16", "shape": [4, 1024],
                 "encoding": {"scheme": "int8.rowwise", "params": {"block": 32, "scale": "F32"}},
                 "parts": [{"role": "weight", "dtype": "I8", "shape": [4, 1024],
                            "begin": 100, "end": 4196, "extents": extents},
                           {"role": "scale", "dtype": "F32", "shape": [4],
                            "begin": 4196, "end": 4212, "extents": [[1, 0, 16, 4196]]}]},
            ],
        });
        assert_eq!(got, expected);
        // Params that are not JSON are shown as null, never as broken text.
        let mut bad = located();
        bad.encoding.as_mut().unwrap().params = "{not json".into();
        let text = describe(&[FileTensor::Stored(bad)], "/s", &|_| None);
        let got: serde_json::Value = serde_json::from_slice(&text).expect("valid JSON");
        assert_eq!(
            got["tensors"][0]["encoding"]["params"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn malformed_queries_get_their_errnos() {
        let parse = |buf: &[u8], out| Query::parse(Command::Tensor, buf, out);
        let size = TENSOR_BYTES as u32;
        let good = request(Command::Tensor, 0, "x");
        assert_eq!(parse(&good[1..], size).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(parse(&good, size - 1).unwrap_err().errno(), libc::EINVAL);
        let mut other = good.clone();
        put_u32(&mut other, Q_VERSION, 2);
        assert_eq!(parse(&other, size).unwrap_err(), IoctlError::Version(2));
        assert_eq!(IoctlError::Version(2).errno(), libc::EPROTO);
        let mut reserved = good.clone();
        reserved[Q_RESERVED] = 1;
        assert_eq!(parse(&reserved, size).unwrap_err().errno(), libc::EINVAL);
        let mut unterminated = good.clone();
        unterminated[Q_NAME..Q_NAME + NAME_BYTES].fill(b'a');
        assert_eq!(
            parse(&unterminated, size).unwrap_err().errno(),
            libc::EINVAL
        );
        let empty = request(Command::Tensor, 0, "");
        assert_eq!(parse(&empty, size).unwrap_err().errno(), libc::EINVAL);
        let mut bad_utf8 = good.clone();
        bad_utf8[Q_NAME] = 0xFF;
        assert_eq!(parse(&bad_utf8, size).unwrap_err().errno(), libc::EINVAL);

        let mut deep = located();
        deep.shape = vec![1; MAX_RANK + 1];
        let q = parse(&good, size).unwrap();
        assert_eq!(q.answer(&deep, "/s").unwrap_err().errno(), libc::EOVERFLOW);
        let long_root = "/r".repeat(STORE_BYTES);
        assert_eq!(
            q.answer(&located(), &long_root).unwrap_err().errno(),
            libc::EOVERFLOW
        );
    }
}
