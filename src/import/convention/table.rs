//! The conventions table (`fs-layout/conventions.json`) as typed rules; its grammar is in
//! `fs-layout/README.md`, section Quantized checkpoints.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use serde::Deserialize;

/// The table, as the build carries it.
const TABLE: &str = include_str!("../../../fs-layout/conventions.json");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Table {
    #[allow(dead_code)]
    pub(super) about: String,
    pub(super) ignored_marker_keys: Vec<String>,
    pub(super) conventions: Vec<Convention>,
}

/// One convention of the table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Convention {
    pub(super) name: String,
    pub(super) producer: String,
    pub(super) declared_by: Vec<Declaration>,
    pub(super) key: String,
    pub(super) anchor_dtypes: Vec<String>,
    pub(super) parts: Vec<PartRule>,
    #[serde(default)]
    pub(super) constants: Vec<ConstantRule>,
    pub(super) dtype: Option<Expr>,
    pub(super) shape: Option<ShapeRule>,
    pub(super) encodings: Vec<EncodingRule>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
pub(super) enum Declaration {
    /// A tensor called `marker` (or `….marker`) anywhere in the component.
    Marker { marker: String },
    /// A module's `.comfy_quant` JSON array whose `format` is one of these.
    ComfyQuant {
        comfy_quant: Vec<String>,
        #[serde(default)]
        with: BTreeMap<String, Vec<serde_json::Value>>,
    },
    /// A module's JSON array `<module><state><anything>` (bitsandbytes' quant_state).
    State {
        state: String,
        #[serde(default)]
        with: BTreeMap<String, Vec<serde_json::Value>>,
    },
    /// The component config's `quantization_config` holding these values.
    Config {
        config: BTreeMap<String, Vec<serde_json::Value>>,
    },
    /// A JSON file of the component folder holding these values.
    File {
        file: String,
        #[serde(rename = "match")]
        matches: BTreeMap<String, Vec<serde_json::Value>>,
    },
    /// The arrays alone may tell this convention.
    Undeclared { undeclared: bool },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PartRule {
    pub(super) suffix: String,
    pub(super) role: String,
    /// The dtype the part has in the header when the producer stores other bytes of the same
    /// length (`U8` holding F4 pairs or F8_E8M0 scales).
    #[serde(rename = "as")]
    pub(super) as_dtype: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConstantRule {
    pub(super) role: String,
    pub(super) dtype: String,
    pub(super) value: Expr,
    pub(super) if_part: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EncodingRule {
    pub(super) scheme: String,
    #[serde(default)]
    pub(super) when: BTreeMap<String, Vec<serde_json::Value>>,
    #[serde(default)]
    pub(super) vars: BTreeMap<String, Expr>,
    #[serde(default)]
    pub(super) params: BTreeMap<String, Expr>,
}

/// A value: a literal, or looked up.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Expr {
    Config {
        config: Keys,
        #[serde(default)]
        map: Option<BTreeMap<String, serde_json::Value>>,
        #[serde(default)]
        default: Option<serde_json::Value>,
    },
    Marker {
        marker: String,
        #[serde(default)]
        default: Option<serde_json::Value>,
    },
    HasPart {
        has_part: String,
    },
    Logical {
        logical: String,
    },
    CtPacking {
        ct_packing: String,
    },
    Literal(serde_json::Value),
}

/// One key, or the first present of several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Keys {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
pub(super) enum ShapeRule {
    /// The anchor's shape with its last extent holding codes of this many bits in bytes.
    AnchorBits { anchor_bits: u64 },
    /// `[extent of one part, extent of another]`.
    Extents {
        rows: (String, usize),
        cols: (String, usize),
    },
    /// The values of an integer part.
    Values { values: String },
    /// A list in the marker document.
    Marker { marker: String },
    /// gpt-oss's MXFP4 experts: the anchor is `[lead…, N, K/B, B/2]` bytes of F4 pairs, stored
    /// transposed (spec §6 "Transposed storage"): the stored view is `[lead…, N, K]`, the
    /// logical shape `[lead…, K, N]`.
    TransposedBlocks { transposed_blocks: bool },
}

pub(super) fn table() -> &'static Table {
    static TABLE_PARSED: OnceLock<Table> = OnceLock::new();
    TABLE_PARSED.get_or_init(|| {
        serde_json::from_str(TABLE).expect("fs-layout/conventions.json is checked by a unit test")
    })
}

/// The names `--converter` accepts.
pub(crate) fn names() -> Vec<&'static str> {
    table()
        .conventions
        .iter()
        .map(|c| c.name.as_str())
        .collect()
}

/// The JSON files of a component folder that may declare a convention.
pub(crate) fn declaration_files() -> BTreeSet<&'static str> {
    table()
        .conventions
        .iter()
        .flat_map(|c| &c.declared_by)
        .filter_map(|d| match d {
            Declaration::File { file, .. } => Some(file.as_str()),
            _ => None,
        })
        .collect()
}
