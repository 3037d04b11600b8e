//! Strict JSON in, canonical JSON out (spec §9), and the Hugging Face config writer.
//!
//! [`parse`] reads RFC 8259 JSON from UTF-8 bytes and refuses a repeated key in any object,
//! `NaN`/`Infinity`, and integers outside [−2^63, 2^64). Numbers with a fraction or exponent
//! are [`Json::Float`]; documents (trees, repos) refuse them, configs keep them.
//! [`parse_config`] reads the JSON a model's producers wrote, where an integer past that range
//! is a float.
//!
//! The parser is our own rather than serde_json's: only the number's spelling tells an
//! out-of-range integer (refused) from a float with an exponent (kept), and serde_json without
//! `arbitrary_precision` hands both over as the same `f64`.

use std::collections::HashSet;
use std::fmt::Write as _;

use super::{FormatError, FormatResult, ObjectRef, Sha256, Value};

/// Deepest array/object nesting [`parse`] accepts (serde_json's default); bounds recursion on
/// hostile input.
pub const MAX_DEPTH: usize = 128;

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

impl Json {
    /// The name of this value's JSON type, for messages about a field of the wrong type.
    pub fn type_name(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Uint(_) | Json::Int(_) => "an integer",
            Json::Float(_) => "a number with a fraction or exponent",
            Json::Text(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }

    /// The value of `key`, if this is an object holding it.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Parses one JSON value spanning `bytes` (surrounding whitespace allowed).
///
/// # Errors
/// [`super::FormatError::Encoding`] for invalid UTF-8 or JSON (with line and column), a
/// repeated key (naming it), a non-finite or out-of-range number.
pub fn parse(bytes: &[u8]) -> FormatResult<Json> {
    parse_with(bytes, false)
}

/// Parses JSON a model's producers wrote (configs, quantization declarations, shard indexes)
/// as [`parse`] does, except that an integer outside [−2^63, 2^64) is read as the nearest
/// [`Json::Float`]: configs may hold floats (spec §4), Transformers writes
/// `"model_max_length": 1000000000000000019884624838656` for a tokenizer without a limit, and
/// the reference (serde_json) reads such an integer as that float.
///
/// # Errors
/// As [`parse`], and an integer too large for a finite float.
pub fn parse_config(bytes: &[u8]) -> FormatResult<Json> {
    parse_with(bytes, true)
}

fn parse_with(bytes: &[u8], wide_integers: bool) -> FormatResult<Json> {
    if let Err(e) = std::str::from_utf8(bytes) {
        let at = e.valid_up_to();
        return Err(FormatError::Encoding(format!(
            "invalid JSON: not UTF-8 at {}",
            position(bytes, at)
        )));
    }
    let mut parser = Parser {
        bytes,
        pos: 0,
        wide_integers,
    };
    parser.skip_ws();
    let result = parser.value(0).and_then(|value| {
        parser.skip_ws();
        if parser.pos < bytes.len() {
            return Err(parser.fail("trailing characters after the JSON value"));
        }
        Ok(value)
    });
    result.map_err(|e| {
        let mut path = String::from("$");
        for seg in e.path.iter().rev() {
            path.push_str(seg);
        }
        FormatError::Encoding(format!(
            "invalid JSON at {path} ({}): {}",
            position(bytes, e.pos),
            e.message
        ))
    })
}

/// `line L, column C` (both from 1; the column counts characters) of byte offset `at`.
fn position(bytes: &[u8], at: usize) -> String {
    let before = &bytes[..at.min(bytes.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    // Continuation bytes do not start a character.
    let column = before[line_start..]
        .iter()
        .filter(|&&b| b & 0xC0 != 0x80)
        .count()
        + 1;
    format!("line {line}, column {column}")
}

/// A parse failure on its way out: the path is collected innermost first as the recursion
/// unwinds, so a successful parse never pays for it.
struct ParseError {
    message: String,
    pos: usize,
    path: Vec<String>,
}

impl ParseError {
    fn within(mut self, segment: String) -> ParseError {
        self.path.push(segment);
        self
    }
}

type ParseResult<T> = Result<T, ParseError>;

/// A path segment for a key: `.key` when it reads unambiguously, else `["key"]`.
pub(crate) fn key_segment(key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    if plain {
        format!(".{key}")
    } else {
        format!("[{key:?}]")
    }
}

/// Objects with more entries than this check repeated keys with a hash set; smaller ones scan,
/// which is cheaper than hashing for the few keys most objects hold.
const SCAN_KEYS: usize = 8;

/// A recursive-descent parser over input already known to be UTF-8, so any slice between ASCII
/// delimiters is valid text.
struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Whether an integer outside [−2^63, 2^64) is read as a float ([`parse_config`]) rather
    /// than refused.
    wide_integers: bool,
}

impl<'a> Parser<'a> {
    fn fail(&self, message: impl Into<String>) -> ParseError {
        self.fail_at(self.pos, message)
    }

    fn fail_at(&self, pos: usize, message: impl Into<String>) -> ParseError {
        ParseError {
            message: message.into(),
            pos,
            path: Vec::new(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn expect_literal(&mut self, literal: &[u8], value: Json) -> ParseResult<Json> {
        if self.bytes[self.pos..].starts_with(literal) {
            self.pos += literal.len();
            Ok(value)
        } else {
            Err(self.fail("expected a JSON value"))
        }
    }

    fn value(&mut self, depth: usize) -> ParseResult<Json> {
        match self.peek() {
            None => Err(self.fail("unexpected end of input, expected a value")),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(Json::Text),
            Some(b't') => self.expect_literal(b"true", Json::Bool(true)),
            Some(b'f') => self.expect_literal(b"false", Json::Bool(false)),
            Some(b'n') => self.expect_literal(b"null", Json::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'N' | b'I') => Err(self.fail("NaN and Infinity are not JSON numbers")),
            Some(_) => Err(self.fail("expected a JSON value")),
        }
    }

    fn enter(&self, depth: usize) -> ParseResult<()> {
        if depth > MAX_DEPTH {
            Err(self.fail(format!("nested deeper than {MAX_DEPTH} levels")))
        } else {
            Ok(())
        }
    }

    fn array(&mut self, depth: usize) -> ParseResult<Json> {
        self.enter(depth)?;
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Json::Array(items));
        }
        loop {
            let item = self
                .value(depth)
                .map_err(|e| e.within(format!("[{}]", items.len())))?;
            items.push(item);
            self.skip_ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(self.fail("expected ',' or ']' in an array")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> ParseResult<Json> {
        self.enter(depth)?;
        self.pos += 1;
        let mut entries: Vec<(String, Json)> = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Json::Object(entries));
        }
        loop {
            if self.peek() != Some(b'"') {
                return Err(self.fail("expected a string key in an object"));
            }
            let key_pos = self.pos;
            let key = self.string()?;
            let repeated = if entries.len() < SCAN_KEYS {
                entries.iter().any(|(k, _)| *k == key)
            } else {
                if seen.is_empty() {
                    seen.extend(entries.iter().map(|(k, _)| k.clone()));
                }
                !seen.insert(key.clone())
            };
            if repeated {
                return Err(self.fail_at(key_pos, format!("repeated key {key:?} in an object")));
            }
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(self.fail("expected ':' after an object key"));
            }
            self.pos += 1;
            self.skip_ws();
            let value = match self.value(depth) {
                Ok(value) => value,
                Err(e) => return Err(e.within(key_segment(&key))),
            };
            entries.push((key, value));
            self.skip_ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Json::Object(entries));
                }
                _ => return Err(self.fail("expected ',' or '}' in an object")),
            }
        }
    }

    fn hex4(&mut self) -> ParseResult<u32> {
        let digits = self
            .bytes
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.fail("truncated \\u escape"))?;
        let mut code = 0u32;
        for &d in digits {
            let v = (d as char)
                .to_digit(16)
                .ok_or_else(|| self.fail("a \\u escape needs four hex digits"))?;
            code = code * 16 + v;
        }
        self.pos += 4;
        Ok(code)
    }

    fn string(&mut self) -> ParseResult<String> {
        let start = self.pos;
        self.pos += 1;
        let mut out = String::new();
        loop {
            let run = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // Input is valid UTF-8 and the run stops only at ASCII bytes.
            out.push_str(std::str::from_utf8(&self.bytes[run..self.pos]).expect("utf-8 run"));
            match self.peek() {
                None => return Err(self.fail_at(start, "unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    let escape_pos = self.pos;
                    self.pos += 1;
                    let Some(e) = self.peek() else {
                        return Err(self.fail_at(start, "unterminated string"));
                    };
                    self.pos += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => out.push(self.unicode_escape(escape_pos)?),
                        _ => return Err(self.fail_at(escape_pos, "invalid escape in a string")),
                    }
                }
                Some(_) => return Err(self.fail("a control character must be escaped in a string")),
            }
        }
    }

    /// The character of a `\u` escape (its `\u` already read), joining a surrogate pair.
    fn unicode_escape(&mut self, escape_pos: usize) -> ParseResult<char> {
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if !self.bytes[self.pos..].starts_with(b"\\u") {
                    return Err(self.fail_at(escape_pos, "lone leading surrogate in a \\u escape"));
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(self.fail_at(escape_pos, "lone leading surrogate in a \\u escape"));
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => {
                return Err(self.fail_at(escape_pos, "lone trailing surrogate in a \\u escape"))
            }
            code => code,
        };
        Ok(char::from_u32(code).expect("a scalar value"))
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> ParseResult<Json> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let int_start = self.pos;
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.fail_at(int_start, "a number has no leading zeros"));
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            Some(b'I') => return Err(self.fail_at(start, "Infinity is not a JSON number")),
            _ => return Err(self.fail("expected a digit")),
        }
        let int_end = self.pos;
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.fail("expected a digit after the decimal point"));
            }
            float = true;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.fail("expected a digit in the exponent"));
            }
            float = true;
        }
        let text = std::str::from_utf8(&self.bytes[start..self.pos]).expect("ascii");
        let digits = std::str::from_utf8(&self.bytes[int_start..int_end]).expect("ascii");
        let magnitude: Option<u64> = if float { None } else { digits.parse().ok() };
        let in_range = magnitude.is_some_and(|m| !negative || m <= 1 << 63);
        if float || (!in_range && self.wide_integers) {
            // std's parse is correctly rounded, so every float reads back exactly.
            let value: f64 = text.parse().expect("a JSON number is a Rust float");
            if !value.is_finite() {
                return Err(self.fail_at(start, format!("{text} is out of the float range")));
            }
            return Ok(Json::Float(value));
        }
        match magnitude {
            // `-0` is a float, as serde_json reads it (safetensors refuses it where it wants
            // an integer).
            Some(0) if negative => Ok(Json::Float(-0.0)),
            Some(m) if !negative => Ok(Json::Uint(m)),
            Some(m) if in_range => Ok(Json::Int((m as i64).wrapping_neg())),
            _ => Err(self.fail_at(
                start,
                format!("integer {text} is outside [-2^63, 2^64) (spec §2)"),
            )),
        }
    }
}

/// The canonical form of a document (spec §9): keys sorted by UTF-8 bytes, no whitespace,
/// shortest integers, the spec's string escapes.
///
/// # Errors
/// A [`Json::Float`] or [`Json::Null`] anywhere (documents hold neither), or an object that
/// repeats a key (only a hand-built value can).
pub fn canonical(json: &Json) -> FormatResult<String> {
    let mut out = String::new();
    write_canonical(json, &mut out).map_err(|(message, mut path)| {
        path.push("$".into());
        path.reverse();
        FormatError::Invalid(format!("{} {message}", path.concat()))
    })?;
    Ok(out)
}

fn write_canonical(json: &Json, out: &mut String) -> Result<(), (String, Vec<String>)> {
    match json {
        Json::Null => return Err(("is null, which a document cannot hold".into(), vec![])),
        Json::Float(f) => {
            return Err((
                format!("is the float {f}, which a document cannot hold"),
                vec![],
            ))
        }
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Uint(n) => write!(out, "{n}").expect("write to string"),
        Json::Int(n) => write!(out, "{n}").expect("write to string"),
        Json::Text(text) => write_string(text, out),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out).map_err(|(m, mut p)| {
                    p.push(format!("[{i}]"));
                    (m, p)
                })?;
            }
            out.push(']');
        }
        Json::Object(entries) => {
            let mut sorted: Vec<&(String, Json)> = entries.iter().collect();
            sorted.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            if let Some(w) = sorted.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err((format!("repeats the key {:?}", w[0].0), vec![]));
            }
            out.push('{');
            for (i, (key, value)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(value, out).map_err(|(m, mut p)| {
                    p.push(key_segment(key));
                    (m, p)
                })?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// A JSON string as spec §9 (and serde_json, and so the safetensors library) writes it: `"`
/// and `\` escaped, the five short control escapes, other controls below U+0020 as `\u00xx`,
/// everything else raw.
pub(crate) fn write_string(text: &str, out: &mut String) {
    out.push('"');
    let mut run = 0;
    for (i, b) in text.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x09 => "\\t",
            0x0A => "\\n",
            0x0C => "\\f",
            0x0D => "\\r",
            0x00..=0x1F => "",
            _ => continue,
        };
        out.push_str(&text[run..i]);
        if escape.is_empty() {
            write!(out, "\\u{:04x}", b).expect("write to string");
        } else {
            out.push_str(escape);
        }
        run = i + 1;
    }
    out.push_str(&text[run..]);
    out.push('"');
}

/// A config as the header holds it: objects become canonical maps, floats and null are kept.
pub fn to_value(json: &Json) -> Value {
    match json {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Uint(n) => Value::Uint(*n),
        Json::Int(n) if *n >= 0 => Value::Uint(*n as u64),
        // CBOR's negative integers store −1 − n, which `!n` is in two's complement.
        Json::Int(n) => Value::Nint(!*n as u64),
        Json::Float(f) => Value::Float(*f),
        Json::Text(t) => Value::Text(t.clone()),
        Json::Array(items) => Value::Array(items.iter().map(to_value).collect()),
        Json::Object(entries) => Value::map(entries.iter().map(|(k, v)| (k.clone(), to_value(v)))),
    }
}

/// The JSON of a header value (a config, metadata); byte strings become lowercase hex text.
///
/// A [`Value::Nint`] below −2^63, which [`super::cbor::decode`] never yields, becomes the
/// nearest [`Json::Float`] as JSON has no integer for it here.
pub fn from_value(value: &Value) -> Json {
    match value {
        Value::Uint(n) => Json::Uint(*n),
        Value::Nint(n) => match i64::try_from(*n) {
            Ok(n) => Json::Int(!n),
            Err(_) => Json::Float(-1.0 - *n as f64),
        },
        Value::Bytes(b) => Json::Text(hex::encode(b)),
        Value::Text(t) => Json::Text(t.clone()),
        Value::Array(items) => Json::Array(items.iter().map(from_value).collect()),
        Value::Map(entries) => Json::Object(
            entries
                .iter()
                .map(|(k, v)| (k.clone(), from_value(v)))
                .collect(),
        ),
        Value::Bool(b) => Json::Bool(*b),
        Value::Null => Json::Null,
        Value::Float(f) => Json::Float(*f),
    }
}

/// A config file as the Hugging Face libraries write one: Python's
/// `json.dumps(config, indent=2, sort_keys=True) + "\n"` (ASCII-escaped, floats as Python's
/// `repr`). Used for configs of checkpoints imported without their original bytes.
///
/// Keys sort by code point, which for UTF-8 is byte order, as Python sorts `str` keys.
/// A non-finite float (which [`parse`] never yields) is written as Python would, `NaN`,
/// `Infinity` or `-Infinity`.
pub fn hf_config_text(config: &Json) -> String {
    let mut out = String::new();
    write_python(config, 0, &mut out);
    out.push('\n');
    out
}

fn newline_indent(level: usize, out: &mut String) {
    out.push('\n');
    for _ in 0..level {
        out.push_str("  ");
    }
}

fn write_python(json: &Json, level: usize, out: &mut String) {
    match json {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Uint(n) => write!(out, "{n}").expect("write to string"),
        Json::Int(n) => write!(out, "{n}").expect("write to string"),
        Json::Float(f) => out.push_str(&python_float_repr(*f)),
        Json::Text(t) => write_ascii_string(t, out),
        Json::Array(items) if items.is_empty() => out.push_str("[]"),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline_indent(level + 1, out);
                write_python(item, level + 1, out);
            }
            newline_indent(level, out);
            out.push(']');
        }
        Json::Object(entries) if entries.is_empty() => out.push_str("{}"),
        Json::Object(entries) => {
            let mut sorted: Vec<&(String, Json)> = entries.iter().collect();
            sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, value)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline_indent(level + 1, out);
                write_ascii_string(key, out);
                out.push_str(": ");
                write_python(value, level + 1, out);
            }
            newline_indent(level, out);
            out.push('}');
        }
    }
}

/// A string as Python's `json.dumps(..., ensure_ascii=True)` writes it: printable ASCII raw
/// (but `"` and `\`), the five short control escapes, everything else `\uxxxx` in lowercase
/// hex, characters past U+FFFF as a UTF-16 surrogate pair.
fn write_ascii_string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(out, "\\u{unit:04x}").expect("write to string");
                }
            }
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that read back to the same double, in fixed
/// notation when the decimal exponent (the point's place after the first digit) is in
/// [−4, 16), else in scientific notation with a signed exponent of at least two digits.
pub fn python_float_repr(value: f64) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sign = if value.is_sign_negative() { "-" } else { "" };
    let (digits, exponent) = shortest_digits(value.abs());
    let ndigits = digits.len() as i32;
    // Python's `decpt`: the value is 0.DIGITS × 10^decpt.
    let decpt = exponent + 1;
    if (-4 < decpt) && decpt <= 16 {
        if decpt <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-decpt) as usize))
        } else if decpt >= ndigits {
            format!("{sign}{digits}{}.0", "0".repeat((decpt - ndigits) as usize))
        } else {
            let (int, frac) = digits.split_at(decpt as usize);
            format!("{sign}{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let point = if rest.is_empty() { "" } else { "." };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!(
            "{sign}{first}{point}{rest}e{exp_sign}{:02}",
            exponent.unsigned_abs()
        )
    }
}

/// The significant digits and decimal exponent of `d.ddd × 10^exponent` (`value` ≥ 0,
/// finite) that Python's `repr` picks: the shortest that read back to `value`, and of two such
/// equally near it, the one whose last digit is even.
fn shortest_digits(value: f64) -> (String, i32) {
    let split = |sci: &str| {
        let (mantissa, exponent) = sci.split_once('e').expect("LowerExp has an exponent");
        let exponent: i32 = exponent.parse().expect("LowerExp exponent is an integer");
        let digits: String = mantissa.chars().filter(|&c| c != '.').collect();
        (digits, exponent)
    };
    // std's shortest digits are Python's but for exact ties, which std rounds up and Python's
    // dtoa rounds to even (1000000000000000.25 is `…0.3` to std, `…0.2` to Python).
    let (digits, exponent) = split(&format!("{value:e}"));
    let n = digits.len();
    // 767 significant digits hold any double exactly.
    let (exact, exact_exponent) = split(&format!("{value:.767e}"));
    let exact = exact.trim_end_matches('0');
    let tie = exact_exponent == exponent
        && exact.len() == n + 1
        && exact.ends_with('5')
        && exact[..n - 1] == digits[..n - 1];
    if !tie {
        return (digits, exponent);
    }
    let below = &exact[..n];
    let last = below.as_bytes()[n - 1];
    let even = if last % 2 == 0 {
        below.to_string()
    } else if last == b'9' {
        // Rounding up would carry into a shorter number; keep std's pick.
        return (digits, exponent);
    } else {
        format!("{}{}", &below[..n - 1], (last + 1 - b'0'))
    };
    let reads_back = format!("{even}e{}", exponent - (n as i32 - 1))
        .parse::<f64>()
        .is_ok_and(|v| v == value);
    if reads_back {
        (even, exponent)
    } else {
        (digits, exponent)
    }
}

/// Refuses what a tree or repo may not hold anywhere, known field or not (spec §9): `null` and
/// numbers with a fraction or exponent.
///
/// # Errors
/// [`FormatError::Invalid`] naming the first such value's path.
pub(crate) fn check_document_values(json: &Json) -> FormatResult<()> {
    fn walk(json: &Json, path: &mut Vec<String>) -> Result<(), String> {
        match json {
            Json::Null => Err("null".into()),
            Json::Float(f) => Err(format!("the number {f} with a fraction or exponent")),
            Json::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    path.push(format!("[{i}]"));
                    walk(item, path)?;
                    path.pop();
                }
                Ok(())
            }
            Json::Object(entries) => {
                for (key, value) in entries {
                    path.push(key_segment(key));
                    walk(value, path)?;
                    path.pop();
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
    let mut path = vec![String::from("$")];
    walk(json, &mut path).map_err(|what| {
        FormatError::Invalid(format!(
            "{} is {what}, which a document cannot hold (spec §9)",
            path.concat()
        ))
    })
}

/// The fields of a tree or repo (spec §2, §9): `bytes` parsed strictly, its top level an object
/// whose `format` is `expected` or a later minor of it, holding no `null` or float anywhere.
///
/// The tag is checked before the values so that a document of another kind or major is
/// refused as such, whatever it holds.
pub(crate) fn read_document(
    bytes: &[u8],
    expected: &'static str,
) -> FormatResult<Vec<(String, Json)>> {
    let json = parse(bytes)?;
    let Json::Object(fields) = json else {
        return Err(FormatError::Invalid(format!(
            "a {expected} document is a JSON object, not {} (spec §9)",
            json.type_name()
        )));
    };
    match fields.iter().find(|(k, _)| k == "format").map(|(_, v)| v) {
        None => {
            return Err(FormatError::Invalid(format!(
                "no `format` field (want {expected})"
            )))
        }
        Some(Json::Text(found)) => check_format(found, expected)?,
        Some(other) => {
            return Err(FormatError::Invalid(format!(
                "`format` is {}, not a string (want {expected})",
                other.type_name()
            )))
        }
    }
    let json = Json::Object(fields);
    check_document_values(&json)?;
    let Json::Object(fields) = json else {
        unreachable!("still the object")
    };
    Ok(fields)
}

/// A reader takes `<kind>/<major>` and `<kind>/<major>.<minor>`, the minor one or more digits
/// (spec §2).
pub(crate) fn check_format(found: &str, expected: &'static str) -> FormatResult<()> {
    let accepted = found.strip_prefix(expected).is_some_and(|rest| {
        rest.is_empty()
            || rest
                .strip_prefix('.')
                .is_some_and(|minor| !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit()))
    });
    if accepted {
        Ok(())
    } else {
        Err(FormatError::Format {
            found: found.into(),
            expected,
        })
    }
}

/// The value of `key` among an object's `fields`.
pub(crate) fn field<'a>(fields: &'a [(String, Json)], key: &str) -> Option<&'a Json> {
    fields.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// Wrong-type refusal for the field at `at` (a path such as `files["a"].length`).
pub(crate) fn wrong_type(at: &str, want: &str, found: &Json) -> FormatError {
    FormatError::Invalid(format!("{at} is {}, not {want}", found.type_name()))
}

/// The object of field `key` at `at`, required.
pub(crate) fn required_object<'a>(
    fields: &'a [(String, Json)],
    key: &str,
    at: &str,
) -> FormatResult<&'a [(String, Json)]> {
    match field(fields, key) {
        Some(Json::Object(entries)) => Ok(entries),
        Some(other) => Err(wrong_type(
            &format!("{at}{}", key_segment(key)),
            "an object",
            other,
        )),
        None => Err(FormatError::Invalid(format!("{at} has no `{key}` field"))),
    }
}

/// The text of field `key` at `at`, required.
pub(crate) fn required_text<'a>(
    fields: &'a [(String, Json)],
    key: &str,
    at: &str,
) -> FormatResult<&'a str> {
    match field(fields, key) {
        Some(Json::Text(text)) => Ok(text),
        Some(other) => Err(wrong_type(
            &format!("{at}{}", key_segment(key)),
            "a string",
            other,
        )),
        None => Err(FormatError::Invalid(format!("{at} has no `{key}` field"))),
    }
}

/// An object ref `{sha256, length}` (spec §1) at `at`; other fields are ignored (spec §2).
pub(crate) fn object_ref(json: &Json, at: &str) -> FormatResult<ObjectRef> {
    let Json::Object(fields) = json else {
        return Err(wrong_type(at, "an object ref {sha256, length}", json));
    };
    let sha256: Sha256 = required_text(fields, "sha256", at)?
        .parse()
        .map_err(|e| FormatError::Invalid(format!("{at}.sha256: {e}")))?;
    let length = match field(fields, "length") {
        Some(Json::Uint(n)) => *n,
        Some(other @ Json::Int(_)) => {
            return Err(wrong_type(&format!("{at}.length"), "a length ≥ 0", other))
        }
        Some(other) => return Err(wrong_type(&format!("{at}.length"), "an integer", other)),
        None => return Err(FormatError::Invalid(format!("{at} has no `length` field"))),
    };
    Ok(ObjectRef { sha256, length })
}

/// The JSON of an object ref.
pub(crate) fn object_ref_json(object: &ObjectRef) -> Json {
    Json::Object(vec![
        ("length".into(), Json::Uint(object.length)),
        ("sha256".into(), Json::Text(object.sha256.hex())),
    ])
}

#[cfg(test)]
mod tests;
