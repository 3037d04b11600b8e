//! The lane folder of a checkpoint without `source_files` (one the reference imported): files
//! as the Diffusers, Transformers and safetensors libraries write them.
//!
//! - With a pipeline, each component is the folder of its name. Without one, the component
//!   [`ROOT_COMPONENT`] is the root (a Transformers folder), another with a config or assets is
//!   its folder, and any other is `<component>.safetensors` at the root.
//! - Configs and `model_index.json` are written as `json.dumps(config, indent=2,
//!   sort_keys=True) + "\n"`: equal to the source's as parsed JSON.
//! - A component's weights are one `<weights>.safetensors`, `<weights>` being
//!   `diffusion_pytorch_model` for a Diffusers component and `model` otherwise, laid out as the
//!   safetensors library writes it (dtype descending, then name), with the component's recorded
//!   `__metadata__` (`format: pt` when it has none).
//! - An encoded tensor `x.weight` keeps its parts as tensors: `x.weight` (role `weight`),
//!   `x.weight_<role>`, and `x.input_scale`; `__metadata__`'s `cozytensors.encodings` gives each
//!   one's scheme, params and part names as JSON.
//!
//! Components are never sharded here: safetensors files have no size limit that loaders need.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::decoded::Compute;
use super::plan::PlanBuilder;
use super::{Content, Files, LayoutError, Owner, FILE_METADATA, PIPELINE_FILE, ROOT_COMPONENT};
use crate::format::json::{self, Json};
use crate::format::safetensors::{canonical_header, Entry};
use crate::format::{Body, Component, Config, Dtype, Header, Location, ObjectRef, Value};

/// Each component's folder in the lane: `""` (the root) or `"<name>/"`.
pub(super) fn folders(header: &Header) -> Vec<String> {
    header
        .components
        .iter()
        .map(|c| {
            let bare = c.config.is_empty() && c.config_file.is_none() && c.assets.is_empty();
            if header.pipeline.is_none() && (c.name == ROOT_COMPONENT || bare) {
                String::new()
            } else {
                format!("{}/", c.name)
            }
        })
        .collect()
}

/// The JSON text of a config map.
pub(super) fn config_text(config: &Config) -> Vec<u8> {
    let json = json::from_value(&Value::map(
        config.iter().map(|(k, v)| (k.clone(), v.clone())),
    ));
    json::hf_config_text(&json).into_bytes()
}

/// Config keys that tell a loader the weights are quantized; the decoded view's weights are
/// not, so its configs leave them out (Transformers would otherwise expect packed weights).
const QUANTIZATION_KEYS: [&str; 2] = ["quantization_config", "compression_config"];

/// Lays out `header`'s files as the libraries write them, of the components `shown` takes;
/// with `decoding` (the header and its object), every encoded tensor as a plain tensor of its
/// logical dtype, decoded when read.
pub(super) fn lay_out(
    header: &Header,
    folders: &[String],
    chunks: &Arc<[ObjectRef]>,
    files: &mut Files,
    decoding: Option<&(Arc<Header>, ObjectRef)>,
    shown: &dyn Fn(usize) -> bool,
) -> Result<(), LayoutError> {
    if let Some(pipeline) = &header.pipeline {
        let text = config_text(&pipeline.config);
        files.add(
            PIPELINE_FILE.to_owned(),
            Content::Inline(text.into()),
            Owner::Pipeline,
            "the pipeline config",
        )?;
    }
    for (index, (c, folder)) in header.components.iter().zip(folders).enumerate() {
        if !shown(index) {
            continue;
        }
        if !c.config.is_empty() || c.config_file.is_some() {
            let path = format!("{folder}{}", c.config_name());
            let owner = Owner::Component {
                index,
                tensors: Vec::new(),
            };
            let text = match decoding {
                Some(_) => {
                    let mut config = c.config.clone();
                    config.retain(|k, _| !QUANTIZATION_KEYS.contains(&k.as_str()));
                    config_text(&config)
                }
                None => config_text(&c.config),
            };
            files.add(path, Content::Inline(text.into()), owner, "a config")?;
        }
        if c.tensors.is_empty() {
            continue;
        }
        // A bare component at the root (loose files) keeps its own name; one with a config is
        // a model folder's weights.
        let bare = c.config.is_empty() && c.config_file.is_none() && c.assets.is_empty();
        let weights =
            if header.pipeline.is_none() && folder.is_empty() && c.name != ROOT_COMPONENT && bare {
                c.name.clone()
            } else if c.class.library == "diffusers" || c.config.contains_key("_diffusers_version")
            {
                "diffusion_pytorch_model".to_owned()
            } else {
                "model".to_owned()
            };
        let path = format!("{folder}{weights}.safetensors");
        let plan = weights_plan(header, index, chunks, decoding)
            .map_err(|why| files.invalid(&path, why))?;
        let owner = Owner::Component {
            index,
            tensors: (0..c.tensors.len() as u32).collect(),
        };
        files.add(
            path,
            Content::Safetensors(Arc::new(plan)),
            owner,
            "a weights file",
        )?;
    }
    Ok(())
}

/// The safetensors name of part `role` of tensor `key` in a lane's weights file: `key` for
/// the `weight` part, `<base>.input_scale` for `input_scale`, else `<key>_<role>`.
pub(crate) fn part_name(key: &str, role: &str) -> String {
    match role {
        "weight" => key.to_owned(),
        "input_scale" => match key.strip_suffix(".weight") {
            Some(base) => format!("{base}.input_scale"),
            None => format!("{key}_input_scale"),
        },
        role => format!("{key}_{role}"),
    }
}

/// Where an entry's bytes come from: a location, or tensor `i` of the component decoded.
#[derive(Clone, Copy)]
enum Bytes {
    Stored(Location),
    Decoded(usize, u64),
}

impl Bytes {
    fn length(self) -> u64 {
        match self {
            Bytes::Stored(location) => location.length,
            Bytes::Decoded(_, length) => length,
        }
    }
}

fn weights_plan(
    header: &Header,
    component: usize,
    chunks: &Arc<[ObjectRef]>,
    decoding: Option<&(Arc<Header>, ObjectRef)>,
) -> Result<super::SafetensorsPlan, String> {
    let c: &Component = &header.components[component];
    let mut names: Vec<String> = Vec::new();
    let mut items: Vec<(&Dtype, &[u64], Bytes)> = Vec::new();
    let mut encodings: BTreeMap<String, Json> = BTreeMap::new();
    for (i, t) in c.tensors.iter().enumerate() {
        match &t.body {
            Body::Plain(location) => {
                names.push(t.key.clone());
                items.push((&t.dtype, &t.shape, Bytes::Stored(*location)));
            }
            Body::Encoded { .. } if decoding.is_some() => {
                let length = t
                    .dtype
                    .byte_len(&t.shape)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| {
                        format!(
                            "tensor {:?} has dtype {}, which has no size",
                            t.key, t.dtype
                        )
                    })?;
                names.push(t.key.clone());
                items.push((&t.dtype, &t.shape, Bytes::Decoded(i, length)));
            }
            Body::Encoded { encoding, parts } => {
                let e = &header.encodings[*encoding];
                let roles = parts
                    .iter()
                    .map(|p| (p.role.clone(), Json::Text(part_name(&t.key, &p.role))))
                    .collect();
                let params = json::from_value(&Value::map(
                    e.params.iter().map(|(k, v)| (k.clone(), v.clone())),
                ));
                encodings.insert(
                    t.key.clone(),
                    Json::Object(vec![
                        ("parts".into(), Json::Object(roles)),
                        ("params".into(), params),
                        ("scheme".into(), Json::Text(e.scheme.clone())),
                    ]),
                );
                for p in parts {
                    names.push(part_name(&t.key, &p.role));
                    items.push((&p.dtype, &p.shape, Bytes::Stored(p.location)));
                }
            }
        }
    }
    if let Some(((dtype, _, _), name)) = items
        .iter()
        .zip(&names)
        .find(|((d, _, _), _)| d.bits().is_none())
    {
        return Err(format!(
            "tensor {name:?} has dtype {dtype}, which safetensors cannot hold"
        ));
    }
    let mut seen = HashSet::new();
    if let Some(name) = names.iter().find(|n| !seen.insert(n.as_str())) {
        return Err(format!(
            "two tensors are both named {name:?} in safetensors"
        ));
    }
    let mut metadata: BTreeMap<String, String> = match header.metadata.get(FILE_METADATA) {
        Some(Value::Map(by_component)) => by_component
            .iter()
            .find(|(k, _)| *k == c.name)
            .and_then(|(_, v)| match v {
                Value::Map(m) => Some(
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_text()?.to_owned())))
                        .collect(),
                ),
                _ => None,
            })
            .unwrap_or_default(),
        _ => BTreeMap::new(),
    };
    metadata
        .entry("format".into())
        .or_insert_with(|| "pt".into());
    if !encodings.is_empty() {
        let text = json::canonical(&Json::Object(encodings.into_iter().collect()))
            .map_err(|e| e.to_string())?;
        metadata.insert("cozytensors.encodings".into(), text);
    }
    let metadata: Vec<(String, String)> = metadata.into_iter().collect();
    let entries: Vec<Entry> = items
        .iter()
        .zip(&names)
        .map(|((dtype, shape, bytes), name)| Entry {
            name,
            dtype,
            shape,
            length: bytes.length(),
        })
        .collect();
    let (prefix, order) = canonical_header(&entries, Some(&metadata));
    let mut builder = PlanBuilder::new(header, chunks, prefix);
    for i in order {
        match (items[i].2, decoding) {
            (Bytes::Stored(location), _) => builder.push(location),
            (Bytes::Decoded(tensor, length), Some(decoding)) => {
                builder.push_computed(decoding, Compute::Decode, component, tensor, length)
            }
            (Bytes::Decoded(..), None) => unreachable!("decoded entries only with decoding"),
        }
    }
    Ok(builder.finish())
}
