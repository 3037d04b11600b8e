//! What one lane of a source holds once read: its components, their tensors in the source
//! files and what each array becomes, its repo files and recipe. Built by `model` (safetensors
//! folders and files) and `gguf`, consumed by the planner and writer in `import`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use std::sync::Arc;

use super::chunks::SourceStamp;
use super::convention::Item;
use super::scan::SourceTensor;
use crate::format::{ClassRef, Component, Config, Encoding, ObjectRef, Pipeline};
use crate::layout::recipe::SourceFiles;

/// One lane to import.
#[derive(Debug)]
pub(crate) struct LaneModel {
    /// The lane label.
    pub lane: String,
    pub pipeline: Option<Pipeline>,
    pub components: Vec<ComponentModel>,
    /// Repo files by path in the lane folder.
    pub repo_files: BTreeMap<String, PathBuf>,
    pub recipe: SourceFiles,
    /// Each component's first weights file's `__metadata__`.
    pub file_metadata: BTreeMap<String, Vec<(String, String)>>,
    /// Files left out, with why (shown to the user).
    pub skipped: Vec<(String, &'static str)>,
    /// What a loader may trip on (shown to the user; the import goes on).
    pub warnings: Vec<String>,
    /// For a single-file checkpoint converted into Diffusers components: the header's
    /// [`crate::layout::SINGLE_FILE`] record.
    pub single_file: Option<SingleFile>,
}

/// Where an asset's bytes come from.
#[derive(Debug)]
pub(crate) enum Asset {
    /// A file of the source.
    File(PathBuf),
    /// Bytes the import made (a converted checkpoint's bundled tokenizer files).
    Bytes(Vec<u8>),
}

#[derive(Debug)]
pub(crate) struct ComponentModel {
    pub name: String,
    pub class: ClassRef,
    pub config: Config,
    pub config_file: Option<String>,
    pub assets: BTreeMap<String, Asset>,
    /// Tensors in construction order: weights files by name, each in data order.
    pub tensors: Vec<SourceTensor>,
    /// The weights files the tensors come from (identifies the component's bytes).
    pub weights: Vec<PathBuf>,
    /// Each weights file's length and mtime when its header was read.
    pub stamps: Vec<SourceStamp>,
    /// Each weights file's path in the lane folder (its recipe entry).
    pub lane_paths: Vec<String>,
    /// What the arrays become (plain tensors, encoded tensors, markers), in array order.
    pub items: Vec<Item>,
    /// For a component another commit stores (a composed pipeline's): its entry there,
    /// taken as it is; the component then has no source files.
    pub borrowed: Option<Borrowed>,
}

/// A component of a stored commit's header, joined to a new lane without copying its bytes.
#[derive(Clone, Debug)]
pub(crate) struct Borrowed {
    /// The component's header entry: its tensors' locations index `chunks`, their encodings
    /// `encodings`.
    pub component: Component,
    /// The lending header's chunks.
    pub chunks: Arc<[ObjectRef]>,
    /// The lending header's encodings.
    pub encodings: Arc<[Encoding]>,
}

impl ComponentModel {
    pub(crate) fn empty(name: &str, class: ClassRef) -> ComponentModel {
        ComponentModel {
            name: name.to_owned(),
            class,
            config: Config::new(),
            config_file: None,
            assets: BTreeMap::new(),
            tensors: Vec::new(),
            weights: Vec::new(),
            stamps: Vec::new(),
            lane_paths: Vec::new(),
            items: Vec::new(),
            borrowed: None,
        }
    }
}

/// A converted lane's [`crate::layout::SINGLE_FILE`] record.
#[derive(Debug)]
pub(crate) struct SingleFile {
    /// The converter's name.
    pub converter: String,
    /// The file's path in the lane.
    pub file: String,
    /// The file's own component (the arrays no Diffusers component takes).
    pub component: String,
    /// What the model predicts, as the file's markers or `--prediction-type` said (a model
    /// alone has no scheduler to record it).
    pub prediction_type: Option<String>,
}
