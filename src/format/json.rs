//! Strict JSON in, canonical JSON out (spec §9), and the Hugging Face config writer.
//!
//! [`parse`] reads RFC 8259 JSON from UTF-8 bytes and refuses a repeated key in any object,
//! `NaN`/`Infinity`, and integers outside [−2^63, 2^64). Numbers with a fraction or exponent
//! are [`Json::Float`]; documents (trees, repos) refuse them, configs keep them.

use super::{FormatResult, Value};

/// A parsed JSON value; objects keep document order.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer ≥ 0 written without fraction or exponent.
    Uint(u64),
    /// A negative integer (≥ −2^63) written without fraction or exponent.
    Int(i64),
    /// A number with a fraction or exponent (finite).
    Float(f64),
    /// A string.
    Text(String),
    /// An array.
    Array(Vec<Json>),
    /// An object, entries in document order, keys unique.
    Object(Vec<(String, Json)>),
}

/// Parses one JSON value spanning `bytes` (surrounding whitespace allowed).
///
/// # Errors
/// [`super::FormatError::Encoding`] for invalid UTF-8 or JSON (with line and column), a
/// repeated key (naming it), a non-finite or out-of-range number.
pub fn parse(bytes: &[u8]) -> FormatResult<Json> {
    let _ = bytes;
    todo!("json parse")
}

/// The canonical form of a document (spec §9): keys sorted by UTF-8 bytes, no whitespace,
/// shortest integers, the spec's string escapes.
///
/// # Errors
/// A [`Json::Float`] or [`Json::Null`] anywhere (documents hold neither).
pub fn canonical(json: &Json) -> FormatResult<String> {
    let _ = json;
    todo!("canonical json")
}

/// A config as the header holds it: objects become canonical maps, floats and null are kept.
pub fn to_value(json: &Json) -> Value {
    let _ = json;
    todo!("json to value")
}

/// The JSON of a header value (a config, metadata); byte strings become lowercase hex text.
pub fn from_value(value: &Value) -> Json {
    let _ = value;
    todo!("value to json")
}

/// A config file as the Hugging Face libraries write one: Python's
/// `json.dumps(config, indent=2, sort_keys=True) + "\n"` (ASCII-escaped, floats as Python's
/// `repr`). Used for configs of checkpoints imported without their original bytes.
pub fn hf_config_text(config: &Json) -> String {
    let _ = config;
    todo!("hf config text")
}
