//! The ComfyUI view, `MOUNT/@comfyui/`: ComfyUI's model folders (`checkpoints/`, `loras/`,
//! `vae/`, … and the older names it still reads, `unet/`, `clip/`, `t2i_adapter/`) holding
//! each lane of each repo's `latest` revision once, sorted by [`crate::layout::comfyui`].
//!
//! ```text
//! @comfyui/loras/ORG/NAME.safetensors        a lane with one weights file
//!         /checkpoints/ORG/NAME.fp16.safetensors   another lane of the repo
//!         /text_encoders/ORG/NAME/<path>     a lane with several weights files
//!         /diffusers/ORG/NAME/               a Diffusers pipeline: its lane folder
//! ```
//!
//! Files are the lane folders' own inodes. ComfyUI re-lists a folder only when its mtime (or
//! that of a folder under it) changes, so a folder's mtime is the newest ref mtime of the repos
//! it shows, moved on whenever what it lists changes while mounted (a repo removed, say).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::inodes::{Inode, Node};
use super::lanes::{join, ChildKind, Folders};
use super::namespace::Snapshot;
use super::{FsResult, LaneRef, TensorFs};
use crate::format::ObjectRef;
use crate::layout::comfyui::{self, Shows};
use crate::layout::Face;
use crate::revisions::{self, Revision};
use crate::sync::lock;

/// The view's folder in the mount's root.
pub const COMFYUI_VIEW: &str = "@comfyui";

/// What a commit that cannot be read leads to here, for the log.
const LEFT_OUT: &str = "left out of the ComfyUI view";

/// One shown entry: a lane file, or a whole lane folder (a pipeline).
#[derive(Debug)]
struct Shown {
    lane: LaneRef,
    shows: Shows,
    /// The ref mtime of its repo.
    mtime: SystemTime,
    /// A file's size in bytes and its lane's mtime, taken when the index was built (so a
    /// listing of many files builds no lane view again).
    size: u64,
    lane_mtime: SystemTime,
}

/// The view as the refs were read at one moment.
#[derive(Debug, Default)]
pub(super) struct ComfyIndex {
    /// Model folder (canonical name) → its entries' paths (`ORG/NAME.safetensors`) indexed as
    /// folders, and what each shows (a file child's index points into the list).
    entries: BTreeMap<String, (Folders, Vec<Shown>)>,
}

/// The index with the snapshot it was built from, and folder mtimes kept across rebuilds.
#[derive(Debug, Default)]
pub(super) struct ComfyState {
    built: Option<(Arc<Snapshot>, Arc<ComfyIndex>)>,
    /// View path → (hash of its listing, mtime given).
    mtimes: HashMap<String, (u64, SystemTime)>,
}

/// The state of a mount's ComfyUI view.
pub(super) type ComfyView = Mutex<ComfyState>;

impl TensorFs {
    /// The index of the current snapshot, built on first use after each refresh.
    fn comfy_index(&self) -> FsResult<Arc<ComfyIndex>> {
        let snapshot = self.snapshot()?;
        if let Some((of, index)) = &lock(&self.comfy).built {
            if Arc::ptr_eq(of, &snapshot) {
                return Ok(index.clone());
            }
        }
        let index = Arc::new(self.build_comfy_index(&snapshot));
        lock(&self.comfy).built = Some((snapshot, index.clone()));
        Ok(index)
    }

    /// Every repo's `latest` lanes sorted into model folders. A lane that cannot be read is
    /// left out (its error is logged), so one damaged commit hides nothing else.
    fn build_comfy_index(&self, snapshot: &Snapshot) -> ComfyIndex {
        let mut by_folder: BTreeMap<String, Vec<(String, Shown)>> = BTreeMap::new();
        for org in snapshot.orgs.values() {
            for entry in org.repos.values() {
                let repo = &entry.repo;
                // A commit that cannot be read is logged once and left out.
                let left_out =
                    |commit: &ObjectRef, source| self.commit_error(commit, source, LEFT_OUT);
                let label = |c: &ObjectRef| {
                    self.try_commit_lane(c)
                        .map(|l| l.lane)
                        .map_err(|source| left_out(c, source))
                };
                let Ok(mut lanes) = revisions::lanes(repo, Revision::Latest, label) else {
                    continue;
                };
                comfyui::order_lanes(repo, &mut lanes, label);
                for (i, (label, commit)) in lanes.iter().enumerate() {
                    let lane = LaneRef {
                        commit: *commit,
                        face: Face::AsImported,
                    };
                    let faces = match self.try_lane(&lane) {
                        Ok(built) => comfyui::faces(&built.contents.view.header),
                        Err(source) => {
                            left_out(commit, source);
                            continue;
                        }
                    };
                    for &face in faces {
                        let lane = LaneRef {
                            commit: *commit,
                            face,
                        };
                        let built = match self.try_lane(&lane) {
                            Ok(built) => built,
                            Err(source) => {
                                left_out(commit, source);
                                continue;
                            }
                        };
                        let (entries, _) =
                            comfyui::entries(&built.contents.view, &repo.name, label, i == 0);
                        for e in entries {
                            let size = match &e.shows {
                                Shows::File(f) => {
                                    built.contents.view.file(f).map_or(0, |f| f.content.size())
                                }
                                Shows::Lane => 0,
                            };
                            let shown = Shown {
                                lane,
                                shows: e.shows,
                                mtime: entry.mtime,
                                size,
                                lane_mtime: built.contents.mtime,
                            };
                            by_folder.entry(e.folder).or_default().push((e.path, shown));
                        }
                    }
                }
            }
        }
        let entries = by_folder
            .into_iter()
            .map(|(folder, mut shown)| {
                // Repos in name order claim names: one that finds its name taken is left out.
                let paths: Vec<&str> = shown.iter().map(|(p, _)| p.as_str()).collect();
                let lost = comfyui::collisions(&paths);
                for &(i, by) in &lost {
                    tracing::warn!(
                        "{COMFYUI_VIEW}/{folder}/{}: the name is taken by {}; left out",
                        shown[i].0,
                        shown[by].0
                    );
                }
                let lost: std::collections::HashSet<usize> = lost.iter().map(|(i, _)| *i).collect();
                let mut kept: Vec<(String, Shown)> = shown
                    .drain(..)
                    .enumerate()
                    .filter(|(i, _)| !lost.contains(i))
                    .map(|(_, e)| e)
                    .collect();
                kept.sort_by(|a, b| a.0.cmp(&b.0));
                let folders = Folders::index(kept.iter().map(|(p, _)| p.as_str()));
                (
                    folder,
                    (folders, kept.into_iter().map(|(_, s)| s).collect()),
                )
            })
            .collect();
        ComfyIndex { entries }
    }

    /// The entries of view folder `path` (`""`, `loras`, `loras/acme`): names, and the shown
    /// entry of each file or pipeline child.
    fn comfy_children(&self, path: &str) -> FsResult<Vec<(String, Option<usize>)>> {
        let index = self.comfy_index()?;
        if path.is_empty() {
            let table = comfyui::table();
            let mut names: Vec<String> = table
                .folders
                .iter()
                .flat_map(|f| std::iter::once(&f.name).chain(&f.aliases))
                .cloned()
                .collect();
            names.sort();
            return Ok(names.into_iter().map(|n| (n, None)).collect());
        }
        let Some((_, (folders, _))) = comfy_folder(&index, path) else {
            return Ok(Vec::new());
        };
        let rest = path.split_once('/').map_or("", |(_, r)| r);
        Ok(folders
            .children(rest)
            .unwrap_or_default()
            .iter()
            .map(|c| match c.kind {
                ChildKind::Dir => (c.name.clone(), None),
                ChildKind::File(i) => (c.name.clone(), Some(i)),
            })
            .collect())
    }

    /// The inode of `name` in view folder `dir`; `None` when there is none.
    pub(super) fn comfy_lookup(&self, dir: &Inode, name: &str) -> FsResult<Option<Arc<Inode>>> {
        let Node::ComfyDir { path } = &dir.node else {
            return Ok(None);
        };
        let shown = match path.as_str() {
            "" => match comfyui::table().folder(name) {
                Some(_) => None,
                None => return Ok(None),
            },
            path => {
                let index = self.comfy_index()?;
                let Some((_, (folders, _))) = comfy_folder(&index, path) else {
                    return Ok(None);
                };
                let rest = path.split_once('/').map_or("", |(_, r)| r);
                match folders.child(rest, name).map(|c| c.kind) {
                    None => return Ok(None),
                    Some(ChildKind::Dir) => None,
                    Some(ChildKind::File(i)) => Some(i),
                }
            }
        };
        self.comfy_inode(dir.ino, path, name, shown).map(Some)
    }

    /// The children of view folder `dir`.
    pub(super) fn comfy_list(&self, dir: &Inode) -> FsResult<Vec<(Arc<Inode>, String)>> {
        let Node::ComfyDir { path } = &dir.node else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (name, shown) in self.comfy_children(path)? {
            out.push((self.comfy_inode(dir.ino, path, &name, shown)?, name));
        }
        Ok(out)
    }

    fn comfy_inode(
        &self,
        parent: u64,
        path: &str,
        name: &str,
        shown: Option<usize>,
    ) -> FsResult<Arc<Inode>> {
        let Some(i) = shown else {
            let node = Node::ComfyDir {
                path: join(path, name),
            };
            return Ok(self.inodes.dir(parent, name, node));
        };
        let index = self.comfy_index()?;
        let (_, (_, shown)) = comfy_folder(&index, path).expect("a listed folder");
        let shown = &shown[i];
        Ok(match &shown.shows {
            Shows::Lane => self.inodes.dir(
                parent,
                name,
                Node::LaneDir {
                    lane: shown.lane,
                    path: String::new(),
                },
            ),
            Shows::File(file) => {
                self.inodes
                    .file(parent, &shown.lane, file, shown.size, shown.lane_mtime)
            }
        })
    }

    /// The mtime of view folder `path`: the newest ref mtime of the repos it shows, moved on
    /// (at least 1 ms) each time its listing changes while mounted.
    pub(super) fn comfy_mtime(&self, path: &str) -> FsResult<SystemTime> {
        let index = self.comfy_index()?;
        let shown: Vec<&Shown> = match path {
            "" => index.entries.values().flat_map(|(_, s)| s).collect(),
            path => match comfy_folder(&index, path) {
                Some((_, (folders, shown))) => {
                    let rest = path.split_once('/').map_or("", |(_, r)| r);
                    under(folders, rest)
                        .into_iter()
                        .map(|i| &shown[i])
                        .collect()
                }
                None => Vec::new(),
            },
        };
        let newest = shown.iter().map(|s| s.mtime).max().unwrap_or(UNIX_EPOCH);
        // ComfyUI caches names only: a file whose bytes changed under the same name needs no
        // new listing.
        let mut hasher = DefaultHasher::new();
        for (name, child) in self.comfy_children(path)? {
            (name, child.is_some()).hash(&mut hasher);
        }
        let listing = hasher.finish();
        let mut state = lock(&self.comfy);
        let mtime = match state.mtimes.get(path) {
            Some(&(hash, mtime)) if hash == listing => mtime,
            Some(&(_, mtime)) => newest.max(mtime + Duration::from_millis(1)),
            None => newest,
        };
        state.mtimes.insert(path.to_owned(), (listing, mtime));
        Ok(mtime)
    }
}

/// The model folder of view path `path` (its first segment, an older name mapped to its
/// folder) and its entries.
fn comfy_folder<'a>(
    index: &'a ComfyIndex,
    path: &str,
) -> Option<(&'a String, &'a (Folders, Vec<Shown>))> {
    static EMPTY: std::sync::OnceLock<(Folders, Vec<Shown>)> = std::sync::OnceLock::new();
    let first = path.split('/').next().unwrap_or(path);
    let folder = comfyui::table().folder(first)?;
    match index.entries.get_key_value(&folder.name) {
        Some(found) => Some(found),
        None => {
            let empty = EMPTY.get_or_init(|| (Folders::index(std::iter::empty()), Vec::new()));
            Some((&folder.name, empty))
        }
    }
}

/// The entry indices of every file under folder `path` of `folders`.
fn under(folders: &Folders, path: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut stack = vec![path.to_owned()];
    while let Some(dir) = stack.pop() {
        for child in folders.children(&dir).unwrap_or_default() {
            match child.kind {
                ChildKind::Dir => stack.push(join(&dir, &child.name)),
                ChildKind::File(i) => out.push(i),
            }
        }
    }
    out
}
