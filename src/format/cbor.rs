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
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(text: &str) -> Vec<u8> {
        hex::decode(text.replace(' ', "")).unwrap()
    }

    fn refused(text: &str, rule: &str) {
        match decode(&hex(text)) {
            Err(FormatError::Encoding(message)) => {
                assert!(message.contains(rule), "{text}: {message:?} lacks {rule:?}")
            }
            other => panic!("{text}: expected a refusal naming {rule:?}, got {other:?}"),
        }
    }

    fn accepted(text: &str) -> Value {
        let bytes = hex(text);
        let value = decode(&bytes).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            encode(&value).unwrap(),
            bytes,
            "{text} re-encodes differently"
        );
        value
    }

    fn nested_arrays(levels: usize) -> Vec<u8> {
        let mut bytes = vec![0x81; levels - 1];
        bytes.push(0x80);
        bytes
    }

    #[test]
    fn every_kind_of_value_decodes_and_reencodes_identically() {
        assert_eq!(accepted("00"), Value::Uint(0));
        assert_eq!(accepted("17"), Value::Uint(23));
        assert_eq!(accepted("1818"), Value::Uint(24));
        assert_eq!(accepted("1bffffffffffffffff"), Value::Uint(u64::MAX));
        assert_eq!(accepted("20"), Value::Nint(0));
        assert_eq!(accepted("3903e7"), Value::Nint(999));
        assert_eq!(accepted("4401020304"), Value::Bytes(vec![1, 2, 3, 4]));
        assert_eq!(accepted("62c3bc"), Value::Text("ü".into()));
        assert_eq!(accepted("60"), Value::Text(String::new()));
        assert_eq!(
            accepted("83 01 82 02 03 80"),
            Value::Array(vec![
                Value::Uint(1),
                Value::Array(vec![Value::Uint(2), Value::Uint(3)]),
                Value::Array(vec![])
            ])
        );
        assert_eq!(
            accepted("a2 61 62 f5 62 61 61 f6"),
            Value::Map(vec![
                ("b".into(), Value::Bool(true)),
                ("aa".into(), Value::Null)
            ])
        );
        assert_eq!(accepted("f4"), Value::Bool(false));
        assert_eq!(accepted("f93e00"), Value::Float(1.5));
    }

    #[test]
    fn tags_are_refused() {
        refused("c0 60", "a tag");
        refused("d8 20 60", "a tag");
    }

    #[test]
    fn undefined_and_simple_values_other_than_true_false_null_are_refused() {
        refused("f7", "undefined");
        refused("e0", "simple value");
        refused("f3", "simple value");
        refused("f8 20", "simple value");
        refused("fc", "reserved");
        accepted("f4");
        accepted("f5");
        accepted("f6");
    }

    #[test]
    fn non_finite_floats_are_refused_in_every_width() {
        refused("f9 7c00", "not finite");
        refused("f9 fc00", "not finite");
        refused("f9 7e00", "not finite");
        refused("fa 7f800000", "not finite");
        refused("fa 7fc00000", "not finite");
        refused("fb 7ff0000000000000", "not finite");
        refused("fb 7ff8000000000000", "not finite");
    }

    #[test]
    fn floats_wider_than_their_shortest_exact_width_are_refused() {
        refused("fa 3fc00000", "shortest width (half)");
        refused("fb 3ff8000000000000", "shortest width (half)");
        refused("fa 80000000", "shortest width (half)");
        refused("fb 40f86a0000000000", "shortest width (single)");
        assert_eq!(accepted("fa 47c35000"), Value::Float(100000.0));
        assert_eq!(accepted("fb 3fb999999999999a"), Value::Float(0.1));
        assert_eq!(accepted("f9 7bff"), Value::Float(65504.0));
        assert_eq!(accepted("f9 0001"), Value::Float(5.960464477539063e-08));
        assert_eq!(accepted("fa 00000001"), Value::Float(1.401298464324817e-45));
        assert_eq!(accepted("fb 0000000000000001"), Value::Float(5e-324));
        let negative_zero = accepted("f9 8000");
        assert!(matches!(negative_zero, Value::Float(z) if z == 0.0 && z.is_sign_negative()));
    }

    #[test]
    fn floats_encode_in_the_shortest_width_that_holds_them_exactly() {
        let cases: [(f64, &str); 10] = [
            (0.0, "f90000"),
            (-0.0, "f98000"),
            (1.5, "f93e00"),
            (65504.0, "f97bff"),
            (65520.0, "fa477ff000"),
            (5.960464477539063e-08, "f90001"),
            (2.9802322387695312e-08, "fa33000000"),
            (100000.0, "fa47c35000"),
            (0.1, "fb3fb999999999999a"),
            (1.0 + f64::EPSILON, "fb3ff0000000000001"),
        ];
        for (value, expected) in cases {
            assert_eq!(
                hex::encode(encode(&Value::Float(value)).unwrap()),
                expected,
                "{value:e}"
            );
        }
    }

    #[test]
    fn every_finite_half_converts_to_double_and_back_exactly() {
        for bits in 0..=u16::MAX {
            match half_to_f64(bits) {
                Some(value) => assert_eq!(f64_to_half(value), Some(bits), "{bits:#06x}"),
                None => assert_eq!(bits & 0x7c00, 0x7c00),
            }
        }
        // Just off the half grid: one bit more precision, or just outside its range.
        assert_eq!(f64_to_half(1.0 + f64::powi(2.0, -11)), None);
        assert_eq!(f64_to_half(f64::powi(2.0, -25)), None);
        assert_eq!(f64_to_half(3.0 * f64::powi(2.0, -25)), None);
        assert_eq!(f64_to_half(65536.0), None);
        assert_eq!(f64_to_half(f64::MIN_POSITIVE / 2.0), None);
    }

    #[test]
    fn heads_not_in_their_shortest_form_are_refused() {
        refused("18 17", "shortest form");
        accepted("18 18");
        refused("19 00ff", "shortest form");
        accepted("19 0100");
        refused("1a 0000ffff", "shortest form");
        accepted("1a 00010000");
        refused("1b 00000000ffffffff", "shortest form");
        accepted("1b 0000000100000000");
        refused("78 01 61", "shortest form");
        refused("98 00", "shortest form");
        refused("b8 00", "shortest form");
        refused("38 00", "shortest form");
    }

    #[test]
    fn indefinite_lengths_breaks_and_reserved_heads_are_refused() {
        refused("9f ff", "indefinite");
        refused("5f 41 00 ff", "indefinite");
        refused("7f 61 61 ff", "indefinite");
        refused("bf ff", "indefinite");
        refused("ff", "break");
        refused("1c", "reserved");
        refused("1f", "indefinite");
    }

    #[test]
    fn map_keys_must_be_text() {
        refused("a1 01 02", "not a text string");
        refused("a1 41 61 02", "not a text string");
    }

    #[test]
    fn map_keys_must_be_in_bytewise_order_of_their_encodings_and_unique() {
        accepted("a2 61 61 00 61 62 00");
        refused("a2 61 62 00 61 61 00", "out of canonical order");
        refused("a2 61 61 00 61 61 00", "repeated");
        // Shorter keys first, whatever their bytes.
        accepted("a2 61 7a 00 62 61 61 00");
        refused("a2 62 61 61 00 61 7a 00", "out of canonical order");
    }

    #[test]
    fn invalid_utf8_is_refused_with_its_offset() {
        refused("62 c3 28", "byte 1: invalid UTF-8");
        refused("82 60 63 61 ed a0", "invalid UTF-8");
        accepted("63 e2 82 ac");
    }

    #[test]
    fn integers_must_lie_in_minus_two_to_the_63_up_to_two_to_the_64() {
        assert_eq!(
            accepted("3b 7fffffffffffffff").as_int(),
            Some(i64::MIN as i128)
        );
        refused("3b 8000000000000000", "below -2^63");
        assert_eq!(
            accepted("1b ffffffffffffffff").as_int(),
            Some(u64::MAX as i128)
        );
        assert!(encode(&Value::Nint(1 << 63)).is_err());
    }

    #[test]
    fn bytes_after_the_root_are_refused() {
        refused("00 00", "1 bytes after the root");
        refused("80 ff", "after the root");
    }

    #[test]
    fn truncated_input_is_refused() {
        refused("", "input ends");
        refused("18", "left");
        refused("82 00", "2 items, but 1 bytes are left");
        refused("82 82 00 00", "input ends");
        refused("63 61 62", "left");
        refused("f9 00", "left");
    }

    #[test]
    fn nesting_is_accepted_up_to_max_depth_and_refused_beyond() {
        let deepest = decode(&nested_arrays(MAX_DEPTH)).unwrap();
        assert_eq!(encode(&deepest).unwrap(), nested_arrays(MAX_DEPTH));
        let err = decode(&nested_arrays(MAX_DEPTH + 1)).unwrap_err();
        assert!(err.to_string().contains("nested deeper"), "{err}");
        let mut too_deep = Value::Array(vec![]);
        for _ in 0..MAX_DEPTH {
            too_deep = Value::Array(vec![too_deep]);
        }
        assert!(encode(&too_deep).is_err());
        let mut maps = [0xa1, 0x60].repeat(MAX_DEPTH);
        maps.push(0x00);
        assert!(decode(&maps).is_ok());
        let mut maps = [0xa1, 0x60].repeat(MAX_DEPTH + 1);
        maps.push(0x00);
        assert!(decode(&maps).is_err());
    }

    #[test]
    fn hostile_lengths_are_refused_before_anything_is_reserved() {
        refused(
            "9b ffffffffffffffff",
            "an array of 18446744073709551615 items",
        );
        refused("bb ffffffffffffffff", "a map of");
        refused("5b ffffffffffffffff", "a byte string of");
        refused("7a ffffffff", "a text string of 4294967295 bytes");
        refused(
            "9a 0fffffff 00 00",
            "an array of 268435455 items, but 2 bytes are left",
        );
        // A map needs two bytes an entry.
        refused("a2 60 00", "a map of 2 entries");
    }

    #[test]
    fn encode_refuses_non_finite_floats_and_repeated_keys() {
        assert!(encode(&Value::Float(f64::NAN)).is_err());
        assert!(encode(&Value::Float(f64::INFINITY)).is_err());
        let repeated = Value::Map(vec![("a".into(), Value::Null), ("a".into(), Value::Null)]);
        assert!(encode(&repeated).is_err());
    }

    #[test]
    fn encode_writes_map_entries_in_canonical_order_whatever_their_order() {
        let unordered = Value::Map(vec![
            ("bb".into(), Value::Uint(1)),
            ("c".into(), Value::Uint(2)),
            ("a".into(), Value::Uint(3)),
        ]);
        let bytes = encode(&unordered).unwrap();
        assert_eq!(hex::encode(&bytes), "a361610361630262626201");
        assert_eq!(
            decode(&bytes).unwrap(),
            Value::map(match unordered {
                Value::Map(entries) => entries,
                _ => unreachable!(),
            })
        );
    }

    fn float() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>().prop_filter("finite", |f| f.is_finite()),
            any::<f32>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(f64::from),
            any::<u16>().prop_filter_map("finite", half_to_f64),
            Just(-0.0),
            Just(0.0),
        ]
    }

    pub(crate) fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<u64>().prop_map(Value::Uint),
            (0..=i64::MAX as u64).prop_map(Value::Nint),
            prop::collection::vec(any::<u8>(), 0..40).prop_map(Value::Bytes),
            ".{0,12}".prop_map(Value::Text),
            any::<bool>().prop_map(Value::Bool),
            Just(Value::Null),
            float().prop_map(Value::Float),
        ];
        leaf.prop_recursive(6, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,6}", inner, 0..6).prop_map(Value::map),
            ]
        })
    }

    proptest! {
        #[test]
        fn random_values_round_trip_and_encode_stably(v in value()) {
            let bytes = encode(&v).unwrap();
            let back = decode(&bytes).unwrap();
            prop_assert_eq!(&back, &v);
            prop_assert_eq!(encode(&back).unwrap(), bytes);
        }

        #[test]
        fn decode_never_panics_and_accepted_bytes_reencode_identically(
            bytes in prop::collection::vec(any::<u8>(), 0..64)
        ) {
            if let Ok(v) = decode(&bytes) {
                prop_assert_eq!(encode(&v).unwrap(), bytes);
            }
        }

        #[test]
        fn decode_never_panics_on_mutated_encodings(
            v in value(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)
        ) {
            let mut bytes = encode(&v).unwrap();
            for (at, byte) in flips {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            if let Ok(v) = decode(&bytes) {
                prop_assert_eq!(encode(&v).unwrap(), bytes);
            }
        }
    }
}
