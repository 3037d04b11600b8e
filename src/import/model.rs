//! What one lane of a source becomes: its pipeline, components (configs, assets, tensors read
//! from safetensors headers), repo files, and the recipe that re-creates each source file.
//!
//! Everything here reads only headers and small files; tensor bytes are read later, once, by
//! the chunk writer. So every refusal (a malformed safetensors header, an index naming a
//! missing shard, a bad name) happens before anything is written to the store.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::chunks::SourceStamp;
use super::convention::{self, Item};
use super::lane::{Asset, ComponentModel, LaneModel};
use super::scan::{self, Kind, Source, SourceTensor, Weights};
use super::ImportError;
use crate::format::json::{self, Json};
use crate::format::names::{has_control, is_label, is_segment};
use crate::format::safetensors::{self as st, SafetensorsHeader};
use crate::format::{ClassRef, Config, Pipeline, Value};
use crate::layout::recipe::{ArraySource, SourceFile, SourceFiles};
use crate::layout::{PIPELINE_FILE, ROOT_COMPONENT};

/// A folder's config file: the first of these it holds.
const CONFIGS: [&str; 5] = [
    "config.json",
    "scheduler_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "tokenizer_config.json",
];

/// A component folder's files, sorted out.
#[derive(Default)]
struct Folder {
    /// Component-relative path → source path.
    files: BTreeMap<String, PathBuf>,
}

/// Every lane of `source`: the default (files without a variant), then one per variant.
///
/// # Errors
/// Any malformed file, with its path and what is wrong.
pub(crate) fn lanes(
    source: &Source,
    config: &super::ImportConfig,
) -> Result<Vec<LaneModel>, ImportError> {
    let variants = scan::variants(&source.files);
    let mut lanes = Vec::new();
    // Loose GGUF files have no variant: they are default weights.
    let has_default = source.files.keys().any(|p| {
        matches!(
            scan::weights(file_name(p)),
            Some(Weights::File { variant: None })
        ) || (source.kind == Kind::Files && scan::is_gguf(p))
    });
    if has_default || variants.is_empty() {
        lanes.push(lane(source, None, config)?);
    }
    for v in &variants {
        lanes.push(lane(source, Some(v), config)?);
    }
    let mut taken = BTreeSet::new();
    for (i, l) in lanes.iter_mut().enumerate() {
        let default = i == 0 && has_default;
        if default && variants.contains(&l.lane) {
            l.lane = "default".into();
        }
        if !taken.insert(l.lane.clone()) {
            return Err(ImportError::Usage(format!(
                "two lanes would both be called {:?}",
                l.lane
            )));
        }
    }
    Ok(lanes)
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Component folders: name ("" for a Transformers root), the prefix of its files in the
/// source, and its files; the rest of a source are repo files.
type Folders = Vec<(String, String, Folder)>;

/// The lane of `source` with `variant` (`None`: files without one): its folders by the
/// source's kind, their components, a single file converted, and the lane's name.
///
/// # Errors
/// Any malformed file, with its path and what is wrong; flags the source does not take.
fn lane(
    source: &Source,
    variant: Option<&str>,
    config: &super::ImportConfig,
) -> Result<LaneModel, ImportError> {
    let mut model = LaneModel {
        lane: String::new(),
        pipeline: None,
        components: Vec::new(),
        repo_files: BTreeMap::new(),
        recipe: SourceFiles::default(),
        file_metadata: BTreeMap::new(),
        skipped: Vec::new(),
        warnings: Vec::new(),
        single_file: None,
    };
    let folders = match source.kind {
        Kind::Files => loose_files(&mut model, source)?,
        Kind::Transformers => transformers_folder(&mut model, source),
        Kind::Diffusers => pipeline_folders(&mut model, source)?,
    };
    let converter = config.converter.as_deref();
    components(&mut model, source.kind, folders, variant, converter)?;
    single_file(&mut model, source, config)?;
    resolve_versions(&mut model);
    model.lane = match variant {
        Some(v) => lane_label(v),
        None => lane_label(&main_dtype(&model)),
    };
    Ok(model)
}

/// Loose files: each `.safetensors` file a component named by its stem, each GGUF file a
/// component read at once.
///
/// # Errors
/// A stem that makes no component name, or two files of one stem.
fn loose_files(model: &mut LaneModel, source: &Source) -> Result<Folders, ImportError> {
    let mut folders = Folders::new();
    let mut stems: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, path) in &source.files {
        let stem = name
            .strip_suffix(".safetensors")
            .or_else(|| name.strip_suffix(".gguf"))
            .expect("scanned as .safetensors or .gguf");
        if !is_segment(stem) {
            return Err(ImportError::source(
                path,
                "the file name makes no component name",
            ));
        }
        if let Some(other) = stems.insert(stem, name) {
            return Err(ImportError::source(
                path,
                format!("{other} would also be component {stem:?}; import them apart"),
            ));
        }
        if scan::is_gguf(name) {
            let c = super::gguf::component(model, stem, name, path)?;
            model.components.push(c);
            continue;
        }
        let mut folder = Folder::default();
        folder.files.insert(name.clone(), path.clone());
        folders.push((stem.to_owned(), String::new(), folder));
    }
    Ok(folders)
}

/// A Transformers folder: its root files one component; files in subfolders are repo files.
fn transformers_folder(model: &mut LaneModel, source: &Source) -> Folders {
    let mut folders = Folders::new();
    let mut folder = Folder::default();
    for (rel, path) in &source.files {
        if rel.contains('/') {
            keep(model, rel, path);
        } else {
            folder.files.insert(rel.clone(), path.clone());
        }
    }
    folders.push((ROOT_COMPONENT.to_owned(), String::new(), folder));
    folders
}

/// A Diffusers pipeline: `model_index.json` read into `model.pipeline` (and kept as the
/// recipe's text), then a folder per listed component in its order, then unlisted folders
/// that hold weights, by name; other files are repo files, and a single file beside the
/// pipeline is skipped.
///
/// # Errors
/// `model_index.json` is malformed, names a component that cannot be a folder, or lists a
/// component whose folder is not there.
fn pipeline_folders(model: &mut LaneModel, source: &Source) -> Result<Folders, ImportError> {
    let mut folders = Folders::new();
    let path = &source.files[PIPELINE_FILE];
    let text = read_text(path)?;
    let config = parse_config(path, &text)?;
    let mut listed: Vec<(String, ClassRef)> = Vec::new();
    for (name, row) in &config {
        if name.starts_with('_') {
            continue;
        }
        let Value::Array(row) = row else { continue };
        if !is_segment(name) || has_control(name) {
            return Err(ImportError::source(
                path,
                format!("component {name:?} cannot be a folder name"),
            ));
        }
        let class = match row.as_slice() {
            [Value::Text(library), Value::Text(class), ..] => ClassRef {
                library: library.clone(),
                version: String::new(),
                name: class.clone(),
            },
            _ => ClassRef::default(),
        };
        listed.push((name.clone(), class));
    }
    let class = ClassRef {
        library: "diffusers".into(),
        version: String::new(),
        name: config
            .get("_class_name")
            .and_then(Value::as_text)
            .unwrap_or_default()
            .to_owned(),
    };
    model
        .recipe
        .0
        .insert(PIPELINE_FILE.into(), SourceFile::Text(text));
    model.pipeline = Some(Pipeline { class, config });
    // Components in model_index.json's order (its producer's), then unlisted folders
    // that hold weights, by name.
    let mut names: Vec<String> = listed.iter().map(|(n, _)| n.clone()).collect();
    let unlisted: BTreeSet<&str> = source
        .files
        .keys()
        .filter(|p| p.ends_with(".safetensors"))
        .filter_map(|p| p.split_once('/').map(|(f, _)| f))
        .filter(|f| !names.iter().any(|n| n == f))
        .collect();
    names.extend(unlisted.into_iter().map(str::to_owned));
    for name in names {
        let prefix = format!("{name}/");
        let mut folder = Folder::default();
        for (rel, path) in source.files.range(prefix.clone()..) {
            let Some(inner) = rel.strip_prefix(&prefix) else {
                break;
            };
            folder.files.insert(inner.to_owned(), path.clone());
        }
        let class = listed
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, c)| c.clone());
        // A listed class with no folder is a pipeline Diffusers cannot load.
        if let Some(class) = class.as_ref().filter(|c| !c.library.is_empty()) {
            if folder.files.is_empty() {
                return Err(ImportError::source(
                    path,
                    format!(
                        "lists component {name:?} ({} {}), but there is no {name}/ folder",
                        class.library, class.name
                    ),
                ));
            }
            if !CONFIGS.iter().any(|f| folder.files.contains_key(*f)) {
                model.warnings.push(format!(
                    "{name}/ has no config file ({}); Diffusers cannot load it as {}",
                    CONFIGS.join(", "),
                    class.name
                ));
            }
        }
        folders.push((name.clone(), prefix, folder));
        if let Some(class) = class {
            model.components.push(ComponentModel::empty(&name, class));
        }
    }
    for (rel, path) in &source.files {
        let in_component = rel
            .split_once('/')
            .is_some_and(|(f, _)| folders.iter().any(|(n, _, _)| n == f));
        if rel != PIPELINE_FILE && !in_component {
            if !rel.contains('/') && rel.ends_with(".safetensors") {
                model.skipped.push((
                    rel.clone(),
                    "a single-file checkpoint beside the pipeline; import it on its own",
                ));
            } else {
                keep(model, rel, path);
            }
        }
    }
    Ok(folders)
}

/// Fills `model`'s components from `folders`: each read as a component, a pipeline's keeping
/// the class `model_index.json` lists; loose files' in file name order; listed components with
/// nothing to store dropped. `converter` is `--converter`, which names a producer convention or
/// a single-file converter.
fn components(
    model: &mut LaneModel,
    kind: Kind,
    folders: Folders,
    variant: Option<&str>,
    converter: Option<&str>,
) -> Result<(), ImportError> {
    let convention = converter.filter(|n| super::single_file::named(n).is_none());
    for (name, prefix, folder) in folders {
        let component = component(model, &name, &prefix, folder, variant, convention)?;
        match model.components.iter_mut().find(|c| c.name == name) {
            Some(listed) => {
                let class = std::mem::take(&mut listed.class);
                *listed = component;
                if kind == Kind::Diffusers {
                    listed.class = class;
                }
            }
            None => model.components.push(component),
        }
    }
    if kind == Kind::Files {
        // Loose files' components in file name order, GGUF files among the others.
        model
            .components
            .sort_by(|a, b| a.lane_paths.first().cmp(&b.lane_paths.first()));
    }
    // A listed component with no folder (`[null, null]`, an optional part left out) has nothing
    // to store.
    model.components.retain(|c| {
        !(c.weights.is_empty()
            && c.assets.is_empty()
            && c.config.is_empty()
            && c.config_file.is_none())
    });
    // A convention that reads nothing of the source (a plain file, or one whose arrays declare
    // another convention themselves) was declared for something else.
    if let Some(name) = convention {
        let encoded = |c: &ComponentModel| {
            c.items
                .iter()
                .any(|i| matches!(i, Item::Encoded(e) if e.convention == name))
        };
        if !model.components.iter().any(encoded) {
            return Err(ImportError::Usage(format!(
                "--converter {name}: no array of the source is read as {name} stores one (it \
                 has no quantized arrays, or they declare another convention themselves)"
            )));
        }
    }
    Ok(())
}

/// Converts a single file imported alone ([`super::single_file::apply`]); refuses the flags
/// that only such a file takes (`--converter` of a single-file converter, `--pipeline`,
/// `--prediction-type`) for anything else.
fn single_file(
    model: &mut LaneModel,
    source: &Source,
    config: &super::ImportConfig,
) -> Result<(), ImportError> {
    let (converter, prediction) = (
        config.converter.as_deref(),
        config.prediction_type.as_deref(),
    );
    let single = source.kind == Kind::Files && source.files.len() == 1;
    match converter.and_then(super::single_file::named) {
        Some(c) if !single => Err(ImportError::Usage(format!(
            "--converter {}: it converts one single-file checkpoint, imported alone",
            c.name
        ))),
        _ if single => super::single_file::apply(model, config),
        _ if config.pipeline.is_some() => Err(ImportError::Usage(
            "--pipeline joins a single file of a model alone to a pipeline; import the file \
             alone"
                .into(),
        )),
        _ if prediction.is_some() => Err(ImportError::Usage(
            "--prediction-type declares what a single-file checkpoint predicts; import the \
             file alone"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// A repo file, unless it is weights the mount cannot serve.
fn keep(model: &mut LaneModel, rel: &str, path: &Path) {
    if scan::is_foreign_weights(rel) {
        model
            .skipped
            .push((rel.to_owned(), "weights in a format other than safetensors"));
    } else {
        model.repo_files.insert(rel.to_owned(), path.to_path_buf());
    }
}

/// Run data: a file a component loads or runs with (tokenizers and vocabularies, generation
/// and preprocessor configs, chat templates). Docs, code and images are repo files.
fn run_data(path: &str) -> bool {
    let lower = file_name(path).to_ascii_lowercase();
    let doc = ["readme", "license", "licence", "notice", "copying"];
    !doc.iter().any(|d| lower.starts_with(d))
        && [".json", ".txt", ".model", ".jinja", ".tiktoken"]
            .iter()
            .any(|e| lower.ends_with(e))
}

fn component(
    model: &mut LaneModel,
    name: &str,
    prefix: &str,
    folder: Folder,
    variant: Option<&str>,
    converter: Option<&str>,
) -> Result<ComponentModel, ImportError> {
    let mut c = ComponentModel::empty(name, ClassRef::default());
    // Weights of this folder (not nested), by variant.
    let mut files: BTreeMap<Option<String>, Vec<(String, PathBuf)>> = BTreeMap::new();
    let mut indexes: BTreeMap<Option<String>, (String, PathBuf)> = BTreeMap::new();
    let mut rest = Vec::new();
    for (rel, path) in folder.files {
        match (rel.contains('/'), scan::weights(&rel)) {
            (false, Some(Weights::File { variant })) => {
                files.entry(variant).or_default().push((rel, path))
            }
            (false, Some(Weights::Index { variant })) => {
                indexes.insert(variant, (rel, path));
            }
            _ => rest.push((rel, path)),
        }
    }
    let wanted = variant.map(str::to_owned);
    let pick = if files.contains_key(&wanted) {
        wanted.clone()
    } else {
        None
    };
    let mut weights = files.remove(&pick).unwrap_or_default();
    let index = indexes.remove(&pick);
    // Weights of other variants belong to other lanes; an index of this variant names its shards.
    if let Some((index_rel, index_path)) = &index {
        let text = read_text(index_path)?;
        let (shards, unlisted) = check_index(index_path, &text, &weights)?;
        model.warnings.extend(unlisted);
        let (named, others): (Vec<_>, Vec<_>) = weights
            .into_iter()
            .partition(|(rel, _)| shards.contains(rel));
        weights = named;
        for (rel, path) in others {
            model.repo_files.insert(format!("{prefix}{rel}"), path);
        }
        model
            .recipe
            .0
            .insert(format!("{prefix}{index_rel}"), SourceFile::Text(text));
    }
    let config_name = CONFIGS
        .iter()
        .find(|f| rest.iter().any(|(rel, _)| rel == *f))
        .copied();
    for (rel, path) in rest {
        let lane_path = format!("{prefix}{rel}");
        if Some(rel.as_str()) == config_name {
            let text = read_text(&path)?;
            c.config = parse_config(&path, &text)?;
            model.recipe.0.insert(lane_path, SourceFile::Text(text));
        } else if scan::is_foreign_weights(&rel) {
            model
                .skipped
                .push((lane_path, "weights in a format other than safetensors"));
        } else if run_data(&rel) {
            c.assets.insert(rel, Asset::File(path));
        } else {
            model.repo_files.insert(lane_path, path);
        }
    }
    c.config_file = config_name
        .filter(|f| *f != "config.json")
        .map(str::to_owned);
    c.class = config_class(config_name.unwrap_or(""), &c.config);
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (rel, path) in weights {
        let (header, text, stamp) = read_header(&path)?;
        let file = c.weights.len();
        for t in &header.tensors {
            if let Some(other) = seen.insert(t.name.clone(), file) {
                return Err(ImportError::source(
                    &path,
                    format!(
                        "tensor {:?} is also in {}",
                        t.name,
                        c.weights[other].display()
                    ),
                ));
            }
            c.tensors.push(SourceTensor {
                key: t.name.clone(),
                dtype: t.dtype.clone(),
                shape: t.shape.clone(),
                file,
                offset: header.data_start() + t.begin,
                length: t.end - t.begin,
            });
        }
        if file == 0 {
            if let Some(meta) = &header.metadata {
                model.file_metadata.insert(name.to_owned(), meta.clone());
            }
        }
        c.weights.push(path);
        c.stamps.push(stamp);
        c.lane_paths.push(format!("{prefix}{rel}"));
        model.recipe.0.insert(
            format!("{prefix}{rel}"),
            SourceFile::Safetensors {
                component: name.to_owned(),
                header: text,
                arrays: BTreeMap::new(),
            },
        );
    }
    recognize(&mut c, model, converter)?;
    Ok(c)
}

/// Sorts the component's arrays by producer convention (plain, encoded, markers) and records
/// in each safetensors file's recipe which part or marker bytes each non-plain array is.
fn recognize(
    c: &mut ComponentModel,
    model: &mut LaneModel,
    converter: Option<&str>,
) -> Result<(), ImportError> {
    let mut files = BTreeMap::new();
    for name in convention::declaration_files() {
        if let Some(Asset::File(path)) = c.assets.get(name) {
            let text = read_text(path)?;
            let doc = json::parse_config(text.as_bytes())
                .map_err(|e| ImportError::source(path, e.to_string()))?;
            files.insert(name.to_owned(), doc);
        }
    }
    let metadata = model
        .file_metadata
        .get(&c.name)
        .map_or(&[][..], Vec::as_slice);
    let cx = convention::Context {
        component: &c.name,
        config: &c.config,
        files: &files,
        metadata,
        converter,
    };
    let weights = &c.weights;
    let read = |i: usize| -> Result<Vec<u8>, String> {
        let t = &c.tensors[i];
        let path = &weights[t.file];
        let file = File::open(path).map_err(|e| format!("{}: cannot open: {e}", path.display()))?;
        let mut bytes = vec![0u8; t.length as usize];
        file.read_exact_at(&mut bytes, t.offset)
            .map_err(|e| format!("{}: cannot read {}: {e}", path.display(), t.key))?;
        Ok(bytes)
    };
    let items = convention::recognize(&cx, &c.tensors, &read).map_err(|why| {
        let path = c
            .weights
            .first()
            .map_or_else(|| PathBuf::from(&c.name), Clone::clone);
        ImportError::source(&path, why)
    })?;
    // Which file each array is in, to record it in that file's recipe.
    let file_of = |i: usize| c.tensors[i].file;
    let mut arrays: Vec<BTreeMap<String, ArraySource>> = vec![BTreeMap::new(); c.weights.len()];
    for item in &items {
        match item {
            Item::Plain(_) | Item::Computed(..) => {}
            Item::Marker(i) => {
                let bytes =
                    read(*i).map_err(|why| ImportError::source(&c.weights[file_of(*i)], why))?;
                arrays[file_of(*i)].insert(c.tensors[*i].key.clone(), ArraySource::Bytes(bytes));
            }
            Item::Encoded(e) => {
                for p in &e.parts {
                    if let convention::PartSource::Array(i) = p.source {
                        arrays[file_of(i)].insert(
                            c.tensors[i].key.clone(),
                            ArraySource::Part {
                                tensor: e.key.clone(),
                                role: p.role.clone(),
                            },
                        );
                    }
                }
            }
        }
    }
    for (file, held) in arrays.into_iter().enumerate() {
        if let Some(SourceFile::Safetensors { arrays, .. }) =
            model.recipe.0.get_mut(&c.lane_paths[file])
        {
            *arrays = held;
        }
    }
    c.items = items;
    Ok(())
}

/// Reads and validates a safetensors file's header; returns it and its exact JSON text.
fn read_header(path: &Path) -> Result<(SafetensorsHeader, String, SourceStamp), ImportError> {
    let bad = |why: String| ImportError::source(path, why);
    let file = File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
    let stamp = super::chunks::stamp(&file, path)?;
    let file_len = stamp.0;
    let mut first = [0u8; 8];
    let got = read_prefix(&file, &mut first).map_err(|e| bad(format!("cannot read: {e}")))?;
    let n = st::header_len(&first[..got], file_len).map_err(|e| bad(e.to_string()))?;
    let mut json = vec![0u8; n as usize];
    file.read_exact_at(&mut json, 8)
        .map_err(|e| bad(format!("cannot read the header: {e}")))?;
    let header = st::parse_header(&json, file_len).map_err(|e| bad(e.to_string()))?;
    let text = String::from_utf8(json).map_err(|_| bad("the header is not UTF-8".into()))?;
    Ok((header, text, stamp))
}

fn read_prefix(file: &File, buf: &mut [u8; 8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// Checks a shard index against the shards present: every shard it names exists, and every
/// tensor it maps is in that shard. Returns the shards it names.
fn check_index(
    path: &Path,
    text: &str,
    shards: &[(String, PathBuf)],
) -> Result<(BTreeSet<String>, Vec<String>), ImportError> {
    let bad = |why: String| ImportError::source(path, why);
    let doc = json::parse_config(text.as_bytes()).map_err(|e| bad(e.to_string()))?;
    let Json::Object(fields) = doc else {
        return Err(bad("is not a JSON object".into()));
    };
    let Some((_, Json::Object(map))) = fields.iter().find(|(k, _)| k == "weight_map") else {
        return Err(bad("has no weight_map object".into()));
    };
    let mut by_shard: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut warnings = Vec::new();
    for (tensor, shard) in map {
        let Json::Text(shard) = shard else {
            return Err(bad(format!("weight_map[{tensor:?}] is not a file name")));
        };
        if !is_segment(shard) || has_control(shard) {
            return Err(bad(format!(
                "weight_map[{tensor:?}] names {shard:?}, which is not a file in this folder"
            )));
        }
        by_shard.entry(shard.clone()).or_default().push(tensor);
    }
    for (shard, tensors) in &by_shard {
        let Some((_, shard_path)) = shards.iter().find(|(rel, _)| rel == shard) else {
            return Err(bad(format!("names shard {shard:?}, which is missing")));
        };
        let (header, _, _) = read_header(shard_path)?;
        let held: BTreeSet<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
        if let Some(missing) = tensors.iter().find(|t| !held.contains(**t)) {
            return Err(bad(format!(
                "maps tensor {missing:?} to {shard}, which lacks it"
            )));
        }
        // Legal, and loaded: Transformers and Diffusers read every key of every shard the index
        // names, so such tensors reach the model and are kept, byte-exact, with a warning.
        let listed: BTreeSet<&str> = tensors.iter().copied().collect();
        let extra: Vec<&str> = held.difference(&listed).copied().collect();
        if !extra.is_empty() {
            let shown: Vec<String> = extra.iter().take(5).map(|t| format!("{t:?}")).collect();
            let more = match extra.len() {
                n if n > 5 => format!(" and {} more", n - 5),
                _ => String::new(),
            };
            warnings.push(format!(
                "{}: shard {shard} holds {} that {} does not list ({}{more}); imported \
                 byte-exact (loaders read every key of every shard the index names)",
                shard_path.display(),
                if extra.len() == 1 {
                    "a tensor".to_owned()
                } else {
                    format!("{} tensors", extra.len())
                },
                path.file_name().map_or_else(
                    || path.display().to_string(),
                    |n| n.to_string_lossy().into_owned()
                ),
                shown.join(", ")
            ));
        }
    }
    Ok((by_shard.into_keys().collect(), warnings))
}

fn read_text(path: &Path) -> Result<String, ImportError> {
    let bytes =
        std::fs::read(path).map_err(|e| ImportError::source(path, format!("cannot read: {e}")))?;
    String::from_utf8(bytes).map_err(|_| ImportError::source(path, "is not UTF-8 text"))
}

/// A config file as the header's structured config.
fn parse_config(path: &Path, text: &str) -> Result<Config, ImportError> {
    match json::to_value(
        &json::parse_config(text.as_bytes())
            .map_err(|e| ImportError::source(path, e.to_string()))?,
    ) {
        Value::Map(entries) => Ok(entries.into_iter().collect()),
        _ => Err(ImportError::source(path, "is not a JSON object")),
    }
}

/// A component's class from its config (spec §4): Transformers' `architectures[0]`, Diffusers'
/// `_class_name`, a tokenizer config's `tokenizer_class`; else the unknown class.
fn config_class(file: &str, config: &Config) -> ClassRef {
    let text = |key: &str| config.get(key).and_then(Value::as_text);
    let first = match config.get("architectures") {
        Some(Value::Array(a)) => a.first().and_then(Value::as_text),
        _ => None,
    };
    let (library, name) = match (first, text("_class_name"), text("tokenizer_class")) {
        (Some(c), _, _) => ("transformers", c),
        (_, Some(c), _) => ("diffusers", c),
        (_, _, Some(c)) if file == "tokenizer_config.json" => ("transformers", c),
        _ => return ClassRef::default(),
    };
    ClassRef {
        library: library.into(),
        version: String::new(),
        name: name.into(),
    }
}

/// Fills each class's library and version (spec §4): a `model_index.json` library that is a
/// dotted module path is its top-level package, and an undotted one other than `diffusers`,
/// `transformers` or a library some config records is a Diffusers pipeline module, so
/// `diffusers`. The version is the component's own config's record for its library, else one
/// another config of the model records, else `""`.
fn resolve_versions(model: &mut LaneModel) {
    let recorded = |config: &Config| -> Vec<(String, String)> {
        config
            .iter()
            .filter_map(|(k, v)| {
                let library = k.strip_suffix("_version")?;
                let library = library.strip_prefix('_').unwrap_or(library);
                let version = v.as_text()?;
                (!library.is_empty() && !version.is_empty())
                    .then(|| (library.to_owned(), version.to_owned()))
            })
            .collect()
    };
    let mut versions: BTreeMap<String, String> = BTreeMap::new();
    let configs = model
        .pipeline
        .iter()
        .map(|p| &p.config)
        .chain(model.components.iter().map(|c| &c.config));
    for (library, version) in configs.flat_map(&recorded) {
        versions.entry(library).or_insert(version);
    }
    let from_index = model.pipeline.is_some();
    let classes = model
        .pipeline
        .iter_mut()
        .map(|p| (&mut p.class, p.config.clone()))
        .chain(
            model
                .components
                .iter_mut()
                // A borrowed component keeps its class as its commit has it.
                .filter(|c| c.borrowed.is_none())
                .map(|c| (&mut c.class, c.config.clone())),
        );
    for (class, config) in classes {
        if class.library.is_empty() {
            continue;
        }
        let installed = matches!(class.library.as_str(), "diffusers" | "transformers")
            || versions.contains_key(&class.library);
        if from_index {
            if let Some((package, _)) = class.library.split_once('.') {
                class.library = package.to_owned();
            } else if !installed {
                class.library = "diffusers".into();
            }
        }
        let own = recorded(&config)
            .into_iter()
            .find(|(l, _)| *l == class.library)
            .map(|(_, v)| v);
        class.version = own
            .or_else(|| versions.get(&class.library).cloned())
            .unwrap_or_default();
    }
}

/// The default lane's label: the dtype or encoding scheme holding the most bytes, lowercase
/// (`f32`, `bf16`, `gptq.int4`, as the reference labels its lanes); `files` for a source without
/// tensors.
fn main_dtype(model: &LaneModel) -> String {
    let mut bytes: BTreeMap<String, u64> = BTreeMap::new();
    for c in &model.components {
        for item in &c.items {
            let (label, length) = match item {
                Item::Marker(_) => continue,
                Item::Plain(i) | Item::Computed(i, _) => {
                    (c.tensors[*i].dtype.name().to_owned(), c.tensors[*i].length)
                }
                Item::Encoded(e) => {
                    let length = e
                        .parts
                        .iter()
                        .map(|p| match p.source {
                            convention::PartSource::Array(i) => c.tensors[i].length,
                            convention::PartSource::Bytes(ref b) => b.len() as u64,
                        })
                        .sum();
                    (e.scheme.clone(), length)
                }
            };
            *bytes.entry(label.to_ascii_lowercase()).or_default() += length;
        }
    }
    bytes
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map_or_else(|| "files".into(), |(name, _)| name)
}

/// A variant name as a lane label: characters outside the label alphabet become `-`.
fn lane_label(variant: &str) -> String {
    let mut label: String = variant
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._+!-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    if !label.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        label.insert(0, 'v');
    }
    label.truncate(64);
    debug_assert!(is_label(&label));
    label
}
