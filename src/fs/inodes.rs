//! The inode table: every inode given out, and the keys that give the same number again.
//!
//! - Folders get one inode per full path: the kernel refuses a folder reachable by two paths.
//!   A lane folder's key also holds its commit, so when `latest/bf16` moves to a new commit it
//!   becomes a new inode, and the old one (with long kernel TTLs on everything inside) still
//!   shows the old commit to whoever holds it.
//! - Files inside lanes share one inode per (commit, path) across aliases (`latest/bf16/x` and
//!   `<hex>/bf16/x`), so they share one page cache.
//! - Numbers are never reused or forgotten while mounted (`forget` is ignored): the table grows
//!   with what was looked up, a few hundred bytes per inode.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use super::hub::Group;
use super::{LaneRef, ROOT_INO};
use crate::format::Sha256;
use crate::sync::{read, write};

/// What an inode is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    /// The mount's root: the orgs.
    Root,
    /// An org: its repos.
    Org {
        /// The org's name.
        org: String,
    },
    /// A repo: its revisions.
    Repo {
        /// The org.
        org: String,
        /// The repo's name within the org.
        name: String,
    },
    /// A revision: its lane folders.
    Revision {
        /// The org.
        org: String,
        /// The repo's name within the org.
        name: String,
        /// The revision folder's name.
        rev: String,
    },
    /// A folder of a commit's lane: the lane folder itself (`path` empty) or a folder in it.
    LaneDir {
        /// The lane shown.
        lane: LaneRef,
        /// The folder's path in the lane (`unet`), empty for the lane folder.
        path: String,
    },
    /// The hub cache view's folder `@hf`: its repo folders.
    HubRoot,
    /// A repo folder of the hub view (`path` empty) or a folder in it above the snapshots:
    /// `refs` and folders in it, `snapshots`, `trees`.
    HubRepo {
        /// The repo folder's name (`models--ORG--NAME`).
        folder: String,
        /// The folder's path in it.
        path: String,
    },
    /// A snapshot folder of the hub view (`path` empty) or a folder in it.
    HubSnapshot {
        /// The lane commits it shows.
        group: Arc<Group>,
        /// The folder's path in the snapshot.
        path: String,
    },
    /// A folder of the ComfyUI view: `@comfyui` itself (`path` empty), a model folder
    /// (`loras`), or a folder in one (`loras/acme`).
    ComfyDir {
        /// The folder's path in the view.
        path: String,
    },
    /// A file whose bytes are made here: a ref or a tree listing of the hub view.
    Generated {
        /// Its bytes.
        bytes: Arc<[u8]>,
        /// Its mtime.
        mtime: SystemTime,
        /// Whether its bytes never change (a listing; a ref moves).
        immutable: bool,
    },
    /// A file of a commit's lane.
    File {
        /// The lane.
        lane: LaneRef,
        /// The file's path in the lane.
        path: String,
        /// Its size in bytes.
        size: u64,
        /// The commit's tree blob mtime.
        mtime: SystemTime,
    },
}

impl Node {
    /// Whether the inode is a folder.
    pub fn is_dir(&self) -> bool {
        !matches!(self, Node::File { .. } | Node::Generated { .. })
    }

    /// Whether the inode never changes: a lane folder, a hub snapshot folder, what lies in
    /// them, and tree listings.
    pub fn immutable(&self) -> bool {
        match self {
            Node::LaneDir { .. } | Node::File { .. } | Node::HubSnapshot { .. } => true,
            Node::Generated { immutable, .. } => *immutable,
            _ => false,
        }
    }

    /// The lane shown, for inodes in lanes.
    pub fn lane(&self) -> Option<&LaneRef> {
        match self {
            Node::LaneDir { lane, .. } | Node::File { lane, .. } => Some(lane),
            _ => None,
        }
    }
}

/// An inode: what it is and the folder that holds it (for `..`; a file's first parent).
#[derive(Debug)]
pub struct Inode {
    /// Its number.
    pub ino: u64,
    /// The folder it was first found in (the root is its own parent).
    pub parent: u64,
    /// What it is.
    pub node: Node,
}

/// What a folder's inode is tied to besides its path: the commit of a lane folder, the
/// group of a snapshot folder, the bytes of a made file.
#[derive(Debug, Hash, PartialEq, Eq)]
enum Pin {
    Lane(LaneRef),
    Group(Sha256),
    Bytes(Sha256),
}

#[derive(Debug, Hash, PartialEq, Eq)]
struct DirKey {
    parent: u64,
    name: String,
    pin: Option<Pin>,
}

#[derive(Debug)]
struct Table {
    /// Inode `n` at index `n - 1`.
    nodes: Vec<Arc<Inode>>,
    /// Folders, and made files, by path and pin.
    dirs: HashMap<DirKey, u64>,
    files: HashMap<(LaneRef, String), u64>,
}

/// Every inode of a mount.
#[derive(Debug)]
pub struct InodeTable {
    table: RwLock<Table>,
}

impl Default for InodeTable {
    fn default() -> Self {
        let root = Arc::new(Inode {
            ino: ROOT_INO,
            parent: ROOT_INO,
            node: Node::Root,
        });
        InodeTable {
            table: RwLock::new(Table {
                nodes: vec![root],
                dirs: HashMap::new(),
                files: HashMap::new(),
            }),
        }
    }
}

impl InodeTable {
    /// Inode `ino`, if it was given out.
    pub fn get(&self, ino: u64) -> Option<Arc<Inode>> {
        let table = read(&self.table);
        let index = usize::try_from(ino.checked_sub(1)?).ok()?;
        table.nodes.get(index).cloned()
    }

    /// How many inodes were given out.
    pub fn len(&self) -> u64 {
        read(&self.table).nodes.len() as u64
    }

    /// Whether only the root exists.
    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }

    /// The folder (or made file) `name` in `parent`, `node` the first time. A lane folder
    /// is tied to its commit, a snapshot folder to its group, a made file to its bytes, so a
    /// path that moves to other contents gets another inode.
    pub fn dir(&self, parent: u64, name: &str, node: Node) -> Arc<Inode> {
        let key = DirKey {
            parent,
            name: name.to_owned(),
            pin: match &node {
                Node::LaneDir { lane, path } if path.is_empty() => Some(Pin::Lane(*lane)),
                Node::HubSnapshot { group, path } if path.is_empty() => Some(Pin::Group(group.key)),
                Node::Generated { bytes, .. } => Some(Pin::Bytes(Sha256::of(bytes))),
                _ => None,
            },
        };
        if let Some(found) = self.lookup(|t| t.dirs.get(&key).copied()) {
            return found;
        }
        let mut table = write(&self.table);
        if let Some(&ino) = table.dirs.get(&key) {
            return table.nodes[ino as usize - 1].clone();
        }
        let inode = push(&mut table, parent, node);
        table.dirs.insert(key, inode.ino);
        inode
    }

    /// The file `path` of `lane` (one inode across every alias of the commit).
    pub fn file(
        &self,
        parent: u64,
        lane: &LaneRef,
        path: &str,
        size: u64,
        mtime: SystemTime,
    ) -> Arc<Inode> {
        let key = (*lane, path.to_owned());
        if let Some(found) = self.lookup(|t| t.files.get(&key).copied()) {
            return found;
        }
        let mut table = write(&self.table);
        if let Some(&ino) = table.files.get(&key) {
            return table.nodes[ino as usize - 1].clone();
        }
        let node = Node::File {
            lane: *lane,
            path: path.to_owned(),
            size,
            mtime,
        };
        let inode = push(&mut table, parent, node);
        table.files.insert(key, inode.ino);
        inode
    }

    fn lookup(&self, find: impl FnOnce(&Table) -> Option<u64>) -> Option<Arc<Inode>> {
        let table = read(&self.table);
        find(&table).map(|ino| table.nodes[ino as usize - 1].clone())
    }
}

fn push(table: &mut Table, parent: u64, node: Node) -> Arc<Inode> {
    let ino = table.nodes.len() as u64 + 1;
    let inode = Arc::new(Inode { ino, parent, node });
    table.nodes.push(inode.clone());
    inode
}
