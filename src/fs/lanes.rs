//! Lane views as folders, built on first use and cached per commit.
//!
//! A commit never changes, so its [`Lane`] is built once (tree and header read, layout made)
//! and shared by every alias (`latest/<lane>`, `<version>/<lane>`, `<hex>/<lane>`). The cache
//! is a bounded LRU: an evicted lane is built again on its next use, and inodes stay valid
//! because they name (commit, path), not a view.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;

use super::{LaneContents, LaneRef};
use crate::extents::{FileTensors, LocateError};
use crate::format::ObjectRef;
use crate::layout::LaneFile;
use crate::sync::lock;

/// What a name in a lane folder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildKind {
    /// A folder.
    Dir,
    /// The file at this index of the view's files.
    File(usize),
}

/// One name in a lane folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Child {
    /// The name (one path segment).
    pub name: String,
    /// Folder or file.
    pub kind: ChildKind,
}

/// Folders indexed from a list of file paths: each folder's children sorted by name, a file
/// child naming its index in the list.
#[derive(Debug, Default)]
pub struct Folders {
    /// Each folder's path (`""` for the top) → its children sorted by name.
    folders: HashMap<String, Vec<Child>>,
}

impl Folders {
    /// Indexes `paths` (`/`-separated, relative); the top folder exists even when empty.
    pub fn index<'a>(paths: impl IntoIterator<Item = &'a str>) -> Folders {
        let mut folders: BTreeMap<String, BTreeMap<String, ChildKind>> = BTreeMap::new();
        folders.insert(String::new(), BTreeMap::new());
        for (index, path) in paths.into_iter().enumerate() {
            let mut parent = String::new();
            let mut segments = path.split('/').peekable();
            while let Some(segment) = segments.next() {
                let last = segments.peek().is_none();
                let kind = if last {
                    ChildKind::File(index)
                } else {
                    ChildKind::Dir
                };
                folders
                    .entry(parent.clone())
                    .or_default()
                    .insert(segment.to_owned(), kind);
                if !last {
                    parent = join(&parent, segment);
                    folders.entry(parent.clone()).or_default();
                }
            }
        }
        let folders = folders
            .into_iter()
            .map(|(path, children)| {
                let children = children
                    .into_iter()
                    .map(|(name, kind)| Child { name, kind })
                    .collect();
                (path, children)
            })
            .collect();
        Folders { folders }
    }

    /// The children of folder `path`, sorted by name; `None` when it is not a folder.
    pub fn children(&self, path: &str) -> Option<&[Child]> {
        self.folders.get(path).map(Vec::as_slice)
    }

    /// Child `name` of folder `path`.
    pub fn child(&self, path: &str, name: &str) -> Option<&Child> {
        let children = self.children(path)?;
        children
            .binary_search_by(|c| c.name.as_str().cmp(name))
            .ok()
            .map(|i| &children[i])
    }
}

/// A commit laid out (as imported or decoded), with its folders indexed.
#[derive(Debug)]
pub struct Lane {
    /// The commit and view.
    pub lane: LaneRef,
    /// Its files, header and mtime.
    pub contents: LaneContents,
    folders: Folders,
    /// Its safetensors files' tensors, indexed on their first extents query.
    indexes: Mutex<HashMap<String, Arc<FileIndex>>>,
}

/// A safetensors file of a lane indexed for the extents queries, kept with its lane: every
/// open of the file asks the same, and a model's file has thousands of tensors.
#[derive(Debug)]
pub struct FileIndex {
    /// The file's tensors, or why it cannot be located.
    pub tensors: Result<Arc<FileTensors>, LocateError>,
    /// The last whole-file answer made for it.
    described: Mutex<Option<Arc<Description>>>,
}

/// A whole-file answer (ABI 2, [`crate::extents::ioctl::describe`]) and what it was made of.
#[derive(Debug)]
pub struct Description {
    /// The answer's JSON text.
    pub text: Vec<u8>,
    /// The blobs its extents name, each once.
    pub blobs: Vec<ObjectRef>,
    /// Each blob's proven stamp as the answer gives it: an answer is reused only while the
    /// blobs' stamps are still these.
    pub stamps: Vec<Option<[i128; 5]>>,
}

impl FileIndex {
    /// The last answer made, if any.
    pub fn description(&self) -> Option<Arc<Description>> {
        lock(&self.described).clone()
    }

    /// Keeps `description` as the answer to give next.
    pub fn set_description(&self, description: Arc<Description>) {
        *lock(&self.described) = Some(description);
    }
}

impl Lane {
    /// Indexes `contents` of `lane`.
    pub fn new(lane: LaneRef, contents: LaneContents) -> Lane {
        let folders = Folders::index(contents.view.files.iter().map(|f| f.path.as_str()));
        Lane {
            lane,
            contents,
            folders,
            indexes: Mutex::default(),
        }
    }

    /// The index of file `path` (a safetensors file of the view, or an error saying what it
    /// is), made on first use.
    pub fn index(&self, path: &str) -> Arc<FileIndex> {
        if let Some(index) = lock(&self.indexes).get(path) {
            return index.clone();
        }
        // Made without the lock: a large header takes milliseconds to index.
        let index = Arc::new(FileIndex {
            tensors: FileTensors::new(&self.contents.view, path).map(Arc::new),
            described: Mutex::default(),
        });
        lock(&self.indexes)
            .entry(path.to_owned())
            .or_insert(index)
            .clone()
    }

    /// The children of folder `path`, sorted by name; `None` when it is not a folder.
    pub fn children(&self, path: &str) -> Option<&[Child]> {
        self.folders.children(path)
    }

    /// Child `name` of folder `path`.
    pub fn child(&self, path: &str, name: &str) -> Option<&Child> {
        self.folders.child(path, name)
    }

    /// The file at `index` of the view.
    pub fn file(&self, index: usize) -> &LaneFile {
        &self.contents.view.files[index]
    }
}

/// `parent/name`, or `name` at the lane folder.
pub fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}/{name}")
    }
}

/// Built lanes by commit and view, least recently used evicted first.
#[derive(Debug)]
pub struct LaneCache {
    lanes: Mutex<LruCache<LaneRef, Arc<Lane>>>,
}

impl LaneCache {
    /// A cache of at most `capacity` lanes (at least one).
    pub fn new(capacity: usize) -> LaneCache {
        let capacity = NonZeroUsize::new(capacity.max(1)).expect("at least one");
        LaneCache {
            lanes: Mutex::new(LruCache::new(capacity)),
        }
    }

    /// The lane of `commit`, built by `build` when not cached. Two threads may build one lane
    /// at once; both results are equal and the second replaces the first.
    ///
    /// # Errors
    /// `build` fails (failures are not cached: a repaired store shows the lane again).
    pub fn get_or_build<E>(
        &self,
        key: &LaneRef,
        build: impl FnOnce() -> Result<LaneContents, E>,
    ) -> Result<Arc<Lane>, E> {
        if let Some(lane) = lock(&self.lanes).get(key) {
            return Ok(lane.clone());
        }
        // Built without the lock: reading a header can take a while and must not stall
        // lookups in other lanes.
        let lane = Arc::new(Lane::new(*key, build()?));
        lock(&self.lanes).put(*key, lane.clone());
        Ok(lane)
    }

    /// How many lanes are cached.
    pub fn len(&self) -> usize {
        lock(&self.lanes).len()
    }

    /// Whether no lane is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
