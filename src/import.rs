//! Import: Diffusers folders, Transformers folders and loose `.safetensors` and `.gguf` files
//! become commits of a `local/` repo.
//!
//! 1. `scan` lists the source and tells its kind; `model` reads every config, index and
//!    safetensors header of each lane (the default files, then one lane per weights variant
//!    such as `fp16`) and refuses anything malformed, naming the file and tensor. Nothing has
//!    been written yet.
//! 2. [`chunks`] lays each component's tensors into chunks (spec §10) and writes them in
//!    parallel, straight from memory-mapped sources, as staged objects; a component shared by
//!    two lanes is written once.
//! 3. Assets, repo files, each lane's header (with the `source_files` recipe that re-creates
//!    every source file byte for byte) and tree are staged too.
//! 4. Under the collector's fence, staged objects are published (renamed into `blobs/`), the
//!    filesystem is synced, and the repo's ref names the new commits.
//!
//! A failure before step 4 drops the staged files: the store is as it was. A process killed at
//! any point leaves at worst unnamed temp files and unreferenced objects, both of which the next
//! import and the reference's verify accept.
//!
//! The header holds nothing about where the source was, so the same bytes imported from any
//! path give the same header and commit ids.

pub mod chunks;
mod convention;
mod gguf;
pub mod hub_cache;
mod lane;
mod model;
mod scan;
mod single_file;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::format::header::HEADER_FORMAT;
use crate::format::names::{is_portable, split_repo_name};
use crate::format::{
    Body, Component, Encoding, Header, Location, ObjectRef, Part, Repo, Tensor, Tree, Value,
};
use crate::layout::recipe::SOURCE_FILES;
use crate::layout::{FILE_METADATA, SINGLE_FILE};
use crate::store::hub::{HubId, HubRevision, TreeEntry};
use crate::store::{Staged, Store, StoreError};
use convention::Item;
pub use single_file::PREDICTION_TYPES;

/// Why an import failed. Nothing was added to the store.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A source file is malformed or unreadable.
    #[error("{}: {why}", path.display())]
    Source {
        /// The file (or folder).
        path: PathBuf,
        /// What is wrong, naming the tensor and numbers where there are some.
        why: String,
    },
    /// The request itself is wrong (no source, a bad repo name, a lane or scheme that is not
    /// there).
    #[error("{0}")]
    Usage(String),
    /// A header this import built does not encode (past a limit of the format): nothing of
    /// the source is at fault.
    #[error("{what}: {source}")]
    Encode {
        /// Which document.
        what: String,
        /// The format's refusal.
        #[source]
        source: crate::format::FormatError,
    },
    /// A lane this import built cannot be laid out as the folder it came from (two files at
    /// one path, say): refused before anything is published.
    #[error("{what}: {source}")]
    Layout {
        /// Which lane.
        what: String,
        /// The layout's refusal.
        #[source]
        source: crate::layout::LayoutError,
    },
    /// The store could not be written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The import was stopped ([`ImportConfig::cancel`], Ctrl-C) before it published anything.
    #[error("interrupted: nothing was added to the store")]
    Interrupted,
}

impl ImportError {
    pub(crate) fn source(path: &Path, why: impl Into<String>) -> ImportError {
        ImportError::Source {
            path: path.to_path_buf(),
            why: why.into(),
        }
    }
}

/// Told how far an import is, in bytes of chunks written.
pub trait Progress: Sync {
    /// The total bytes the chunk writer will write.
    fn start(&self, total_bytes: u64);
    /// `bytes` more were written.
    fn advance(&self, bytes: u64);
}

/// A progress sink that says nothing.
#[derive(Debug, Default)]
pub struct Quiet;

impl Progress for Quiet {
    fn start(&self, _: u64) {}
    fn advance(&self, _: u64) {}
}

/// What an import made.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ImportReport {
    /// The repo name.
    pub name: String,
    /// One commit per lane.
    pub lanes: Vec<LaneReport>,
    /// Source files left out, with why.
    pub skipped: Vec<(String, String)>,
    /// What a loader may trip on; the import went on.
    pub warnings: Vec<String>,
    /// Bytes of chunks written (before deduplication against the store): the tensors' bytes
    /// with the padding that aligns each in its chunk, and bytes a convention states. The
    /// progress bar counts these.
    pub chunk_bytes: u64,
    /// Objects (chunks, headers, trees, files) that were not in the store before.
    pub new_objects: usize,
    /// Their bytes: what the import added to the store.
    pub new_bytes: u64,
    /// The hub identity recorded for the commits (`ORG/NAME[@REV]`), if any.
    pub hub: Option<String>,
}

/// One imported lane.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LaneReport {
    /// The lane label.
    pub lane: String,
    /// The commit id, `sha256:<hex>`.
    pub commit: String,
    /// The header id, `sha256:<hex>`.
    pub header: String,
    /// Number of tensors.
    pub tensors: usize,
    /// Bytes of tensor data: each plain tensor's bytes and each encoded tensor's parts, as the
    /// source files hold them (no padding).
    pub tensor_bytes: u64,
    /// Files the lane folder shows.
    pub files: usize,
    /// For a single-file checkpoint stored as Diffusers components: how it was converted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub single_file: Option<SingleFileReport>,
}

/// How a single-file checkpoint was converted (`fs-layout/single_file.json`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct SingleFileReport {
    /// The converter (`sd2.single_file`).
    pub converter: String,
    /// The Diffusers pipeline class of the lane's `@diffusers` face; `None` for a model alone.
    pub pipeline: Option<String>,
    /// What the model predicts: the scheduler's `prediction_type` (from the file's markers,
    /// `--prediction-type` or the family), or for a model alone what the markers or
    /// `--prediction-type` said.
    pub prediction_type: Option<String>,
}

/// Settings of an import.
#[derive(Clone, Debug)]
pub struct ImportConfig {
    /// Chunk-writing threads (default: the machine's parallelism).
    pub threads: usize,
    /// A producer convention (`fs-layout/conventions.json`) declared for every quantized
    /// module, for sources that do not declare their own.
    pub converter: Option<String>,
    /// What a single-file checkpoint's model predicts (`epsilon` or `v_prediction`, Diffusers'
    /// scheduler `prediction_type`), for files that do not say (SD 2.x), over their markers.
    pub prediction_type: Option<String>,
    /// The Hugging Face repo and revision the source is (`--hf-id`); when `None`, a source
    /// that is one hub cache snapshot folder (`…/models--ORG--NAME/snapshots/<commit>`) names
    /// its own. Recorded beside the refs ([`crate::store::hub`]); ids do not change.
    pub hub: Option<HubId>,
    /// The hub ref names that point at [`ImportConfig::hub`]'s revision, recorded with it:
    /// the hub cache's (`import --hf-cache`); `None` records `main`, an import that names a
    /// revision making it the one `main` names.
    pub hub_refs: Option<Vec<String>>,
    /// The hub revision's file listing, recorded with it (`import --hf-cache`).
    pub hub_files: Option<BTreeMap<String, TreeEntry>>,
    /// The pipeline a single file of a model alone joins (`--pipeline`): the lane's
    /// Diffusers face is that pipeline with the file's components in place of its own.
    pub pipeline: Option<PipelineBase>,
    /// Set (by a signal handler, say) to stop the import: chunk writing stops within one read
    /// of at most a few MiB, the staged objects are removed, and the import fails with
    /// [`ImportError::Interrupted`], leaving the store as it was.
    pub cancel: Option<&'static std::sync::atomic::AtomicBool>,
}

impl Default for ImportConfig {
    fn default() -> Self {
        ImportConfig {
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            converter: None,
            prediction_type: None,
            hub: None,
            hub_refs: None,
            hub_files: None,
            pipeline: None,
            cancel: None,
        }
    }
}

/// A stored pipeline that a single file of a model alone joins (`import --pipeline REF`): a
/// fine-tuned UNet or transformer with the VAE, text encoders, tokenizers and scheduler of the
/// model it was tuned from. The new lane's components are the pipeline's, in its order, each
/// the file's where the file holds one of that name and class, else the pipeline's own, whose
/// chunks and assets the new commit names as they are: nothing of them is copied.
#[derive(Clone, Debug)]
pub struct PipelineBase {
    /// The pipeline as the user named it (`local/flux-dev@latest`), for messages.
    pub name: String,
    /// Its commit.
    pub commit: crate::store::Commit,
    /// Components of other stored models that stand in for the pipeline's own of their name
    /// (`import --component NAME=REF`): a VAE repo, a text encoder's folder.
    pub components: Vec<LentComponent>,
}

/// A stored model's component that stands in for a pipeline's (`import --component NAME=REF`):
/// the component `name` of `commit`'s lane, or, for a model folder or a file of a model alone,
/// its one model. It must be of the class of the pipeline's component `name` and share its
/// interface values (`fs-layout/single_file.json`, `interfaces`: a VAE's latent channels).
#[derive(Clone, Debug)]
pub struct LentComponent {
    /// The pipeline's component it stands in for (`vae`).
    pub name: String,
    /// The model as the user named it (`local/my-vae`), for messages.
    pub from: String,
    /// Its commit.
    pub commit: crate::store::Commit,
}

/// Imports `sources` (one folder, or `.safetensors` and `.gguf` files) as new commits of repo
/// `name` (`local/<name>`).
///
/// # Errors
/// [`ImportError`]; on any error the store is left as it was.
pub fn import(
    store: &Store,
    sources: &[PathBuf],
    name: &str,
    config: &ImportConfig,
    progress: &dyn Progress,
) -> Result<ImportReport, ImportError> {
    check_name(name)?;
    let source = scan::scan(sources)?;
    // What a composed lane borrows stays while the import runs, and must be here (a lazily
    // mounted model's chunks may not be).
    let mut _holds = Vec::new();
    if let Some(base) = &config.pipeline {
        let flag = format!("--pipeline {}", base.name);
        _holds.push(hold_borrowed(store, &flag, &base.commit)?);
        for lent in &base.components {
            let flag = format!("--component {}={}", lent.name, lent.from);
            _holds.push(hold_borrowed(store, &flag, &lent.commit)?);
        }
    }
    let lanes = model::lanes(&source, config)?;
    if lanes
        .iter()
        .all(|l| l.components.iter().all(|c| c.weights.is_empty()))
    {
        return Err(nothing_to_import(&sources[0], &source));
    }

    let planned = plan_chunks(&lanes);
    let total: u64 = planned.jobs.iter().map(|j| j.length).sum();
    // Every chunk counts as new: which are is known only once they are read.
    store.make_room(total)?;
    progress.start(total);
    let staged_chunks = chunks::write(
        store,
        &planned.files,
        &planned.jobs,
        config.threads,
        &|n| progress.advance(n),
        config.cancel,
    )?;
    let chunk_refs: Vec<ObjectRef> = staged_chunks.iter().map(|s| *s.object()).collect();

    let mut stager = Stager {
        store,
        staged: staged_chunks,
        file_refs: HashMap::new(),
    };
    let mut reports = Vec::new();
    let mut trees = Vec::new();
    // Lanes share most files: say each skipped file and warning once.
    let mut skipped: BTreeMap<String, String> = source
        .skipped
        .iter()
        .map(|p| (p.clone(), "neither a file nor a folder".to_owned()))
        .collect();
    let mut warnings: Vec<String> = Vec::new();
    for lane in &lanes {
        for (path, why) in &lane.skipped {
            skipped
                .entry(path.clone())
                .or_insert_with(|| why.to_string());
        }
        for warning in &lane.warnings {
            if !warnings.contains(warning) {
                warnings.push(warning.clone());
            }
        }
        let (header, tensor_bytes) = lane_header(lane, &planned, &chunk_refs, &mut stager)?;
        let header_bytes = header.to_cbor().map_err(|source| ImportError::Encode {
            what: format!("the header of lane {}", lane.lane),
            source,
        })?;
        let header_ref = stager.bytes(&header_bytes)?;
        let mut tree_files = BTreeMap::new();
        for (path, source) in &lane.repo_files {
            tree_files.insert(path.clone(), stager.file(source)?);
        }
        tree_files.insert(header_name(&tree_files), header_ref);
        let tree = Tree {
            lane: Some(lane.lane.clone()),
            files: tree_files,
        };
        let view = crate::layout::LaneView::build(&ObjectRef::of(&tree.to_json()), &tree, &header)
            .map_err(|source| ImportError::Layout {
                what: format!("lane {}", lane.lane),
                source,
            })?;
        let commit = stager.bytes(&tree.to_json())?;
        trees.push(commit);
        reports.push(LaneReport {
            lane: lane.lane.clone(),
            commit: commit.id(),
            header: header_ref.id(),
            tensors: header.components.iter().map(|c| c.tensors.len()).sum(),
            tensor_bytes,
            files: view.files.len(),
            single_file: lane.single_file.as_ref().map(|single| SingleFileReport {
                converter: single.converter.clone(),
                pipeline: lane.pipeline.as_ref().map(|p| p.class.name.clone()),
                prediction_type: lane
                    .components
                    .iter()
                    .find(|c| c.name == "scheduler")
                    .and_then(|c| c.config.get("prediction_type"))
                    .and_then(|v| v.as_text())
                    .map(str::to_owned)
                    .or_else(|| single.prediction_type.clone()),
            }),
        });
    }
    let staged = stager.staged;

    let hub = config.hub.clone().or_else(|| match sources {
        [one] => HubId::of_snapshot(&std::fs::canonicalize(one).unwrap_or_else(|_| one.clone())),
        _ => None,
    });
    if config
        .cancel
        .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    {
        return Err(ImportError::Interrupted);
    }
    let (new_objects, new_bytes) = publish(store, staged, name, &trees)?;
    // The commits are in: a record that cannot be written is a warning, not a failed import.
    if let Some(hub) = &hub {
        let revision = HubRevision {
            files: config.hub_files.clone(),
            refs: config
                .hub_refs
                .clone()
                .unwrap_or_else(|| vec!["main".to_owned()]),
            ..HubRevision::new(hub.revision.clone(), trees.clone())
        };
        if let Err(e) = store.record_hub(name, &hub.id, revision) {
            warnings.push(format!("the hub identity {hub} was not recorded: {e}"));
        }
    }
    // Names fold case: a repo that exists keeps the spelling it was made with.
    let name = match store.repo(name) {
        Ok(Some(repo)) => repo.name,
        _ => name.to_owned(),
    };
    Ok(ImportReport {
        name,
        lanes: reports,
        skipped: skipped.into_iter().collect(),
        warnings,
        chunk_bytes: total,
        new_objects,
        new_bytes,
        hub: hub.map(|h| h.to_string()),
    })
}

/// The chunks of every distinct component of the lanes (by name and weights files; a
/// borrowed one has none): the source files read, the write jobs, and each component's plan
/// with its jobs' range.
struct Planned {
    files: Vec<(PathBuf, chunks::SourceStamp)>,
    jobs: Vec<chunks::ChunkJob>,
    plans: Vec<(chunks::Plan, std::ops::Range<usize>)>,
    /// Index into `plans` by (component name, weights files).
    by_component: HashMap<(String, Vec<PathBuf>), usize>,
}

impl Planned {
    /// The plan of component `c` and the range of its chunks among the written ones.
    fn of(&self, c: &lane::ComponentModel) -> &(chunks::Plan, std::ops::Range<usize>) {
        &self.plans[self.by_component[&(c.name.clone(), c.weights.clone())]]
    }
}

/// Plans each distinct component of `lanes` once: every stored array (markers live in the
/// recipe) and stated part, in order.
fn plan_chunks(lanes: &[lane::LaneModel]) -> Planned {
    let mut planned = Planned {
        files: Vec::new(),
        jobs: Vec::new(),
        plans: Vec::new(),
        by_component: HashMap::new(),
    };
    let mut file_index: HashMap<PathBuf, usize> = HashMap::new();
    for c in lanes.iter().flat_map(|l| &l.components) {
        let key = (c.name.clone(), c.weights.clone());
        if c.borrowed.is_some() || planned.by_component.contains_key(&key) {
            continue;
        }
        let stored = stored_parts(c);
        let items: Vec<chunks::Item> = stored
            .iter()
            .map(|(key, length, _)| chunks::Item {
                key,
                length: *length,
            })
            .collect();
        let plan = chunks::plan(&items);
        let sources: Vec<chunks::ItemSource> = stored
            .into_iter()
            .map(|(_, _, from)| match from {
                Stored::Array(i) => {
                    let t = &c.tensors[i];
                    let path = &c.weights[t.file];
                    let index = *file_index.entry(path.clone()).or_insert_with(|| {
                        planned.files.push((path.clone(), c.stamps[t.file]));
                        planned.files.len() - 1
                    });
                    chunks::ItemSource::File(index, t.offset)
                }
                Stored::Bytes(bytes) => chunks::ItemSource::Bytes(bytes.into()),
            })
            .collect();
        let first = planned.jobs.len();
        planned.jobs.extend(chunks::jobs(&plan, &sources));
        planned.by_component.insert(key, planned.plans.len());
        planned.plans.push((plan, first..planned.jobs.len()));
    }
    planned
}

/// Stages the documents and files of an import, once each.
struct Stager<'s> {
    store: &'s Store,
    staged: Vec<Staged>,
    /// Each source file staged so far, by path.
    file_refs: HashMap<PathBuf, ObjectRef>,
}

impl Stager<'_> {
    fn bytes(&mut self, bytes: &[u8]) -> Result<ObjectRef, ImportError> {
        stage_bytes(self.store, bytes, &mut self.staged)
    }

    fn file(&mut self, path: &Path) -> Result<ObjectRef, ImportError> {
        stage_file(self.store, path, &mut self.file_refs, &mut self.staged)
    }
}

/// The header of `lane`: each component's entry (its chunks among `chunk_refs`, the written
/// ones, or a borrowed component's as its commit has them), the file metadata, the recipe and
/// a single file's record. Returns it with the bytes of its tensors.
fn lane_header(
    lane: &lane::LaneModel,
    planned: &Planned,
    chunk_refs: &[ObjectRef],
    stager: &mut Stager<'_>,
) -> Result<(Header, u64), ImportError> {
    let mut header = Header {
        format: HEADER_FORMAT.to_owned(),
        chunks: Vec::new(),
        encodings: Vec::new(),
        pipeline: lane.pipeline.clone(),
        components: Vec::new(),
        metadata: BTreeMap::new(),
    };
    let mut tensor_bytes = 0;
    for c in &lane.components {
        tensor_bytes += match &c.borrowed {
            Some(b) => borrow(&mut header, b),
            None => component_entry(&mut header, c, planned, chunk_refs, stager)?,
        };
    }
    if !lane.file_metadata.is_empty() {
        let by_component = lane.file_metadata.iter().map(|(c, m)| {
            let strings = m.iter().map(|(k, v)| (k.clone(), Value::Text(v.clone())));
            (c.clone(), Value::map(strings))
        });
        header
            .metadata
            .insert(FILE_METADATA.into(), Value::map(by_component));
    }
    header
        .metadata
        .insert(SOURCE_FILES.into(), lane.recipe.to_value());
    if let Some(single) = &lane.single_file {
        let record = Value::map([
            (
                "converter".to_owned(),
                Value::Text(single.converter.clone()),
            ),
            ("file".to_owned(), Value::Text(single.file.clone())),
            (
                "component".to_owned(),
                Value::Text(single.component.clone()),
            ),
        ]);
        header.metadata.insert(SINGLE_FILE.into(), record);
    }
    Ok((header, tensor_bytes))
}

/// Adds component `c`'s entry to `header`: its chunks after the header's, each tensor (plain,
/// or encoded with its parts) at its planned place, its assets staged. Returns its tensors'
/// bytes.
fn component_entry(
    header: &mut Header,
    c: &lane::ComponentModel,
    planned: &Planned,
    chunk_refs: &[ObjectRef],
    stager: &mut Stager<'_>,
) -> Result<u64, ImportError> {
    let (plan, range) = planned.of(c);
    let base = header.chunks.len() as u64;
    header.chunks.extend_from_slice(&chunk_refs[range.clone()]);
    let located = |place: &Location| match place.length {
        0 => Location::default(),
        _ => Location {
            chunk: place.chunk + base,
            ..*place
        },
    };
    let mut places = plan.places.iter();
    let mut tensors = Vec::with_capacity(c.items.len());
    let mut bytes = 0;
    for item in &c.items {
        match item {
            Item::Marker(_) => {}
            Item::Plain(i) | Item::Computed(i, _) => {
                let t = &c.tensors[*i];
                bytes += t.length;
                tensors.push(Tensor {
                    key: t.key.clone(),
                    dtype: t.dtype.clone(),
                    shape: t.shape.clone(),
                    body: Body::Plain(located(places.next().expect("planned"))),
                });
            }
            Item::Encoded(e) => {
                let parts = e
                    .parts
                    .iter()
                    .map(|p| {
                        let location = located(places.next().expect("planned"));
                        bytes += location.length;
                        Part {
                            role: p.role.clone(),
                            dtype: p.dtype.clone(),
                            shape: p.shape.clone(),
                            location,
                        }
                    })
                    .collect();
                let encoding = Encoding {
                    scheme: e.scheme.clone(),
                    params: e.params.clone(),
                };
                tensors.push(Tensor {
                    key: e.key.clone(),
                    dtype: e.dtype.clone(),
                    shape: e.shape.clone(),
                    body: Body::Encoded {
                        encoding: encoding_index(header, &encoding),
                        parts,
                    },
                });
            }
        }
    }
    let mut assets = BTreeMap::new();
    for (rel, asset) in &c.assets {
        let object = match asset {
            lane::Asset::File(path) => stager.file(path)?,
            lane::Asset::Bytes(bytes) => stager.bytes(bytes)?,
        };
        assets.insert(rel.clone(), object);
    }
    header.components.push(Component {
        name: c.name.clone(),
        class: c.class.clone(),
        config: c.config.clone(),
        tensors,
        assets,
        config_file: c.config_file.clone(),
    });
    Ok(bytes)
}

/// The index of `encoding` among `header`'s, added when it is not there yet.
fn encoding_index(header: &mut Header, encoding: &Encoding) -> usize {
    match header.encodings.iter().position(|e| e == encoding) {
        Some(i) => i,
        None => {
            header.encodings.push(encoding.clone());
            header.encodings.len() - 1
        }
    }
}

/// Holds what `commit` (lent by the flag `flag`) names while the import runs, and checks
/// that it is all in the store.
///
/// # Errors
/// The hold cannot be placed, or an object is missing (a lazily mounted model's chunk that
/// was never read).
fn hold_borrowed(
    store: &Store,
    flag: &str,
    commit: &crate::store::Commit,
) -> Result<crate::store::retention::Hold, ImportError> {
    let closure = commit.closure();
    let hold = store.hold(&closure)?;
    if let Some(missing) = closure
        .iter()
        .find(|o| std::fs::symlink_metadata(store.object_path(o)).is_err())
    {
        return Err(ImportError::Usage(format!(
            "{flag}: object {} of its commit is not in the store: a lazily mounted \
             model's never read (read its files through the mount first), or a damaged store \
             (tensorfs verify --repair)",
            missing.id()
        )));
    }
    Ok(hold)
}

/// Adds borrowed component `b` to `header`: its chunks after the header's, its encodings
/// among the header's, its tensors' locations and encodings renumbered to match. Returns its
/// tensors' bytes.
fn borrow(header: &mut Header, b: &lane::Borrowed) -> u64 {
    let mut chunk_of: HashMap<u64, u64> = HashMap::new();
    let mut located = |chunks: &mut Vec<ObjectRef>, place: &Location| -> Location {
        if place.length == 0 {
            return Location::default();
        }
        let chunk = *chunk_of.entry(place.chunk).or_insert_with(|| {
            chunks.push(b.chunks[place.chunk as usize]);
            chunks.len() as u64 - 1
        });
        Location { chunk, ..*place }
    };
    let mut component = b.component.clone();
    let mut bytes = 0;
    for t in &mut component.tensors {
        match &mut t.body {
            Body::Plain(place) => {
                bytes += place.length;
                *place = located(&mut header.chunks, place);
            }
            Body::Encoded { encoding, parts } => {
                for p in parts.iter_mut() {
                    bytes += p.location.length;
                    p.location = located(&mut header.chunks, &p.location);
                }
                *encoding = encoding_index(header, &b.encodings[*encoding]);
            }
        }
    }
    header.components.push(component);
    bytes
}

/// Where a stored part's bytes come from.
enum Stored {
    /// A source array (index into the component's tensors).
    Array(usize),
    /// Bytes a convention states outside the arrays.
    Bytes(Vec<u8>),
}

/// The component's stored parts in header order: each plain tensor, each part of each encoded
/// tensor (markers are kept in the recipe instead), as (key, length, source).
fn stored_parts(c: &lane::ComponentModel) -> Vec<(&str, u64, Stored)> {
    let mut out = Vec::new();
    for item in &c.items {
        match item {
            Item::Marker(_) => {}
            Item::Plain(i) => {
                let t = &c.tensors[*i];
                out.push((t.key.as_str(), t.length, Stored::Array(*i)));
            }
            Item::Computed(i, bytes) => {
                let t = &c.tensors[*i];
                out.push((t.key.as_str(), t.length, Stored::Bytes(bytes.to_vec())));
            }
            Item::Encoded(e) => {
                for p in &e.parts {
                    out.push(match &p.source {
                        convention::PartSource::Array(i) => {
                            (e.key.as_str(), c.tensors[*i].length, Stored::Array(*i))
                        }
                        convention::PartSource::Bytes(b) => {
                            (e.key.as_str(), b.len() as u64, Stored::Bytes(b.clone()))
                        }
                    });
                }
            }
        }
    }
    out
}

/// Publishes `staged` objects under the collector's fence, then makes `commits` the newest of
/// repo `name` (creating it); returns how many objects were new to the store.
///
/// # Errors
/// A rename or the ref update fails (objects already published stay, unreferenced).
pub(crate) fn publish(
    store: &Store,
    staged: Vec<Staged>,
    name: &str,
    commits: &[ObjectRef],
) -> Result<(usize, u64), StoreError> {
    let _fence = store.fence()?;
    let (mut new_objects, mut new_bytes) = (0, 0);
    for s in staged {
        let present = store.contains(s.object());
        let length = s.object().length;
        s.publish()?;
        if !present {
            new_objects += 1;
            new_bytes += length;
        }
    }
    store.update_repo(name, |old| {
        let mut repo = old.unwrap_or_else(|| Repo {
            name: name.to_owned(),
            releases: Vec::new(),
            commits: Vec::new(),
        });
        // Newest last: a re-import makes its commits the newest again.
        repo.commits.retain(|c| !commits.contains(c));
        repo.commits.extend(commits.iter().copied());
        repo
    })?;
    Ok((new_objects, new_bytes))
}

/// The refusal of a source without safetensors weights, saying what it has instead.
fn nothing_to_import(path: &Path, source: &scan::Source) -> ImportError {
    let foreign: Vec<&str> = source
        .files
        .keys()
        .filter(|p| scan::is_foreign_weights(p))
        .map(String::as_str)
        .take(3)
        .collect();
    let nested = source
        .files
        .keys()
        .find(|p| p.contains('/') && p.ends_with(".safetensors"));
    let mut why = "no .safetensors weights to import".to_owned();
    if !foreign.is_empty() {
        why.push_str(&format!(
            "; it has weights in other formats ({}): convert them to safetensors first",
            foreign.join(", ")
        ));
        if foreign.iter().any(|p| scan::is_gguf(p)) {
            why.push_str(" (a .gguf file imports when named itself)");
        }
    }
    if let Some(nested) = nested {
        why.push_str(&format!(
            "; {nested} is in a subfolder: import the folder that holds the model"
        ));
    }
    // Weights that are there but no regular file (a link to a device, a FIFO).
    if let Some(special) = source.skipped.iter().find(|p| p.ends_with(".safetensors")) {
        why.push_str(&format!(
            "; {special} is not a regular file (a FIFO, a device, or a link to one)"
        ));
    }
    ImportError::source(path, why)
}

/// The header's file name in the tree: `model.cozytensors`, unless a repo file has it.
pub(crate) fn header_name(files: &BTreeMap<String, ObjectRef>) -> String {
    let mut name = "model.cozytensors".to_owned();
    while files.contains_key(&name) {
        name.insert(0, '_');
    }
    name
}

pub(crate) fn check_name(name: &str) -> Result<(), ImportError> {
    let usage = |why: &str| ImportError::Usage(format!("repo name {name:?}: {why}"));
    let (org, model) = split_repo_name(name).map_err(|_| usage("is not local/<name>"))?;
    if org != "local" {
        return Err(usage(
            "imports are named local/<name> (the org `local` is this machine's own)",
        ));
    }
    if !is_portable(model) {
        return Err(usage(
            "a name is ASCII letters, digits, `.`, `_` and `-`, not starting with `.`",
        ));
    }
    Ok(())
}

pub(crate) fn stage_bytes(
    store: &Store,
    bytes: &[u8],
    staged: &mut Vec<Staged>,
) -> Result<ObjectRef, ImportError> {
    let mut writer = store.writer()?;
    writer.write_all(bytes).map_err(|e| StoreError::Io {
        op: "write",
        path: store.root().join("tmp"),
        source: e,
    })?;
    let s = writer.finish_staged()?;
    let object = *s.object();
    staged.push(s);
    Ok(object)
}

fn stage_file(
    store: &Store,
    path: &Path,
    done: &mut HashMap<PathBuf, ObjectRef>,
    staged: &mut Vec<Staged>,
) -> Result<ObjectRef, ImportError> {
    if let Some(object) = done.get(path) {
        return Ok(*object);
    }
    let mut file = std::fs::File::open(path)
        .map_err(|e| ImportError::source(path, format!("cannot open: {e}")))?;
    let mut writer = store.writer()?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| ImportError::source(path, format!("cannot read: {e}")))?;
        if n == 0 {
            break;
        }
        writer.write_all(&buf[..n]).map_err(|e| StoreError::Io {
            op: "write",
            path: store.root().join("tmp"),
            source: e,
        })?;
    }
    let s = writer.finish_staged()?;
    let object = *s.object();
    staged.push(s);
    done.insert(path.to_path_buf(), object);
    Ok(object)
}
