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
    /// The value as JSON: byte strings as lowercase hex text, negative integers as numbers.
    pub fn to_serde(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Value::Uint(n) => json!(n),
            Value::Nint(n) => json!(-1 - *n as i64),
            Value::Bytes(b) => json!(hex::encode(b)),
            Value::Text(t) => json!(t),
            Value::Array(items) => items.iter().map(Value::to_serde).collect(),
            Value::Map(entries) => entries
                .iter()
                .map(|(k, v)| (k.clone(), v.to_serde()))
                .collect::<serde_json::Map<_, _>>()
                .into(),
            Value::Bool(b) => json!(b),
            Value::Null => serde_json::Value::Null,
            Value::Float(f) => json!(f),
        }
    }

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
    a.len()
        .cmp(&b.len())
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// Decodes exactly one deterministic CBOR value spanning all of `bytes`.
///
/// # Errors
/// [`FormatError::Encoding`] naming the byte offset and the rule broken.
pub fn decode(bytes: &[u8]) -> FormatResult<Value> {
    let mut reader = Reader::new(bytes);
    let value = reader.value(Domain::Any, 0)?;
    reader.finish()?;
    Ok(value)
}

/// Encodes `value` in core deterministic encoding (shortest heads, definite lengths, floats in
/// their shortest exact width, map entries in canonical key order).
///
/// # Errors
/// A non-finite float, a map with a repeated key, a [`Value::Nint`] below −2^63 or nesting
/// deeper than [`MAX_DEPTH`]: what [`decode`] would refuse, so an encoded value always decodes.
pub fn encode(value: &Value) -> FormatResult<Vec<u8>> {
    let mut writer = Writer::with_capacity(64);
    writer.value(value, Domain::Any, 0)?;
    Ok(writer.into_bytes())
}

const MAJOR_UINT: u8 = 0;
const MAJOR_NINT: u8 = 1;
const MAJOR_BYTES: u8 = 2;
const MAJOR_TEXT: u8 = 3;
const MAJOR_ARRAY: u8 = 4;
const MAJOR_MAP: u8 = 5;
const FALSE: u8 = 0xf4;
const TRUE: u8 = 0xf5;
const NULL: u8 = 0xf6;
const HALF: u8 = 0xf9;
const SINGLE: u8 = 0xfa;
const DOUBLE: u8 = 0xfb;

/// Where in a header a value sits, which decides the kinds it may hold (spec §9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Domain {
    /// Whatever the encoding allows: [`decode`] and [`encode`] themselves.
    Any,
    /// A header's configs: also floats and `null`, never byte strings.
    Config,
    /// Metadata, params: no floats, `null` or byte strings.
    Document,
    /// A later minor's trailing fields: byte strings too, but still no floats or `null`.
    Extension,
}

impl Domain {
    fn allows_floats(self) -> bool {
        matches!(self, Domain::Any | Domain::Config)
    }

    fn allows_bytes(self) -> bool {
        matches!(self, Domain::Any | Domain::Extension)
    }
}

/// One data item's head, with a string's payload already taken and checked. Array and map
/// counts are already checked against the bytes left, so callers may reserve for them.
#[derive(Clone, Copy, Debug)]
pub(super) enum Item<'a> {
    Uint(u64),
    Nint(u64),
    Bytes(&'a [u8]),
    Text(&'a str),
    Array(u64),
    Map(u64),
    Bool(bool),
    Null,
    Float(f64),
}

impl Item<'_> {
    /// What the item is, for messages.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Item::Uint(_) => "an unsigned integer",
            Item::Nint(_) => "a negative integer",
            Item::Bytes(_) => "a byte string",
            Item::Text(_) => "a text string",
            Item::Array(_) => "an array",
            Item::Map(_) => "a map",
            Item::Bool(_) => "a boolean",
            Item::Null => "null",
            Item::Float(_) => "a float",
        }
    }
}

/// An encoding error at byte `at`.
pub(super) fn error_at(at: usize, rule: impl std::fmt::Display) -> FormatError {
    FormatError::Encoding(format!("spec §9: CBOR byte {at}: {rule}"))
}

/// A strict, allocation-free cursor over deterministic CBOR; the header reader drives it
/// directly so that records never pass through [`Value`].
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, pos: 0 }
    }

    /// The offset of the next item.
    pub(super) fn pos(&self) -> usize {
        self.pos
    }

    /// The bytes from `start` to the cursor (an item's encoding, once read).
    pub(super) fn since(&self, start: usize) -> &'a [u8] {
        &self.bytes[start..self.pos]
    }

    /// The bytes not yet read.
    pub(super) fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Refuses bytes after the root.
    pub(super) fn finish(&self) -> FormatResult<()> {
        match self.left() {
            0 => Ok(()),
            n => Err(error_at(self.pos, format_args!("{n} bytes after the root"))),
        }
    }

    fn take(&mut self, n: u64, at: usize, what: &str) -> FormatResult<&'a [u8]> {
        // The declared length is checked against the input before anything is sliced or
        // reserved, so a hostile length costs nothing.
        if n > self.left() as u64 {
            return Err(error_at(
                at,
                format_args!("{what} of {n} bytes, but {} bytes are left", self.left()),
            ));
        }
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn argument(&mut self, info: u8, at: usize) -> FormatResult<u64> {
        let (width, min) = match info {
            0..=23 => return Ok(u64::from(info)),
            24 => (1, 24),
            25 => (2, 0x100),
            26 => (4, 0x1_0000),
            27 => (8, 0x1_0000_0000),
            28..=30 => {
                return Err(error_at(
                    at,
                    format_args!("reserved additional information {info}"),
                ))
            }
            _ => return Err(error_at(at, "an indefinite length")),
        };
        let raw = self.take(width, at, "a head argument")?;
        let n = raw.iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b));
        if n < min {
            return Err(error_at(
                at,
                format_args!("head argument {n} is not in its shortest form"),
            ));
        }
        Ok(n)
    }

    /// Reads one item's head (and a string's payload, a float's bits), applying every rule
    /// that concerns the item alone.
    pub(super) fn item(&mut self) -> FormatResult<Item<'a>> {
        let at = self.pos;
        let Some(&initial) = self.bytes.get(at) else {
            return Err(error_at(at, "the input ends where an item should start"));
        };
        self.pos += 1;
        let (major, info) = (initial >> 5, initial & 0x1f);
        Ok(match major {
            MAJOR_UINT => Item::Uint(self.argument(info, at)?),
            MAJOR_NINT => {
                let n = self.argument(info, at)?;
                if n > i64::MAX as u64 {
                    return Err(error_at(at, format_args!("integer -1-{n} is below -2^63")));
                }
                Item::Nint(n)
            }
            MAJOR_BYTES => {
                let n = self.argument(info, at)?;
                Item::Bytes(self.take(n, at, "a byte string")?)
            }
            MAJOR_TEXT => {
                let n = self.argument(info, at)?;
                let raw = self.take(n, at, "a text string")?;
                match std::str::from_utf8(raw) {
                    Ok(text) => Item::Text(text),
                    Err(e) => {
                        let bad = self.pos - raw.len() + e.valid_up_to();
                        return Err(error_at(bad, "invalid UTF-8 in a text string"));
                    }
                }
            }
            MAJOR_ARRAY => {
                let n = self.argument(info, at)?;
                // Every element takes at least one byte.
                if n > self.left() as u64 {
                    return Err(error_at(
                        at,
                        format_args!("an array of {n} items, but {} bytes are left", self.left()),
                    ));
                }
                Item::Array(n)
            }
            MAJOR_MAP => {
                let n = self.argument(info, at)?;
                // Every entry takes at least two bytes.
                if n > self.left() as u64 / 2 {
                    return Err(error_at(
                        at,
                        format_args!("a map of {n} entries, but {} bytes are left", self.left()),
                    ));
                }
                Item::Map(n)
            }
            6 => return Err(error_at(at, "a tag")),
            _ => match initial {
                FALSE => Item::Bool(false),
                TRUE => Item::Bool(true),
                NULL => Item::Null,
                0xf7 => return Err(error_at(at, "undefined")),
                HALF => {
                    let raw = self.take(2, at, "a half float")?;
                    let bits = u16::from_be_bytes([raw[0], raw[1]]);
                    match half_to_f64(bits) {
                        Some(value) => Item::Float(value),
                        None => return Err(error_at(at, "a float that is not finite")),
                    }
                }
                SINGLE => {
                    let raw = self.take(4, at, "a single float")?;
                    let value = f32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
                    if !value.is_finite() {
                        return Err(error_at(at, "a float that is not finite"));
                    }
                    let value = f64::from(value);
                    if f64_to_half(value).is_some() {
                        return Err(error_at(
                            at,
                            format_args!(
                                "float {value:?} as single, not its shortest width (half)"
                            ),
                        ));
                    }
                    Item::Float(value)
                }
                DOUBLE => {
                    let raw = self.take(8, at, "a double float")?;
                    let value = f64::from_be_bytes(raw.try_into().expect("8 bytes"));
                    if !value.is_finite() {
                        return Err(error_at(at, "a float that is not finite"));
                    }
                    if let Some(width) = shorter_width(value) {
                        return Err(error_at(
                            at,
                            format_args!(
                                "float {value:?} as double, not its shortest width ({width})"
                            ),
                        ));
                    }
                    Item::Float(value)
                }
                0xff => return Err(error_at(at, "a break outside an indefinite length")),
                0xfc..=0xfe => {
                    return Err(error_at(
                        at,
                        format_args!("reserved simple head {initial:#04x}"),
                    ))
                }
                _ => return Err(error_at(at, format_args!("simple value {initial:#04x}"))),
            },
        })
    }

    /// Reads an item and refuses the kinds `domain` does not hold.
    fn item_in(&mut self, domain: Domain) -> FormatResult<Item<'a>> {
        let at = self.pos;
        let item = self.item()?;
        match item {
            Item::Float(_) | Item::Null if !domain.allows_floats() => Err(error_at(
                at,
                format_args!("{} outside a config", item.kind()),
            )),
            Item::Bytes(_) if !domain.allows_bytes() => Err(error_at(
                at,
                "a byte string outside an object's sha256 or a later field",
            )),
            _ => Ok(item),
        }
    }

    /// Refuses a container at `depth` enclosing containers (the root is at 0).
    fn enter(&self, depth: usize, at: usize) -> FormatResult<()> {
        if depth >= MAX_DEPTH {
            return Err(error_at(
                at,
                format_args!("arrays and maps nested deeper than {MAX_DEPTH}"),
            ));
        }
        Ok(())
    }

    /// A map key: text, after `previous` (the previous key's encoding) in bytewise order.
    /// Returns the key and its encoding.
    pub(super) fn key(&mut self, previous: Option<&[u8]>) -> FormatResult<(&'a str, &'a [u8])> {
        let at = self.pos;
        let Item::Text(key) = self.item()? else {
            return Err(error_at(at, "a map key that is not a text string"));
        };
        let encoded = self.since(at);
        if let Some(previous) = previous {
            match previous.cmp(encoded) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => {
                    return Err(error_at(at, format_args!("map key {key:?} repeated")))
                }
                std::cmp::Ordering::Greater => {
                    return Err(error_at(
                        at,
                        format_args!("map key {key:?} out of canonical order"),
                    ))
                }
            }
        }
        Ok((key, encoded))
    }

    /// Decodes one value at `depth` (the count of containers around it).
    pub(super) fn value(&mut self, domain: Domain, depth: usize) -> FormatResult<Value> {
        let at = self.pos;
        Ok(match self.item_in(domain)? {
            Item::Uint(n) => Value::Uint(n),
            Item::Nint(n) => Value::Nint(n),
            Item::Bytes(b) => Value::Bytes(b.to_vec()),
            Item::Text(t) => Value::Text(t.to_owned()),
            Item::Array(n) => {
                self.enter(depth, at)?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(domain, depth + 1)?);
                }
                Value::Array(items)
            }
            Item::Map(n) => {
                self.enter(depth, at)?;
                Value::Map(self.entries(n, domain, depth)?)
            }
            Item::Bool(b) => Value::Bool(b),
            Item::Null => Value::Null,
            Item::Float(f) => Value::Float(f),
        })
    }

    /// The `n` entries of a map whose head was just read, the map at `depth`.
    fn entries(
        &mut self,
        n: u64,
        domain: Domain,
        depth: usize,
    ) -> FormatResult<Vec<(String, Value)>> {
        let mut entries = Vec::with_capacity(n as usize);
        let mut previous = None;
        for _ in 0..n {
            let (key, encoded) = self.key(previous)?;
            previous = Some(encoded);
            entries.push((key.to_owned(), self.value(domain, depth + 1)?));
        }
        Ok(entries)
    }

    /// Decodes a map (at `depth`) into its entries in canonical order.
    pub(super) fn map(
        &mut self,
        domain: Domain,
        depth: usize,
        what: &dyn Fn() -> String,
    ) -> FormatResult<Vec<(String, Value)>> {
        let at = self.pos;
        match self.item_in(domain)? {
            Item::Map(n) => {
                self.enter(depth, at)?;
                self.entries(n, domain, depth)
            }
            other => Err(FormatError::Invalid(format!(
                "spec §4: {} is {}, not a map (byte {at})",
                what(),
                other.kind()
            ))),
        }
    }

    /// Checks one value at `depth` as [`Reader::value`] would, keeping nothing.
    pub(super) fn skip(&mut self, domain: Domain, depth: usize) -> FormatResult<()> {
        let at = self.pos;
        match self.item_in(domain)? {
            Item::Array(n) => {
                self.enter(depth, at)?;
                for _ in 0..n {
                    self.skip(domain, depth + 1)?;
                }
            }
            Item::Map(n) => {
                self.enter(depth, at)?;
                let mut previous = None;
                for _ in 0..n {
                    previous = Some(self.key(previous)?.1);
                    self.skip(domain, depth + 1)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// A head in its shortest form.
fn head(out: &mut Vec<u8>, major: u8, n: u64) {
    let major = major << 5;
    if n < 24 {
        out.push(major | n as u8);
    } else if n <= 0xff {
        out.extend_from_slice(&[major | 24, n as u8]);
    } else if n <= 0xffff {
        out.push(major | 25);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n <= 0xffff_ffff {
        out.push(major | 26);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(major | 27);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// The deterministic writer; the header writer drives it directly.
pub(super) struct Writer {
    out: Vec<u8>,
}

impl Writer {
    pub(super) fn with_capacity(capacity: usize) -> Writer {
        Writer {
            out: Vec::with_capacity(capacity),
        }
    }

    pub(super) fn into_bytes(self) -> Vec<u8> {
        self.out
    }

    pub(super) fn uint(&mut self, n: u64) {
        head(&mut self.out, MAJOR_UINT, n);
    }

    pub(super) fn text(&mut self, text: &str) {
        head(&mut self.out, MAJOR_TEXT, text.len() as u64);
        self.out.extend_from_slice(text.as_bytes());
    }

    pub(super) fn bytes(&mut self, bytes: &[u8]) {
        head(&mut self.out, MAJOR_BYTES, bytes.len() as u64);
        self.out.extend_from_slice(bytes);
    }

    pub(super) fn array(&mut self, n: usize) {
        head(&mut self.out, MAJOR_ARRAY, n as u64);
    }

    pub(super) fn map_head(&mut self, n: usize) {
        head(&mut self.out, MAJOR_MAP, n as u64);
    }

    fn float(&mut self, value: f64) -> FormatResult<()> {
        if !value.is_finite() {
            return Err(FormatError::Encoding(format!(
                "spec §9: float {value} is not finite"
            )));
        }
        if let Some(bits) = f64_to_half(value) {
            self.out.push(HALF);
            self.out.extend_from_slice(&bits.to_be_bytes());
        } else if f64::from(value as f32) == value {
            self.out.push(SINGLE);
            self.out
                .extend_from_slice(&(value as f32).to_bits().to_be_bytes());
        } else {
            self.out.push(DOUBLE);
            self.out.extend_from_slice(&value.to_bits().to_be_bytes());
        }
        Ok(())
    }

    /// Writes a value at `depth`, refusing what [`Reader::value`] would refuse in `domain`.
    pub(super) fn value(
        &mut self,
        value: &Value,
        domain: Domain,
        depth: usize,
    ) -> FormatResult<()> {
        match value {
            Value::Uint(n) => self.uint(*n),
            Value::Nint(n) => {
                if *n > i64::MAX as u64 {
                    return Err(FormatError::Encoding(format!(
                        "spec §9: integer -1-{n} is below -2^63"
                    )));
                }
                head(&mut self.out, MAJOR_NINT, *n);
            }
            Value::Bytes(b) => {
                if !domain.allows_bytes() {
                    return Err(FormatError::Encoding(
                        "spec §9: a byte string outside an object's sha256 or a later field".into(),
                    ));
                }
                self.bytes(b);
            }
            Value::Text(t) => self.text(t),
            Value::Array(items) => {
                enter_to_write(depth)?;
                self.array(items.len());
                for item in items {
                    self.value(item, domain, depth + 1)?;
                }
            }
            Value::Map(entries) => {
                enter_to_write(depth)?;
                self.entries(entries.iter().map(|(k, v)| (k.as_str(), v)), domain, depth)?;
            }
            Value::Bool(b) => self.out.push(if *b { TRUE } else { FALSE }),
            Value::Null | Value::Float(_) if !domain.allows_floats() => {
                let kind = if matches!(value, Value::Null) {
                    "null"
                } else {
                    "a float"
                };
                return Err(FormatError::Encoding(format!(
                    "spec §9: {kind} outside a config"
                )));
            }
            Value::Null => self.out.push(NULL),
            Value::Float(f) => self.float(*f)?,
        }
        Ok(())
    }

    /// Writes map entries (the map at `depth`) in canonical key order, whatever order they
    /// come in.
    pub(super) fn entries<'v>(
        &mut self,
        entries: impl Iterator<Item = (&'v str, &'v Value)>,
        domain: Domain,
        depth: usize,
    ) -> FormatResult<()> {
        let mut sorted: Vec<(&str, &Value)> = entries.collect();
        // Stable, and cheap when already in order, as decoded maps are.
        sorted.sort_by(|a, b| key_order(a.0, b.0));
        if let Some(pair) = sorted.windows(2).find(|p| p[0].0 == p[1].0) {
            return Err(FormatError::Encoding(format!(
                "spec §9: map key {:?} repeated",
                pair[0].0
            )));
        }
        self.map_head(sorted.len());
        for (key, value) in sorted {
            self.text(key);
            self.value(value, domain, depth + 1)?;
        }
        Ok(())
    }
}

fn enter_to_write(depth: usize) -> FormatResult<()> {
    if depth >= MAX_DEPTH {
        return Err(FormatError::Encoding(format!(
            "spec §9: arrays and maps nested deeper than {MAX_DEPTH}"
        )));
    }
    Ok(())
}

/// The value of IEEE half-precision `bits`; `None` for an infinity or NaN. Exact: every half
/// is a small integer times a power of two.
fn half_to_f64(bits: u16) -> Option<f64> {
    let exponent = i32::from(bits >> 10 & 0x1f);
    let mantissa = f64::from(bits & 0x3ff);
    let magnitude = match exponent {
        0x1f => return None,
        0 => mantissa * f64::powi(2.0, -24),
        e => (1024.0 + mantissa) * f64::powi(2.0, e - 25),
    };
    Some(if bits & 0x8000 != 0 {
        -magnitude
    } else {
        magnitude
    })
}

/// The half-precision bits holding finite `value` exactly, if any (−0.0 is `0x8000`).
fn f64_to_half(value: f64) -> Option<u16> {
    let bits = value.to_bits();
    let sign = ((bits >> 48) & 0x8000) as u16;
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1 << 52) - 1);
    if biased == 0 {
        // Zero, or a double subnormal, far below the smallest half.
        return (fraction == 0).then_some(sign);
    }
    let exponent = biased - 1023;
    if exponent > 15 {
        return None;
    }
    if exponent >= -14 {
        // A normal half keeps the top 10 of the 52 fraction bits.
        return (fraction & ((1 << 42) - 1) == 0)
            .then(|| sign | ((exponent + 15) as u16) << 10 | (fraction >> 42) as u16);
    }
    if exponent < -24 {
        return None;
    }
    // A subnormal half is m × 2^−24 with m < 1024; the significand is (2^52 + fraction) × 2^(e−52).
    let significand = (1u64 << 52) | fraction;
    let shift = (28 - exponent) as u32;
    (significand & ((1 << shift) - 1) == 0).then(|| sign | (significand >> shift) as u16)
}

/// The width shorter than double that holds finite `value` exactly, if any.
fn shorter_width(value: f64) -> Option<&'static str> {
    if f64_to_half(value).is_some() {
        Some("half")
    } else if f64::from(value as f32) == value {
        Some("single")
    } else {
        None
    }
}

#[cfg(test)]
pub(crate) mod tests;
