//! `source_files`: what re-creates every imported file byte for byte.
//!
//! The header's parsed configs and tensor list do not fix a file's bytes (JSON spacing and key
//! order, a safetensors header's key order, padding and `__metadata__` order). So an import
//! records, in the header metadata under [`SOURCE_FILES`], a map from each such file's path in
//! the lane folder to one of:
//!
//! ```text
//! {"text": "<the file's exact text>"}                                 configs, model_index.json, shard indexes
//! {"component": "<name>", "header": "<the exact safetensors header JSON, padding included>"}
//! ```
//!
//! A safetensors file is then the header's length (u64 little-endian), the header text, and the
//! data buffer: each tensor the header names, taken from that component, at its `data_offsets`.
//! Metadata is free-form (spec §4) and holds no object references, so the reference's verify,
//! export and GC read such a header as any other (spec §7 closure rules); it ignores the key.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::plan::PlanBuilder;
use super::{Content, Files, LayoutError, Owner};
use crate::format::json::{self, Json};
use crate::format::safetensors;
use crate::format::{Body, Header, ObjectRef, Tensor, Value};

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
    },
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
            let file = match (field("text"), field("component"), field("header")) {
                (Some(text), None, None) => SourceFile::Text(text.to_owned()),
                (None, Some(component), Some(header)) => SourceFile::Safetensors {
                    component: component.to_owned(),
                    header: header.to_owned(),
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
                SourceFile::Safetensors { component, header } => vec![
                    ("component".to_owned(), text(component)),
                    ("header".to_owned(), text(header)),
                ],
            };
            (path.clone(), Value::map(fields))
        }))
    }

    pub(super) fn lay_out(
        &self,
        header: &Header,
        folders: &[String],
        chunks: &Arc<[ObjectRef]>,
        files: &mut Files,
    ) -> Result<(), LayoutError> {
        let mut indexes: HashMap<usize, HashMap<&str, u32>> = HashMap::new();
        for (path, file) in &self.0 {
            let (content, owner) = match file {
                SourceFile::Text(text) => (
                    Content::Inline(text.as_bytes().into()),
                    text_owner(header, folders, path),
                ),
                SourceFile::Safetensors {
                    component,
                    header: text,
                } => {
                    let Some(index) = header.components.iter().position(|c| c.name == *component)
                    else {
                        return Err(files.invalid(path, format!("no component {component:?}")));
                    };
                    let c = &header.components[index];
                    let by_key = indexes.entry(index).or_insert_with(|| {
                        c.tensors
                            .iter()
                            .enumerate()
                            .map(|(i, t)| (t.key.as_str(), i as u32))
                            .collect()
                    });
                    let (plan, tensors) = plan(header, chunks, text, &c.tensors, by_key)
                        .map_err(|why| files.invalid(path, why))?;
                    (
                        Content::Safetensors(Arc::new(plan)),
                        Owner::Component { index, tensors },
                    )
                }
            };
            files.add(path.clone(), content, owner, "a source file")?;
        }
        Ok(())
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

/// The plan of one recorded safetensors file, and the component's tensors it holds, in the
/// file's data order.
fn plan(
    header: &Header,
    chunks: &Arc<[ObjectRef]>,
    text: &str,
    all: &[Tensor],
    by_key: &HashMap<&str, u32>,
) -> Result<(super::SafetensorsPlan, Vec<u32>), String> {
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
    for info in &parsed.tensors {
        let Some(&index) = by_key.get(info.name.as_str()) else {
            return Err(format!("tensor {:?} is not in the component", info.name));
        };
        held.push(index);
        let tensor = &all[index as usize];
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
    Ok((builder.finish(), held))
}
