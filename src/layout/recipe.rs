//! `source_files`: what re-creates every imported file byte for byte.
//!
//! The header's parsed configs and tensor list do not fix a file's bytes (JSON spacing and key
//! order, a safetensors header's key order, padding and `__metadata__` order). So an import
//! records, in the header metadata under [`SOURCE_FILES`], a map from each such file's path in
//! the lane folder to one of:
//!
//! ```text
//! {"text": "<the file's exact text>"}                                 configs, model_index.json, shard indexes
//! {"component": "<name>", "header": "<the exact safetensors header JSON, padding included>",
//!  "arrays": {"<array>": {"tensor": "<key>", "role": "<role>"} | {"hex": "<the bytes>"}
//!             | {"component": "<name>", "tensor": "<key>"[, "transposed": true]}
//!             | {"component": "<name>", "rows": ["<key>", …]}, …}}
//! {"component": "<name>", "gguf": {<the GGUF header, structured>}, "size": <bytes>,
//!  "arrays": {"<tensor>": {"tensor": "<key>", "role": "<role>"}, …}}           a GGUF file
//! ```
//!
//! A safetensors file is then the header's length (u64 little-endian), the header text, and the
//! data buffer: each array the header names at its `data_offsets`. An array is the component's
//! plain tensor of the same name, unless `arrays` (optional, omitted when empty) says it is a
//! part of an encoded tensor (a producer's companion array, such as `x.weight_scale` as part
//! `scale` of `x.weight`) or gives its bytes (an array that only declares how others decode,
//! such as ComfyUI's `x.comfy_quant`), or names another component's plain tensor (a
//! single-file checkpoint's array stored under its Diffusers name, `import::single_file`).
//! A GGUF file (`recipe/gguf.rs`) is its header written again from the structure, then each tensor at
//! its offset with zeros between: the component's tensor of its name (a plain tensor, or an
//! encoded tensor's `blocks` part), unless `arrays` names another part.
//! Metadata is free-form (spec §4) and holds no object references, so the reference's verify,
//! export and GC read such a header as any other (spec §7 closure rules); it ignores the key.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::decoded::Compute;
use super::plan::PlanBuilder;
use super::{Content, Files, LayoutError, Owner};
use crate::format::gguf::Gguf;
use crate::format::json::{self, Json};
use crate::format::safetensors;
use crate::format::{Body, Header, ObjectRef, Tensor, Value};

mod gguf;

/// The header metadata key of the source files' recipe.
pub const SOURCE_FILES: &str = "source_files";

/// How one source file is re-created.
#[derive(Clone, Debug, PartialEq)]
pub enum SourceFile {
    /// A text file, exactly.
    Text(String),
    /// A safetensors file of `component`'s tensors under this exact header JSON.
    Safetensors {
        /// The component whose tensors the header names.
        component: String,
        /// The header JSON as it was in the file (the `N` bytes after the length).
        header: String,
        /// Arrays that are not the plain tensor of their name, by array name.
        arrays: BTreeMap<String, ArraySource>,
    },
    /// A GGUF file of `component`'s tensors: this header (written again byte for byte), then
    /// each tensor at its offset, zeros between, `size` bytes in all.
    Gguf {
        /// The component whose tensors the file holds.
        component: String,
        /// The header: version, KV and tensor infos.
        gguf: Box<Gguf>,
        /// The file's length in bytes.
        size: u64,
        /// Tensors that are not the component's tensor of their name (or its `blocks` part),
        /// by tensor name.
        arrays: BTreeMap<String, ArraySource>,
    },
}

/// Where an array of a recorded safetensors file comes from, when it is not the plain tensor
/// of its name.
#[derive(Clone, Debug, PartialEq)]
pub enum ArraySource {
    /// Part `role` of encoded tensor `tensor` of the component; the part's bytes are the
    /// array's (its dtype and shape may read them otherwise, as F4 for `U8` pairs).
    Part {
        /// The encoded tensor's key.
        tensor: String,
        /// The part's role.
        role: String,
    },
    /// These bytes, kept in the recipe.
    Bytes(Vec<u8>),
    /// The plain tensor `tensor` of another component, `component`: a single-file
    /// checkpoint's array that the import stored under its Diffusers name. Its bytes are the
    /// array's (its shape may read them otherwise, a 1×1 kernel as a linear weight), or with
    /// `transposed` the 2-D tensor's transposed (OpenCLIP's `text_projection`).
    Tensor {
        /// The component's name.
        component: String,
        /// The tensor's key there.
        tensor: String,
        /// Whether the array is the tensor transposed.
        transposed: bool,
    },
    /// Rows of plain tensors of component `component`, one after another: a single file's
    /// fused array (OpenCLIP's `in_proj_weight`) that the import stored as its row parts
    /// (Diffusers' `q_proj`, `k_proj`, `v_proj`), or an array whose halves Diffusers holds in
    /// the other order (an original adaLN projection's shift and scale).
    Rows {
        /// The component's name.
        component: String,
        /// The pieces, in the array's row order.
        tensors: Vec<TensorRows>,
    },
}

/// Rows of one plain tensor, a piece of an array ([`ArraySource::Rows`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TensorRows {
    /// The tensor's key.
    pub tensor: String,
    /// Rows `[begin, end)` of its first dimension; `None`: all of them.
    pub rows: Option<(u64, u64)>,
}

impl TensorRows {
    /// All of tensor `tensor`.
    pub fn whole(tensor: impl Into<String>) -> TensorRows {
        TensorRows {
            tensor: tensor.into(),
            rows: None,
        }
    }

    /// Rows `[begin, end)` of tensor `tensor`.
    pub fn part(tensor: impl Into<String>, (begin, end): (u64, u64)) -> TensorRows {
        TensorRows {
            tensor: tensor.into(),
            rows: Some((begin, end)),
        }
    }
}

/// The recipe: source files by path in the lane folder.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceFiles(pub BTreeMap<String, SourceFile>);

impl SourceFiles {
    /// The recipe in `header`'s metadata; `None` when it has none.
    ///
    /// # Errors
    /// The metadata entry is malformed.
    pub fn of(header: &Header) -> Result<Option<SourceFiles>, String> {
        let Some(value) = header.metadata.get(SOURCE_FILES) else {
            return Ok(None);
        };
        let Value::Map(entries) = value else {
            return Err(format!("metadata {SOURCE_FILES} is not a map"));
        };
        let mut files = BTreeMap::new();
        for (path, entry) in entries {
            let Value::Map(fields) = entry else {
                return Err(format!("{path}: entry is not a map"));
            };
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name)
                    .and_then(|(_, v)| v.as_text())
            };
            let gguf_field = fields.iter().find(|(k, _)| k == "gguf").map(|(_, v)| v);
            let size = fields.iter().find(|(k, _)| k == "size").map(|(_, v)| v);
            let file = match (field("text"), field("component"), field("header")) {
                (None, Some(component), None) if gguf_field.is_some() => {
                    let g = gguf::from_value(gguf_field.expect("present"))
                        .map_err(|why| format!("{path}: {why}"))?;
                    let Some(Value::Uint(size)) = size else {
                        return Err(format!("{path}: a GGUF entry has no size"));
                    };
                    SourceFile::Gguf {
                        component: component.to_owned(),
                        gguf: Box::new(g),
                        size: *size,
                        arrays: arrays_of(path, fields)?,
                    }
                }
                (Some(text), None, None) => SourceFile::Text(text.to_owned()),
                (None, Some(component), Some(header)) => SourceFile::Safetensors {
                    component: component.to_owned(),
                    header: header.to_owned(),
                    arrays: arrays_of(path, fields)?,
                },
                _ => {
                    return Err(format!(
                        "{path}: entry is neither a text nor a safetensors file"
                    ))
                }
            };
            files.insert(path.clone(), file);
        }
        Ok(Some(SourceFiles(files)))
    }

    /// The metadata value to store under [`SOURCE_FILES`].
    pub fn to_value(&self) -> Value {
        let text = |s: &str| Value::Text(s.to_owned());
        Value::map(self.0.iter().map(|(path, file)| {
            let fields = match file {
                SourceFile::Text(t) => vec![("text".to_owned(), text(t))],
                SourceFile::Safetensors {
                    component,
                    header,
                    arrays,
                } => {
                    let mut fields = vec![
                        ("component".to_owned(), text(component)),
                        ("header".to_owned(), text(header)),
                    ];
                    push_arrays(&mut fields, arrays);
                    fields
                }
                SourceFile::Gguf {
                    component,
                    gguf: g,
                    size,
                    arrays,
                } => {
                    let mut fields = vec![
                        ("component".to_owned(), text(component)),
                        ("gguf".to_owned(), gguf::to_value(g)),
                        ("size".to_owned(), Value::Uint(*size)),
                    ];
                    push_arrays(&mut fields, arrays);
                    fields
                }
            };
            (path.clone(), Value::map(fields))
        }))
    }

    /// Lays out every recorded file; `computing` (the header and its object) is what a
    /// segment computed on read (a transposed tensor) reads through.
    pub(super) fn lay_out(
        &self,
        header: &Header,
        folders: &[String],
        chunks: &Arc<[ObjectRef]>,
        files: &mut Files,
        computing: &(Arc<Header>, ObjectRef),
    ) -> Result<(), LayoutError> {
        let mut indexes = Indexes::new(header);
        for (path, file) in &self.0 {
            let (content, owner) = match file {
                SourceFile::Text(text) => (
                    Content::Inline(text.as_bytes().into()),
                    text_owner(header, folders, path),
                ),
                SourceFile::Safetensors { component, .. } | SourceFile::Gguf { component, .. } => {
                    let Some(index) = header.components.iter().position(|c| c.name == *component)
                    else {
                        return Err(files.invalid(path, format!("no component {component:?}")));
                    };
                    let planned = match file {
                        SourceFile::Safetensors {
                            header: text,
                            arrays,
                            ..
                        } => plan(header, chunks, text, index, &mut indexes, arrays, computing),
                        SourceFile::Gguf {
                            gguf: g,
                            size,
                            arrays,
                            ..
                        } => {
                            let c = &header.components[index];
                            let by_key = indexes.of(index);
                            gguf::plan(header, chunks, g, *size, &c.tensors, by_key, arrays)
                                .map(|(plan, held)| (plan, held, false))
                        }
                        SourceFile::Text(_) => unreachable!("matched above"),
                    };
                    let (plan, tensors, others) =
                        planned.map_err(|why| files.invalid(path, why))?;
                    let owner = match others {
                        true => Owner::Checkpoint,
                        false => Owner::Component { index, tensors },
                    };
                    (Content::Safetensors(Arc::new(plan)), owner)
                }
            };
            files.add(path.clone(), content, owner, "a source file")?;
        }
        Ok(())
    }
}

/// Each component's tensors by key, indexed when first asked for.
struct Indexes<'h> {
    header: &'h Header,
    by_component: HashMap<usize, HashMap<&'h str, u32>>,
}

impl<'h> Indexes<'h> {
    fn new(header: &'h Header) -> Indexes<'h> {
        Indexes {
            header,
            by_component: HashMap::new(),
        }
    }

    fn of(&mut self, component: usize) -> &HashMap<&'h str, u32> {
        let header = self.header;
        self.by_component.entry(component).or_insert_with(|| {
            header.components[component]
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.key.as_str(), i as u32))
                .collect()
        })
    }

    /// Tensor `key` of the component called `name`.
    fn find(&mut self, name: &str, key: &str) -> Option<(usize, usize, &'h Tensor)> {
        let header = self.header;
        let c = header.components.iter().position(|c| c.name == name)?;
        let i = *self.of(c).get(key)? as usize;
        Some((c, i, header.components[c].tensors.get(i)?))
    }
}

/// Adds the `arrays` field (when there are any) to a recipe entry's `fields`.
fn push_arrays(fields: &mut Vec<(String, Value)>, arrays: &BTreeMap<String, ArraySource>) {
    if arrays.is_empty() {
        return;
    }
    let text = |s: &str| Value::Text(s.to_owned());
    let entries = arrays.iter().map(|(name, source)| {
        let entry = match source {
            ArraySource::Part { tensor, role } => Value::map([
                ("tensor".to_owned(), text(tensor)),
                ("role".to_owned(), text(role)),
            ]),
            // Metadata holds no byte strings (spec §9): hex text.
            ArraySource::Bytes(bytes) => {
                Value::map([("hex".to_owned(), text(&hex::encode(bytes)))])
            }
            ArraySource::Tensor {
                component,
                tensor,
                transposed,
            } => {
                let mut fields = vec![
                    ("component".to_owned(), text(component)),
                    ("tensor".to_owned(), text(tensor)),
                ];
                if *transposed {
                    fields.push(("transposed".to_owned(), Value::Bool(true)));
                }
                Value::map(fields)
            }
            // A whole tensor is its key; rows of one `{tensor, rows: [begin, end]}`.
            ArraySource::Rows { component, tensors } => Value::map([
                ("component".to_owned(), text(component)),
                (
                    "rows".to_owned(),
                    Value::Array(
                        tensors
                            .iter()
                            .map(|t| match t.rows {
                                None => text(&t.tensor),
                                Some((begin, end)) => Value::map([
                                    ("tensor".to_owned(), text(&t.tensor)),
                                    (
                                        "rows".to_owned(),
                                        Value::Array(vec![Value::Uint(begin), Value::Uint(end)]),
                                    ),
                                ]),
                            })
                            .collect(),
                    ),
                ),
            ]),
        };
        (name.clone(), entry)
    });
    fields.push(("arrays".to_owned(), Value::map(entries)));
}

/// The `arrays` entry of a recorded safetensors or GGUF file (absent: none).
fn arrays_of(
    path: &str,
    fields: &[(String, Value)],
) -> Result<BTreeMap<String, ArraySource>, String> {
    let Some((_, value)) = fields.iter().find(|(k, _)| k == "arrays") else {
        return Ok(BTreeMap::new());
    };
    let Value::Map(entries) = value else {
        return Err(format!("{path}: arrays is not a map"));
    };
    let mut arrays = BTreeMap::new();
    for (name, entry) in entries {
        let bad = || format!("{path}: array {name:?} is neither a part, bytes nor a tensor");
        let Value::Map(fields) = entry else {
            return Err(bad());
        };
        let get = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v);
        let text = |k: &str| match get(k) {
            Some(Value::Text(t)) => Some(t.clone()),
            _ => None,
        };
        let transposed = match get("transposed") {
            None => false,
            Some(Value::Bool(true)) => true,
            Some(_) => return Err(bad()),
        };
        let source = match (text("tensor"), text("role"), text("hex"), text("component")) {
            (Some(tensor), Some(role), None, None) if fields.len() == 2 => {
                ArraySource::Part { tensor, role }
            }
            (None, None, Some(hex), None) if fields.len() == 1 => {
                ArraySource::Bytes(hex::decode(hex).map_err(|_| bad())?)
            }
            (Some(tensor), None, None, Some(component))
                if fields.len() == 2 + usize::from(transposed) =>
            {
                ArraySource::Tensor {
                    component,
                    tensor,
                    transposed,
                }
            }
            (None, None, None, Some(component)) if fields.len() == 2 => {
                let Some(Value::Array(rows)) = get("rows") else {
                    return Err(bad());
                };
                let tensors = rows
                    .iter()
                    .map(tensor_rows)
                    .collect::<Option<Vec<_>>>()
                    .filter(|t| !t.is_empty())
                    .ok_or_else(bad)?;
                ArraySource::Rows { component, tensors }
            }
            _ => return Err(bad()),
        };
        arrays.insert(name.clone(), source);
    }
    Ok(arrays)
}

/// A piece of a recorded `rows` array: a key, or `{tensor, rows: [begin, end]}` with
/// `begin < end`.
fn tensor_rows(value: &Value) -> Option<TensorRows> {
    if let Some(key) = value.as_text() {
        return Some(TensorRows::whole(key));
    }
    let Value::Map(fields) = value else {
        return None;
    };
    let get = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v);
    let tensor = get("tensor")?.as_text()?;
    let Some(Value::Array(range)) = get("rows") else {
        return None;
    };
    match range.as_slice() {
        [Value::Uint(begin), Value::Uint(end)] if begin < end && fields.len() == 2 => {
            Some(TensorRows::part(tensor, (*begin, *end)))
        }
        _ => None,
    }
}

/// Whose a recorded text file is: `model_index.json` the pipeline's, a file in a component's
/// folder that component's (the deepest folder), a file at the root the root component's if
/// there is one, else a repo file's.
fn text_owner(header: &Header, folders: &[String], path: &str) -> Owner {
    if path == super::PIPELINE_FILE && header.pipeline.is_some() {
        return Owner::Pipeline;
    }
    folders
        .iter()
        .enumerate()
        .filter(|(_, f)| path.starts_with(f.as_str()) && (!f.is_empty() || !path.contains('/')))
        .max_by_key(|(_, f)| f.len())
        .map_or(Owner::Repo, |(index, _)| Owner::Component {
            index,
            tensors: Vec::new(),
        })
}

/// The plan of one recorded safetensors file of component `component`; the component's
/// tensors it holds, in the file's data order; and whether it holds other components' tensors
/// too (a single-file checkpoint).
fn plan(
    header: &Header,
    chunks: &Arc<[ObjectRef]>,
    text: &str,
    component: usize,
    indexes: &mut Indexes<'_>,
    arrays: &BTreeMap<String, ArraySource>,
    computing: &(Arc<Header>, ObjectRef),
) -> Result<(super::SafetensorsPlan, Vec<u32>, bool), String> {
    let all = &header.components[component].tensors;
    // The data length is not recorded; the header's own offsets give it.
    let Json::Object(entries) = json::parse(text.as_bytes()).map_err(|e| e.to_string())? else {
        return Err("the safetensors header is not a JSON object".into());
    };
    let data_len = entries
        .iter()
        .filter(|(k, _)| k != "__metadata__")
        .filter_map(|(_, v)| match v {
            Json::Object(fields) => fields
                .iter()
                .find(|(k, _)| k == "data_offsets")
                .map(|(_, v)| v),
            _ => None,
        })
        .filter_map(|offsets| match offsets {
            Json::Array(pair) => match pair.get(1) {
                Some(Json::Uint(end)) => Some(*end),
                _ => None,
            },
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let n = text.len() as u64;
    let parsed =
        safetensors::parse_header(text.as_bytes(), 8 + n + data_len).map_err(|e| e.to_string())?;
    let mut prefix = Vec::with_capacity(8 + text.len());
    prefix.extend_from_slice(&n.to_le_bytes());
    prefix.extend_from_slice(text.as_bytes());
    let mut builder = PlanBuilder::new(header, chunks, prefix);
    let mut held = Vec::with_capacity(parsed.tensors.len());
    let mut others = false;
    for info in &parsed.tensors {
        let length = info.end - info.begin;
        let (key, role) = match arrays.get(&info.name) {
            None => (info.name.as_str(), None),
            Some(ArraySource::Part { tensor, role }) => (tensor.as_str(), Some(role.as_str())),
            Some(ArraySource::Bytes(bytes)) => {
                if bytes.len() as u64 != length {
                    return Err(format!(
                        "array {:?} is {length} bytes in the header, {} in the recipe",
                        info.name,
                        bytes.len()
                    ));
                }
                builder.push_inline(bytes);
                continue;
            }
            Some(ArraySource::Tensor {
                component: other,
                tensor,
                transposed,
            }) => {
                let (c, i, t) = indexes.find(other, tensor).ok_or_else(|| {
                    format!(
                        "array {:?} is {other}'s {tensor:?}, which it lacks",
                        info.name
                    )
                })?;
                let Body::Plain(location) = t.body else {
                    return Err(format!("{other}'s {tensor:?} is encoded, not plain"));
                };
                if t.dtype != info.dtype || location.length != length {
                    return Err(format!(
                        "array {:?} is {} ({length} bytes) in the header but {other}'s {tensor:?} \
                         is {} ({} bytes)",
                        info.name, info.dtype, t.dtype, location.length
                    ));
                }
                match transposed {
                    false => builder.push(location),
                    true => {
                        let flipped: Vec<u64> = t.shape.iter().rev().copied().collect();
                        if t.shape.len() != 2 || flipped != info.shape {
                            return Err(format!(
                                "array {:?} has shape {:?}, not {other}'s {tensor:?} {:?} \
                                 transposed",
                                info.name, info.shape, t.shape
                            ));
                        }
                        builder.push_computed(computing, Compute::Transpose, c, i, length);
                    }
                }
                others = true;
                continue;
            }
            Some(ArraySource::Rows {
                component: other,
                tensors,
            }) => {
                let mut total = 0;
                for TensorRows { tensor, rows } in tensors {
                    let (_, _, t) = indexes.find(other, tensor).ok_or_else(|| {
                        format!(
                            "array {:?} holds {other}'s {tensor:?}, which it lacks",
                            info.name
                        )
                    })?;
                    let Body::Plain(location) = t.body else {
                        return Err(format!("{other}'s {tensor:?} is encoded, not plain"));
                    };
                    if t.dtype != info.dtype {
                        return Err(format!(
                            "array {:?} is {} but {other}'s {tensor:?} is {}",
                            info.name, info.dtype, t.dtype
                        ));
                    }
                    let (skip, length) = match *rows {
                        None => (0, location.length),
                        Some((begin, end)) => {
                            let count = t.shape.first().copied().unwrap_or(1);
                            if end > count || location.length % count != 0 {
                                return Err(format!(
                                    "array {:?} holds rows {begin}..{end} of {other}'s \
                                     {tensor:?}, which has {count}",
                                    info.name
                                ));
                            }
                            let row = location.length / count;
                            (begin * row, (end - begin) * row)
                        }
                    };
                    total += length;
                    builder.push_range(location, skip, length);
                }
                if total != length {
                    return Err(format!(
                        "array {:?} is {length} bytes in the header, its rows {total}",
                        info.name
                    ));
                }
                others = true;
                continue;
            }
        };
        let Some(&index) = indexes.of(component).get(key) else {
            return Err(format!("tensor {key:?} is not in the component"));
        };
        if !held.contains(&index) {
            held.push(index);
        }
        let tensor = &all[index as usize];
        if let Some(role) = role {
            let Body::Encoded { parts, .. } = &tensor.body else {
                return Err(format!("tensor {key:?} is plain, not encoded"));
            };
            let Some(part) = parts.iter().find(|p| p.role == role) else {
                return Err(format!("tensor {key:?} has no part {role:?}"));
            };
            if part.location.length != length {
                return Err(format!(
                    "array {:?} is {length} bytes in the header, part {role:?} of {key:?} is {}",
                    info.name, part.location.length
                ));
            }
            builder.push(part.location);
            continue;
        }
        let Body::Plain(location) = tensor.body else {
            return Err(format!("tensor {:?} is encoded, not plain", info.name));
        };
        if tensor.dtype != info.dtype
            || tensor.shape != info.shape
            || location.length != info.end - info.begin
        {
            return Err(format!(
                "tensor {:?} is {} {:?} ({} bytes) in the header but {} {:?} ({} bytes) in the file",
                info.name, tensor.dtype, tensor.shape, location.length, info.dtype, info.shape,
                info.end - info.begin
            ));
        }
        builder.push(location);
    }
    Ok((builder.finish(), held, others))
}
