//! The safetensors container: `u64` little-endian header length `N`, `N` bytes of UTF-8 JSON,
//! then the data buffer that the header's `data_offsets` index.
//!
//! [`parse_header`] is strict where loaders are lenient, so that nothing imported is ambiguous:
//! it refuses a header over [`MAX_HEADER_BYTES`], a length past the end of the file, repeated
//! keys, `__metadata__` that is not a map of strings, unknown dtypes, names with NUL or control
//! characters, `data_offsets` whose span is not dtype × shape, ranges that overlap or leave
//! holes, and bytes after the last tensor. [`canonical_header`] writes a header exactly as the
//! safetensors library (0.4–0.8) does for the same tensors and metadata.

use super::{Dtype, FormatResult};

/// The largest header accepted, in bytes (the safetensors library's own limit).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A parsed, validated safetensors header.
#[derive(Clone, Debug, PartialEq)]
pub struct SafetensorsHeader {
    /// `N`: the header's JSON length in bytes, padding included.
    pub json_len: u64,
    /// `__metadata__`, in document order, if present.
    pub metadata: Option<Vec<(String, String)>>,
    /// Tensors in the order of their data (ascending `begin`; ties in document order).
    pub tensors: Vec<TensorInfo>,
}

impl SafetensorsHeader {
    /// Where the data buffer starts in the file: `8 + N`.
    pub fn data_start(&self) -> u64 {
        8 + self.json_len
    }

    /// The data buffer's length: the last tensor's end (0 with no tensors).
    pub fn data_len(&self) -> u64 {
        self.tensors.iter().map(|t| t.end).max().unwrap_or(0)
    }
}

/// One tensor entry of a safetensors header.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name (never `__metadata__`).
    pub name: String,
    /// Its dtype (a known safetensors dtype).
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Start of its bytes, relative to the data buffer.
    pub begin: u64,
    /// End (exclusive) of its bytes, relative to the data buffer.
    pub end: u64,
}

/// Reads `N` from the first eight bytes of a file of `file_len` bytes.
///
/// # Errors
/// A file shorter than 8 bytes, `N` over [`MAX_HEADER_BYTES`], or `8 + N` past the end.
pub fn header_len(first8: &[u8], file_len: u64) -> FormatResult<u64> {
    let _ = (first8, file_len);
    todo!("safetensors header len")
}

/// Parses and validates header JSON `json` (the `N` bytes after the length) of a file of
/// `file_len` bytes: the data buffer must be exactly `file_len − 8 − N` bytes.
///
/// # Errors
/// Every refusal in the module docs, naming the tensor and the numbers.
pub fn parse_header(json: &[u8], file_len: u64) -> FormatResult<SafetensorsHeader> {
    let _ = (json, file_len);
    todo!("safetensors parse")
}

/// A tensor to write: name, dtype, shape; its byte length follows from dtype and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Dtype (known).
    pub dtype: &'a Dtype,
    /// Shape.
    pub shape: &'a [u64],
    /// Byte length (dtype × shape).
    pub length: u64,
}

/// The bytes before the data buffer of the file the safetensors library writes for `entries`
/// and `metadata`: the 8-byte length, then JSON with `__metadata__` first (when given) and the
/// tensors sorted by dtype (descending, the library's order) then name, padded with spaces to a
/// multiple of 8. Returns the prefix and the entries' indices in data order; each tensor's data
/// follows the previous one's with no gap.
pub fn canonical_header(
    entries: &[Entry<'_>],
    metadata: Option<&[(String, String)]>,
) -> (Vec<u8>, Vec<usize>) {
    let _ = (entries, metadata);
    todo!("safetensors canonical header")
}
