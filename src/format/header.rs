//! The `cozytensors/1` header (spec §4): a deterministic CBOR array of records.
//!
//! ```text
//! header    = [format, chunks: [* object], encodings: [* encoding], pipeline, components: [* component], metadata]
//! object    = [sha256: bytes(32), length]
//! encoding  = [scheme, params]
//! pipeline  = [] / [class, config]
//! class     = [library, version, name]
//! component = [name, class, config, tensors, assets: {path => object}, ? config_file]
//! tensor    = [key, dtype, shape, 0, location] / [key, dtype, shape, encoding_index ≥ 1, [+ part]]
//! part      = [role, dtype, shape, location]
//! location  = [chunk_index, offset, length]
//! ```
//!
//! [`Header::from_cbor`] applies every reader refusal of §2, §4, §5 and §9; later elements of a
//! record (a later minor's fields) are skipped. [`Header::to_cbor`] writes what this build knows
//! (no extensions), so a header that must keep its identity is kept as its original bytes.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use super::cbor::{self, Domain, Item, Reader, Writer};
use super::names::{is_path, is_segment};
use super::{Dtype, FormatError, FormatResult, ObjectRef, Sha256, Value};

/// The `format` tag a writer writes (spec §2).
pub const HEADER_FORMAT: &str = "cozytensors/1";

/// A component's config, a pipeline's config, an encoding's params or the header metadata: a map
/// with text keys. Only configs may hold [`Value::Float`] and [`Value::Null`] (spec §4, §9).
pub type Config = BTreeMap<String, Value>;

/// A decoded, validated header.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    /// The document's `format` tag as written (`cozytensors/1` or `cozytensors/1.<minor>`).
    pub format: String,
    /// The chunk objects that locations index.
    pub chunks: Vec<ObjectRef>,
    /// Each distinct encoding once, in order of first citation.
    pub encodings: Vec<Encoding>,
    /// What `model_index.json` held; `None` for a model without a pipeline (`[]`).
    pub pipeline: Option<Pipeline>,
    /// Components in construction order.
    pub components: Vec<Component>,
    /// Loading metadata (free-form values, no floats or null).
    pub metadata: Config,
}

/// An encoding `[scheme, params]` (spec §6).
#[derive(Clone, Debug, PartialEq)]
pub struct Encoding {
    /// `family.variant`, non-empty.
    pub scheme: String,
    /// Snake-case params; values in the document value domain (no floats, no null).
    pub params: Config,
}

/// A class `[library, version, name]`; all three empty is the unknown model (spec §4).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ClassRef {
    /// The library (`diffusers`, `transformers`); empty only for the unknown class.
    pub library: String,
    /// The library version that recorded it; empty where nothing records it.
    pub version: String,
    /// The class name (`UNet2DConditionModel`).
    pub name: String,
}

/// The pipeline: `model_index.json` as its class and config.
#[derive(Clone, Debug, PartialEq)]
pub struct Pipeline {
    /// `["diffusers", version, _class_name]`.
    pub class: ClassRef,
    /// The parsed `model_index.json`.
    pub config: Config,
}

/// A component: one folder of a Diffusers pipeline, or the model of a Transformers folder.
#[derive(Clone, Debug, PartialEq)]
pub struct Component {
    /// A path segment, unique within the header.
    pub name: String,
    /// Its class.
    pub class: ClassRef,
    /// Its parsed config file (empty when it has none).
    pub config: Config,
    /// Tensors in construction order; keys unique within the component.
    pub tensors: Vec<Tensor>,
    /// Run data by path relative to the component's folder.
    pub assets: BTreeMap<String, ObjectRef>,
    /// The config's file name when it is not `config.json`.
    pub config_file: Option<String>,
}

impl Component {
    /// The config's file name: `config_file`, else `config.json`.
    pub fn config_name(&self) -> &str {
        self.config_file.as_deref().unwrap_or("config.json")
    }
}

/// A tensor: its key, logical dtype and shape, and where its bytes are.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// The state-dict key within its component; non-empty.
    pub key: String,
    /// The logical dtype.
    pub dtype: Dtype,
    /// Extents, outermost first; `[]` is a scalar.
    pub shape: Vec<u64>,
    /// Plain bytes or encoded parts.
    pub body: Body,
}

/// How a tensor's bytes are stored.
#[derive(Clone, Debug, PartialEq)]
pub enum Body {
    /// The tensor's bytes, row-major little-endian, at this location.
    Plain(Location),
    /// Parts that become the tensor through `encodings[encoding]` (0-based here; the document
    /// writes `encoding + 1`).
    Encoded {
        /// Index into [`Header::encodings`].
        encoding: usize,
        /// The parts, in construction order; roles unique.
        parts: Vec<Part>,
    },
}

/// One stored part of an encoded tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    /// What the part is (`weight`, `scale`); non-empty, unique within its tensor.
    pub role: String,
    /// The stored dtype.
    pub dtype: Dtype,
    /// The stored shape.
    pub shape: Vec<u64>,
    /// Where its bytes are.
    pub location: Location,
}

/// Bytes in the chunks: `length` bytes from `offset` in `chunks[chunk]`, continuing at offset 0
/// of the following chunks when the chunk ends first (spec §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Location {
    /// Index into [`Header::chunks`].
    pub chunk: u64,
    /// Byte offset in that chunk; a multiple of 4096 when `length > 0`.
    pub offset: u64,
    /// Byte count.
    pub length: u64,
}

impl Header {
    /// Decodes and validates a header.
    ///
    /// # Errors
    /// Any reader refusal of the spec, naming the rule, the component and tensor.
    pub fn from_cbor(bytes: &[u8]) -> FormatResult<Header> {
        let header = Parser {
            r: Reader::new(bytes),
        }
        .header()?;
        header.validate()?;
        Ok(header)
    }

    /// The deterministic encoding of this header (no extension fields).
    ///
    /// # Errors
    /// A value outside the document value domain (a float outside a config, …) or a header that
    /// breaks a rule [`Header::from_cbor`] would refuse.
    pub fn to_cbor(&self) -> FormatResult<Vec<u8>> {
        self.validate()?;
        let root = At::default();
        let mut w = Writer::with_capacity(4096);
        w.array(6);
        w.text(&self.format);
        w.array(self.chunks.len());
        for chunk in &self.chunks {
            write_object(&mut w, chunk);
        }
        w.array(self.encodings.len());
        for (i, encoding) in self.encodings.iter().enumerate() {
            w.array(2);
            w.text(&encoding.scheme);
            write_map(&mut w, &encoding.params, Domain::Document, 3)
                .map_err(|e| within(e, root, format_args!("encoding {}'s params", i + 1)))?;
        }
        match &self.pipeline {
            None => w.array(0),
            Some(pipeline) => {
                w.array(2);
                write_class(&mut w, &pipeline.class);
                write_map(&mut w, &pipeline.config, Domain::Config, 2)
                    .map_err(|e| within(e, root, format_args!("the pipeline's config")))?;
            }
        }
        w.array(self.components.len());
        for c in &self.components {
            let at = At::component(&c.name);
            w.array(5 + usize::from(c.config_file.is_some()));
            w.text(&c.name);
            write_class(&mut w, &c.class);
            write_map(&mut w, &c.config, Domain::Config, 3)
                .map_err(|e| within(e, at, format_args!("the config")))?;
            w.array(c.tensors.len());
            for t in &c.tensors {
                w.array(5);
                w.text(&t.key);
                w.text(t.dtype.name());
                write_shape(&mut w, &t.shape);
                match &t.body {
                    Body::Plain(location) => {
                        w.uint(0);
                        write_location(&mut w, location);
                    }
                    Body::Encoded { encoding, parts } => {
                        w.uint(*encoding as u64 + 1);
                        w.array(parts.len());
                        for part in parts {
                            w.array(4);
                            w.text(&part.role);
                            w.text(part.dtype.name());
                            write_shape(&mut w, &part.shape);
                            write_location(&mut w, &part.location);
                        }
                    }
                }
            }
            let mut assets: Vec<(&str, &ObjectRef)> =
                c.assets.iter().map(|(k, v)| (k.as_str(), v)).collect();
            assets.sort_by(|a, b| cbor::key_order(a.0, b.0));
            w.map_head(assets.len());
            for (path, object) in assets {
                w.text(path);
                write_object(&mut w, object);
            }
            if let Some(file) = &c.config_file {
                w.text(file);
            }
        }
        write_map(&mut w, &self.metadata, Domain::Document, 1)
            .map_err(|e| within(e, root, format_args!("the metadata")))?;
        Ok(w.into_bytes())
    }

    /// Checks every rule of spec §2, §4 and §5 that concerns the decoded values rather than
    /// their encoding: the format tag, names, uniqueness, classes, encodings and their
    /// citation order, dtype sizes and locations. [`Header::from_cbor`] and
    /// [`Header::to_cbor`] both apply it.
    ///
    /// # Errors
    /// The first rule broken, naming the rule, the component, tensor and part, and the numbers.
    pub fn validate(&self) -> FormatResult<()> {
        check_format(&self.format)?;
        let root = At::default();
        let mut seen_encodings = HashSet::with_capacity(self.encodings.len());
        for (i, encoding) in self.encodings.iter().enumerate() {
            let number = i + 1;
            if encoding.scheme.is_empty() {
                return Err(invalid4(
                    root,
                    format_args!("encoding {number} has an empty scheme"),
                ));
            }
            // The encoded params are the encoding's identity: equal values, equal bytes.
            let mut w = Writer::with_capacity(64);
            w.text(&encoding.scheme);
            write_map(&mut w, &encoding.params, Domain::Document, 3)
                .map_err(|e| within(e, root, format_args!("encoding {number}'s params")))?;
            if !seen_encodings.insert(w.into_bytes()) {
                return Err(invalid4(
                    root,
                    format_args!(
                        "encoding {number} ({:?}) repeats an earlier one; each distinct encoding is listed once",
                        encoding.scheme
                    ),
                ));
            }
        }
        if let Some(pipeline) = &self.pipeline {
            check_class(&pipeline.class, root, "the pipeline")?;
        }
        // rooms[i]: the bytes of chunks[i..], which a location starting in chunk i may span.
        let mut rooms = vec![0u128; self.chunks.len()];
        let mut sum = 0u128;
        for (room, chunk) in rooms.iter_mut().zip(&self.chunks).rev() {
            sum += u128::from(chunk.length);
            *room = sum;
        }
        let mut names = HashSet::with_capacity(self.components.len());
        let mut keys = HashSet::new();
        let mut roles = HashSet::new();
        let mut cited = 0usize;
        for c in &self.components {
            let at = At::component(&c.name);
            if !is_segment(&c.name) {
                return Err(invalid4(
                    root,
                    format_args!("component name {:?} is not a path segment", c.name),
                ));
            }
            if !names.insert(c.name.as_str()) {
                return Err(invalid4(
                    root,
                    format_args!("component name {:?} is repeated", c.name),
                ));
            }
            check_class(&c.class, at, "its class")?;
            if let Some(file) = &c.config_file {
                if !is_path(file) {
                    return Err(invalid4(
                        at,
                        format_args!("config_file {file:?} is not a path"),
                    ));
                }
                if file == DEFAULT_CONFIG {
                    return Err(invalid4(
                        at,
                        format_args!(
                            "config_file {file:?} is the default, written only before later fields"
                        ),
                    ));
                }
            }
            let config_name = c.config_name();
            for path in c.assets.keys() {
                if !is_path(path) {
                    return Err(invalid4(
                        at,
                        format_args!("asset key {path:?} is not a path"),
                    ));
                }
                if path == config_name {
                    return Err(invalid4(
                        at,
                        format_args!("asset key {path:?} is the config's file name"),
                    ));
                }
            }
            keys.clear();
            keys.reserve(c.tensors.len());
            for t in &c.tensors {
                if t.key.is_empty() {
                    return Err(invalid4(at, format_args!("a tensor key is empty")));
                }
                if !keys.insert(t.key.as_str()) {
                    return Err(invalid4(
                        at,
                        format_args!("tensor key {:?} is repeated", t.key),
                    ));
                }
                let at = At {
                    tensor: Some(&t.key),
                    ..at
                };
                check_dtype_name(&t.dtype, at)?;
                match &t.body {
                    Body::Plain(location) => {
                        check_location(&self.chunks, &rooms, location, &t.dtype, &t.shape, at)?;
                    }
                    Body::Encoded { encoding, parts } => {
                        t.dtype
                            .byte_len(&t.shape)
                            .map_err(|e| invalid5(at, format_args!("logical shape: {e}")))?;
                        let number = encoding.saturating_add(1);
                        if *encoding >= self.encodings.len() {
                            return Err(invalid4(
                                at,
                                format_args!(
                                    "encoding index {number} is out of range: the header lists {} encodings",
                                    self.encodings.len()
                                ),
                            ));
                        }
                        if *encoding > cited {
                            return Err(invalid4(
                                at,
                                format_args!(
                                    "encoding index {number} is cited before encoding {}; encodings are listed in order of first citation",
                                    cited + 1
                                ),
                            ));
                        }
                        if *encoding == cited {
                            cited += 1;
                        }
                        if parts.is_empty() {
                            return Err(invalid4(
                                at,
                                format_args!("an encoded tensor has no parts"),
                            ));
                        }
                        // Parts are few: a scan beats hashing until a hostile count.
                        let hashed = parts.len() > SCAN_ROLES;
                        roles.clear();
                        for (i, part) in parts.iter().enumerate() {
                            if part.role.is_empty() {
                                return Err(invalid4(at, format_args!("a part role is empty")));
                            }
                            let repeated = if hashed {
                                !roles.insert(part.role.as_str())
                            } else {
                                parts[..i].iter().any(|p| p.role == part.role)
                            };
                            if repeated {
                                return Err(invalid4(
                                    at,
                                    format_args!("part role {:?} is repeated", part.role),
                                ));
                            }
                            let at = At {
                                part: Some(&part.role),
                                ..at
                            };
                            check_dtype_name(&part.dtype, at)?;
                            check_location(
                                &self.chunks,
                                &rooms,
                                &part.location,
                                &part.dtype,
                                &part.shape,
                                at,
                            )?;
                        }
                    }
                }
            }
        }
        if cited != self.encodings.len() {
            return Err(invalid4(
                root,
                format_args!(
                    "encoding {} is never cited; every listed encoding is cited by a tensor",
                    cited + 1
                ),
            ));
        }
        Ok(())
    }

    /// Every object the header cites: its chunks, then each component's assets (its closure
    /// minus itself, spec §7), possibly repeated.
    pub fn objects(&self) -> impl Iterator<Item = &ObjectRef> {
        self.chunks
            .iter()
            .chain(self.components.iter().flat_map(|c| c.assets.values()))
    }

    /// The component called `name`.
    pub fn component(&self, name: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.name == name)
    }

    /// The pieces of `location` in chunk order: `(chunk index, offset in chunk, length)`,
    /// splitting where a chunk ends. Assumes a validated header (the range fits the chunks).
    pub fn pieces(&self, location: Location) -> Pieces<'_> {
        Pieces {
            chunks: &self.chunks,
            chunk: location.chunk as usize,
            offset: location.offset,
            left: location.length,
        }
    }
}

/// Iterator of [`Header::pieces`].
#[derive(Clone, Debug)]
pub struct Pieces<'a> {
    chunks: &'a [ObjectRef],
    chunk: usize,
    offset: u64,
    left: u64,
}

impl Iterator for Pieces<'_> {
    type Item = (usize, u64, u64);

    fn next(&mut self) -> Option<(usize, u64, u64)> {
        while self.left > 0 {
            let chunk = self.chunks.get(self.chunk)?;
            let room = chunk.length.saturating_sub(self.offset);
            let (index, offset) = (self.chunk, self.offset);
            self.chunk += 1;
            self.offset = 0;
            if room == 0 {
                continue;
            }
            let take = room.min(self.left);
            self.left -= take;
            return Some((index, offset, take));
        }
        None
    }
}

/// A component's config file name unless `config_file` says otherwise (spec §4).
const DEFAULT_CONFIG: &str = "config.json";

/// Offsets of located bytes are multiples of this (spec §4).
const ALIGN: u64 = 4096;

/// Up to this many parts, roles are checked for repeats by a scan.
const SCAN_ROLES: usize = 16;

/// Elements of the root; a root of one fewer is the pre-cut layout (spec §4, CDDL).
const ROOT_FIELDS: u64 = 6;

/// Lower bounds on the encoded size of records, so that an announced count reserves no more
/// than the bytes left could hold.
const MIN_OBJECT_BYTES: usize = 36;
const MIN_TENSOR_BYTES: usize = 10;
const MIN_COMPONENT_BYTES: usize = 9;
const MIN_PART_BYTES: usize = 9;

/// Refuses a format tag of another kind or major (spec §2): `cozytensors/1` or
/// `cozytensors/1.<digits>`.
fn check_format(found: &str) -> FormatResult<()> {
    let accepted = found.strip_prefix(HEADER_FORMAT).is_some_and(|rest| {
        rest.is_empty()
            || rest
                .strip_prefix('.')
                .is_some_and(|minor| !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit()))
    });
    if accepted {
        Ok(())
    } else {
        Err(FormatError::Format {
            found: found.to_owned(),
            expected: HEADER_FORMAT,
        })
    }
}

/// Where in the header a value is, for messages.
#[derive(Clone, Copy, Default)]
struct At<'a> {
    component: Option<&'a str>,
    tensor: Option<&'a str>,
    part: Option<&'a str>,
}

impl<'a> At<'a> {
    fn component(name: &'a str) -> At<'a> {
        At {
            component: Some(name),
            ..At::default()
        }
    }
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(component) = self.component else {
            return f.write_str("the header");
        };
        write!(f, "component {component:?}")?;
        if let Some(tensor) = self.tensor {
            write!(f, " tensor {tensor:?}")?;
        }
        if let Some(part) = self.part {
            write!(f, " part {part:?}")?;
        }
        Ok(())
    }
}

fn invalid4(at: At<'_>, message: fmt::Arguments<'_>) -> FormatError {
    FormatError::Invalid(format!("spec §4: {at}: {message}"))
}

fn invalid5(at: At<'_>, message: fmt::Arguments<'_>) -> FormatError {
    FormatError::Invalid(format!("spec §5: {at}: {message}"))
}

/// Adds where an encoding error happened to the CBOR layer's message.
fn within(error: FormatError, at: At<'_>, what: fmt::Arguments<'_>) -> FormatError {
    match error {
        FormatError::Encoding(message) => {
            let rule = message.strip_prefix("spec §9: ").unwrap_or(&message);
            FormatError::Encoding(format!("spec §9: {at}: {what}: {rule}"))
        }
        other => other,
    }
}

fn check_class(class: &ClassRef, at: At<'_>, whose: &str) -> FormatResult<()> {
    if class.library.is_empty() && !(class.version.is_empty() && class.name.is_empty()) {
        return Err(invalid4(
            at,
            format_args!(
                "{whose} class [\"\", {:?}, {:?}] has a version or name but no library",
                class.version, class.name
            ),
        ));
    }
    Ok(())
}

fn check_dtype_name(dtype: &Dtype, at: At<'_>) -> FormatResult<()> {
    if dtype.name().is_empty() {
        return Err(invalid5(at, format_args!("a dtype is a non-empty name")));
    }
    Ok(())
}

/// The size rule (spec §5) and the location rules (spec §4) for the bytes of a plain tensor or
/// a part. `rooms[i]` is the summed length of `chunks[i..]`.
fn check_location(
    chunks: &[ObjectRef],
    rooms: &[u128],
    location: &Location,
    dtype: &Dtype,
    shape: &[u64],
    at: At<'_>,
) -> FormatResult<()> {
    let Location {
        chunk,
        offset,
        length,
    } = *location;
    let size = dtype
        .byte_len(shape)
        .map_err(|e| invalid5(at, format_args!("{e}")))?;
    if let Some(size) = size {
        if size != length {
            return Err(invalid5(
                at,
                format_args!(
                    "location length {length} is not the {size} bytes of {dtype} {shape:?}"
                ),
            ));
        }
    }
    if length == 0 {
        return Ok(());
    }
    let index = match usize::try_from(chunk) {
        Ok(index) if index < chunks.len() => index,
        _ => {
            return Err(invalid4(
                at,
                format_args!(
                    "location chunk {chunk} is out of range: the header has {} chunks",
                    chunks.len()
                ),
            ))
        }
    };
    if offset % ALIGN != 0 {
        return Err(invalid4(
            at,
            format_args!("location offset {offset} is not a multiple of {ALIGN}"),
        ));
    }
    let chunk_length = chunks[index].length;
    if offset >= chunk_length {
        return Err(invalid4(
            at,
            format_args!(
                "location offset {offset} is not inside chunk {chunk} of {chunk_length} bytes"
            ),
        ));
    }
    let end = u128::from(offset) + u128::from(length);
    if end > rooms[index] {
        return Err(invalid4(
            at,
            format_args!(
                "location offset {offset} + length {length} = {end} runs past the {} bytes of chunks {chunk}..",
                rooms[index]
            ),
        ));
    }
    Ok(())
}

fn write_object(w: &mut Writer, object: &ObjectRef) {
    w.array(2);
    w.bytes(&object.sha256.0);
    w.uint(object.length);
}

fn write_class(w: &mut Writer, class: &ClassRef) {
    w.array(3);
    w.text(&class.library);
    w.text(&class.version);
    w.text(&class.name);
}

fn write_shape(w: &mut Writer, shape: &[u64]) {
    w.array(shape.len());
    for &extent in shape {
        w.uint(extent);
    }
}

fn write_location(w: &mut Writer, location: &Location) {
    w.array(3);
    w.uint(location.chunk);
    w.uint(location.offset);
    w.uint(location.length);
}

/// A text-keyed map at `depth` whose values must lie in `domain`.
fn write_map(w: &mut Writer, map: &Config, domain: Domain, depth: usize) -> FormatResult<()> {
    w.entries(map.iter().map(|(k, v)| (k.as_str(), v)), domain, depth)
}

/// Reserve for `n` announced items no more than `left` input bytes can hold.
fn reserve(n: u64, left: usize, min_bytes: usize) -> usize {
    n.min((left / min_bytes) as u64) as usize
}

/// Reads the header's records straight from the bytes. Depths count the arrays and maps around
/// a value from the root (0), as [`cbor::decode`] counts them, so both accept the same nesting.
struct Parser<'a> {
    r: Reader<'a>,
}

impl<'a> Parser<'a> {
    fn item(&mut self, at: At<'_>, what: fmt::Arguments<'_>) -> FormatResult<(usize, Item<'a>)> {
        let start = self.r.pos();
        let item = self.r.item().map_err(|e| within(e, at, what))?;
        Ok((start, item))
    }

    fn wrong(
        at: At<'_>,
        what: fmt::Arguments<'_>,
        start: usize,
        found: Item<'_>,
        expected: &str,
    ) -> FormatError {
        invalid4(
            at,
            format_args!(
                "{what} is {}, not {expected} (CBOR byte {start})",
                found.kind()
            ),
        )
    }

    fn array(&mut self, at: At<'_>, what: fmt::Arguments<'_>) -> FormatResult<u64> {
        match self.item(at, what)? {
            (_, Item::Array(n)) => Ok(n),
            (start, other) => Err(Self::wrong(at, what, start, other, "an array")),
        }
    }

    /// A record of at least `min` elements; returns how many later elements follow them.
    fn record(&mut self, at: At<'_>, what: fmt::Arguments<'_>, min: u64) -> FormatResult<u64> {
        let n = self.array(at, what)?;
        n.checked_sub(min).ok_or_else(|| {
            invalid4(
                at,
                format_args!("{what} has {n} elements, fewer than the {min} listed"),
            )
        })
    }

    fn uint(&mut self, at: At<'_>, what: fmt::Arguments<'_>) -> FormatResult<u64> {
        match self.item(at, what)? {
            (_, Item::Uint(n)) => Ok(n),
            (start, other) => Err(Self::wrong(at, what, start, other, "an unsigned integer")),
        }
    }

    fn text(&mut self, at: At<'_>, what: fmt::Arguments<'_>) -> FormatResult<&'a str> {
        match self.item(at, what)? {
            (_, Item::Text(text)) => Ok(text),
            (start, other) => Err(Self::wrong(at, what, start, other, "a text string")),
        }
    }

    /// Skips `n` later elements at `depth`, still in the extension value domain.
    fn skip(
        &mut self,
        n: u64,
        depth: usize,
        at: At<'_>,
        what: fmt::Arguments<'_>,
    ) -> FormatResult<()> {
        for _ in 0..n {
            self.r
                .skip(Domain::Extension, depth)
                .map_err(|e| within(e, at, format_args!("a later field of {what}")))?;
        }
        Ok(())
    }

    /// A text-keyed map at `depth` with values in `domain`.
    fn map(
        &mut self,
        domain: Domain,
        depth: usize,
        at: At<'_>,
        what: fmt::Arguments<'_>,
    ) -> FormatResult<Config> {
        let entries = self
            .r
            .map(domain, depth, &|| format!("{at}: {what}"))
            .map_err(|e| within(e, at, what))?;
        Ok(entries.into_iter().collect())
    }

    fn object(
        &mut self,
        depth: usize,
        at: At<'_>,
        what: fmt::Arguments<'_>,
    ) -> FormatResult<ObjectRef> {
        let later = self.record(at, what, 2)?;
        let sha256 = match self.item(at, what)? {
            (_, Item::Bytes(bytes)) => match <[u8; 32]>::try_from(bytes) {
                Ok(digest) => Sha256(digest),
                Err(_) => {
                    return Err(invalid4(
                        at,
                        format_args!("{what}'s sha256 is {} bytes, not 32", bytes.len()),
                    ))
                }
            },
            (start, other) => return Err(Self::wrong(at, what, start, other, "a byte string")),
        };
        let length = self.uint(at, format_args!("{what}'s length"))?;
        self.skip(later, depth + 1, at, what)?;
        Ok(ObjectRef { sha256, length })
    }

    fn class(&mut self, at: At<'_>, what: fmt::Arguments<'_>) -> FormatResult<ClassRef> {
        let n = self.array(at, what)?;
        if n != 3 {
            return Err(invalid4(
                at,
                format_args!(
                    "{what} has {n} elements, not exactly three texts [library, version, name]"
                ),
            ));
        }
        Ok(ClassRef {
            library: self.text(at, format_args!("{what}'s library"))?.to_owned(),
            version: self.text(at, format_args!("{what}'s version"))?.to_owned(),
            name: self.text(at, format_args!("{what}'s name"))?.to_owned(),
        })
    }

    fn dtype(&mut self, at: At<'_>) -> FormatResult<Dtype> {
        let name = self.text(at, format_args!("the dtype"))?;
        Dtype::parse(name).map_err(|e| invalid5(at, format_args!("{e}")))
    }

    fn shape(&mut self, at: At<'_>) -> FormatResult<Vec<u64>> {
        let n = self.array(at, format_args!("the shape"))?;
        let mut shape = Vec::with_capacity(n as usize);
        for i in 0..n {
            shape.push(self.uint(at, format_args!("shape extent {i}"))?);
        }
        Ok(shape)
    }

    fn location(&mut self, depth: usize, at: At<'_>) -> FormatResult<Location> {
        let what = format_args!("the location");
        let later = self.record(at, what, 3)?;
        let location = Location {
            chunk: self.uint(at, format_args!("the location's chunk index"))?,
            offset: self.uint(at, format_args!("the location's offset"))?,
            length: self.uint(at, format_args!("the location's length"))?,
        };
        self.skip(later, depth + 1, at, what)?;
        Ok(location)
    }

    fn header(mut self) -> FormatResult<Header> {
        let root = At::default();
        let fields = self.array(root, format_args!("the root"))?;
        if fields == 0 {
            return Err(invalid4(
                root,
                format_args!("the root is empty: it has no format tag"),
            ));
        }
        let format = self.text(root, format_args!("the format tag"))?;
        check_format(format)?;
        if fields == ROOT_FIELDS - 1 {
            return Err(invalid4(
                root,
                format_args!("the root has 5 elements: a pre-cut layout, refused as such"),
            ));
        }
        if fields < ROOT_FIELDS {
            return Err(invalid4(
                root,
                format_args!("the root has {fields} elements, fewer than the {ROOT_FIELDS} listed"),
            ));
        }

        let n = self.array(root, format_args!("chunks"))?;
        let mut chunks = Vec::with_capacity(reserve(n, self.r.left(), MIN_OBJECT_BYTES));
        for i in 0..n {
            chunks.push(self.object(2, root, format_args!("chunk {i}"))?);
        }

        let n = self.array(root, format_args!("encodings"))?;
        let mut encodings = Vec::with_capacity(reserve(n, self.r.left(), 3));
        for i in 1..=n {
            let what = format_args!("encoding {i}");
            let later = self.record(root, what, 2)?;
            let scheme = self
                .text(root, format_args!("encoding {i}'s scheme"))?
                .to_owned();
            let params = self.map(
                Domain::Document,
                3,
                root,
                format_args!("encoding {i}'s params"),
            )?;
            self.skip(later, 3, root, what)?;
            encodings.push(Encoding { scheme, params });
        }

        let pipeline = match self.array(root, format_args!("the pipeline"))? {
            0 => None,
            1 => {
                return Err(invalid4(
                    root,
                    format_args!("the pipeline has 1 element: it is [] or [class, config]"),
                ))
            }
            n => {
                let class = self.class(root, format_args!("the pipeline's class"))?;
                let config = self.map(
                    Domain::Config,
                    2,
                    root,
                    format_args!("the pipeline's config"),
                )?;
                self.skip(n - 2, 2, root, format_args!("the pipeline"))?;
                Some(Pipeline { class, config })
            }
        };

        let n = self.array(root, format_args!("components"))?;
        let mut components = Vec::with_capacity(reserve(n, self.r.left(), MIN_COMPONENT_BYTES));
        for i in 0..n {
            components.push(self.component(i)?);
        }

        let metadata = self.map(Domain::Document, 1, root, format_args!("the metadata"))?;
        self.skip(fields - ROOT_FIELDS, 1, root, format_args!("the root"))?;
        self.r.finish()?;
        Ok(Header {
            format: format.to_owned(),
            chunks,
            encodings,
            pipeline,
            components,
            metadata,
        })
    }

    fn component(&mut self, index: u64) -> FormatResult<Component> {
        let root = At::default();
        let what = format_args!("component {index}");
        let later = self.record(root, what, 5)?;
        let name = self.text(root, format_args!("component {index}'s name"))?;
        let at = At::component(name);
        let class = self.class(at, format_args!("the class"))?;
        let config = self.map(Domain::Config, 3, at, format_args!("the config"))?;
        let n = self.array(at, format_args!("the tensors"))?;
        let mut tensors = Vec::with_capacity(reserve(n, self.r.left(), MIN_TENSOR_BYTES));
        for i in 0..n {
            tensors.push(self.tensor(at, i)?);
        }
        let assets = match self.item(at, format_args!("the assets"))? {
            (_, Item::Map(n)) => {
                let mut assets = BTreeMap::new();
                let mut previous = None;
                for _ in 0..n {
                    let (path, encoded) = self
                        .r
                        .key(previous)
                        .map_err(|e| within(e, at, format_args!("the assets")))?;
                    previous = Some(encoded);
                    let object = self.object(4, at, format_args!("asset {path:?}"))?;
                    assets.insert(path.to_owned(), object);
                }
                assets
            }
            (start, other) => {
                return Err(Self::wrong(
                    at,
                    format_args!("the assets"),
                    start,
                    other,
                    "a map",
                ))
            }
        };
        let config_file = match later {
            0 => None,
            _ => {
                let file = self.text(at, format_args!("config_file"))?;
                // Later fields make the default explicit; without them it is never written.
                (later == 1 || file != DEFAULT_CONFIG).then(|| file.to_owned())
            }
        };
        self.skip(
            later.saturating_sub(1),
            3,
            at,
            format_args!("the component"),
        )?;
        Ok(Component {
            name: name.to_owned(),
            class,
            config,
            tensors,
            assets,
            config_file,
        })
    }

    /// A tensor record (at depth 4).
    fn tensor(&mut self, component: At<'_>, index: u64) -> FormatResult<Tensor> {
        let what = format_args!("tensor {index}");
        let later = self.record(component, what, 5)?;
        let key = self.text(component, format_args!("tensor {index}'s key"))?;
        let at = At {
            tensor: Some(key),
            ..component
        };
        let dtype = self.dtype(at)?;
        let shape = self.shape(at)?;
        let body = match self.uint(at, format_args!("the encoding index"))? {
            0 => Body::Plain(self.location(5, at)?),
            number => {
                // An index past the table is refused by validation, with the table's size.
                let encoding = usize::try_from(number - 1).unwrap_or(usize::MAX);
                let n = self.array(at, format_args!("the parts"))?;
                let mut parts = Vec::with_capacity(reserve(n, self.r.left(), MIN_PART_BYTES));
                for i in 0..n {
                    let what = format_args!("part {i}");
                    let later = self.record(at, what, 4)?;
                    let role = self.text(at, format_args!("part {i}'s role"))?;
                    let at = At {
                        part: Some(role),
                        ..at
                    };
                    let dtype = self.dtype(at)?;
                    let shape = self.shape(at)?;
                    let location = self.location(7, at)?;
                    self.skip(later, 7, at, format_args!("the part"))?;
                    parts.push(Part {
                        role: role.to_owned(),
                        dtype,
                        shape,
                        location,
                    });
                }
                Body::Encoded { encoding, parts }
            }
        };
        self.skip(later, 5, at, format_args!("the tensor"))?;
        Ok(Tensor {
            key: key.to_owned(),
            dtype,
            shape,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::cbor::{decode, encode};
    use proptest::prelude::*;

    fn t(text: &str) -> Value {
        Value::Text(text.into())
    }

    fn u(n: u64) -> Value {
        Value::Uint(n)
    }

    fn a(items: Vec<Value>) -> Value {
        Value::Array(items)
    }

    fn m(entries: Vec<(&str, Value)>) -> Value {
        Value::map(entries.into_iter().map(|(k, v)| (k.to_owned(), v)))
    }

    fn object(seed: u8, length: u64) -> Value {
        a(vec![Value::Bytes(vec![seed; 32]), u(length)])
    }

    fn class(library: &str, version: &str, name: &str) -> Value {
        a(vec![t(library), t(version), t(name)])
    }

    fn location(chunk: u64, offset: u64, length: u64) -> Value {
        a(vec![u(chunk), u(offset), u(length)])
    }

    /// A valid header touching every record: two chunks, two encodings, a pipeline, a
    /// component with a plain and two encoded tensors, an asset and a `config_file`, and a
    /// second component without one.
    fn base() -> Value {
        a(vec![
            t("cozytensors/1"),
            a(vec![object(1, 8192), object(2, 4096)]),
            a(vec![
                a(vec![t("fp8.rowwise"), m(vec![])]),
                a(vec![t("int8.convrot"), m(vec![("rotation_size", u(256))])]),
            ]),
            a(vec![
                class("diffusers", "0.30.0", "FluxPipeline"),
                m(vec![
                    ("_class_name", t("FluxPipeline")),
                    ("eps", Value::Float(1e-6)),
                ]),
            ]),
            a(vec![
                a(vec![
                    t("unet"),
                    class("diffusers", "0.30.0", "UNet2DConditionModel"),
                    m(vec![("scale", Value::Float(0.5)), ("none", Value::Null)]),
                    a(vec![
                        a(vec![
                            t("w"),
                            t("F32"),
                            a(vec![u(2), u(2)]),
                            u(0),
                            location(0, 0, 16),
                        ]),
                        a(vec![
                            t("q"),
                            t("BF16"),
                            a(vec![u(64), u(64)]),
                            u(1),
                            a(vec![
                                a(vec![
                                    t("weight"),
                                    t("F8_E4M3"),
                                    a(vec![u(64), u(64)]),
                                    location(0, 4096, 4096),
                                ]),
                                a(vec![
                                    t("scale"),
                                    t("F32"),
                                    a(vec![u(64)]),
                                    location(1, 0, 256),
                                ]),
                            ]),
                        ]),
                        a(vec![
                            t("r"),
                            t("BF16"),
                            a(vec![u(4)]),
                            u(2),
                            a(vec![a(vec![
                                t("weight"),
                                t("I8"),
                                a(vec![u(4)]),
                                location(0, 0, 4),
                            ])]),
                        ]),
                    ]),
                    m(vec![("tokenizer.json", object(3, 10))]),
                    t("unet_config.json"),
                ]),
                a(vec![
                    t("vae"),
                    class("", "", ""),
                    m(vec![]),
                    a(vec![a(vec![
                        t("w"),
                        t("X9"),
                        a(vec![u(3)]),
                        u(0),
                        location(1, 0, 7),
                    ])]),
                    m(vec![]),
                ]),
            ]),
            m(vec![
                ("source", t("hf://a/b@c")),
                ("tags", a(vec![t("x"), u(1)])),
            ]),
        ])
    }

    /// The value at `path`: array indices, or entry indices in a map (its value).
    fn at<'v>(v: &'v mut Value, path: &[usize]) -> &'v mut Value {
        path.iter().fold(v, |v, &i| match v {
            Value::Array(items) => &mut items[i],
            Value::Map(entries) => &mut entries[i].1,
            other => panic!("no index {i} in {other:?}"),
        })
    }

    fn items<'v>(v: &'v mut Value, path: &[usize]) -> &'v mut Vec<Value> {
        match at(v, path) {
            Value::Array(items) => items,
            other => panic!("{other:?} is not an array"),
        }
    }

    const CHUNKS: &[usize] = &[1];
    const ENCODINGS: &[usize] = &[2];
    const PIPELINE: &[usize] = &[3];
    const UNET: &[usize] = &[4, 0];
    const PLAIN: &[usize] = &[4, 0, 3, 0];
    const ENCODED: &[usize] = &[4, 0, 3, 1];
    const PART: &[usize] = &[4, 0, 3, 1, 4, 0];
    const METADATA: &[usize] = &[5];

    fn with(path: &[usize], new: Value) -> Value {
        let mut v = base();
        *at(&mut v, path) = new;
        v
    }

    fn edited(edit: impl FnOnce(&mut Value)) -> Value {
        let mut v = base();
        edit(&mut v);
        v
    }

    fn parse(v: &Value) -> FormatResult<Header> {
        Header::from_cbor(&encode(v).expect("test headers encode"))
    }

    #[track_caller]
    fn ok(v: &Value) -> Header {
        let bytes = encode(v).unwrap();
        let header = Header::from_cbor(&bytes).unwrap_or_else(|e| panic!("{e}"));
        let again = header.to_cbor().unwrap();
        assert_eq!(Header::from_cbor(&again).unwrap(), header);
        header
    }

    #[track_caller]
    fn refused(v: &Value, needle: &str) -> FormatError {
        match parse(v) {
            Ok(h) => panic!("accepted, expected a refusal naming {needle:?}: {h:?}"),
            Err(e) => {
                assert!(e.to_string().contains(needle), "{e:?} lacks {needle:?}");
                e
            }
        }
    }

    fn golden(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/data/header/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn the_reference_imports_header_decodes_and_reencodes_byte_identically() {
        let bytes = golden("minilm.cozytensors");
        assert_eq!(
            ObjectRef::of(&bytes).sha256.hex(),
            "32e56e3b632692babcb607703bc547195077b4e19280153b97f2fd2a8a0d63bf"
        );
        let header = Header::from_cbor(&bytes).unwrap();
        assert_eq!(header.components.len(), 1);
        assert_eq!(header.components[0].tensors.len(), 104);
        assert_eq!(header.pipeline, None);
        assert_eq!(header.to_cbor().unwrap(), bytes);
        assert_eq!(encode(&decode(&bytes).unwrap()).unwrap(), bytes);
    }

    #[test]
    fn the_reference_writers_header_with_encodings_reencodes_byte_identically() {
        let bytes = golden("dev-ckpt-mixed.cozytensors");
        let header = Header::from_cbor(&bytes).unwrap();
        assert_eq!(header.encodings.len(), 7);
        assert_eq!(header.encodings[1].scheme, "int8.convrot");
        let Body::Encoded { encoding, parts } = &header.components[0].tensors[1].body else {
            panic!("the second tensor is encoded");
        };
        assert_eq!((*encoding, parts.len()), (1, 2));
        assert_eq!(header.to_cbor().unwrap(), bytes);
    }

    #[test]
    fn the_spec_example_headers_reencode_byte_identically() {
        for name in ["header-basic.cozytensors", "header-configs.cozytensors"] {
            let bytes = golden(name);
            let header = Header::from_cbor(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(header.to_cbor().unwrap(), bytes, "{name}");
        }
        let configs = Header::from_cbor(&golden("header-configs.cozytensors")).unwrap();
        let config = &configs.pipeline.unwrap().config;
        assert!(matches!(config["negative-zero"], Value::Float(z) if z.is_sign_negative()));
        assert_eq!(config["f64-subnormal"], Value::Float(5e-324));
        assert_eq!(config["i64"], Value::Nint(i64::MAX as u64));
    }

    #[test]
    fn the_base_header_decodes_to_its_records_and_round_trips() {
        let bytes = encode(&base()).unwrap();
        let header = Header::from_cbor(&bytes).unwrap();
        assert_eq!(header.to_cbor().unwrap(), bytes);
        let unet = header.component("unet").unwrap();
        assert_eq!(unet.config_name(), "unet_config.json");
        assert_eq!(
            unet.tensors[0].body,
            Body::Plain(Location {
                chunk: 0,
                offset: 0,
                length: 16
            })
        );
        assert!(matches!(
            unet.tensors[1].body,
            Body::Encoded { encoding: 0, .. }
        ));
        assert!(matches!(
            unet.tensors[2].body,
            Body::Encoded { encoding: 1, .. }
        ));
        let vae = header.component("vae").unwrap();
        assert_eq!(vae.config_name(), "config.json");
        assert_eq!(vae.tensors[0].dtype, Dtype::Other("X9".into()));
    }

    #[test]
    fn the_format_tag_accepts_major_one_with_any_decimal_minor() {
        for tag in [
            "cozytensors/1",
            "cozytensors/1.0",
            "cozytensors/1.12",
            "cozytensors/1.007",
        ] {
            let header = ok(&with(&[0], t(tag)));
            assert_eq!(header.format, tag);
            assert_eq!(
                header.to_cbor().unwrap(),
                encode(&with(&[0], t(tag))).unwrap()
            );
        }
    }

    #[test]
    fn the_format_tag_refuses_another_kind_or_major() {
        for tag in [
            "cozytensors/2",
            "cozytensors/10",
            "cozytensors/1.",
            "cozytensors/1.x",
            "cozytensors/1.1a",
            "cozytensors/01",
            "cozytensors.tree/1",
            "cozytensors",
            "",
        ] {
            let err = parse(&with(&[0], t(tag))).unwrap_err();
            assert_eq!(
                err,
                FormatError::Format {
                    found: tag.into(),
                    expected: HEADER_FORMAT
                },
                "{tag}"
            );
        }
        refused(&with(&[0], u(1)), "the format tag is an unsigned integer");
    }

    #[test]
    fn a_root_of_exactly_five_elements_is_refused_as_a_pre_cut_layout() {
        let five = edited(|v| drop(items(v, &[]).pop()));
        refused(&five, "pre-cut layout");
        let four = edited(|v| items(v, &[]).truncate(4));
        refused(&four, "4 elements, fewer than the 6 listed");
        refused(&a(vec![]), "no format tag");
        refused(
            &t("cozytensors/1"),
            "the root is a text string, not an array",
        );
    }

    #[test]
    fn later_elements_of_the_root_and_every_record_are_skipped() {
        let extension = || {
            a(vec![
                Value::Bytes(vec![7; 3]),
                m(vec![("k", a(vec![u(1), Value::Nint(5)]))]),
            ])
        };
        let paths: [&[usize]; 11] = [
            &[],
            &[1, 0],
            &[2, 0],
            PIPELINE,
            UNET,
            PLAIN,
            &[4, 0, 3, 0, 4],
            PART,
            &[4, 0, 3, 1, 4, 0, 3],
            &[4, 0, 4, 0],
            ENCODED,
        ];
        for path in paths {
            let v = edited(|v| items(v, path).push(extension()));
            let header = ok(&v);
            assert_eq!(
                header,
                Header::from_cbor(&encode(&base()).unwrap()).unwrap(),
                "{path:?}"
            );
            assert_eq!(header.to_cbor().unwrap(), encode(&base()).unwrap());
        }
    }

    #[test]
    fn later_elements_stay_in_the_value_domain() {
        refused(
            &edited(|v| items(v, PLAIN).push(Value::Float(1.0))),
            "a float outside a config",
        );
        refused(
            &edited(|v| items(v, &[]).push(Value::Null)),
            "null outside a config",
        );
        refused(
            &edited(|v| items(v, UNET).push(a(vec![m(vec![("x", Value::Float(0.5))])]))),
            "a float outside a config",
        );
        ok(&edited(|v| items(v, PART).push(Value::Bytes(vec![]))));
        let mut with_tag = encode(&edited(|v| items(v, &[]).push(u(0)))).unwrap();
        let last = with_tag.len() - 1;
        with_tag[last] = 0xc0;
        with_tag.push(0x00);
        assert!(Header::from_cbor(&with_tag)
            .unwrap_err()
            .to_string()
            .contains("a tag"));
    }

    #[test]
    fn records_with_fewer_elements_than_listed_are_refused() {
        let cases: [(&[usize], usize, &str); 7] = [
            (
                &[1, 0],
                1,
                "chunk 0 has 1 elements, fewer than the 2 listed",
            ),
            (
                &[2, 0],
                1,
                "encoding 1 has 1 elements, fewer than the 2 listed",
            ),
            (
                UNET,
                4,
                "component 0 has 4 elements, fewer than the 5 listed",
            ),
            (PLAIN, 4, "tensor 0 has 4 elements, fewer than the 5 listed"),
            (PART, 3, "part 0 has 3 elements, fewer than the 4 listed"),
            (
                &[4, 0, 3, 0, 4],
                2,
                "the location has 2 elements, fewer than the 3 listed",
            ),
            (&[4, 0, 4, 0], 1, "asset \"tokenizer.json\" has 1 elements"),
        ];
        for (path, keep, needle) in cases {
            refused(&edited(|v| items(v, path).truncate(keep)), needle);
        }
        refused(
            &edited(|v| items(v, PIPELINE).truncate(1)),
            "the pipeline has 1 element",
        );
    }

    #[test]
    fn the_pipeline_is_empty_or_a_class_and_config() {
        assert_eq!(ok(&with(PIPELINE, a(vec![]))).pipeline, None);
        let pipeline = ok(&base()).pipeline.unwrap();
        assert_eq!(pipeline.class.name, "FluxPipeline");
        refused(
            &with(&[3, 1], a(vec![])),
            "the pipeline's config is an array, not a map",
        );
    }

    #[test]
    fn a_class_is_exactly_three_texts() {
        refused(
            &with(&[4, 0, 1], a(vec![t("a"), t("b")])),
            "not exactly three texts",
        );
        refused(
            &with(&[4, 0, 1], a(vec![t("a"), t("b"), t("c"), t("d")])),
            "not exactly three texts",
        );
        refused(
            &with(&[4, 0, 1, 2], u(3)),
            "the class's name is an unsigned integer",
        );
        refused(
            &with(&[3, 0, 0], Value::Null),
            "the pipeline's class's library is null",
        );
    }

    #[test]
    fn an_empty_library_with_a_name_or_version_is_refused() {
        refused(
            &with(&[4, 1, 1], class("", "", "X")),
            "has a version or name but no library",
        );
        refused(
            &with(&[4, 1, 1], class("", "1.0", "")),
            "has a version or name but no library",
        );
        refused(&with(&[3, 0], class("", "1.0", "P")), "the pipeline class");
        ok(&with(&[4, 1, 1], class("", "", "")));
        ok(&with(&[4, 1, 1], class("x", "", "")));
        ok(&with(&[3, 0], class("", "", "")));
    }

    #[test]
    fn component_names_are_unique_path_segments() {
        for bad in ["", ".", "..", "a/b", "a\\b", "a\0b"] {
            refused(&with(&[4, 1, 0], t(bad)), "is not a path segment");
        }
        for good in ["...", ".hidden", "text encoder"] {
            ok(&with(&[4, 1, 0], t(good)));
        }
        refused(
            &with(&[4, 1, 0], t("unet")),
            "component name \"unet\" is repeated",
        );
    }

    #[test]
    fn tensor_keys_are_non_empty_and_unique_within_their_component() {
        refused(
            &with(&[4, 0, 3, 0, 0], t("")),
            "component \"unet\": a tensor key is empty",
        );
        refused(
            &with(&[4, 0, 3, 0, 0], t("q")),
            "component \"unet\": tensor key \"q\" is repeated",
        );
        // The same key in another component is another tensor.
        assert_eq!(ok(&base()).components[1].tensors[0].key, "w");
    }

    #[test]
    fn roles_are_non_empty_and_unique_within_their_tensor() {
        refused(
            &with(&[4, 0, 3, 1, 4, 1, 0], t("")),
            "tensor \"q\": a part role is empty",
        );
        refused(
            &with(&[4, 0, 3, 1, 4, 1, 0], t("weight")),
            "part role \"weight\" is repeated",
        );
        // Another tensor's parts may reuse a role.
        ok(&base());
    }

    #[test]
    fn an_encoded_tensor_needs_at_least_one_part() {
        refused(
            &with(&[4, 0, 3, 2, 4], a(vec![])),
            "tensor \"r\": an encoded tensor has no parts",
        );
    }

    #[test]
    fn an_encoding_index_must_cite_a_listed_encoding() {
        refused(
            &with(&[4, 0, 3, 2, 3], u(3)),
            "encoding index 3 is out of range: the header lists 2 encodings",
        );
        refused(&with(&[4, 0, 3, 2, 3], u(u64::MAX)), "is out of range");
        // Index 2 is the last one listed.
        ok(&base());
    }

    #[test]
    fn encodings_are_listed_in_order_of_first_citation() {
        let swapped = edited(|v| {
            *at(v, &[4, 0, 3, 1, 3]) = u(2);
            *at(v, &[4, 0, 3, 2, 3]) = u(1);
        });
        refused(&swapped, "encoding index 2 is cited before encoding 1");
        // The table follows the citations, whatever the schemes.
        let swapped_table = edited(|v| items(v, ENCODINGS).swap(0, 1));
        assert_eq!(ok(&swapped_table).encodings[0].scheme, "int8.convrot");
        // Citing an earlier encoding again later is fine.
        let again = edited(|v| {
            let mut third = at(v, ENCODED).clone();
            *at(&mut third, &[0]) = t("q2");
            items(v, &[4, 0, 3]).push(third);
        });
        ok(&again);
    }

    #[test]
    fn every_listed_encoding_must_be_cited() {
        let uncited = edited(|v| items(v, ENCODINGS).push(a(vec![t("nvfp4"), m(vec![])])));
        refused(&uncited, "encoding 3 is never cited");
        let cited_once = with(&[4, 0, 3, 2, 3], u(1));
        refused(&cited_once, "encoding 2 is never cited");
    }

    #[test]
    fn a_repeated_encoding_is_refused() {
        let repeated = edited(|v| *at(v, &[2, 1]) = a(vec![t("fp8.rowwise"), m(vec![])]));
        refused(
            &repeated,
            "encoding 2 (\"fp8.rowwise\") repeats an earlier one",
        );
        let other_params =
            edited(|v| *at(v, &[2, 1]) = a(vec![t("fp8.rowwise"), m(vec![("a", u(1))])]));
        ok(&other_params);
    }

    #[test]
    fn an_encoding_scheme_is_non_empty_and_its_params_are_document_values() {
        refused(&with(&[2, 0, 0], t("")), "encoding 1 has an empty scheme");
        refused(
            &with(&[2, 1, 1, 0], Value::Float(256.0)),
            "a float outside a config",
        );
        refused(
            &with(&[2, 1, 1, 0], Value::Bytes(vec![1])),
            "a byte string outside",
        );
        refused(
            &with(&[2, 1, 1], a(vec![])),
            "encoding 2's params is an array, not a map",
        );
    }

    #[test]
    fn floats_and_null_are_allowed_only_inside_configs() {
        ok(&with(
            &[4, 0, 2, 0],
            a(vec![
                Value::Float(-0.0),
                Value::Null,
                m(vec![("x", Value::Float(0.1))]),
            ]),
        ));
        ok(&with(&[3, 1, 0], Value::Null));
        refused(&with(&[5, 0], Value::Float(0.5)), "the metadata: CBOR byte");
        refused(
            &with(&[5, 1], a(vec![Value::Null])),
            "null outside a config",
        );
        refused(
            &with(&[4, 0, 3, 0, 4, 2], Value::Float(16.0)),
            "the location's length is a float",
        );
    }

    #[test]
    fn byte_strings_are_allowed_only_as_object_digests_and_in_later_fields() {
        refused(
            &with(&[4, 0, 2, 0], Value::Bytes(vec![1])),
            "component \"unet\": the config: CBOR byte",
        );
        refused(
            &with(&[5, 0], Value::Bytes(vec![])),
            "a byte string outside",
        );
        refused(
            &with(&[1, 0, 0], Value::Bytes(vec![0; 31])),
            "chunk 0's sha256 is 31 bytes, not 32",
        );
        refused(
            &with(&[1, 0, 0], Value::Bytes(vec![0; 33])),
            "chunk 0's sha256 is 33 bytes, not 32",
        );
        refused(
            &with(&[4, 0, 4, 0, 0], Value::Bytes(vec![0; 31])),
            "is 31 bytes, not 32",
        );
        refused(
            &with(&[1, 0, 0], t("ab")),
            "chunk 0 is a text string, not a byte string",
        );
    }

    #[test]
    fn dtypes_are_non_empty_texts_and_unknown_ones_are_read_raw() {
        refused(
            &with(&[4, 0, 3, 0, 1], t("")),
            "spec §5: component \"unet\" tensor \"w\": a dtype is a non-empty name",
        );
        refused(
            &with(&[4, 0, 3, 1, 4, 0, 1], t("")),
            "part \"weight\": a dtype is a non-empty name",
        );
        refused(
            &with(&[4, 0, 3, 0, 1], u(1)),
            "the dtype is an unsigned integer",
        );
        // An unknown dtype's length stands as written, even one no known dtype could have.
        ok(&with(&[4, 1, 3, 0, 4, 2], u(4095)));
    }

    #[test]
    fn shapes_are_arrays_of_unsigned_integers() {
        refused(
            &with(&[4, 0, 3, 0, 2, 0], Value::Nint(1)),
            "shape extent 0 is a negative integer",
        );
        refused(
            &with(&[4, 0, 3, 0, 2], u(4)),
            "the shape is an unsigned integer, not an array",
        );
        ok(&with(&[4, 0, 3, 0, 2], a(vec![u(4)])));
        let scalar = ok(&edited(|v| {
            *at(v, &[4, 0, 3, 0, 2]) = a(vec![]);
            *at(v, &[4, 0, 3, 0, 4, 2]) = u(4);
        }));
        assert!(scalar.components[0].tensors[0].shape.is_empty());
    }

    #[test]
    fn a_located_chunk_index_must_be_in_range() {
        // vae's unknown-dtype tensor: 7 bytes in chunk 1 of 2.
        refused(
            &with(&[4, 1, 3, 0, 4, 0], u(2)),
            "location chunk 2 is out of range: the header has 2 chunks",
        );
        refused(&with(&[4, 1, 3, 0, 4, 0], u(u64::MAX)), "is out of range");
        ok(&with(&[4, 1, 3, 0, 4, 0], u(0)));
    }

    #[test]
    fn a_located_offset_must_be_a_multiple_of_4096() {
        let err = refused(&with(&[4, 0, 3, 0, 4, 1], u(100)), "not a multiple of 4096");
        assert_eq!(
            err.to_string(),
            "spec §4: component \"unet\" tensor \"w\": location offset 100 is not a multiple of 4096"
        );
        refused(
            &with(&[4, 0, 3, 0, 4, 1], u(4095)),
            "offset 4095 is not a multiple",
        );
        refused(
            &with(&[4, 0, 3, 0, 4, 1], u(4097)),
            "offset 4097 is not a multiple",
        );
        ok(&with(&[4, 0, 3, 0, 4, 1], u(4096)));
    }

    #[test]
    fn a_located_offset_must_lie_inside_its_chunk() {
        // Chunk 0 is 8192 bytes, chunk 1 4096: offset 8192 starts past chunk 0 even though the
        // bytes would fit in chunk 1.
        refused(
            &with(&[4, 0, 3, 0, 4, 1], u(8192)),
            "location offset 8192 is not inside chunk 0 of 8192 bytes",
        );
        let shrunk = edited(|v| *at(v, &[1, 0, 1]) = u(4096));
        refused(
            &shrunk,
            "part \"weight\": location offset 4096 is not inside chunk 0 of 4096 bytes",
        );
    }

    #[test]
    fn a_location_may_continue_into_later_chunks_but_not_past_the_last() {
        // 12288 bytes of chunks; from offset 4096 of chunk 0 there are 8192.
        let exactly = edited(|v| {
            *at(v, &[4, 0, 3, 0, 2]) = a(vec![u(2048)]);
            *at(v, &[4, 0, 3, 0, 4]) = location(0, 4096, 8192);
        });
        let header = ok(&exactly);
        let pieces: Vec<_> = header
            .pieces(Location {
                chunk: 0,
                offset: 4096,
                length: 8192,
            })
            .collect();
        assert_eq!(pieces, vec![(0, 4096, 4096), (1, 0, 4096)]);
        let past = edited(|v| {
            *at(v, &[4, 0, 3, 0, 1]) = t("U8");
            *at(v, &[4, 0, 3, 0, 2]) = a(vec![u(8193)]);
            *at(v, &[4, 0, 3, 0, 4]) = location(0, 4096, 8193);
        });
        refused(
            &past,
            "location offset 4096 + length 8193 = 12289 runs past the 12288 bytes of chunks 0..",
        );
    }

    #[test]
    fn location_sums_do_not_overflow() {
        let huge = edited(|v| {
            *at(v, &[1, 0, 1]) = u(u64::MAX);
            *at(v, &[4, 1, 3, 0, 4]) = location(0, u64::MAX - 4095, u64::MAX);
        });
        refused(&huge, "runs past the");
        let huge_chunks = edited(|v| {
            *at(v, &[1, 0, 1]) = u(u64::MAX);
            *at(v, &[1, 1, 1]) = u(u64::MAX);
            *at(v, &[4, 1, 3, 0, 4]) = location(0, u64::MAX - 4095, u64::MAX);
        });
        ok(&huge_chunks);
    }

    #[test]
    fn zero_length_locations_are_not_checked_against_the_chunks() {
        let empty = edited(|v| {
            *at(v, &[4, 0, 3, 0, 2]) = a(vec![u(0), u(7)]);
            *at(v, &[4, 0, 3, 0, 4]) = location(99, 5, 0);
        });
        ok(&empty);
        ok(&with(&[4, 1, 3, 0, 4], location(u64::MAX, 1, 0)));
    }

    #[test]
    fn a_known_dtypes_location_length_must_be_its_byte_size() {
        refused(&with(&[4, 0, 3, 0, 4, 2], u(15)), "spec §5: component \"unet\" tensor \"w\": location length 15 is not the 16 bytes of F32 [2, 2]");
        refused(
            &with(&[4, 0, 3, 0, 4, 2], u(17)),
            "location length 17 is not the 16 bytes",
        );
        refused(
            &with(&[4, 0, 3, 1, 4, 1, 3, 2], u(255)),
            "part \"scale\": location length 255 is not the 256 bytes of F32 [64]",
        );
        refused(
            &with(&[4, 0, 3, 1, 4, 1, 3, 2], u(257)),
            "location length 257",
        );
    }

    #[test]
    fn a_dtype_size_that_overflows_or_is_not_whole_bytes_is_refused() {
        refused(&with(&[4, 0, 3, 0, 2], a(vec![u(u64::MAX), u(0)])), "spec §5: component \"unet\" tensor \"w\": F32 [18446744073709551615, 0]: the size overflows 64 bits");
        let f4 = edited(|v| {
            *at(v, &[4, 0, 3, 2, 4, 0, 1]) = t("F4");
            *at(v, &[4, 0, 3, 2, 4, 0, 2]) = a(vec![u(3)]);
        });
        refused(
            &f4,
            "part \"weight\": F4 [3]: 12 bits is not a whole number of bytes",
        );
        let f4_even = edited(|v| {
            *at(v, &[4, 0, 3, 2, 4, 0, 1]) = t("F4");
            *at(v, &[4, 0, 3, 2, 4, 0, 2]) = a(vec![u(8)]);
        });
        ok(&f4_even);
        // An encoded tensor's logical shape must also size, though no location holds it.
        refused(
            &with(&[4, 0, 3, 2, 2], a(vec![u(1 << 62), u(4)])),
            "tensor \"r\": logical shape: BF16",
        );
        ok(&with(&[4, 0, 3, 2, 2], a(vec![u(1 << 59)])));
        refused(&with(&[4, 0, 3, 2, 2], a(vec![u(1 << 60)])), "overflows");
    }

    #[test]
    fn asset_keys_are_paths_and_never_the_config_file() {
        let asset = |key: &str| {
            edited(|v| {
                let Value::Map(entries) = at(v, &[4, 0, 4]) else {
                    unreachable!()
                };
                entries.push((key.to_owned(), object(4, 1)));
                let sorted = Value::map(entries.drain(..));
                *at(v, &[4, 0, 4]) = sorted;
            })
        };
        for bad in ["", "a//b", "/abs", "a/../b", "./x"] {
            refused(&asset(bad), "is not a path");
        }
        refused(
            &asset("unet_config.json"),
            "asset key \"unet_config.json\" is the config's file name",
        );
        // Only the component's own config name is reserved.
        ok(&asset("config.json"));
        ok(&asset("sub/vocab.json"));
        let vae_config = edited(|v| *at(v, &[4, 1, 4]) = m(vec![("config.json", object(5, 2))]));
        refused(
            &vae_config,
            "component \"vae\": asset key \"config.json\" is the config's file name",
        );
    }

    #[test]
    fn asset_keys_follow_the_canonical_map_rules() {
        let two = edited(|v| {
            *at(v, &[4, 0, 4]) = m(vec![
                ("vocab.json", object(4, 1)),
                ("merges.txt", object(5, 1)),
            ]);
        });
        let mut bytes = encode(&two).unwrap();
        // Equal lengths: swapping the two keys' bytes puts them out of order.
        let merges = bytes.windows(10).position(|w| w == b"merges.txt").unwrap();
        let vocab = bytes.windows(10).position(|w| w == b"vocab.json").unwrap();
        bytes[merges..merges + 10].copy_from_slice(b"vocab.json");
        bytes[vocab..vocab + 10].copy_from_slice(b"merges.txt");
        let err = Header::from_cbor(&bytes).unwrap_err();
        assert!(err.to_string().contains("out of canonical order"), "{err}");
        bytes[vocab..vocab + 10].copy_from_slice(b"vocab.json");
        let err = Header::from_cbor(&bytes).unwrap_err();
        assert!(
            err.to_string().contains("map key \"vocab.json\" repeated"),
            "{err}"
        );
        refused(
            &with(&[4, 0, 4], a(vec![])),
            "the assets is an array, not a map",
        );
    }

    #[test]
    fn config_file_is_a_path_written_only_when_not_the_default() {
        refused(
            &with(&[4, 0, 5], t("a/../b.json")),
            "config_file \"a/../b.json\" is not a path",
        );
        refused(&with(&[4, 0, 5], t("")), "is not a path");
        refused(
            &with(&[4, 0, 5], u(1)),
            "config_file is an unsigned integer",
        );
        assert_eq!(
            ok(&with(&[4, 0, 5], t("sub/c.json"))).components[0].config_name(),
            "sub/c.json"
        );
        refused(
            &with(&[4, 0, 5], t("config.json")),
            "is the default, written only before later fields",
        );
        // Before later fields the default is spelled out; it decodes as the default.
        let explicit = edited(|v| {
            *at(v, &[4, 0, 5]) = t("config.json");
            items(v, UNET).push(u(0));
        });
        assert_eq!(ok(&explicit).components[0].config_file, None);
    }

    #[test]
    fn metadata_is_a_map_of_document_values() {
        refused(
            &with(METADATA, a(vec![])),
            "the metadata is an array, not a map",
        );
        let header = ok(&base());
        assert_eq!(header.metadata["source"], t("hf://a/b@c"));
        refused(
            &with(&[5, 1], m(vec![("x", Value::Float(1.0))])),
            "a float outside a config",
        );
    }

    #[test]
    fn structure_of_the_wrong_type_is_refused_naming_the_place() {
        refused(
            &with(CHUNKS, m(vec![])),
            "the header: chunks is a map, not an array",
        );
        refused(
            &with(ENCODINGS, u(0)),
            "encodings is an unsigned integer, not an array",
        );
        refused(&with(&[4], m(vec![])), "components is a map, not an array");
        refused(
            &with(&[4, 0, 3], m(vec![])),
            "component \"unet\": the tensors is a map",
        );
        refused(
            &with(&[4, 0, 3, 0, 3], Value::Nint(0)),
            "tensor \"w\": the encoding index is a negative integer",
        );
        refused(
            &with(&[4, 0, 3, 1, 4], u(1)),
            "tensor \"q\": the parts is an unsigned integer",
        );
        refused(
            &with(&[4, 0, 0], u(1)),
            "component 0's name is an unsigned integer",
        );
        refused(
            &with(&[4, 0, 3, 0, 0], u(1)),
            "tensor 0's key is an unsigned integer",
        );
    }

    #[test]
    fn bytes_after_the_root_are_refused() {
        let mut bytes = encode(&base()).unwrap();
        bytes.push(0);
        assert!(Header::from_cbor(&bytes)
            .unwrap_err()
            .to_string()
            .contains("1 bytes after the root"));
    }

    #[test]
    fn encoding_errors_name_the_place_and_the_byte() {
        let mut bytes = encode(&base()).unwrap();
        // Make the unet config's float 0.5 (f9 3800) a single 0.5 in place of the half.
        let at = bytes
            .windows(3)
            .position(|w| w == [0xf9, 0x38, 0x00])
            .unwrap();
        bytes.splice(at..at + 3, [0xfa, 0x3f, 0x00, 0x00, 0x00]);
        let err = Header::from_cbor(&bytes).unwrap_err();
        let FormatError::Encoding(message) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(
            message,
            &format!("spec §9: component \"unet\": the config: CBOR byte {at}: float 0.5 as single, not its shortest width (half)")
        );
    }

    #[test]
    fn nesting_in_a_config_counts_from_the_root() {
        // The unet config map sits at depth 3, so a value in it may nest 60 arrays.
        let nested = |levels: usize| {
            let mut bytes = encode(&with(&[4, 0, 2, 0], t("PLACEHOLDER"))).unwrap();
            let at = bytes
                .windows(12)
                .position(|w| w == b"\x6bPLACEHOLDER")
                .unwrap();
            let mut arrays = vec![0x81; levels - 1];
            arrays.push(0x80);
            bytes.splice(at..at + 12, arrays);
            bytes
        };
        let deepest = nested(cbor::MAX_DEPTH - 4);
        let header = Header::from_cbor(&deepest).unwrap();
        assert_eq!(header.to_cbor().unwrap(), deepest);
        assert!(decode(&deepest).is_ok());
        let too_deep = nested(cbor::MAX_DEPTH - 3);
        let err = Header::from_cbor(&too_deep).unwrap_err();
        assert!(err.to_string().contains("nested deeper than 64"), "{err}");
        assert!(decode(&too_deep).is_err());
    }

    #[test]
    fn hostile_counts_are_refused_without_reserving() {
        // A root claiming 2^32 − 1 components in a few bytes.
        let mut bytes = encode(&edited(|v| items(v, &[4]).clear())).unwrap();
        let at = bytes.len() - encode(&at(&mut base(), METADATA).clone()).unwrap().len() - 1;
        assert_eq!(bytes[at], 0x80);
        bytes.splice(at..at + 1, [0x9a, 0xff, 0xff, 0xff, 0xff]);
        assert!(Header::from_cbor(&bytes)
            .unwrap_err()
            .to_string()
            .contains("an array of 4294967295 items"));
    }

    #[test]
    fn to_cbor_refuses_what_from_cbor_refuses() {
        let header = ok(&base());
        let mut float_metadata = header.clone();
        float_metadata
            .metadata
            .insert("x".into(), Value::Float(1.0));
        assert!(float_metadata
            .to_cbor()
            .unwrap_err()
            .to_string()
            .contains("the metadata: a float outside a config"));
        let mut default_file = header.clone();
        default_file.components[0].config_file = Some("config.json".into());
        assert!(default_file.to_cbor().is_err());
        let mut twice = header.clone();
        twice.components.push(twice.components[0].clone());
        assert!(twice
            .to_cbor()
            .unwrap_err()
            .to_string()
            .contains("is repeated"));
        let mut bytes_in_config = header.clone();
        bytes_in_config.components[0]
            .config
            .insert("b".into(), Value::Bytes(vec![]));
        assert!(bytes_in_config.to_cbor().is_err());
        let mut nan = header.clone();
        nan.components[0]
            .config
            .insert("n".into(), Value::Float(f64::NAN));
        assert!(nan.to_cbor().is_err());
        let mut other_format = header.clone();
        other_format.format = "cozytensors/2".into();
        assert!(matches!(
            other_format.to_cbor(),
            Err(FormatError::Format { .. })
        ));
        let mut empty_dtype = header;
        empty_dtype.components[0].tensors[0].dtype = Dtype::Other("".into());
        assert!(empty_dtype.to_cbor().is_err());
    }

    /// A random valid header: locations are placed first and chunks sized around them.
    fn header() -> impl Strategy<Value = Header> {
        let dtype = prop_oneof![
            Just(Dtype::F32),
            Just(Dtype::BF16),
            Just(Dtype::U8),
            Just(Dtype::F4),
            Just(Dtype::I64),
            "[A-Z][A-Z0-9_]{0,5}".prop_map(|n| Dtype::parse(&n).unwrap()),
        ];
        let spec = (
            dtype,
            prop::collection::vec(0u64..40, 0..3),
            0u64..3,
            0u64..4,
            any::<bool>(),
        );
        let part = ("[a-z_]{1,8}", spec.clone());
        let tensor = (
            "[a-z.0-9]{1,12}",
            spec,
            prop::option::of((0usize..4, prop::collection::vec(part, 1..4))),
        );
        let config = || {
            prop::collection::btree_map(
                "[a-z_]{0,8}",
                crate::format::cbor::tests::value().prop_filter("no bytes", |v| !has_bytes(v)),
                0..4,
            )
        };
        let params =
            prop::collection::btree_map("[a-z_]{1,8}", (0u64..300).prop_map(Value::Uint), 0..3);
        let component = (
            "[a-z_]{1,10}",
            prop::collection::vec(tensor, 0..6),
            config(),
            prop::collection::btree_map(
                "[a-z]{1,6}(/[a-z.]{1,6})?",
                (any::<[u8; 32]>(), any::<u64>()),
                0..3,
            ),
            prop::option::of("[a-z_]{1,8}\\.json"),
            prop_oneof![
                Just(ClassRef::default()),
                ("[a-z]{1,8}", "[0-9.]{0,6}", "[A-Za-z]{0,10}").prop_map(
                    |(library, version, name)| {
                        ClassRef {
                            library,
                            version,
                            name,
                        }
                    }
                ),
            ],
        );
        let encoding_pool = prop::collection::vec(("[a-z0-9]{1,6}\\.[a-z]{1,6}", params), 4);
        (
            prop::collection::vec(component, 0..4),
            encoding_pool,
            prop::option::of(config()),
            prop::collection::btree_map("[a-z]{1,6}", "[ -~]{0,8}".prop_map(Value::Text), 0..3),
            1u64..4,
            prop::collection::vec(0u64..5000, 3),
            prop::sample::select(vec!["cozytensors/1", "cozytensors/1.3"]),
        )
            .prop_map(
                |(components, pool, pipeline, metadata, chunk_count, slack, format)| {
                    let mut chunk_needs = vec![1u64; chunk_count as usize];
                    let mut place =
                        |(dtype, shape, chunk, block, empty): (Dtype, Vec<u64>, u64, u64, bool)| {
                            let length = match dtype.byte_len(&shape) {
                                Ok(Some(n)) => n,
                                _ => shape.iter().product::<u64>() + 3,
                            };
                            let shape = if dtype.byte_len(&shape).is_err() {
                                vec![2 * shape.len() as u64]
                            } else {
                                shape
                            };
                            let length = dtype.byte_len(&shape).unwrap().unwrap_or(length);
                            let chunk = chunk % chunk_count;
                            let location = if length == 0 {
                                Location {
                                    chunk: if empty { 7 } else { 0 },
                                    offset: 0,
                                    length: 0,
                                }
                            } else {
                                let offset = block * ALIGN;
                                let need = &mut chunk_needs[chunk as usize];
                                *need = (*need).max(offset + length);
                                Location {
                                    chunk,
                                    offset,
                                    length,
                                }
                            };
                            (dtype, shape, location)
                        };
                    let mut names = HashSet::new();
                    let mut encodings: Vec<Encoding> = Vec::new();
                    let mut order: Vec<usize> = Vec::new();
                    let mut built = Vec::new();
                    for (name, tensors, config, assets, config_file, class) in components {
                        if !names.insert(name.clone()) {
                            continue;
                        }
                        let mut keys = HashSet::new();
                        let mut out = Vec::new();
                        for (key, spec, body) in tensors {
                            if !keys.insert(key.clone()) {
                                continue;
                            }
                            let (dtype, shape, location) = place(spec);
                            let body = match body {
                                None => Body::Plain(location),
                                Some((pick, parts)) => {
                                    let index = match order.iter().position(|&p| p == pick) {
                                        Some(i) => i,
                                        None => {
                                            order.push(pick);
                                            encodings.push(Encoding {
                                                scheme: pool[pick].0.clone(),
                                                params: pool[pick].1.clone(),
                                            });
                                            order.len() - 1
                                        }
                                    };
                                    let mut roles = HashSet::new();
                                    let parts = parts
                                        .into_iter()
                                        .filter(|(role, _)| roles.insert(role.clone()))
                                        .map(|(role, spec)| {
                                            let (dtype, shape, location) = place(spec);
                                            Part {
                                                role,
                                                dtype,
                                                shape,
                                                location,
                                            }
                                        })
                                        .collect();
                                    Body::Encoded {
                                        encoding: index,
                                        parts,
                                    }
                                }
                            };
                            out.push(Tensor {
                                key,
                                dtype,
                                shape,
                                body,
                            });
                        }
                        let config_name = config_file
                            .clone()
                            .unwrap_or_else(|| DEFAULT_CONFIG.to_owned());
                        let config_file = config_file.filter(|f| f != DEFAULT_CONFIG);
                        let assets = assets
                            .into_iter()
                            .filter(|(path, _)| *path != config_name && is_path(path))
                            .map(|(path, (digest, length))| {
                                (
                                    path,
                                    ObjectRef {
                                        sha256: Sha256(digest),
                                        length,
                                    },
                                )
                            })
                            .collect();
                        built.push(Component {
                            name,
                            class,
                            config,
                            tensors: out,
                            assets,
                            config_file,
                        });
                    }
                    // Identical pool entries would be one encoding.
                    let chunks = chunk_needs
                        .iter()
                        .enumerate()
                        .map(|(i, need)| ObjectRef {
                            sha256: Sha256([i as u8; 32]),
                            length: need + slack[i % 3],
                        })
                        .collect();
                    Header {
                        format: format.to_owned(),
                        chunks,
                        encodings,
                        pipeline: pipeline.map(|config| Pipeline {
                            class: ClassRef {
                                library: "diffusers".into(),
                                version: "0.30.0".into(),
                                name: "P".into(),
                            },
                            config,
                        }),
                        components: built,
                        metadata,
                    }
                },
            )
            .prop_filter("distinct encodings", |h| {
                h.encodings
                    .iter()
                    .enumerate()
                    .all(|(i, e)| !h.encodings[..i].contains(e))
            })
    }

    fn has_bytes(v: &Value) -> bool {
        match v {
            Value::Bytes(_) => true,
            Value::Array(items) => items.iter().any(has_bytes),
            Value::Map(entries) => entries.iter().any(|(_, v)| has_bytes(v)),
            _ => false,
        }
    }

    proptest! {
        #[test]
        fn random_headers_round_trip_through_their_bytes(h in header()) {
            let bytes = h.to_cbor().unwrap();
            let back = Header::from_cbor(&bytes).unwrap();
            prop_assert_eq!(&back, &h);
            prop_assert_eq!(back.to_cbor().unwrap(), bytes.clone());
            prop_assert_eq!(encode(&decode(&bytes).unwrap()).unwrap(), bytes);
        }

        #[test]
        fn from_cbor_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(h) = Header::from_cbor(&bytes) {
                prop_assert_eq!(h.to_cbor().unwrap(), bytes);
            }
        }

        #[test]
        fn from_cbor_never_panics_on_mutated_headers(
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)
        ) {
            let mut bytes = encode(&base()).unwrap();
            for (at, byte) in flips {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            if let Ok(h) = Header::from_cbor(&bytes) {
                let again = h.to_cbor().unwrap();
                prop_assert_eq!(Header::from_cbor(&again).unwrap(), h);
            }
        }
    }
}
