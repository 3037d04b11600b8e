//! Deterministic CBOR (RFC 8949 §4.2.1) as cozytensors headers use it (spec §9).
//!
//! The value domain: unsigned and negative integers in [−2^63, 2^64), byte and text strings,
//! arrays, maps with text keys, `true`/`false`, and floats and `null`, which only a header's
//! configs may hold (the header layer enforces where; this layer decodes them anywhere).
//!
//! [`decode`] refuses everything §9 refuses about the encoding itself: tags, `undefined` and
//! other simple values, non-finite floats or floats not in their shortest exact width, heads not
//! in shortest form, indefinite lengths, map keys out of bytewise order of their encodings or
//! repeated, non-text map keys, invalid UTF-8, integers out of range, bytes after the root, and
//! nesting deeper than [`MAX_DEPTH`]. So `encode(&decode(b)?) == b` for every accepted `b`.

use super::{FormatError, FormatResult};

/// Deepest array/map nesting accepted; bounds recursion on hostile input.
pub const MAX_DEPTH: usize = 64;

/// A decoded CBOR value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Major type 0: 0 ..= 2^64 − 1.
    Uint(u64),
    /// Major type 1: the value −1 − n, with n ≤ 2^63 − 1 (so the value is ≥ −2^63).
    Nint(u64),
    /// Major type 2.
    Bytes(Vec<u8>),
    /// Major type 3, valid UTF-8.
    Text(String),
    /// Major type 4.
    Array(Vec<Value>),
    /// Major type 5 with text keys, in canonical order (bytewise order of the keys' encodings:
    /// shorter keys first, then bytewise), no key repeated.
    Map(Vec<(String, Value)>),
    /// `true` / `false`.
    Bool(bool),
    /// `null`.
    Null,
    /// A finite float; encoded in the shortest of half, single, double that holds it exactly.
    Float(f64),
}

impl Value {
    /// The integer value as i128 (for range checks and display); `None` if not an integer.
    pub fn as_int(&self) -> Option<i128> {
        match self {
            Value::Uint(n) => Some(*n as i128),
            Value::Nint(n) => Some(-1 - *n as i128),
            _ => None,
        }
    }

    /// The text, if a text string.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Value::Text(t) => Some(t),
            _ => None,
        }
    }

    /// A map value from entries in any order: sorts them canonically.
    ///
    /// # Panics
    /// Never; a repeated key keeps both entries, which [`encode`] then writes and [`decode`]
    /// would refuse, so callers build maps from unique keys (e.g. a `BTreeMap`).
    pub fn map(entries: impl IntoIterator<Item = (String, Value)>) -> Value {
        let mut entries: Vec<_> = entries.into_iter().collect();
        entries.sort_by(|(a, _), (b, _)| key_order(a, b));
        Value::Map(entries)
    }
}

/// Canonical order of text map keys: by encoded length (the head), then bytewise.
pub fn key_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.len().cmp(&b.len()).then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// Decodes exactly one deterministic CBOR value spanning all of `bytes`.
///
/// # Errors
/// [`FormatError::Encoding`] naming the byte offset and the rule broken.
pub fn decode(bytes: &[u8]) -> FormatResult<Value> {
    let _ = bytes;
    todo!("cbor decode")
}

/// Encodes `value` in core deterministic encoding (shortest heads, definite lengths, floats in
/// their shortest exact width, map entries in canonical key order).
///
/// # Errors
/// A non-finite float, or a map with a repeated key.
pub fn encode(value: &Value) -> FormatResult<Vec<u8>> {
    let _ = value;
    todo!("cbor encode")
}

#[allow(dead_code)]
fn _unused(_: FormatError) {}
