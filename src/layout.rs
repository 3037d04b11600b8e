//! What a lane folder holds: the files of one commit, each with where its bytes come from.
//!
//! A [`LaneView`] is built once per commit from its tree and header and never changes (commits
//! are immutable). Its files are:
//! - the tree's repo files (README, LICENSE, images), as their objects;
//! - each component's assets, in the component's folder, as their objects;
//! - for a checkpoint this implementation imported, every other source file exactly as it was
//!   ([`recipe`]: config texts and safetensors headers kept in the header's `source_files`
//!   metadata, tensor bytes from the chunks);
//! - for any other checkpoint (one the reference `tfs` imported), `model_index.json`, each
//!   component's config and one safetensors file per component, written as the Diffusers,
//!   Transformers and safetensors libraries write them (`canonical`).
//!
//! Reading a file ([`Content::read_at`]) copies header bytes from memory and tensor bytes from
//! chunk objects through an [`ObjectSource`], which verifies each object before its first use.
//! The `fs` layer (mount) and `export` both read through here, so they show the same bytes.

pub mod attrs;
mod canonical;
pub mod comfyui;
pub(crate) mod convert;
pub mod decoded;
mod plan;
pub mod recipe;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;

pub(crate) use canonical::part_name;
pub use decoded::Compute;
pub use plan::{SafetensorsPlan, Segment, Source};

use crate::format::{Header, ObjectRef, Tree};
use crate::io::ObjectSource;

/// The component whose folder is the lane root in a model without a pipeline (a Transformers
/// folder).
pub const ROOT_COMPONENT: &str = "model";
/// The pipeline's config file.
pub const PIPELINE_FILE: &str = "model_index.json";
/// Header metadata: each component's source safetensors `__metadata__`
/// (`{component: {key: value}}`), as the reference records it.
pub const FILE_METADATA: &str = "safetensors_metadata";

/// Header metadata of a lane imported from a single-file checkpoint
/// (`import::single_file`): `{"converter": <name>, "file": <its path in the lane>,
/// "component": <the file's own component>}`. Such a
/// lane's components are Diffusers components, and it has two faces: the file itself
/// ([`Face::AsImported`], through the recipe) and a Diffusers folder ([`Face::Diffusers`]).
pub const SINGLE_FILE: &str = "single_file";

/// Which face of a commit a lane folder shows.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Face {
    /// The files as imported (the recipe), or as the libraries write them for a checkpoint
    /// without a recipe.
    AsImported,
    /// Every encoded tensor decoded (`<lane>@decoded`).
    Decoded,
    /// A single-file checkpoint's lane as a Diffusers folder (`<lane>@diffusers`): the
    /// components `model_index.json` lists, as the libraries write them.
    Diffusers,
    /// A Diffusers pipeline's lane as the single files its components make (`<lane>@single`):
    /// [`SINGLE_FILE_NAME`], in the key layout of the converter whose pipeline it is, or one
    /// `<component>.safetensors` per component in its model-alone layout (FLUX.1, SD3:
    /// ComfyUI's diffusion model, VAE and text encoder files) ([`convert::reverse`]), each
    /// array a component's tensor's rows (OpenCLIP's fused arrays its row parts one after
    /// another, its projection transposed when read).
    Single,
}

/// The file a whole pipeline's single-file face holds ([`Face::Single`]).
pub const SINGLE_FILE_NAME: &str = "model.safetensors";

/// Why a lane's view cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// Two entries claim one path, or a file and a folder collide (spec §3).
    #[error("commit {commit}: {path:?} is claimed twice ({why})")]
    Collision {
        /// The commit's id.
        commit: String,
        /// The contested path.
        path: String,
        /// Which entries.
        why: String,
    },
    /// The header's `source_files` or tensors cannot make the file.
    #[error("commit {commit}: {path}: {why}")]
    Invalid {
        /// The commit's id.
        commit: String,
        /// The file being laid out.
        path: String,
        /// What is wrong.
        why: String,
    },
}

/// Where a file's bytes come from.
#[derive(Clone, Debug)]
pub enum Content {
    /// A whole object (a repo file or an asset).
    Object(ObjectRef),
    /// Bytes held in memory (config texts).
    Inline(Arc<[u8]>),
    /// A safetensors file synthesized from a header prefix and chunk ranges.
    Safetensors(Arc<SafetensorsPlan>),
}

impl Content {
    /// The file's size in bytes.
    pub fn size(&self) -> u64 {
        match self {
            Content::Object(o) => o.length,
            Content::Inline(bytes) => bytes.len() as u64,
            Content::Safetensors(plan) => plan.size(),
        }
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns how many (0 at or past the end).
    ///
    /// # Errors
    /// The [`ObjectSource`] fails.
    pub fn read_at(
        &self,
        source: &dyn ObjectSource,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let size = self.size();
        if offset >= size {
            return Ok(0);
        }
        let n = buf.len().min((size - offset) as usize);
        let buf = &mut buf[..n];
        match self {
            Content::Object(object) => source.read_object(object, offset, buf)?,
            Content::Inline(bytes) => {
                buf.copy_from_slice(&bytes[offset as usize..offset as usize + n])
            }
            Content::Safetensors(plan) => plan.read_at(source, offset, buf)?,
        }
        Ok(n)
    }
}

impl Content {
    /// The first `count` distinct chunks the file's bytes from `offset` on come from, in file
    /// order (what a reader going through the file in order reads next). Empty for files
    /// without chunk ranges; decoded tensors' parts are not followed.
    pub fn chunks_from(&self, offset: u64, count: usize) -> Vec<ObjectRef> {
        match self {
            Content::Safetensors(plan) => plan.chunks_from(offset, count),
            Content::Object(_) | Content::Inline(_) => Vec::new(),
        }
    }
}

/// What a file of a lane folder is to the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A repo file (README, LICENSE, images): of no component.
    Repo,
    /// `model_index.json`.
    Pipeline,
    /// A file of component `index` (of the header's components): its config, an asset, a shard
    /// index, or a weights file holding the bytes of `tensors` (indices into its tensors, in the
    /// file's order).
    Component {
        /// Index into the header's components.
        index: usize,
        /// The tensors a weights file holds; empty for other files.
        tensors: Vec<u32>,
    },
    /// A single-file checkpoint re-created from the tensors of several components (its
    /// arrays stored under their Diffusers names, [`SINGLE_FILE`]).
    Checkpoint,
}

/// One file of a lane folder.
#[derive(Clone, Debug)]
pub struct LaneFile {
    /// Path relative to the lane folder (`unet/config.json`).
    pub path: String,
    /// Where its bytes come from.
    pub content: Content,
    /// What it is to the checkpoint.
    pub owner: Owner,
}

/// The files of one commit's lane folder, sorted by path, and the header they come from.
#[derive(Clone, Debug)]
pub struct LaneView {
    /// Files sorted by path; no path is another's folder.
    pub files: Vec<LaneFile>,
    /// The commit.
    pub commit: ObjectRef,
    /// The header's object.
    pub header_ref: ObjectRef,
    /// The header.
    pub header: Arc<Header>,
    /// Each component's folder (`""` for the lane folder, else `"<name>/"`), in header order.
    pub folders: Vec<String>,
}

impl LaneView {
    /// Lays out commit `commit` (its id, tree and header).
    ///
    /// # Errors
    /// [`LayoutError`] when paths collide or the header cannot make a file.
    pub fn build(
        commit: &ObjectRef,
        tree: &Tree,
        header: &Header,
    ) -> Result<LaneView, LayoutError> {
        Self::build_face(commit, tree, header, Face::AsImported)
    }

    /// Lays out the decoded face of commit `commit` ([`Face::Decoded`]).
    ///
    /// # Errors
    /// As [`LaneView::build`].
    pub fn build_decoded(
        commit: &ObjectRef,
        tree: &Tree,
        header: &Header,
    ) -> Result<LaneView, LayoutError> {
        Self::build_face(commit, tree, header, Face::Decoded)
    }

    /// Lays out face `face` of commit `commit`: as imported; decoded (its files as the
    /// libraries write them, configs without their quantization settings, every encoded
    /// tensor a plain tensor of its logical dtype, decoded when first read); or, for a
    /// single-file checkpoint, as a Diffusers folder.
    ///
    /// # Errors
    /// As [`LaneView::build`]; and [`LayoutError::Invalid`] for a Diffusers face of a lane
    /// that is no single-file checkpoint.
    pub fn build_face(
        commit: &ObjectRef,
        tree: &Tree,
        header: &Header,
        face: Face,
    ) -> Result<LaneView, LayoutError> {
        if face == Face::Single {
            return Self::build_single(commit, tree, header, Files::new(commit));
        }
        let mut files = Files::new(commit);
        for (path, object) in tree.repo_files() {
            files.add(
                path.to_owned(),
                Content::Object(*object),
                Owner::Repo,
                "a repo file",
            )?;
        }
        let single_file = Self::is_single_file(header);
        if face == Face::Diffusers && !single_file {
            return Err(files.invalid(SINGLE_FILE, "the lane is no single-file checkpoint"));
        }

        let own = Self::single_file_component(header);
        let shown = |index: usize| match face {
            // Every component but the file's own (what Diffusers does not load).
            Face::Diffusers => Some(header.components[index].name.as_str()) != own,
            Face::Decoded => true,
            // The file holds the tensors; the Diffusers components' files are the other face.
            Face::AsImported => !single_file,
            Face::Single => unreachable!("laid out above"),
        };
        let mut folders = canonical::folders(header);
        // A component alone (a VAE's file) is the Diffusers folder itself, as a Diffusers
        // model repo is, so `AutoencoderKL.from_pretrained(<lane>@diffusers)` loads it.
        let alone: Vec<usize> = (0..header.components.len()).filter(|&i| shown(i)).collect();
        if let (Face::Diffusers, None, [i]) = (face, &header.pipeline, alone.as_slice()) {
            folders[*i] = String::new();
        }
        for (index, (component, folder)) in header.components.iter().zip(&folders).enumerate() {
            if !shown(index) {
                continue;
            }
            for (name, object) in &component.assets {
                let owner = Owner::Component {
                    index,
                    tensors: Vec::new(),
                };
                files.add(
                    format!("{folder}{name}"),
                    Content::Object(*object),
                    owner,
                    "an asset",
                )?;
            }
        }
        let chunks: Arc<[ObjectRef]> = header.chunks.clone().into();
        let header_ref = *tree.header().1;
        let shared = Arc::new(header.clone());
        let recipe =
            recipe::SourceFiles::of(header).map_err(|why| files.invalid("source_files", why))?;
        match (face, recipe) {
            (Face::AsImported, Some(source)) => {
                let computing = (shared.clone(), header_ref);
                source.lay_out(header, &folders, &chunks, &mut files, &computing)?
            }
            (Face::AsImported, None) => {
                canonical::lay_out(header, &folders, &chunks, &mut files, None, &shown)?
            }
            (Face::Diffusers, _) => {
                canonical::lay_out(header, &folders, &chunks, &mut files, None, &shown)?
            }
            (Face::Single, _) => unreachable!("laid out above"),
            (Face::Decoded, _) => {
                let decoding = (shared.clone(), header_ref);
                canonical::lay_out(
                    header,
                    &folders,
                    &chunks,
                    &mut files,
                    Some(&decoding),
                    &shown,
                )?
            }
        }
        let files = files.finish()?;
        Ok(LaneView {
            files,
            commit: *commit,
            header_ref,
            header: shared,
            folders,
        })
    }

    /// The single-file face of a Diffusers lane ([`Face::Single`]): one file, the safetensors
    /// file the safetensors library would write of the converter's arrays (dtype, then name;
    /// `__metadata__` `{"format": "pt"}`), re-created by the recipe machinery that re-creates
    /// an imported single file.
    fn build_single(
        commit: &ObjectRef,
        tree: &Tree,
        header: &Header,
        mut files: Files,
    ) -> Result<LaneView, LayoutError> {
        use crate::format::{safetensors, Body};
        use recipe::{ArraySource, SourceFile, SourceFiles};

        let reversed = convert::reverse(convert::table(), header)
            .map_err(|why| files.invalid(SINGLE_FILE_NAME, format!("no single file: {why}")))?;
        let tensor = |component: &str, key: &str| {
            header
                .components
                .iter()
                .find(|c| c.name == component)
                .and_then(|c| c.tensors.iter().find(|t| t.key == key))
        };
        let mut recipe = SourceFiles::default();
        for file in &reversed {
            let mut entries = Vec::with_capacity(file.arrays.len());
            let mut arrays = BTreeMap::new();
            for a in &file.arrays {
                let mut length = 0;
                let mut dtype = None;
                for piece in &a.pieces {
                    let t =
                        tensor(&a.component, &piece.tensor).expect("reverse names lane tensors");
                    let Body::Plain(location) = &t.body else {
                        unreachable!("reverse takes plain tensors only");
                    };
                    length += match piece.rows {
                        None => location.length,
                        // Reverse splits a tensor only in halves of its rows.
                        Some((begin, end)) => location.length / t.shape[0] * (end - begin),
                    };
                    dtype = Some(&t.dtype);
                }
                let dtype = dtype.expect("an array has a tensor");
                entries.push(safetensors::Entry {
                    name: &a.key,
                    dtype,
                    shape: &a.shape,
                    length,
                });
                let source = match a.pieces.as_slice() {
                    [one] if one.rows.is_none() => ArraySource::Tensor {
                        component: a.component.clone(),
                        tensor: one.tensor.clone(),
                        transposed: a.transposed,
                    },
                    many => ArraySource::Rows {
                        component: a.component.clone(),
                        tensors: many.to_vec(),
                    },
                };
                arrays.insert(a.key.clone(), source);
            }
            let metadata = [("format".to_owned(), "pt".to_owned())];
            let (prefix, _) = safetensors::canonical_header(&entries, Some(&metadata));
            let text = String::from_utf8(prefix[8..].to_vec()).expect("the header is JSON text");
            let Some(first) = file.arrays.first() else {
                continue;
            };
            let component = first.component.clone();
            recipe.0.insert(
                file.name.clone(),
                SourceFile::Safetensors {
                    component,
                    header: text,
                    arrays,
                },
            );
        }
        let chunks: Arc<[ObjectRef]> = header.chunks.clone().into();
        let header_ref = *tree.header().1;
        let shared = Arc::new(header.clone());
        let folders = canonical::folders(header);
        recipe.lay_out(
            header,
            &folders,
            &chunks,
            &mut files,
            &(shared.clone(), header_ref),
        )?;
        Ok(LaneView {
            files: files.finish()?,
            commit: *commit,
            header_ref,
            header: shared,
            folders,
        })
    }

    /// Whether `header` is a Diffusers lane whose components make a single file, and so has
    /// a single-file face ([`Face::Single`]).
    pub fn has_single_face(header: &Header) -> bool {
        !Self::is_single_file(header) && convert::reverse(convert::table(), header).is_ok()
    }

    /// Whether `header` is a single-file checkpoint's, and so has a Diffusers face.
    pub fn is_single_file(header: &Header) -> bool {
        header.metadata.contains_key(SINGLE_FILE)
    }

    /// A single-file checkpoint's own component (the arrays no Diffusers component takes).
    pub(crate) fn single_file_component(header: &Header) -> Option<&str> {
        match header.metadata.get(SINGLE_FILE)? {
            crate::format::Value::Map(fields) => fields
                .iter()
                .find(|(k, _)| k == "component")
                .and_then(|(_, v)| v.as_text()),
            _ => None,
        }
    }

    /// Whether `header` has encoded tensors, and so a decoded view that differs from the lane.
    pub fn has_encoded(header: &Header) -> bool {
        !header.encodings.is_empty()
    }

    /// The file at `path`.
    pub fn file(&self, path: &str) -> Option<&LaneFile> {
        self.files
            .binary_search_by(|f| f.path.as_str().cmp(path))
            .ok()
            .map(|i| &self.files[i])
    }
}

/// Files being gathered for a view; refuses collisions.
pub(crate) struct Files {
    commit: String,
    by_path: BTreeMap<String, (Content, Owner, &'static str)>,
}

impl Files {
    fn new(commit: &ObjectRef) -> Files {
        Files {
            commit: commit.id(),
            by_path: BTreeMap::new(),
        }
    }

    pub(crate) fn add(
        &mut self,
        path: String,
        content: Content,
        owner: Owner,
        what: &'static str,
    ) -> Result<(), LayoutError> {
        if !crate::format::names::is_path(&path) {
            return Err(self.invalid(
                &path,
                format!("{what} has a path that is not a relative path"),
            ));
        }
        if let Some((_, _, other)) = self.by_path.get(&path) {
            return Err(LayoutError::Collision {
                commit: self.commit.clone(),
                why: format!("{other} and {what}"),
                path,
            });
        }
        self.by_path.insert(path, (content, owner, what));
        Ok(())
    }

    pub(crate) fn invalid(&self, path: &str, why: impl Into<String>) -> LayoutError {
        LayoutError::Invalid {
            commit: self.commit.clone(),
            path: path.to_owned(),
            why: why.into(),
        }
    }

    fn finish(self) -> Result<Vec<LaneFile>, LayoutError> {
        // A file may not also be a folder of another file (spec §3).
        let mut folders = BTreeSet::new();
        for path in self.by_path.keys() {
            let mut at = 0;
            while let Some(i) = path[at..].find('/') {
                folders.insert(&path[..at + i]);
                at += i + 1;
            }
        }
        if let Some(path) = self.by_path.keys().find(|p| folders.contains(p.as_str())) {
            return Err(LayoutError::Collision {
                commit: self.commit.clone(),
                path: path.clone(),
                why: "a file and a folder".into(),
            });
        }
        Ok(self
            .by_path
            .into_iter()
            .map(|(path, (content, owner, _))| LaneFile {
                path,
                content,
                owner,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests;
