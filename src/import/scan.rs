//! Reading a source's file list: which files exist, what kind of source it is, and which
//! weights variants (lanes) it holds.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use super::ImportError;
use crate::format::names::{has_control, is_segment};
use crate::format::Dtype;

/// What a source is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A folder with `model_index.json`.
    Diffusers,
    /// Any other folder: a Transformers model (or a folder of weights).
    Transformers,
    /// One or more loose `.safetensors` (or `.sft`) and `.gguf` files.
    Files,
}

/// A source's files by path relative to its root (for loose files: their names).
#[derive(Debug)]
pub(crate) struct Source {
    pub kind: Kind,
    pub files: BTreeMap<String, PathBuf>,
    /// Entries that are neither files nor folders (FIFOs, sockets, devices), left out.
    pub skipped: Vec<String>,
}

/// Folders never read: version control and download caches.
const SKIPPED_DIRS: [&str; 3] = [".git", ".cache", ".huggingface"];

/// Weights formats the mount cannot serve; skipped with a warning when safetensors are present.
const FOREIGN_WEIGHTS: [&str; 8] = [
    ".bin", ".pt", ".pth", ".ckpt", ".onnx", ".msgpack", ".h5", ".gguf",
];

/// The extension ComfyUI also reads as safetensors (`comfy/utils.py` `load_torch_file`). A loose
/// `NAME.sft` is imported as the safetensors file it is and shown as `NAME.safetensors`, the name
/// the format gives a component's weights, so its commit is the one of the same bytes named so.
/// Inside a folder an `.sft` stays a repo file, byte for byte.
const SFT: &str = ".sft";

/// Lists `sources`: one folder, or any number of `.safetensors`, `.sft` and `.gguf` files (an
/// `.sft` listed under its `.safetensors` name).
///
/// # Errors
/// No sources, a mix of folders and files, a path that cannot be read, or a name no lane
/// folder may hold.
pub(crate) fn scan(sources: &[PathBuf]) -> Result<Source, ImportError> {
    let bad = |path: &Path, why: &str| ImportError::source(path, why);
    match sources {
        [] => Err(ImportError::Usage("no source given".into())),
        [dir] if dir.is_dir() => {
            let mut source = Source {
                kind: Kind::Transformers,
                files: BTreeMap::new(),
                skipped: Vec::new(),
            };
            walk(dir, "", &mut source, 0)?;
            if source.files.contains_key("model_index.json") {
                source.kind = Kind::Diffusers;
            }
            Ok(source)
        }
        many => {
            let mut files = BTreeMap::new();
            for path in many {
                if path.is_dir() {
                    return Err(bad(path, "a folder can only be imported on its own"));
                }
                let meta =
                    fs::metadata(path).map_err(|e| bad(path, &format!("cannot read: {e}")))?;
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .ok_or_else(|| bad(path, "the file name is not UTF-8"))?;
                let shown = match name.strip_suffix(SFT) {
                    Some(stem) => format!("{stem}.safetensors"),
                    None => name.to_owned(),
                };
                if !meta.is_file() || !(shown.ends_with(".safetensors") || is_gguf(name)) {
                    return Err(bad(
                        path,
                        "is neither a folder nor a .safetensors, .sft or .gguf file",
                    ));
                }
                check_name(path, name)?;
                if let Some(other) = files.insert(shown.clone(), path.clone()) {
                    return Err(bad(
                        path,
                        &format!(
                            "{} is also shown as {shown}; import them apart",
                            other.display()
                        ),
                    ));
                }
            }
            Ok(Source {
                kind: Kind::Files,
                files,
                skipped: Vec::new(),
            })
        }
    }
}

fn check_name(path: &Path, name: &str) -> Result<(), ImportError> {
    if !is_segment(name) || has_control(name) {
        return Err(ImportError::source(
            path,
            format!("the name {name:?} cannot be shown in a folder (separators, `..`, NUL or control characters)"),
        ));
    }
    Ok(())
}

/// Lists `dir` into `source`, following symlinks (Hugging Face cache snapshots link every file
/// to a blob elsewhere, and folders may be linked too).
fn walk(dir: &Path, prefix: &str, source: &mut Source, depth: usize) -> Result<(), ImportError> {
    if depth > 32 {
        return Err(ImportError::source(
            dir,
            "folders nest deeper than 32 levels (a symlink loop?)",
        ));
    }
    let entries =
        fs::read_dir(dir).map_err(|e| ImportError::source(dir, format!("cannot list: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| ImportError::source(dir, format!("cannot list: {e}")))?;
        let path = entry.path();
        let name = entry
            .file_name()
            .into_string()
            .map_err(|_| ImportError::source(&path, "the file name is not UTF-8"))?;
        let meta = fs::metadata(&path)
            .map_err(|e| ImportError::source(&path, format!("cannot read: {e}")))?;
        if meta.is_dir() && SKIPPED_DIRS.contains(&name.as_str()) {
            continue;
        }
        check_name(&path, &name)?;
        let rel = format!("{prefix}{name}");
        if meta.is_dir() {
            walk(&path, &format!("{rel}/"), source, depth + 1)?;
        } else if meta.is_file() {
            source.files.insert(rel, path);
        } else {
            source.skipped.push(rel);
        }
    }
    Ok(())
}

/// Whether `name` is a GGUF file, by its extension.
pub(crate) fn is_gguf(name: &str) -> bool {
    name.ends_with(".gguf")
}

/// Whether `path` is weights in a format other than safetensors.
pub(crate) fn is_foreign_weights(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    FOREIGN_WEIGHTS.iter().any(|ext| lower.ends_with(ext))
}

/// The stems whose files carry a weights variant (`model.fp16.safetensors`), as Diffusers and
/// Transformers name them.
const VARIANT_STEMS: [&str; 2] = ["diffusion_pytorch_model", "model"];

/// A weights file or shard index, by what its name says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Weights {
    /// A `.safetensors` file (whole or a shard) of `variant`.
    File { variant: Option<String> },
    /// A `<stem>.safetensors.index[.<variant>].json` shard index.
    Index { variant: Option<String> },
}

/// Classifies a file name: `model.safetensors`, `model.fp16.safetensors`,
/// `diffusion_pytorch_model.fp16-00001-of-00002.safetensors`,
/// `model.safetensors.index.fp16.json`. Only the standard stems carry variants, so
/// `sd_xl_base_1.0.safetensors` is a file of no variant.
pub(crate) fn weights(name: &str) -> Option<Weights> {
    let variant_of = |rest: &str| -> Option<String> {
        VARIANT_STEMS.iter().find_map(|stem| {
            let v = rest.strip_prefix(stem)?.strip_prefix('.')?;
            (!v.is_empty() && !v.contains('.')).then(|| v.to_owned())
        })
    };
    if let Some(base) = name.strip_suffix(".safetensors") {
        let unsharded = strip_shard(base).unwrap_or(base);
        return Some(Weights::File {
            variant: variant_of(unsharded),
        });
    }
    let (_, tail) = name.split_once(".safetensors.index")?;
    if tail == ".json" {
        return Some(Weights::Index { variant: None });
    }
    let variant = tail.strip_prefix('.')?.strip_suffix(".json")?;
    (!variant.is_empty() && !variant.contains('.')).then(|| Weights::Index {
        variant: Some(variant.to_owned()),
    })
}

/// `stem-00001-of-00002` → `stem`.
fn strip_shard(base: &str) -> Option<&str> {
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (left, total) = base.rsplit_once("-of-")?;
    let (stem, index) = left.rsplit_once('-')?;
    (numeric(total) && numeric(index)).then_some(stem)
}

/// Every weights variant named in `files`.
pub(crate) fn variants(files: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    files
        .keys()
        .filter_map(|p| match weights(p.rsplit('/').next().unwrap_or(p))? {
            Weights::File { variant } | Weights::Index { variant } => variant,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_names_give_their_variants() {
        let file = |v: Option<&str>| {
            Some(Weights::File {
                variant: v.map(str::to_owned),
            })
        };
        assert_eq!(weights("model.safetensors"), file(None));
        assert_eq!(weights("model.fp16.safetensors"), file(Some("fp16")));
        assert_eq!(
            weights("diffusion_pytorch_model.fp16-00001-of-00002.safetensors"),
            file(Some("fp16"))
        );
        assert_eq!(
            weights("diffusion_pytorch_model-00001-of-00002.safetensors"),
            file(None)
        );
        assert_eq!(weights("sd_xl_base_1.0.safetensors"), file(None));
        assert_eq!(
            weights("model.safetensors.index.json"),
            Some(Weights::Index { variant: None })
        );
        assert_eq!(
            weights("diffusion_pytorch_model.safetensors.index.fp16.json"),
            Some(Weights::Index {
                variant: Some("fp16".into())
            })
        );
        assert_eq!(weights("config.json"), None);
    }
}

/// A tensor's place in a source file.
#[derive(Clone, Debug)]
pub(crate) struct SourceTensor {
    pub key: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Index into its component's weights files (`ComponentModel::weights`).
    pub file: usize,
    /// Absolute byte offset in the file.
    pub offset: u64,
    pub length: u64,
}
