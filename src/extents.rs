//! Where a tensor of a lane's safetensors file lies in the store: its logical dtype and shape,
//! its encoding, and for each stored part the byte ranges of chunk blobs that hold it, in
//! order. A loader that reads blobs directly (`pread`, `O_DIRECT`, GPU direct storage) skips
//! the mount's copy; it can cross-check against the part's bytes in the synthesized file.
//!
//! [`FileTensors`] indexes one file of a [`LaneView`] (its safetensors header parsed once);
//! [`FileTensors::locate`] answers for one tensor name. [`locate`] does both for a single
//! query. The mount answers the same query through an ioctl ([`ioctl`], `docs/extents.md`).
//! [`stage`] reads a located tensor's extents with io_uring into reusable host buffers, for a
//! loader that copies them on (GPU-direct loading, `docs/gpu.md`).
//!
//! A part's bytes are one location of the header (spec §4): `length` bytes from `offset` in
//! chunk `chunk`, continuing at offset 0 of the following chunks when a chunk ends first. So a
//! part has one extent per chunk it touches, and extents of a part are consecutive in the file.

pub mod ioctl;
pub mod stage;

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::json as fjson;
use crate::format::{safetensors, Body, Dtype, Header, Location, ObjectRef, Value};
use crate::layout::recipe::{ArraySource, SourceFile, SourceFiles};
use crate::layout::{part_name, Content, LaneView, Owner};
use crate::store::Store;

/// Why a tensor cannot be located. Every variant names the file (its path in the lane folder)
/// and, where there is one, the tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocateError {
    /// The lane folder has no such file.
    #[error("{file}: no such file in the lane folder")]
    NoFile {
        /// The path asked for.
        file: String,
    },
    /// The file is not one of the lane's safetensors files (a config, an asset, a folder).
    #[error("{file}: not a safetensors file of the lane")]
    NotSafetensors {
        /// The file.
        file: String,
    },
    /// The array's bytes are made when read (a single file's transposed array, or a marker
    /// array the file's plan holds): no blob holds them as the file shows them.
    #[error(
        "{file}: array {tensor:?} is {how} when read, so no blob holds it as the file shows \
         it; read it from the file"
    )]
    Computed {
        /// The file.
        file: String,
        /// The array's name.
        tensor: String,
        /// How its bytes are made: `transposed`, `decoded`, `copied from the file's plan`
        /// (an inline marker array) or `zero-filled`.
        how: &'static str,
    },
    /// The file holds no tensor of that name.
    #[error("{file}: no tensor {tensor:?}")]
    NoTensor {
        /// The file.
        file: String,
        /// The name asked for.
        tensor: String,
    },
    /// The tensor is encoded and this file (of a decoded view) shows it decoded: its logical
    /// bytes are computed when read and lie in no chunk.
    #[error(
        "{file}: tensor {tensor:?} is decoded from {scheme} when read, so no bytes of the store \
         hold it; locate it in the lane's own folder (without @decoded) to get its parts"
    )]
    Decoded {
        /// The file.
        file: String,
        /// The tensor's key.
        tensor: String,
        /// Its encoding's scheme.
        scheme: String,
    },
    /// The file and the header disagree (a bug or a malformed header).
    #[error("{file}: tensor {tensor:?}: {why}")]
    Invalid {
        /// The file.
        file: String,
        /// The tensor (empty when the file's header itself is at fault).
        tensor: String,
        /// What is wrong.
        why: String,
    },
}

impl LocateError {
    /// The errno the mount answers with: `EOPNOTSUPP` (not a safetensors file), `ENOENT` (no
    /// such tensor), `ENODATA` (decoded in this view, or computed when read), `EIO`
    /// (inconsistent layout).
    pub fn errno(&self) -> i32 {
        match self {
            LocateError::NoFile { .. } | LocateError::NotSafetensors { .. } => libc::EOPNOTSUPP,
            LocateError::NoTensor { .. } => libc::ENOENT,
            LocateError::Decoded { .. } | LocateError::Computed { .. } => libc::ENODATA,
            LocateError::Invalid { .. } => libc::EIO,
        }
    }
}

/// A tensor's encoding (spec §6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoding {
    /// `family.variant` (`int8.rowwise`).
    pub scheme: String,
    /// The params as canonical JSON text (an object; keys sorted, no spaces).
    pub params: String,
}

/// One stored part of a located tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// Its role: `weight` for a plain tensor's only part; the scheme's roles otherwise.
    pub role: String,
    /// The stored dtype.
    pub dtype: Dtype,
    /// The stored shape, outermost first.
    pub shape: Vec<u64>,
    /// Where the file shows the part's bytes: absolute byte offsets in the synthesized file
    /// (the safetensors `data_offsets` plus `8 + N`), end exclusive.
    pub file_range: Range<u64>,
    /// Its extents: indices into [`Located::extents`].
    pub extents: Range<usize>,
}

/// A byte range of one chunk blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    /// The part it belongs to (index into [`Located::parts`]).
    pub part: usize,
    /// The chunk object.
    pub blob: ObjectRef,
    /// The blob file: `<store>/blobs/<aa>/<bb>/<sha256 hex>`.
    pub path: PathBuf,
    /// Byte offset in the blob.
    pub offset: u64,
    /// Length in bytes (never 0).
    pub length: u64,
    /// Where these bytes are in the synthesized file (absolute offset).
    pub file_offset: u64,
}

/// Where a tensor's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// The file, as given.
    pub file: String,
    /// The tensor's key in its component (the name asked, or the tensor whose part it names).
    pub key: String,
    /// The logical dtype (safetensors name via [`Dtype::name`]).
    pub dtype: Dtype,
    /// The logical shape, outermost first.
    pub shape: Vec<u64>,
    /// `None` for a plain tensor.
    pub encoding: Option<Encoding>,
    /// The stored parts, in the header's order (one, `weight`, for a plain tensor).
    pub parts: Vec<Part>,
    /// Every part's extents, part after part, each part's in file order.
    pub extents: Vec<Extent>,
}

impl Located {
    /// Page `page` of [`Located::extents`] with `per_page` extents a page; empty past the
    /// end or when `per_page` is 0.
    pub fn page(&self, page: u64, per_page: usize) -> &[Extent] {
        let start = usize::try_from(page)
            .ok()
            .and_then(|p| p.checked_mul(per_page))
            .unwrap_or(usize::MAX)
            .min(self.extents.len());
        let end = start.saturating_add(per_page).min(self.extents.len());
        &self.extents[start..end]
    }

    /// How many pages of `per_page` extents hold them all (0 with no extents).
    pub fn pages(&self, per_page: usize) -> u64 {
        match per_page {
            0 => 0,
            n => self.extents.len().div_ceil(n) as u64,
        }
    }

    /// Stored bytes known from elsewhere (a mount's whole-file answer, a header's location):
    /// one part, `weight`, dtype U8 and shape `[n]`, made of `pieces` in order, each `(blob,
    /// offset in it, length)`, its file offsets counted from 0. `file` and `key` name it in
    /// errors; `store_root` holds the blobs.
    pub fn bytes(
        file: &str,
        key: &str,
        store_root: &Path,
        pieces: &[(ObjectRef, u64, u64)],
    ) -> Located {
        let mut extents = Vec::with_capacity(pieces.len());
        let file_offset = extents_of(store_root, 0, pieces.iter().copied(), 0, &mut extents);
        Located {
            file: file.to_owned(),
            key: key.to_owned(),
            dtype: Dtype::U8,
            shape: vec![file_offset],
            encoding: None,
            parts: vec![Part {
                role: "weight".into(),
                dtype: Dtype::U8,
                shape: vec![file_offset],
                file_range: 0..file_offset,
                extents: 0..extents.len(),
            }],
            extents,
        }
    }

    /// The extents of part `part` (empty for an unknown part).
    pub fn part_extents(&self, part: usize) -> &[Extent] {
        self.parts
            .get(part)
            .map_or(&[], |p| &self.extents[p.extents.clone()])
    }
}

/// One safetensors file of a lane, indexed for [`FileTensors::locate`].
#[derive(Debug, Clone)]
pub struct FileTensors {
    file: String,
    header: Arc<Header>,
    /// Each entry of the file's safetensors header → its absolute byte range in the file.
    entries: HashMap<String, Range<u64>>,
    /// The names [`FileTensors::locate_all`] answers for: the component's keys the file
    /// holds, in the component's order, or a single file's array names in file order.
    keys: Vec<String>,
    kind: Kind,
}

/// What a file's entries are.
#[derive(Debug, Clone)]
enum Kind {
    /// One component's tensors (a component's weights file).
    Component {
        component: usize,
        /// The file shows its encoded tensors decoded.
        decodes: bool,
        /// Each name a query may use → the tensor's index in the component: the keys of the
        /// tensors the file holds, and the entry names of encoded tensors' parts.
        names: HashMap<String, usize>,
        /// The entry of each part `(tensor key, role)` where it is not [`part_name`]'s: a
        /// producer's own array name (`x.qweight`), as the import recorded it.
        producer_names: HashMap<(String, String), String>,
    },
    /// Several components' tensors (a single-file checkpoint, or a pipeline's single-file
    /// face): each array where the file's plan takes its bytes from (row parts of several
    /// tensors one after another, or computed when read), with its dtype and shape.
    Arrays {
        plan: Arc<crate::layout::SafetensorsPlan>,
        arrays: HashMap<String, (Dtype, Vec<u64>)>,
    },
}

/// One tensor of a file, as [`FileTensors::locate_all`] gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileTensor {
    /// Its stored bytes' places.
    Stored(Located),
    /// A tensor whose bytes are in no blob as the file shows them, so only a read of the file
    /// gives them: an encoded tensor a decoded view shows decoded, or a single file's array
    /// made when read ([`LocateError::Computed`]).
    Decoded {
        /// The tensor's key.
        key: String,
        /// Its encoding's scheme, or how a computed array is made (`transposed`, ...).
        scheme: String,
        /// Its bytes in the file (absolute offsets, end exclusive).
        file_range: Range<u64>,
    },
}

impl FileTensors {
    /// Indexes file `file` (a path in the lane folder) of `view`.
    ///
    /// # Errors
    /// [`LocateError::NoFile`], [`LocateError::NotSafetensors`], or
    /// [`LocateError::Invalid`] when its header does not parse.
    pub fn new(view: &LaneView, file: &str) -> Result<FileTensors, LocateError> {
        let lane_file = view.file(file).ok_or_else(|| LocateError::NoFile {
            file: file.to_owned(),
        })?;
        let not_safetensors = || LocateError::NotSafetensors {
            file: file.to_owned(),
        };
        let Content::Safetensors(plan) = &lane_file.content else {
            return Err(not_safetensors());
        };
        // A GGUF file's plan has no safetensors header to index.
        if file.ends_with(".gguf") {
            return Err(not_safetensors());
        }
        let invalid = |why: String| LocateError::Invalid {
            file: file.to_owned(),
            tensor: String::new(),
            why,
        };
        let json = plan
            .prefix()
            .get(8..)
            .ok_or_else(|| invalid("the file has no safetensors header".into()))?;
        let parsed = safetensors::parse_header(json, plan.size())
            .map_err(|e| invalid(format!("its safetensors header: {e}")))?;
        let start = parsed.data_start();
        let index = match &lane_file.owner {
            Owner::Component { index, tensors } => (*index, tensors),
            Owner::Checkpoint => {
                let mut arrays = HashMap::new();
                let mut keys = Vec::with_capacity(parsed.tensors.len());
                let mut entries = HashMap::new();
                for t in parsed.tensors {
                    arrays.insert(t.name.clone(), (t.dtype.clone(), t.shape.clone()));
                    entries.insert(t.name.clone(), start + t.begin..start + t.end);
                    keys.push(t.name);
                }
                keys.sort_by_key(|k| entries[k].start);
                return Ok(FileTensors {
                    file: file.to_owned(),
                    header: view.header.clone(),
                    entries,
                    keys,
                    kind: Kind::Arrays {
                        plan: plan.clone(),
                        arrays,
                    },
                });
            }
            _ => return Err(not_safetensors()),
        };
        let (index, tensors) = index;
        let entries = parsed
            .tensors
            .into_iter()
            .map(|t| (t.name, start + t.begin..start + t.end))
            .collect();
        let component = view
            .header
            .components
            .get(index)
            .ok_or_else(|| invalid(format!("no component {index} in the header")))?;
        let decodes = plan.decodes();
        // A file an import re-creates names parts as their producer did (recipe `arrays`).
        let mut producer_names = HashMap::new();
        if !decodes {
            if let Ok(Some(recipe)) = SourceFiles::of(&view.header) {
                if let Some(SourceFile::Safetensors { arrays, .. }) = recipe.0.get(file) {
                    for (name, source) in arrays {
                        if let ArraySource::Part { tensor, role } = source {
                            producer_names.insert((tensor.clone(), role.clone()), name.clone());
                        }
                    }
                }
            }
        }
        let mut names = HashMap::new();
        let mut keys = Vec::with_capacity(tensors.len());
        for &i in tensors {
            let i = i as usize;
            let t = component
                .tensors
                .get(i)
                .ok_or_else(|| invalid(format!("no tensor {i} in the component")))?;
            names.insert(t.key.clone(), i);
            keys.push(t.key.clone());
            if let (Body::Encoded { parts, .. }, false) = (&t.body, decodes) {
                for p in parts {
                    let name = producer_names
                        .get(&(t.key.clone(), p.role.clone()))
                        .cloned()
                        .unwrap_or_else(|| part_name(&t.key, &p.role));
                    names.entry(name).or_insert(i);
                }
            }
        }
        Ok(FileTensors {
            file: file.to_owned(),
            header: view.header.clone(),
            entries,
            keys,
            kind: Kind::Component {
                component: index,
                decodes,
                names,
                producer_names,
            },
        })
    }

    /// Every tensor of the file, in the component's order: [`FileTensors::locate`] of each
    /// key, and for an encoded tensor of a decoded view, where the file shows it decoded.
    ///
    /// # Errors
    /// [`LocateError::Invalid`] when the file and header disagree.
    pub fn locate_all(&self, store_root: &Path) -> Result<Vec<FileTensor>, LocateError> {
        self.keys
            .iter()
            .map(|key| match self.locate(store_root, key) {
                Ok(located) => Ok(FileTensor::Stored(located)),
                Err(LocateError::Computed { tensor, how, .. }) => {
                    let file_range = self.entries[&tensor].clone();
                    Ok(FileTensor::Decoded {
                        key: tensor,
                        scheme: how.into(),
                        file_range,
                    })
                }
                Err(LocateError::Decoded { tensor, scheme, .. }) => {
                    let file_range =
                        self.entries
                            .get(&tensor)
                            .cloned()
                            .ok_or_else(|| LocateError::Invalid {
                                file: self.file.clone(),
                                tensor: tensor.clone(),
                                why: "the file has no entry for it".into(),
                            })?;
                    Ok(FileTensor::Decoded {
                        key: tensor,
                        scheme,
                        file_range,
                    })
                }
                Err(e) => Err(e),
            })
            .collect()
    }

    /// The file's path in the lane folder.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// Locates `tensor`: a tensor key as the file shows it, or the entry name of an encoded
    /// tensor's part (`x.weight_scale`), which locates the whole tensor (`x.weight`). Blob
    /// paths are under `store_root`.
    ///
    /// # Errors
    /// [`LocateError::NoTensor`]; [`LocateError::Decoded`] for an encoded tensor of a decoded
    /// view; [`LocateError::Invalid`] when the file and header disagree.
    pub fn locate(&self, store_root: &Path, tensor: &str) -> Result<Located, LocateError> {
        let no_tensor = || LocateError::NoTensor {
            file: self.file.clone(),
            tensor: tensor.to_owned(),
        };
        let (component, decodes, names, producer_names) = match &self.kind {
            Kind::Component {
                component,
                decodes,
                names,
                producer_names,
            } => (*component, *decodes, names, producer_names),
            Kind::Arrays { plan, arrays } => {
                let (dtype, shape) = arrays.get(tensor).ok_or_else(no_tensor)?;
                return self.locate_array(store_root, plan, tensor, dtype, shape);
            }
        };
        let &index = names.get(tensor).ok_or_else(no_tensor)?;
        let t = &self.header.components[component].tensors[index];
        let invalid = |why: String| LocateError::Invalid {
            file: self.file.clone(),
            tensor: t.key.clone(),
            why,
        };
        // (role, dtype, shape, location, the part's entry name in the file)
        let (encoding, stored) = match &t.body {
            Body::Plain(location) => (
                None,
                vec![("weight", &t.dtype, &t.shape, *location, t.key.clone())],
            ),
            Body::Encoded { encoding, parts } => {
                let e = self
                    .header
                    .encodings
                    .get(*encoding)
                    .ok_or_else(|| invalid(format!("no encoding {encoding} in the header")))?;
                if decodes {
                    return Err(LocateError::Decoded {
                        file: self.file.clone(),
                        tensor: t.key.clone(),
                        scheme: e.scheme.clone(),
                    });
                }
                let params = Value::map(e.params.iter().map(|(k, v)| (k.clone(), v.clone())));
                let params = fjson::canonical(&fjson::from_value(&params))
                    .map_err(|err| invalid(format!("its params: {err}")))?;
                let encoding = Encoding {
                    scheme: e.scheme.clone(),
                    params,
                };
                let parts = parts
                    .iter()
                    .map(|p| {
                        let name = producer_names
                            .get(&(t.key.clone(), p.role.clone()))
                            .cloned()
                            .unwrap_or_else(|| part_name(&t.key, &p.role));
                        (p.role.as_str(), &p.dtype, &p.shape, p.location, name)
                    })
                    .collect();
                (Some(encoding), parts)
            }
        };
        let mut parts = Vec::with_capacity(stored.len());
        let mut extents = Vec::new();
        for (role, dtype, shape, location, name) in stored {
            let range = self
                .entries
                .get(&name)
                .ok_or_else(|| invalid(format!("the file has no entry {name:?}")))?
                .clone();
            if range.end - range.start != location.length {
                return Err(invalid(format!(
                    "entry {name:?} has {} bytes in the file but {} in the header",
                    range.end - range.start,
                    location.length
                )));
            }
            let first = extents.len();
            self.push_extents(store_root, parts.len(), location, range.start, &mut extents)
                .map_err(invalid)?;
            parts.push(Part {
                role: role.to_owned(),
                dtype: dtype.clone(),
                shape: shape.clone(),
                file_range: range,
                extents: first..extents.len(),
            });
        }
        Ok(Located {
            file: self.file.clone(),
            key: t.key.clone(),
            dtype: t.dtype.clone(),
            shape: t.shape.clone(),
            encoding,
            parts,
            extents,
        })
    }

    /// Locates array `name` (`dtype`, `shape`) of a file of several components' tensors: the
    /// chunk ranges its plan reads it from, as one part.
    fn locate_array(
        &self,
        store_root: &Path,
        plan: &crate::layout::SafetensorsPlan,
        name: &str,
        dtype: &Dtype,
        shape: &[u64],
    ) -> Result<Located, LocateError> {
        use crate::layout::Source;
        let range = self.entries[name].clone();
        let segments = plan.segments();
        let first = segments.partition_point(|s| s.file_offset + s.length <= range.start);
        let mut pieces = Vec::new();
        let mut at = range.start;
        for s in segments[first..]
            .iter()
            .take_while(|s| s.file_offset < range.end)
        {
            let (from, to) = (
                at.max(s.file_offset),
                range.end.min(s.file_offset + s.length),
            );
            let how = match s.source {
                Source::Chunk { chunk, offset } => {
                    let blob = plan.chunks()[chunk as usize];
                    pieces.push((blob, offset + (from - s.file_offset), to - from));
                    at = to;
                    continue;
                }
                Source::Computed {
                    how: crate::layout::Compute::Transpose,
                    ..
                } => "transposed",
                Source::Computed {
                    how: crate::layout::Compute::Decode,
                    ..
                } => "decoded",
                Source::Inline { .. } => "copied from the file's plan",
                Source::Zeros => "zero-filled",
            };
            return Err(LocateError::Computed {
                file: self.file.clone(),
                tensor: name.to_owned(),
                how,
            });
        }
        let mut extents = Vec::with_capacity(pieces.len());
        let end = extents_of(store_root, 0, pieces.into_iter(), range.start, &mut extents);
        if end != range.end {
            return Err(LocateError::Invalid {
                file: self.file.clone(),
                tensor: name.to_owned(),
                why: format!(
                    "the file's plan covers bytes {}..{end} of {range:?}",
                    range.start
                ),
            });
        }
        Ok(Located {
            file: self.file.clone(),
            key: name.to_owned(),
            dtype: dtype.clone(),
            shape: shape.to_vec(),
            encoding: None,
            parts: vec![Part {
                role: "weight".into(),
                dtype: dtype.clone(),
                shape: shape.to_vec(),
                file_range: range,
                extents: 0..extents.len(),
            }],
            extents,
        })
    }

    /// Appends the extents of `location` (part `part`, shown from `file_offset`).
    fn push_extents(
        &self,
        store_root: &Path,
        part: usize,
        location: Location,
        file_offset: u64,
        out: &mut Vec<Extent>,
    ) -> Result<(), String> {
        let pieces = self
            .header
            .pieces(location)
            .map(|(chunk, offset, length)| (self.header.chunks[chunk], offset, length));
        let covered = extents_of(store_root, part, pieces, file_offset, out) - file_offset;
        if covered != location.length {
            return Err(format!(
                "its location (chunk {}, offset {}, {} bytes) runs past the last chunk",
                location.chunk, location.offset, location.length
            ));
        }
        Ok(())
    }
}

/// Appends the extents of part `part` made of `pieces` (blob, offset in it, length; empty
/// ones skipped), shown in the file from `file_offset` on; returns where they end in the file.
fn extents_of(
    store_root: &Path,
    part: usize,
    pieces: impl Iterator<Item = (ObjectRef, u64, u64)>,
    mut file_offset: u64,
    out: &mut Vec<Extent>,
) -> u64 {
    for (blob, offset, length) in pieces.filter(|p| p.2 > 0) {
        out.push(Extent {
            part,
            blob,
            path: store_root.join(blob.blob_path()),
            offset,
            length,
            file_offset,
        });
        file_offset += length;
    }
    file_offset
}

/// Locates `tensor` in file `file` of `view`, a lane of `store`: [`FileTensors::new`] then
/// [`FileTensors::locate`].
///
/// # Errors
/// As those two.
pub fn locate(
    store: &Store,
    view: &LaneView,
    file: &str,
    tensor: &str,
) -> Result<Located, LocateError> {
    FileTensors::new(view, file)?.locate(store.root(), tensor)
}
