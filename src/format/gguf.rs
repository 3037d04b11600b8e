//! GGUF, ggml's container (versions 2 and 3, little-endian): a header of typed key-value
//! metadata (the KV) and tensor infos, then the data section, where each tensor's bytes sit at
//! an offset from the section's start.
//!
//! ```text
//! "GGUF" version:u32 tensor_count:u64 kv_count:u64
//! kv_count × (key:string type:u32 value)         string = len:u64 bytes
//!                                                array = type:u32 count:u64 values
//! tensor_count × (name:string n_dims:u32 ne:u64[n_dims] ggml_type:u32 offset:u64)
//! zero padding to `general.alignment` (a u32 power of two; 32 when absent)
//! data section: each tensor at data_start + offset, aligned; zero padding between
//! ```
//!
//! [`parse`] reads a header from a prefix of a file of known length and refuses, naming the key
//! or tensor: a wrong magic or version (big-endian files and version 1 included), a value type
//! or ggml type it does not know, strings that are not UTF-8, a bool byte other than 0 and 1,
//! arrays nested deeper than [`MAX_ARRAY_DEPTH`], repeated keys or tensor names, more than
//! [`MAX_DIMS`] dimensions, a first extent that is not whole blocks of its type, element counts
//! past `i64`, an alignment that is not a `u32` power of two, and tensors whose bytes are not
//! aligned, overlap, or run past the end of the file. Every count and length is checked
//! against the bytes the file has left before anything is reserved for it, and nothing is
//! allocated for bytes not yet in the prefix ([`GgufError::Incomplete`] asks for more), so a
//! hostile header costs at most its own size.
//!
//! [`write()`] is the inverse: the header bytes, padding included, of a parsed [`Gguf`];
//! `write(&parse(f)?.gguf)` is `f` up to its data section.

use std::collections::HashMap;

use super::{names, Dtype, FormatError, FormatResult};

/// The first four bytes of a GGUF file.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of the data section and of each tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The KV key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// The most dimensions a tensor may have.
pub const MAX_DIMS: usize = 8;
/// The deepest nesting of arrays in a KV value (an array of arrays is depth 2).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// The largest header accepted (KV and tensor infos, before the padding), in bytes.
pub const MAX_HEADER_BYTES: u64 = 256 << 20;

/// A ggml tensor type: its id in a GGUF tensor info, name, and `block` elements stored in
/// `size` bytes (1 and the element size for a plain type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlType {
    /// The id in a tensor info.
    pub id: u32,
    /// ggml's name in lowercase (`q4_k`, `f16`).
    pub name: &'static str,
    /// Elements per block (`n`); 1 for a plain type.
    pub block: u64,
    /// Bytes per block (`S`).
    pub size: u64,
}

impl GgmlType {
    /// The dtype of a plain (unblocked) type; `None` for a block type.
    pub fn dtype(&self) -> Option<Dtype> {
        Some(match self.id {
            0 => Dtype::F32,
            1 => Dtype::F16,
            24 => Dtype::I8,
            25 => Dtype::I16,
            26 => Dtype::I32,
            27 => Dtype::I64,
            28 => Dtype::F64,
            30 => Dtype::BF16,
            _ => return None,
        })
    }
}

macro_rules! ggml_types {
    ($(($id:literal, $name:literal, $block:literal, $size:literal)),* $(,)?) => {
        /// Every ggml type a GGUF tensor may have, by id.
        pub const GGML_TYPES: &[GgmlType] = &[
            $(GgmlType { id: $id, name: $name, block: $block, size: $size }),*
        ];
    };
}

ggml_types![
    (0, "f32", 1, 4),
    (1, "f16", 1, 2),
    (2, "q4_0", 32, 18),
    (3, "q4_1", 32, 20),
    (6, "q5_0", 32, 22),
    (7, "q5_1", 32, 24),
    (8, "q8_0", 32, 34),
    (9, "q8_1", 32, 40),
    (10, "q2_k", 256, 84),
    (11, "q3_k", 256, 110),
    (12, "q4_k", 256, 144),
    (13, "q5_k", 256, 176),
    (14, "q6_k", 256, 210),
    (15, "q8_k", 256, 292),
    (16, "iq2_xxs", 256, 66),
    (17, "iq2_xs", 256, 74),
    (18, "iq3_xxs", 256, 98),
    (19, "iq1_s", 256, 50),
    (20, "iq4_nl", 32, 18),
    (21, "iq3_s", 256, 110),
    (22, "iq2_s", 256, 82),
    (23, "iq4_xs", 256, 136),
    (24, "i8", 1, 1),
    (25, "i16", 1, 2),
    (26, "i32", 1, 4),
    (27, "i64", 1, 8),
    (28, "f64", 1, 8),
    (29, "iq1_m", 256, 56),
    (30, "bf16", 1, 2),
    (34, "tq1_0", 256, 54),
    (35, "tq2_0", 256, 66),
    (39, "mxfp4", 32, 17),
    (40, "nvfp4", 64, 36),
    (41, "q1_0", 128, 18),
];

/// The ggml type with id `id`.
pub fn ggml_type(id: u32) -> Option<&'static GgmlType> {
    GGML_TYPES.iter().find(|t| t.id == id)
}

/// A KV value type (GGUF's `gguf_type`), by its code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum KvType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl KvType {
    /// The type with code `code`.
    pub fn from_code(code: u32) -> Option<KvType> {
        use KvType::*;
        Some(match code {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Its code.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The fewest bytes one value of this type takes (a string's length, an array's type and
    /// count).
    fn min_size(self) -> u64 {
        use KvType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A KV value. Floats are kept as their IEEE-754 bits, so every NaN and −0 survives and
/// values compare exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum KvValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    /// An `f32`'s bits.
    F32(u32),
    Bool(bool),
    String(String),
    Array(KvArray),
    U64(u64),
    I64(i64),
    /// An `f64`'s bits.
    F64(u64),
}

/// A KV array: its element type and elements, of that type by construction.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum KvArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    /// `f32` bits.
    F32(Vec<u32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<KvArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    /// `f64` bits.
    F64(Vec<u64>),
}

impl KvValue {
    /// Its type.
    pub fn kind(&self) -> KvType {
        match self {
            KvValue::U8(_) => KvType::U8,
            KvValue::I8(_) => KvType::I8,
            KvValue::U16(_) => KvType::U16,
            KvValue::I16(_) => KvType::I16,
            KvValue::U32(_) => KvType::U32,
            KvValue::I32(_) => KvType::I32,
            KvValue::F32(_) => KvType::F32,
            KvValue::Bool(_) => KvType::Bool,
            KvValue::String(_) => KvType::String,
            KvValue::Array(_) => KvType::Array,
            KvValue::U64(_) => KvType::U64,
            KvValue::I64(_) => KvType::I64,
            KvValue::F64(_) => KvType::F64,
        }
    }
}

impl KvArray {
    /// The type of its elements.
    pub fn kind(&self) -> KvType {
        match self {
            KvArray::U8(_) => KvType::U8,
            KvArray::I8(_) => KvType::I8,
            KvArray::U16(_) => KvType::U16,
            KvArray::I16(_) => KvType::I16,
            KvArray::U32(_) => KvType::U32,
            KvArray::I32(_) => KvType::I32,
            KvArray::F32(_) => KvType::F32,
            KvArray::Bool(_) => KvType::Bool,
            KvArray::String(_) => KvType::String,
            KvArray::Array(_) => KvType::Array,
            KvArray::U64(_) => KvType::U64,
            KvArray::I64(_) => KvType::I64,
            KvArray::F64(_) => KvType::F64,
        }
    }

    /// How many elements it has.
    pub fn len(&self) -> usize {
        match self {
            KvArray::U8(v) => v.len(),
            KvArray::I8(v) => v.len(),
            KvArray::U16(v) => v.len(),
            KvArray::I16(v) => v.len(),
            KvArray::U32(v) | KvArray::F32(v) => v.len(),
            KvArray::I32(v) => v.len(),
            KvArray::Bool(v) => v.len(),
            KvArray::String(v) => v.len(),
            KvArray::Array(v) => v.len(),
            KvArray::U64(v) | KvArray::F64(v) => v.len(),
            KvArray::I64(v) => v.len(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its elements as integers, when it is an array of integers.
    pub fn integers(&self) -> Option<Vec<i128>> {
        fn all<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|x| (*x).into()).collect()
        }
        Some(match self {
            KvArray::U8(v) => all(v),
            KvArray::I8(v) => all(v),
            KvArray::U16(v) => all(v),
            KvArray::I16(v) => all(v),
            KvArray::U32(v) => all(v),
            KvArray::I32(v) => all(v),
            KvArray::U64(v) => all(v),
            KvArray::I64(v) => all(v),
            _ => return None,
        })
    }
}

/// One tensor info.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// ggml's extents, fastest-varying first (the reverse of a row-major shape).
    pub ne: Vec<u64>,
    /// The ggml type id ([`ggml_type`]).
    pub ggml_type: u32,
    /// Where its bytes start, from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// The row-major shape: `ne` reversed.
    pub fn shape(&self) -> Vec<u64> {
        self.ne.iter().rev().copied().collect()
    }

    /// Its element count.
    ///
    /// # Errors
    /// An extent or the count is past `i64::MAX` (ggml's limit).
    pub fn elements(&self) -> FormatResult<u64> {
        let bad = |why: String| FormatError::Invalid(format!("tensor {:?}: {why}", self.name));
        let mut count: u64 = 1;
        for &e in &self.ne {
            if e > i64::MAX as u64 {
                return Err(bad(format!("extent {e} is past ggml's limit of 2^63 − 1")));
            }
            count = count
                .checked_mul(e)
                .filter(|c| *c <= i64::MAX as u64)
                .ok_or_else(|| {
                    bad(format!(
                        "extents {:?} hold more than 2^63 − 1 elements",
                        self.ne
                    ))
                })?;
        }
        Ok(count)
    }

    /// Its type.
    ///
    /// # Errors
    /// The id is not a ggml type TensorFS knows.
    pub fn kind(&self) -> FormatResult<&'static GgmlType> {
        ggml_type(self.ggml_type).ok_or_else(|| {
            FormatError::Invalid(format!(
                "tensor {:?}: ggml type {} is not one TensorFS knows",
                self.name, self.ggml_type
            ))
        })
    }

    /// Its bytes in the data section: `ne[0]/n · S · ne[1] · …`.
    ///
    /// # Errors
    /// An unknown type, a first extent that is not whole blocks (ggml refuses it too), or a
    /// count or size past the integer limits.
    pub fn nbytes(&self) -> FormatResult<u64> {
        let kind = self.kind()?;
        let elements = self.elements()?;
        let first = self.ne.first().copied().unwrap_or(1);
        if !first.is_multiple_of(kind.block) {
            return Err(FormatError::Invalid(format!(
                "tensor {:?}: ne[0] = {first} is not a multiple of {}'s block size {}",
                self.name, kind.name, kind.block
            )));
        }
        // `elements / block` whole blocks: exact, since the first extent is whole blocks.
        (elements / kind.block)
            .checked_mul(kind.size)
            .ok_or_else(|| {
                FormatError::Invalid(format!(
                    "tensor {:?}: {elements} elements of {} take more than 2^64 bytes",
                    self.name, kind.name
                ))
            })
    }
}

/// A GGUF header: version, KV in file order, tensor infos in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gguf {
    /// 2 or 3.
    pub version: u32,
    /// Keys and values in file order.
    pub kv: Vec<(String, KvValue)>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
}

impl Gguf {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&KvValue> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The alignment: `general.alignment`, else [`DEFAULT_ALIGNMENT`].
    ///
    /// # Errors
    /// `general.alignment` is not a `u32` power of two (ggml refuses it too).
    pub fn alignment(&self) -> FormatResult<u64> {
        match self.get(ALIGNMENT_KEY) {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(KvValue::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
            Some(other) => Err(FormatError::Invalid(format!(
                "key {ALIGNMENT_KEY:?} is {}, not a u32 power of two",
                show(other)
            ))),
        }
    }
}

/// Where a header's parts are in its file, as [`layout`] checked them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The header's bytes before its padding.
    pub header_len: u64,
    /// The alignment.
    pub alignment: u64,
    /// Where the data section starts: `header_len` rounded up to the alignment.
    pub data_start: u64,
    /// Each tensor's byte length, in info order.
    pub lengths: Vec<u64>,
    /// Tensor indices in data order (by offset; a zero-length tensor before one at its offset).
    pub order: Vec<usize>,
    /// Where the last byte of the header or of any tensor ends: the file holds at least this.
    pub content_end: u64,
}

/// A parsed header and its layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// The header.
    pub gguf: Gguf,
    /// Where its parts are.
    pub layout: Layout,
}

/// Why [`parse`] did not return a header.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GgufError {
    /// The header goes on past the prefix given: parse again with at least this many bytes.
    #[error("the GGUF header goes on past the bytes read; read {0} bytes")]
    Incomplete(u64),
    /// The file is refused.
    #[error(transparent)]
    Format(#[from] FormatError),
}

type Parse<T> = Result<T, GgufError>;

/// Parses the header of a GGUF file of `file_len` bytes from `prefix`, its first bytes (the
/// whole file, or enough of it), and checks its layout against the file's length.
///
/// # Errors
/// [`GgufError::Incomplete`] when the header goes on past `prefix` (but not past the file);
/// [`GgufError::Format`] for every refusal in the module docs, naming the key or tensor.
pub fn parse(prefix: &[u8], file_len: u64) -> Parse<Parsed> {
    let mut r = Reader {
        bytes: prefix,
        file_len,
        pos: 0,
    };
    let magic = r.take(4, "the magic")?;
    if magic != MAGIC {
        return Err(encoding(format!(
            "not a GGUF file: it starts with {}, not {:?}",
            hex_bytes(magic),
            "GGUF"
        )));
    }
    let version = r.u32("the version")?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(encoding(
                "GGUF version 1 (32-bit counts) is not read; only versions 2 and 3".into(),
            ))
        }
        v if matches!(v.swap_bytes(), 2 | 3) => {
            return Err(encoding(format!(
                "a big-endian GGUF (version {}) is not read; only little-endian files",
                v.swap_bytes()
            )))
        }
        v => {
            return Err(encoding(format!(
                "GGUF version {v} is not read; only versions 2 and 3"
            )))
        }
    }
    let tensor_count = r.u64("the tensor count")?;
    let kv_count = r.u64("the KV count")?;
    // A KV takes at least 13 bytes (key length, type, a byte), a tensor info 24.
    let room = file_len.saturating_sub(r.pos);
    let needed = u128::from(kv_count) * 13 + u128::from(tensor_count) * 24;
    if needed > u128::from(room) {
        return Err(encoding(format!(
            "the header claims {kv_count} keys and {tensor_count} tensors, more than the \
             {room} bytes left in a {file_len}-byte file can hold"
        )));
    }
    let mut kv = Vec::with_capacity(r.capacity(kv_count, 13));
    for i in 0..kv_count {
        let key = r
            .string()
            .map_err(|e| within(e, &format!("key #{i}")))?
            .map_err(|lossy| encoding(format!("key #{i} ({lossy:?}) is not UTF-8")))?;
        let value = r
            .typed_value(0)
            .map_err(|e| within(e, &format!("key {key:?}")))?;
        kv.push((key, value));
    }
    let mut tensors = Vec::with_capacity(r.capacity(tensor_count, 24));
    for i in 0..tensor_count {
        let name = r
            .string()
            .map_err(|e| within(e, &format!("tensor #{i}")))?
            .map_err(|lossy| encoding(format!("tensor #{i}: its name {lossy:?} is not UTF-8")))?;
        let info = r
            .tensor_info(name.clone())
            .map_err(|e| within(e, &format!("tensor {name:?}")))?;
        tensors.push(info);
    }
    let gguf = Gguf {
        version,
        kv,
        tensors,
    };
    let layout = layout(&gguf, file_len)?;
    debug_assert_eq!(layout.header_len, r.pos);
    Ok(Parsed { gguf, layout })
}

/// Checks `gguf` as the header of a file of `file_len` bytes: keys and tensor names unique,
/// names usable as tensor keys, types known, extents and sizes within the limits, the
/// alignment, and every tensor's bytes aligned, not overlapping another's and within the file.
///
/// # Errors
/// The first rule broken, naming the key or tensor.
pub fn layout(gguf: &Gguf, file_len: u64) -> FormatResult<Layout> {
    if !matches!(gguf.version, 2 | 3) {
        return Err(FormatError::Invalid(format!(
            "GGUF version {} is not written; only versions 2 and 3",
            gguf.version
        )));
    }
    let mut keys: HashMap<&str, ()> = HashMap::with_capacity(gguf.kv.len());
    for (key, value) in &gguf.kv {
        if keys.insert(key, ()).is_some() {
            return Err(FormatError::Invalid(format!("key {key:?} appears twice")));
        }
        check_depth(value, key)?;
    }
    let alignment = gguf.alignment()?;
    let header_len = header_len(gguf);
    if header_len > MAX_HEADER_BYTES {
        return Err(FormatError::Invalid(format!(
            "the header takes {header_len} bytes, over the {MAX_HEADER_BYTES}-byte limit"
        )));
    }
    if header_len > file_len {
        return Err(FormatError::Invalid(format!(
            "the {header_len}-byte header does not fit in a {file_len}-byte file"
        )));
    }
    let data_start = header_len.next_multiple_of(alignment);
    let mut names: HashMap<&str, ()> = HashMap::with_capacity(gguf.tensors.len());
    let mut lengths = Vec::with_capacity(gguf.tensors.len());
    let mut content_end = header_len;
    for t in &gguf.tensors {
        let bad = |why: String| FormatError::Invalid(format!("tensor {:?}: {why}", t.name));
        if t.name.is_empty() {
            return Err(FormatError::Invalid("a tensor has an empty name".into()));
        }
        if names::has_control(&t.name) {
            return Err(bad("a name may not hold NUL or control characters".into()));
        }
        if names.insert(&t.name, ()).is_some() {
            return Err(bad("the name appears twice".into()));
        }
        if t.ne.len() > MAX_DIMS {
            return Err(bad(format!(
                "{} dimensions, more than {MAX_DIMS}",
                t.ne.len()
            )));
        }
        let nbytes = t.nbytes()?;
        if !t.offset.is_multiple_of(alignment) {
            return Err(bad(format!(
                "offset {} is not a multiple of the alignment {alignment}",
                t.offset
            )));
        }
        let end = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(nbytes))
            .filter(|end| *end <= file_len)
            .ok_or_else(|| {
                bad(format!(
                    "its {nbytes} bytes at offset {} of the data section (which starts at \
                     {data_start}) run past the end of the {file_len}-byte file",
                    t.offset
                ))
            })?;
        content_end = content_end.max(end);
        lengths.push(nbytes);
    }
    let mut order: Vec<usize> = (0..gguf.tensors.len()).collect();
    order.sort_by_key(|&i| (gguf.tensors[i].offset, lengths[i]));
    let mut last: Option<usize> = None;
    for &i in &order {
        if lengths[i] == 0 {
            continue;
        }
        if let Some(p) = last {
            let (prev, t) = (&gguf.tensors[p], &gguf.tensors[i]);
            if prev.offset + lengths[p] > t.offset {
                return Err(FormatError::Invalid(format!(
                    "tensor {:?} at [{}, {}) of the data section overlaps tensor {:?} at \
                     [{}, {})",
                    t.name,
                    t.offset,
                    t.offset + lengths[i],
                    prev.name,
                    prev.offset,
                    prev.offset + lengths[p]
                )));
            }
        }
        last = Some(i);
    }
    Ok(Layout {
        header_len,
        alignment,
        data_start,
        lengths,
        order,
        content_end,
    })
}

fn check_depth(value: &KvValue, key: &str) -> FormatResult<()> {
    fn depth(a: &KvArray) -> usize {
        match a {
            KvArray::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
            _ => 1,
        }
    }
    match value {
        KvValue::Array(a) if depth(a) > MAX_ARRAY_DEPTH => Err(FormatError::Invalid(format!(
            "key {key:?}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
        ))),
        _ => Ok(()),
    }
}

/// The header's bytes, padding to the alignment included: what a file with this header holds
/// before its data section.
///
/// # Errors
/// `general.alignment` is not a `u32` power of two.
pub fn write(gguf: &Gguf) -> FormatResult<Vec<u8>> {
    let alignment = gguf.alignment()?;
    let mut out = write_unpadded(gguf);
    let padded = (out.len() as u64).next_multiple_of(alignment);
    out.resize(padded as usize, 0);
    Ok(out)
}

/// The header's bytes before its padding.
pub fn write_unpadded(gguf: &Gguf) -> Vec<u8> {
    let mut out = Vec::with_capacity(header_len(gguf) as usize);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&gguf.version.to_le_bytes());
    out.extend_from_slice(&(gguf.tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(gguf.kv.len() as u64).to_le_bytes());
    for (key, value) in &gguf.kv {
        put_string(&mut out, key);
        out.extend_from_slice(&value.kind().code().to_le_bytes());
        put_value(&mut out, value);
    }
    for t in &gguf.tensors {
        put_string(&mut out, &t.name);
        out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
        for e in &t.ne {
            out.extend_from_slice(&e.to_le_bytes());
        }
        out.extend_from_slice(&t.ggml_type.to_le_bytes());
        out.extend_from_slice(&t.offset.to_le_bytes());
    }
    out
}

/// The length of [`write_unpadded`]'s bytes, without writing them.
pub fn header_len(gguf: &Gguf) -> u64 {
    fn array_len(a: &KvArray) -> u64 {
        let n = a.len() as u64;
        12 + match a {
            KvArray::U8(_) | KvArray::I8(_) | KvArray::Bool(_) => n,
            KvArray::U16(_) | KvArray::I16(_) => 2 * n,
            KvArray::U32(_) | KvArray::I32(_) | KvArray::F32(_) => 4 * n,
            KvArray::U64(_) | KvArray::I64(_) | KvArray::F64(_) => 8 * n,
            KvArray::String(v) => v.iter().map(|s| 8 + s.len() as u64).sum(),
            KvArray::Array(v) => v.iter().map(array_len).sum(),
        }
    }
    let value_len = |v: &KvValue| match v {
        KvValue::String(s) => 8 + s.len() as u64,
        KvValue::Array(a) => array_len(a),
        other => other.kind().min_size(),
    };
    let kv: u64 = gguf
        .kv
        .iter()
        .map(|(k, v)| 8 + k.len() as u64 + 4 + value_len(v))
        .sum();
    let tensors: u64 = gguf
        .tensors
        .iter()
        .map(|t| 8 + t.name.len() as u64 + 4 + 8 * t.ne.len() as u64 + 4 + 8)
        .sum();
    24 + kv + tensors
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &KvValue) {
    match value {
        KvValue::U8(v) => out.push(*v),
        KvValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        KvValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        KvValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        KvValue::U32(v) | KvValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        KvValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        KvValue::Bool(v) => out.push(u8::from(*v)),
        KvValue::String(s) => put_string(out, s),
        KvValue::Array(a) => put_array(out, a),
        KvValue::U64(v) | KvValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        KvValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &KvArray) {
    out.extend_from_slice(&a.kind().code().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        KvArray::U8(v) => out.extend_from_slice(v),
        KvArray::I8(v) => each!(v),
        KvArray::U16(v) => each!(v),
        KvArray::I16(v) => each!(v),
        KvArray::U32(v) | KvArray::F32(v) => each!(v),
        KvArray::I32(v) => each!(v),
        KvArray::Bool(v) => out.extend(v.iter().map(|b| u8::from(*b))),
        KvArray::String(v) => v.iter().for_each(|s| put_string(out, s)),
        KvArray::Array(v) => v.iter().for_each(|a| put_array(out, a)),
        KvArray::U64(v) | KvArray::F64(v) => each!(v),
        KvArray::I64(v) => each!(v),
    }
}

/// A value for messages: its type and, for a scalar, the value.
fn show(v: &KvValue) -> String {
    match v {
        KvValue::String(s) => format!("the string {s:?}"),
        KvValue::Array(a) => format!("an array of {} {:?}", a.len(), a.kind()),
        KvValue::Bool(b) => format!("the bool {b}"),
        KvValue::F32(bits) => format!("the f32 {}", f32::from_bits(*bits)),
        KvValue::F64(bits) => format!("the f64 {}", f64::from_bits(*bits)),
        KvValue::U8(x) => format!("the u8 {x}"),
        KvValue::I8(x) => format!("the i8 {x}"),
        KvValue::U16(x) => format!("the u16 {x}"),
        KvValue::I16(x) => format!("the i16 {x}"),
        KvValue::U32(x) => format!("the u32 {x}"),
        KvValue::I32(x) => format!("the i32 {x}"),
        KvValue::U64(x) => format!("the u64 {x}"),
        KvValue::I64(x) => format!("the i64 {x}"),
    }
}

fn encoding(why: String) -> GgufError {
    GgufError::Format(FormatError::Encoding(why))
}

/// `e` with `what` (the key or tensor being read) before its message.
fn within(e: GgufError, what: &str) -> GgufError {
    match e {
        GgufError::Format(FormatError::Encoding(m)) => encoding(format!("{what}: {m}")),
        GgufError::Format(FormatError::Invalid(m)) => {
            GgufError::Format(FormatError::Invalid(format!("{what}: {m}")))
        }
        other => other,
    }
}

fn hex_bytes(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Reads a header from a prefix of a file.
struct Reader<'a> {
    bytes: &'a [u8],
    file_len: u64,
    pos: u64,
}

impl<'a> Reader<'a> {
    /// The next `n` bytes (`what` they are, for the message when the file ends first).
    fn take(&mut self, n: u64, what: &str) -> Parse<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.file_len)
            .ok_or_else(|| {
                encoding(format!(
                    "{what} ({n} bytes at offset {}) runs past the end of the {}-byte file",
                    self.pos, self.file_len
                ))
            })?;
        if end > MAX_HEADER_BYTES {
            return Err(encoding(format!(
                "{what} at offset {} runs past the {MAX_HEADER_BYTES}-byte limit of a header",
                self.pos
            )));
        }
        if end > self.bytes.len() as u64 {
            return Err(GgufError::Incomplete(end));
        }
        let out = &self.bytes[self.pos as usize..end as usize];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Parse<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &str) -> Parse<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Parse<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// How many of `count` items of at least `min` bytes to reserve room for: no more than the
    /// prefix can still hold, so a count never reserves memory for bytes not read.
    fn capacity(&self, count: u64, min: u64) -> usize {
        let left = (self.bytes.len() as u64).saturating_sub(self.pos);
        count.min(left / min) as usize
    }

    /// Checks that `count` items of at least `min` bytes each fit in the rest of the file.
    fn fits(&self, count: u64, min: u64, what: &str) -> Parse<()> {
        let left = self.file_len.saturating_sub(self.pos);
        if u128::from(count) * u128::from(min) > u128::from(left) {
            return Err(encoding(format!(
                "{what} of {count} elements cannot fit in the {left} bytes left in the file"
            )));
        }
        Ok(())
    }

    /// A string, or its lossy reading when its bytes are not UTF-8.
    fn string(&mut self) -> Parse<Result<String, String>> {
        let n = self.u64("a string's length")?;
        let bytes = self.take(n, "a string")?;
        Ok(std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| String::from_utf8_lossy(bytes).into_owned()))
    }

    fn utf8(&mut self) -> Parse<String> {
        self.string()?
            .map_err(|lossy| encoding(format!("the string {lossy:?} is not UTF-8")))
    }

    fn kv_type(&mut self) -> Parse<KvType> {
        let at = self.pos;
        let code = self.u32("a value type")?;
        KvType::from_code(code).ok_or_else(|| {
            encoding(format!(
                "value type {code} (at offset {at}) is not a GGUF type (0 to 12)"
            ))
        })
    }

    /// A value type and a value of it; `depth` arrays enclose it.
    fn typed_value(&mut self, depth: usize) -> Parse<KvValue> {
        let kind = self.kv_type()?;
        self.value(kind, depth)
    }

    fn value(&mut self, kind: KvType, depth: usize) -> Parse<KvValue> {
        Ok(match kind {
            KvType::U8 => KvValue::U8(self.array::<1>("a u8")?[0]),
            KvType::I8 => KvValue::I8(i8::from_le_bytes(self.array("an i8")?)),
            KvType::U16 => KvValue::U16(u16::from_le_bytes(self.array("a u16")?)),
            KvType::I16 => KvValue::I16(i16::from_le_bytes(self.array("an i16")?)),
            KvType::U32 => KvValue::U32(self.u32("a u32")?),
            KvType::I32 => KvValue::I32(i32::from_le_bytes(self.array("an i32")?)),
            KvType::F32 => KvValue::F32(self.u32("an f32")?),
            KvType::Bool => KvValue::Bool(self.bool()?),
            KvType::String => KvValue::String(self.utf8()?),
            KvType::Array => KvValue::Array(self.array_value(depth + 1)?),
            KvType::U64 => KvValue::U64(self.u64("a u64")?),
            KvType::I64 => KvValue::I64(i64::from_le_bytes(self.array("an i64")?)),
            KvType::F64 => KvValue::F64(self.u64("an f64")?),
        })
    }

    fn bool(&mut self) -> Parse<bool> {
        match self.array::<1>("a bool")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(encoding(format!(
                "a bool is the byte {b}, not 0 or 1 (at offset {})",
                self.pos - 1
            ))),
        }
    }

    /// An array's type, count and elements, at nesting `depth` (1 for a top-level array).
    fn array_value(&mut self, depth: usize) -> Parse<KvArray> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(encoding(format!(
                "arrays nested deeper than {MAX_ARRAY_DEPTH}"
            )));
        }
        let kind = self.kv_type()?;
        let count = self.u64("an array's count")?;
        self.fits(count, kind.min_size(), &format!("an array of {kind:?}"))?;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let size = std::mem::size_of::<$t>() as u64;
                let bytes = self.take(count * size, "an array's elements")?;
                KvArray::$variant(
                    bytes
                        .chunks_exact(size as usize)
                        .map(|c| <$t>::from_le_bytes(c.try_into().expect("one element")))
                        .collect(),
                )
            }};
        }
        Ok(match kind {
            KvType::U8 => KvArray::U8(self.take(count, "an array's elements")?.to_vec()),
            KvType::I8 => fixed!(I8, i8),
            KvType::U16 => fixed!(U16, u16),
            KvType::I16 => fixed!(I16, i16),
            KvType::U32 => fixed!(U32, u32),
            KvType::I32 => fixed!(I32, i32),
            KvType::F32 => fixed!(F32, u32),
            KvType::U64 => fixed!(U64, u64),
            KvType::I64 => fixed!(I64, i64),
            KvType::F64 => fixed!(F64, u64),
            KvType::Bool => {
                let at = self.pos;
                let bytes = self.take(count, "an array's elements")?;
                let mut out = Vec::with_capacity(bytes.len());
                for (i, b) in bytes.iter().enumerate() {
                    match b {
                        0 | 1 => out.push(*b == 1),
                        b => {
                            return Err(encoding(format!(
                                "element {i} of a bool array is the byte {b}, not 0 or 1 \
                                 (at offset {})",
                                at + i as u64
                            )))
                        }
                    }
                }
                KvArray::Bool(out)
            }
            KvType::String => {
                let mut out = Vec::with_capacity(self.capacity(count, 8));
                for i in 0..count {
                    let s = self.string()?.map_err(|lossy| {
                        encoding(format!("element {i} ({lossy:?}) is not UTF-8"))
                    })?;
                    out.push(s);
                }
                KvArray::String(out)
            }
            KvType::Array => {
                let mut out = Vec::with_capacity(self.capacity(count, 12));
                for _ in 0..count {
                    out.push(self.array_value(depth + 1)?);
                }
                KvArray::Array(out)
            }
        })
    }

    /// The rest of a tensor info, after its name.
    fn tensor_info(&mut self, name: String) -> Parse<TensorInfo> {
        let n_dims = self.u32("the dimension count")?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::Format(FormatError::Invalid(format!(
                "{n_dims} dimensions, more than {MAX_DIMS}"
            ))));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(self.u64("an extent")?);
        }
        let ggml_type = self.u32("the ggml type")?;
        let offset = self.u64("the offset")?;
        Ok(TensorInfo {
            name,
            ne,
            ggml_type,
            offset,
        })
    }
}

#[cfg(test)]
mod tests;
