//! The safetensors container: `u64` little-endian header length `N`, `N` bytes of UTF-8 JSON,
//! then the data buffer that the header's `data_offsets` index.
//!
//! [`parse_header`] is strict where loaders are lenient, so that nothing imported is ambiguous:
//! it refuses a header over [`MAX_HEADER_BYTES`], a length past the end of the file, repeated
//! keys, `__metadata__` that is not a map of strings, unknown dtypes, names with NUL or control
//! characters, `data_offsets` whose span is not dtype × shape, ranges that overlap or leave
//! holes, and bytes after the last tensor. [`canonical_header`] writes a header exactly as the
//! safetensors library (0.4–0.8) does for the same tensors and metadata.
//!
//! Two refusals go past the library's reader on purpose. A tensor entry with a field other
//! than `dtype`, `shape` and `data_offsets` is refused where the library ignores it: a later
//! writer's field could change what the bytes mean, and a file we cannot fully read is better
//! refused than silently rewritten without it. Repeated keys are refused where the library keeps
//! the last. Bytes after the last tensor are refused as the library itself refuses them.

use std::fmt::Write as _;

use super::json::{self, Json};
use super::{names, Dtype, FormatError, FormatResult};

/// The largest header accepted, in bytes (the safetensors library's own limit).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A parsed, validated safetensors header.
#[derive(Clone, Debug, PartialEq)]
pub struct SafetensorsHeader {
    /// `N`: the header's JSON length in bytes, padding included.
    pub json_len: u64,
    /// `__metadata__`, in document order, if present.
    pub metadata: Option<Vec<(String, String)>>,
    /// Tensors in the order of their data (ascending `(begin, end)`, so a zero-length tensor
    /// comes before a tensor starting where it does; ties in document order).
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
    let Some(prefix) = first8.get(..8).filter(|_| file_len >= 8) else {
        return Err(FormatError::Encoding(format!(
            "a safetensors file starts with an 8-byte header length; this one has only {} bytes",
            file_len.min(first8.len() as u64)
        )));
    };
    let n = u64::from_le_bytes(prefix.try_into().expect("eight bytes"));
    // A length no header has is most often a file of another kind (text, a pickle, HTML saved
    // under the name): say that first, and what it starts with when that is text.
    let not_safetensors = |claim: String| {
        let text = prefix
            .iter()
            .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace());
        let starts = match text {
            true => format!(
                " (it starts with the text {:?})",
                String::from_utf8_lossy(prefix)
            ),
            false => String::new(),
        };
        FormatError::Encoding(format!(
            "not a safetensors file{starts}: its first 8 bytes, read as the header length, \
             claim {n} bytes, {claim}"
        ))
    };
    if n > MAX_HEADER_BYTES {
        return Err(not_safetensors(format!(
            "over the {MAX_HEADER_BYTES}-byte limit"
        )));
    }
    if 8 + n > file_len {
        return Err(not_safetensors(format!(
            "past the end of a {file_len}-byte file"
        )));
    }
    Ok(n)
}

/// Parses and validates header JSON `json` (the `N` bytes after the length) of a file of
/// `file_len` bytes: the data buffer must be exactly `file_len − 8 − N` bytes.
///
/// # Errors
/// Every refusal in the module docs, naming the tensor and the numbers.
pub fn parse_header(json: &[u8], file_len: u64) -> FormatResult<SafetensorsHeader> {
    let json_len = json.len() as u64;
    if json_len > MAX_HEADER_BYTES {
        return Err(FormatError::Encoding(format!(
            "the safetensors header has {json_len} bytes, over the {MAX_HEADER_BYTES}-byte limit"
        )));
    }
    let Some(data_len) = file_len.checked_sub(8 + json_len) else {
        return Err(FormatError::Encoding(format!(
            "a {json_len}-byte safetensors header does not fit in a {file_len}-byte file"
        )));
    };
    let parsed =
        json::parse(json).map_err(|e| FormatError::Encoding(format!("safetensors header: {e}")))?;
    let Json::Object(entries) = parsed else {
        return Err(FormatError::Invalid(format!(
            "a safetensors header is a JSON object, not {}",
            parsed.type_name()
        )));
    };
    let mut metadata = None;
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if name == METADATA_KEY {
            metadata = Some(read_metadata(value)?);
        } else {
            tensors.push(read_tensor(name, value)?);
        }
    }
    // Stable, so tensors at the same range keep document order.
    tensors.sort_by_key(|t| (t.begin, t.end));
    let mut expected = 0u64;
    let mut previous: Option<&TensorInfo> = None;
    for tensor in &tensors {
        if tensor.begin != expected {
            let relation = if tensor.begin < expected {
                "overlaps"
            } else {
                "leaves a hole after"
            };
            let after = previous.map_or_else(
                || "the start of the data".to_string(),
                |p| format!("tensor {:?} [{}, {}]", p.name, p.begin, p.end),
            );
            return Err(FormatError::Invalid(format!(
                "tensor {:?} at data_offsets [{}, {}] {relation} {after}: tensors must cover \
                 the data buffer contiguously from 0",
                tensor.name, tensor.begin, tensor.end
            )));
        }
        expected = tensor.end;
        previous = Some(tensor);
    }
    if expected != data_len {
        let detail = if expected < data_len {
            format!(
                "{} bytes follow the last tensor, which ends at {expected} (the safetensors \
                 library refuses such files too)",
                data_len - expected
            )
        } else {
            format!("the tensors end at {expected}, past the end of the data")
        };
        return Err(FormatError::Invalid(format!(
            "the data buffer holds {data_len} bytes but {detail}"
        )));
    }
    Ok(SafetensorsHeader {
        json_len,
        metadata,
        tensors,
    })
}

/// The reserved key of the header's string metadata.
const METADATA_KEY: &str = "__metadata__";

fn read_metadata(value: Json) -> FormatResult<Vec<(String, String)>> {
    let Json::Object(entries) = value else {
        return Err(FormatError::Invalid(format!(
            "`{METADATA_KEY}` is {}, not a map of strings",
            value.type_name()
        )));
    };
    let looks_like_tensor = ["dtype", "shape", "data_offsets"]
        .iter()
        .all(|k| entries.iter().any(|(key, _)| key == k));
    entries
        .into_iter()
        .map(|(key, value)| match value {
            Json::Text(text) => Ok((key, text)),
            _ if looks_like_tensor => Err(FormatError::Invalid(format!(
                "`{METADATA_KEY}` is shaped like a tensor entry; the name is reserved for a map \
                 of string metadata and cannot name a tensor"
            ))),
            other => Err(FormatError::Invalid(format!(
                "`{METADATA_KEY}` value of {key:?} is {}, not a string",
                other.type_name()
            ))),
        })
        .collect()
}

/// A JSON array of unsigned integers, for `shape` and `data_offsets`.
fn u64_array(name: &str, field: &str, value: &Json) -> FormatResult<Vec<u64>> {
    let wrong = |what: &str| {
        FormatError::Invalid(format!(
            "tensor {name:?}: `{field}` {what}, not an array of integers ≥ 0"
        ))
    };
    let Json::Array(items) = value else {
        return Err(wrong(&format!("is {}", value.type_name())));
    };
    items
        .iter()
        .map(|item| match item {
            Json::Uint(n) => Ok(*n),
            Json::Int(n) => Err(wrong(&format!("holds {n}"))),
            other => Err(wrong(&format!("holds {}", other.type_name()))),
        })
        .collect()
}

fn read_tensor(name: String, value: Json) -> FormatResult<TensorInfo> {
    if name.is_empty() {
        return Err(FormatError::Invalid(
            "a tensor has an empty name".to_string(),
        ));
    }
    if names::has_control(&name) {
        return Err(FormatError::Invalid(format!(
            "tensor {name:?}: a name may not hold NUL or control characters"
        )));
    }
    let Json::Object(fields) = value else {
        return Err(FormatError::Invalid(format!(
            "tensor {name:?} is {}, not an object {{dtype, shape, data_offsets}}",
            value.type_name()
        )));
    };
    let (mut dtype, mut shape, mut offsets) = (None, None, None);
    for (key, value) in &fields {
        match key.as_str() {
            "dtype" => dtype = Some(value),
            "shape" => shape = Some(value),
            "data_offsets" => offsets = Some(value),
            other => {
                return Err(FormatError::Invalid(format!(
                    "tensor {name:?} has an unknown field {other:?}; only dtype, shape and \
                     data_offsets are read"
                )))
            }
        }
    }
    let missing = |field: &str| FormatError::Invalid(format!("tensor {name:?} has no `{field}`"));
    let dtype = match dtype.ok_or_else(|| missing("dtype"))? {
        Json::Text(text) => Dtype::known(text).ok_or_else(|| {
            FormatError::Invalid(format!("tensor {name:?} has the unknown dtype {text:?}"))
        })?,
        other => {
            return Err(FormatError::Invalid(format!(
                "tensor {name:?}: `dtype` is {}, not a string",
                other.type_name()
            )))
        }
    };
    let shape = u64_array(&name, "shape", shape.ok_or_else(|| missing("shape"))?)?;
    let offsets = u64_array(
        &name,
        "data_offsets",
        offsets.ok_or_else(|| missing("data_offsets"))?,
    )?;
    let [begin, end] = offsets[..] else {
        return Err(FormatError::Invalid(format!(
            "tensor {name:?}: `data_offsets` holds {} integers, not [begin, end]",
            offsets.len()
        )));
    };
    if begin > end {
        return Err(FormatError::Invalid(format!(
            "tensor {name:?}: data_offsets [{begin}, {end}] ends before it begins"
        )));
    }
    let length = dtype
        .byte_len(&shape)
        .map_err(|e| FormatError::Invalid(format!("tensor {name:?}: {e}")))?
        .expect("a known dtype has a size");
    if end - begin != length {
        return Err(FormatError::Invalid(format!(
            "tensor {name:?}: data_offsets [{begin}, {end}] span {} bytes, but {dtype} {shape:?} \
             is {length} bytes",
            end - begin
        )));
    }
    Ok(TensorInfo {
        name,
        dtype,
        shape,
        begin,
        end,
    })
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

/// The order in which the safetensors library writes tensors (its `prepare`): dtype by its
/// enum, descending, then name in byte order. A Diffusers folder's files are in this order.
pub fn library_order(a: (&Dtype, &str), b: (&Dtype, &str)) -> std::cmp::Ordering {
    b.0.rank()
        .cmp(&a.0.rank())
        .then_with(|| a.1.as_bytes().cmp(b.1.as_bytes()))
}

/// The bytes before the data buffer of the file the safetensors library writes for `entries`
/// and `metadata`: the 8-byte length, then JSON with `__metadata__` first (when given) and the
/// tensors sorted by dtype (descending, the library's order) then name, padded with spaces to a
/// multiple of 8. Returns the prefix and the entries' indices in data order; each tensor's data
/// follows the previous one's with no gap.
///
/// `metadata` is written in the order given: the library holds it in a hash map, so its own
/// order is arbitrary beyond one key. For empty metadata and no tensors the library writes
/// `{},"__metadata__":{}}`, which is not JSON; this writes `{"__metadata__":{}}`. Entries are expected to have known dtypes; an unknown one
/// sorts after them all.
pub fn canonical_header(
    entries: &[Entry<'_>],
    metadata: Option<&[(String, String)]>,
) -> (Vec<u8>, Vec<usize>) {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&entries[a], &entries[b]);
        library_order((a.dtype, a.name), (b.dtype, b.name))
    });
    let mut text = String::with_capacity(64 + entries.len() * 96);
    text.push('{');
    let mut first = true;
    let mut separator = |text: &mut String| {
        if !std::mem::take(&mut first) {
            text.push(',');
        }
    };
    if let Some(metadata) = metadata {
        separator(&mut text);
        json::write_string(METADATA_KEY, &mut text);
        text.push_str(":{");
        for (i, (key, value)) in metadata.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            json::write_string(key, &mut text);
            text.push(':');
            json::write_string(value, &mut text);
        }
        text.push('}');
    }
    let mut offset = 0u64;
    for &i in &order {
        let entry = &entries[i];
        separator(&mut text);
        json::write_string(entry.name, &mut text);
        text.push_str(":{\"dtype\":");
        json::write_string(entry.dtype.name(), &mut text);
        text.push_str(",\"shape\":[");
        for (k, extent) in entry.shape.iter().enumerate() {
            if k > 0 {
                text.push(',');
            }
            write!(text, "{extent}").expect("write to string");
        }
        let end = offset + entry.length;
        write!(text, "],\"data_offsets\":[{offset},{end}]}}").expect("write to string");
        offset = end;
    }
    text.push('}');
    // The library pads with spaces so the data starts 8-byte aligned.
    let padded = text.len().next_multiple_of(8);
    let mut out = Vec::with_capacity(8 + padded);
    out.extend_from_slice(&(padded as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out.resize(8 + padded, b' ');
    (out, order)
}

#[cfg(test)]
mod tests;
