//! The hub cache view, `MOUNT/@hf/`: the store laid out as huggingface_hub reads a cache
//! (`file_download.py` `try_to_load_from_cache`, `_snapshot_download.py`, `_tree_cache.py`),
//! so `HF_HUB_CACHE=MOUNT/@hf` serves `from_pretrained("ORG/NAME")` from the store.
//!
//! ```text
//! @hf/models--ORG--NAME/refs/<ref>                 a bare 40-hex snapshot name, no newline
//!                      /snapshots/<40 hex>/<path>  every lane's files of one revision together
//!                      /trees/<40 hex>.json        the revision's listing, when recorded
//! ```
//!
//! Which repos: one folder per hub id a local repo was imported as ([`crate::store::hub`]);
//! a local repo without one shows under its own name (`models--local--NAME`). When two local
//! repos record one hub id, the one whose ref changed last has it and the other shows under
//! its own name.
//!
//! Which snapshots (a snapshot is a group of lane commits, shown as one folder: the lanes'
//! files by path, a path in two lanes taken from the newer commit; a lane with encoded
//! tensors shows as its decoded view, and a path a plain lane has is the plain lane's, so a
//! quantized lane never stands in for the original's `model.safetensors`):
//! - each recorded hub revision, named by its commit;
//! - each release, and the newest commit of each lane (`latest`), named by the recorded
//!   revision with the same commits, else by a 40-hex digest of their ids ([`group_id`]);
//! - each commit no group above holds, alone, named by a digest of its id.
//!
//! Refs: a ref recorded with a hub revision (the hub cache's refs when imported; `main` for an
//! import naming its revision) names it; each release version names its own; `main`, when no
//! revision recorded it, names `latest`'s snapshot; and each commit's 64-hex id names a
//! snapshot that holds it (a recorded revision or release first), so
//! `revision=<our commit id>` works.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use sha2::Digest;

use lru::LruCache;

use super::catalog::RepoEntry;
use super::inodes::{Inode, Node};
use super::lanes::{join, Child, ChildKind, Folders, Lane};
use super::{FsResult, LaneRef, TensorFs};
use crate::format::{ObjectRef, Sha256};
use crate::layout::Face;
use crate::revisions::{self, Revision};
use crate::store::hub::{HubRecord, TreeEntry};
use crate::sync::lock;

/// The view's folder in the mount's root.
pub const HUB_VIEW: &str = "@hf";

/// Lane commits shown as one snapshot folder.
#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Group {
    /// The snapshot folder's name: 40 lowercase hex digits.
    pub id: String,
    /// The commits, the one whose files win first (newest first).
    pub commits: Vec<ObjectRef>,
    /// The recorded listing of the hub revision, if any.
    pub files: Option<BTreeMap<String, TreeEntry>>,
    /// A digest of the name and the commits: a snapshot folder's inode is tied to it.
    pub key: Sha256,
}

impl Group {
    fn new(
        id: String,
        commits: Vec<ObjectRef>,
        files: Option<BTreeMap<String, TreeEntry>>,
    ) -> Group {
        let mut hasher = sha2::Sha256::new();
        hasher.update(id.as_bytes());
        for c in &commits {
            hasher.update(c.id().as_bytes());
        }
        let key = Sha256(hasher.finalize().into());
        Group {
            id,
            commits,
            files,
            key,
        }
    }
}

/// The 40-hex snapshot name of `commits` when no hub revision names them: the first 40 hex
/// digits of SHA-256 over `tensorfs @hf snapshot` and each commit id (`sha256:<hex>`) on its
/// own line, in the order given (stable across mounts and machines).
pub fn group_id(commits: &[ObjectRef]) -> String {
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"tensorfs @hf snapshot\n");
    for c in commits {
        hasher.update(c.id().as_bytes());
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())[..40].to_owned()
}

/// A repo folder of the view, as the refs and records were read.
#[derive(Debug)]
pub struct HubRepo {
    /// The local repo.
    pub entry: Arc<RepoEntry>,
    /// Its hub record, when it has this folder by its hub id.
    pub record: Option<HubRecord>,
    /// Refs and snapshots, worked out on first use (they need the commits' lane labels).
    view: Mutex<Option<Arc<HubRepoView>>>,
}

/// What a repo folder holds.
#[derive(Debug, Default)]
pub struct HubRepoView {
    /// Ref names (`main`, `pr/1`) and the snapshot each names, in [`HubRepoView::ref_folders`]
    /// order.
    pub refs: Vec<(String, String)>,
    /// `refs/` indexed as folders (a file child names its index in `refs`).
    pub ref_folders: Folders,
    /// Snapshots by name.
    pub snapshots: BTreeMap<String, Arc<Group>>,
}

/// The view's repo folders by name (`models--ORG--NAME`), from the repos and hub records.
pub fn repo_folders(
    repos: &[Arc<RepoEntry>],
    records: Vec<HubRecord>,
) -> BTreeMap<String, Arc<HubRepo>> {
    let by_name: HashMap<&str, &Arc<RepoEntry>> =
        repos.iter().map(|r| (r.repo.name.as_str(), r)).collect();
    // Each hub id to the record whose repo's ref changed last.
    let mut claims: BTreeMap<String, (HubRecord, Arc<RepoEntry>)> = BTreeMap::new();
    for record in records {
        let Some(entry) = by_name.get(record.repo.as_str()) else {
            continue;
        };
        let folder = folder_name(&record.hub_id);
        let newer = claims.get(&folder).is_none_or(|(_, held)| {
            (entry.mtime, &entry.repo.name) > (held.mtime, &held.repo.name)
        });
        if newer {
            claims.insert(folder, (record, (*entry).clone()));
        }
    }
    let mut out = BTreeMap::new();
    let mut by_hub = std::collections::HashSet::new();
    for (folder, (record, entry)) in claims {
        by_hub.insert(entry.repo.name.clone());
        out.insert(folder, Arc::new(HubRepo::new(entry, Some(record))));
    }
    for entry in repos {
        if by_hub.contains(&entry.repo.name) {
            continue;
        }
        let folder = folder_name(&entry.repo.name);
        if out.contains_key(&folder) {
            tracing::warn!(
                "{HUB_VIEW}/{folder} shows a hub repo; local repo {} is not shown there",
                entry.repo.name
            );
            continue;
        }
        out.insert(folder, Arc::new(HubRepo::new(entry.clone(), None)));
    }
    out
}

/// huggingface_hub's folder name of a model repo: `models--` and the id with `/` as `--`.
pub fn folder_name(id: &str) -> String {
    format!("models--{}", id.replace('/', "--"))
}

impl HubRepo {
    fn new(entry: Arc<RepoEntry>, record: Option<HubRecord>) -> HubRepo {
        HubRepo {
            entry,
            record,
            view: Mutex::new(None),
        }
    }

    /// Refs and snapshots; `lane_of` gives a commit's lane label (reading its tree).
    ///
    /// # Errors
    /// `lane_of` fails for a commit `latest` needs.
    pub fn view<E>(
        &self,
        lane_of: impl FnMut(&ObjectRef) -> Result<Option<String>, E>,
    ) -> Result<Arc<HubRepoView>, E> {
        if let Some(view) = lock(&self.view).as_ref() {
            return Ok(view.clone());
        }
        let view = Arc::new(self.build(lane_of)?);
        *lock(&self.view) = Some(view.clone());
        Ok(view)
    }

    fn build<E>(
        &self,
        mut lane_of: impl FnMut(&ObjectRef) -> Result<Option<String>, E>,
    ) -> Result<HubRepoView, E> {
        let repo = &self.entry.repo;
        // Newest first: a path in two lanes is taken from the newer commit.
        let age = |c: &ObjectRef| {
            repo.commits
                .iter()
                .rev()
                .position(|x| x == c)
                .unwrap_or(usize::MAX)
        };
        let ordered = |mut commits: Vec<ObjectRef>| {
            commits.dedup();
            commits.sort_by_key(age);
            commits
        };
        let present: Vec<&ObjectRef> = repo.roots().collect();
        let mut groups: Vec<Arc<Group>> = Vec::new();
        let mut refs: BTreeMap<String, String> = BTreeMap::new();
        for revision in self.record.iter().flat_map(|r| &r.revisions) {
            let commits: Vec<ObjectRef> = revision
                .commits
                .iter()
                .filter(|c| present.contains(c))
                .copied()
                .collect();
            if commits.is_empty() {
                continue;
            }
            let commits = ordered(commits);
            let id = match &revision.revision {
                Some(rev) => rev.clone(),
                None => group_id(&commits),
            };
            for name in &revision.refs {
                refs.insert(name.clone(), id.clone());
            }
            groups.retain(|g| g.id != id);
            groups.push(Arc::new(Group::new(id, commits, revision.files.clone())));
        }
        // A release or `latest` with the commits of a group above is that snapshot.
        let group_of = |commits: Vec<ObjectRef>, groups: &mut Vec<Arc<Group>>| {
            let commits = ordered(commits);
            let mut sorted = commits.clone();
            sorted.sort();
            let same = groups.iter().find(|g| {
                let mut theirs = g.commits.clone();
                theirs.sort();
                theirs == sorted
            });
            match same {
                Some(g) => g.id.clone(),
                None => {
                    let group = Group::new(group_id(&commits), commits, None);
                    let id = group.id.clone();
                    groups.push(Arc::new(group));
                    id
                }
            }
        };
        // A ref the hub cache had (recorded above) wins over a derived one of the same name:
        // `main` is the cache's main, not whichever lanes are newest.
        for release in &repo.releases {
            let id = group_of(release.lanes.values().copied().collect(), &mut groups);
            refs.entry(release.version.clone()).or_insert(id);
        }
        if !refs.contains_key("main") {
            let latest = revisions::lanes(repo, Revision::Latest, &mut lane_of)?;
            if !latest.is_empty() {
                let id = group_of(latest.into_iter().map(|(_, c)| c).collect(), &mut groups);
                refs.insert("main".to_owned(), id);
            }
        }
        for commit in repo.roots() {
            let holder = groups.iter().find(|g| g.commits.contains(commit));
            let id = match holder {
                Some(g) => g.id.clone(),
                None => {
                    let group = Group::new(group_id(&[*commit]), vec![*commit], None);
                    let id = group.id.clone();
                    groups.push(Arc::new(group));
                    id
                }
            };
            refs.entry(commit.sha256.hex()).or_insert(id);
        }
        let refs: Vec<(String, String)> = refs
            .into_iter()
            // A ref must be a file under `refs/`: segments that are names, no `..`.
            .filter(|(name, _)| crate::format::names::is_path(name))
            .collect();
        let ref_folders = Folders::index(refs.iter().map(|(name, _)| name.as_str()));
        Ok(HubRepoView {
            refs,
            ref_folders,
            snapshots: groups.into_iter().map(|g| (g.id.clone(), g)).collect(),
        })
    }
}

/// huggingface_hub's tree cache file (`trees/<commit>.json`, `format_version` 1) of the
/// recorded `files` that `shown` holds.
pub fn tree_listing(files: &BTreeMap<String, TreeEntry>, shown: impl Fn(&str) -> bool) -> Vec<u8> {
    let files: BTreeMap<&String, &TreeEntry> = files.iter().filter(|(p, _)| shown(p)).collect();
    let listing = serde_json::json!({"format_version": 1, "files": files});
    serde_json::to_vec_pretty(&listing).expect("a listing serializes")
}

/// A snapshot folder's files: its lanes' files by path, the first lane holding a path giving
/// it.
#[derive(Debug)]
pub struct SnapshotTree {
    lanes: Vec<Arc<Lane>>,
    /// (lane index, file index in that lane's view), in `folders` index order.
    files: Vec<(usize, usize)>,
    folders: Folders,
}

impl SnapshotTree {
    fn new(lanes: Vec<Arc<Lane>>) -> SnapshotTree {
        let mut seen = std::collections::HashSet::new();
        let mut files = Vec::new();
        for (l, lane) in lanes.iter().enumerate() {
            for (f, file) in lane.contents.view.files.iter().enumerate() {
                if seen.insert(file.path.as_str()) {
                    files.push((l, f));
                }
            }
        }
        let folders = Folders::index(
            files
                .iter()
                .map(|&(l, f)| lanes[l].contents.view.files[f].path.as_str()),
        );
        SnapshotTree {
            lanes,
            files,
            folders,
        }
    }

    /// Whether the snapshot shows a file at `path`.
    pub fn has_file(&self, path: &str) -> bool {
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
        matches!(
            self.folders.child(parent, name),
            Some(Child {
                kind: ChildKind::File(_),
                ..
            })
        )
    }
}

/// The snapshot trees built lately, by group key.
pub(super) type SnapshotTrees = Mutex<LruCache<Sha256, Arc<SnapshotTree>>>;

/// A new cache of `capacity` snapshot trees.
pub(super) fn snapshot_trees(capacity: usize) -> SnapshotTrees {
    let capacity = std::num::NonZeroUsize::new(capacity.max(1)).expect("at least one");
    Mutex::new(LruCache::new(capacity))
}

/// What a name in a folder of the view is.
enum HubChild {
    /// A folder.
    Dir(Node),
    /// A made file.
    Made(Node),
    /// A file of a lane: file `index` of `lane`'s view.
    LaneFile(Arc<Lane>, usize),
}

impl TensorFs {
    /// The inode of `name` in hub view folder `dir`; `None` when there is none.
    pub(super) fn hub_lookup(&self, dir: &Inode, name: &str) -> FsResult<Option<Arc<Inode>>> {
        Ok(self
            .hub_child(&dir.node, name)?
            .map(|child| self.hub_inode(dir.ino, name, child)))
    }

    /// The children of hub view folder `dir`, sorted by name.
    pub(super) fn hub_list(&self, dir: &Inode) -> FsResult<Vec<(Arc<Inode>, String)>> {
        let mut out = Vec::new();
        for name in self.hub_names(&dir.node)? {
            if let Some(child) = self.hub_child(&dir.node, &name)? {
                out.push((self.hub_inode(dir.ino, &name, child), name));
            }
        }
        Ok(out)
    }

    fn hub_inode(&self, parent: u64, name: &str, child: HubChild) -> Arc<Inode> {
        match child {
            HubChild::Dir(node) | HubChild::Made(node) => self.inodes.dir(parent, name, node),
            HubChild::LaneFile(lane, index) => {
                let file = lane.file(index);
                let size = file.content.size();
                self.inodes
                    .file(parent, &lane.lane, &file.path, size, lane.contents.mtime)
            }
        }
    }

    fn hub_repo(&self, folder: &str) -> FsResult<Option<(Arc<HubRepo>, Arc<HubRepoView>)>> {
        let Some(repo) = self.snapshot()?.hub.get(folder).cloned() else {
            return Ok(None);
        };
        let view = repo.view(|c| self.commit_lane(c).map(|l| l.lane))?;
        Ok(Some((repo, view)))
    }

    pub(super) fn snapshot_tree(&self, group: &Group) -> FsResult<Arc<SnapshotTree>> {
        if let Some(tree) = lock(&self.hub_trees).get(&group.key) {
            return Ok(tree.clone());
        }
        // A lane with encoded tensors holds their parts as stored, which no hub loader reads
        // as the tensors: it shows decoded, and only the paths no plain lane has (a quantized
        // lane's `model.safetensors` beside the original's is the original).
        let mut plain = Vec::new();
        let mut encoded = Vec::new();
        for commit in &group.commits {
            let decoded = self.commit_lane(commit)?.encoded;
            let face = match decoded {
                true => Face::Decoded,
                false => Face::AsImported,
            };
            let lane = LaneRef {
                commit: *commit,
                face,
            };
            if decoded {
                encoded.push(lane);
            } else {
                plain.push(lane);
            }
        }
        let lanes = plain
            .iter()
            .chain(&encoded)
            .map(|lane| self.lane(lane))
            .collect::<FsResult<Vec<_>>>()?;
        let tree = Arc::new(SnapshotTree::new(lanes));
        lock(&self.hub_trees).put(group.key, tree.clone());
        Ok(tree)
    }

    fn hub_names(&self, node: &Node) -> FsResult<Vec<String>> {
        Ok(match node {
            Node::HubRoot => self.snapshot()?.hub.keys().cloned().collect(),
            Node::HubRepo { folder, path } => {
                let Some((_, view)) = self.hub_repo(folder)? else {
                    return Ok(Vec::new());
                };
                match path.as_str() {
                    "" => {
                        let mut names = vec!["refs".to_owned(), "snapshots".to_owned()];
                        if view.snapshots.values().any(|g| g.files.is_some()) {
                            names.push("trees".to_owned());
                        }
                        names
                    }
                    "snapshots" => view.snapshots.keys().cloned().collect(),
                    "trees" => view
                        .snapshots
                        .values()
                        .filter(|g| g.files.is_some())
                        .map(|g| format!("{}.json", g.id))
                        .collect(),
                    refs => {
                        let sub = refs.strip_prefix("refs").unwrap_or(refs);
                        let sub = sub.strip_prefix('/').unwrap_or(sub);
                        view.ref_folders
                            .children(sub)
                            .unwrap_or_default()
                            .iter()
                            .map(|c| c.name.clone())
                            .collect()
                    }
                }
            }
            Node::HubSnapshot { group, path } => self
                .snapshot_tree(group)?
                .folders
                .children(path)
                .unwrap_or_default()
                .iter()
                .map(|c| c.name.clone())
                .collect(),
            _ => Vec::new(),
        })
    }

    fn hub_child(&self, node: &Node, name: &str) -> FsResult<Option<HubChild>> {
        let repo_dir = |folder: &str, path: &str| {
            HubChild::Dir(Node::HubRepo {
                folder: folder.to_owned(),
                path: path.to_owned(),
            })
        };
        Ok(match node {
            Node::HubRoot => self
                .snapshot()?
                .hub
                .contains_key(name)
                .then(|| repo_dir(name, "")),
            Node::HubRepo { folder, path } => {
                let Some((repo, view)) = self.hub_repo(folder)? else {
                    return Ok(None);
                };
                let mtime = repo.entry.mtime;
                match path.as_str() {
                    "" => match name {
                        "refs" | "snapshots" => Some(repo_dir(folder, name)),
                        "trees" if view.snapshots.values().any(|g| g.files.is_some()) => {
                            Some(repo_dir(folder, name))
                        }
                        _ => None,
                    },
                    "snapshots" => view.snapshots.get(name).map(|group| {
                        HubChild::Dir(Node::HubSnapshot {
                            group: group.clone(),
                            path: String::new(),
                        })
                    }),
                    "trees" => {
                        let group = name
                            .strip_suffix(".json")
                            .and_then(|id| view.snapshots.get(id));
                        match group.and_then(|g| Some((g, g.files.as_ref()?))) {
                            Some((group, files)) => {
                                let tree = self.snapshot_tree(group)?;
                                let bytes = tree_listing(files, |p| tree.has_file(p));
                                Some(HubChild::Made(Node::Generated {
                                    bytes: bytes.into(),
                                    mtime,
                                    immutable: true,
                                }))
                            }
                            None => None,
                        }
                    }
                    refs => {
                        let sub = refs.strip_prefix("refs").unwrap_or(refs);
                        let sub = sub.strip_prefix('/').unwrap_or(sub);
                        match view.ref_folders.child(sub, name).map(|c| c.kind) {
                            Some(ChildKind::Dir) => Some(repo_dir(folder, &join(refs, name))),
                            Some(ChildKind::File(i)) => Some(HubChild::Made(Node::Generated {
                                // A bare hash, no newline: huggingface_hub reads it whole.
                                bytes: view.refs[i].1.as_bytes().into(),
                                mtime,
                                immutable: false,
                            })),
                            None => None,
                        }
                    }
                }
            }
            Node::HubSnapshot { group, path } => {
                let tree = self.snapshot_tree(group)?;
                match tree.folders.child(path, name).map(|c| c.kind) {
                    Some(ChildKind::Dir) => Some(HubChild::Dir(Node::HubSnapshot {
                        group: group.clone(),
                        path: join(path, name),
                    })),
                    Some(ChildKind::File(i)) => {
                        let (l, f) = tree.files[i];
                        Some(HubChild::LaneFile(tree.lanes[l].clone(), f))
                    }
                    None => None,
                }
            }
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_ids_are_stable_40_hex() {
        let c = ObjectRef::of(b"x");
        let id = group_id(&[c]);
        assert_eq!(id.len(), 40);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(id, group_id(&[c]));
        assert_ne!(id, group_id(&[c, ObjectRef::of(b"y")]));
    }
}
