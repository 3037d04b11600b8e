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

use std::collections::BTreeMap;

use super::{Dtype, FormatResult, ObjectRef, Value};

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
        let _ = bytes;
        todo!("header decode")
    }

    /// The deterministic encoding of this header (no extension fields).
    ///
    /// # Errors
    /// A value outside the document value domain (a float outside a config, …) or a header that
    /// breaks a rule [`Header::from_cbor`] would refuse.
    pub fn to_cbor(&self) -> FormatResult<Vec<u8>> {
        todo!("header encode")
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
