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

mod decode;

use decode::Parser;

#[cfg(test)]
mod tests;
