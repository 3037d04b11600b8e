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
//! - The kernel keeps the numbers it was given, so a daemon that takes over a live mount
//!   needs the same table: [`InodeTable::after`] gives inodes to keep, in the order given out,
//!   and [`InodeTable::restore`] gives them out again.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use super::hub::Group;
use super::{LaneRef, ROOT_INO};
use crate::format::Sha256;
use crate::sync::{read, write};

/// What an inode is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Inode {
    /// Its number.
    pub ino: u64,
    /// The folder it was first found in (the root is its own parent).
    pub parent: u64,
    /// Its name there (empty for the root).
    pub name: String,
    /// What it is.
    pub node: Node,
}

/// Why [`InodeTable::restore`] refused an inode.
#[derive(Debug, thiserror::Error)]
#[error("inode {ino} cannot be given out again: {why}")]
pub struct RestoreError {
    /// The inode.
    pub ino: u64,
    /// Why.
    pub why: &'static str,
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
            name: String::new(),
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

    /// The inodes given out after `ino`, in the order they were.
    pub fn after(&self, ino: u64) -> Vec<Arc<Inode>> {
        let table = read(&self.table);
        let start = usize::try_from(ino)
            .unwrap_or(usize::MAX)
            .min(table.nodes.len());
        table.nodes[start..].to_vec()
    }

    /// Gives out `inodes` again, as [`InodeTable::after`] gave them: each must be the next
    /// number, or one given out already with the same contents (so restoring twice is
    /// harmless).
    ///
    /// # Errors
    /// An inode that skips a number, differs from the one of its number, or names a parent
    /// not given out yet.
    pub fn restore(&self, inodes: impl IntoIterator<Item = Inode>) -> Result<(), RestoreError> {
        let mut table = write(&self.table);
        for inode in inodes {
            let ino = inode.ino;
            let fail = |why| Err(RestoreError { ino, why });
            let next = table.nodes.len() as u64 + 1;
            if ino < next {
                match *table.nodes[ino as usize - 1] == inode {
                    true => continue,
                    false => return fail("another inode has its number"),
                }
            }
            if ino > next {
                return fail("the inodes before it are missing");
            }
            if inode.parent >= ino {
                return fail("its parent is not given out before it");
            }
            let key = Key::of(&inode);
            push(&mut table, inode.parent, &inode.name, inode.node);
            key.insert(&mut table, ino);
        }
        Ok(())
    }

    /// The folder (or made file) `name` in `parent`, `node` the first time. A lane folder
    /// is tied to its commit, a snapshot folder to its group, a made file to its bytes, so a
    /// path that moves to other contents gets another inode.
    pub fn dir(&self, parent: u64, name: &str, node: Node) -> Arc<Inode> {
        let key = dir_key(parent, name, &node);
        if let Some(found) = self.lookup(|t| t.dirs.get(&key).copied()) {
            return found;
        }
        let mut table = write(&self.table);
        if let Some(&ino) = table.dirs.get(&key) {
            return table.nodes[ino as usize - 1].clone();
        }
        let inode = push(&mut table, parent, name, node);
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
        let name = path.rsplit('/').next().unwrap_or(path);
        let inode = push(&mut table, parent, name, node);
        table.files.insert(key, inode.ino);
        inode
    }

    fn lookup(&self, find: impl FnOnce(&Table) -> Option<u64>) -> Option<Arc<Inode>> {
        let table = read(&self.table);
        find(&table).map(|ino| table.nodes[ino as usize - 1].clone())
    }
}

fn push(table: &mut Table, parent: u64, name: &str, node: Node) -> Arc<Inode> {
    let ino = table.nodes.len() as u64 + 1;
    let inode = Arc::new(Inode {
        ino,
        parent,
        name: name.to_owned(),
        node,
    });
    table.nodes.push(inode.clone());
    inode
}

fn dir_key(parent: u64, name: &str, node: &Node) -> DirKey {
    DirKey {
        parent,
        name: name.to_owned(),
        pin: match node {
            Node::LaneDir { lane, path } if path.is_empty() => Some(Pin::Lane(*lane)),
            Node::HubSnapshot { group, path } if path.is_empty() => Some(Pin::Group(group.key)),
            Node::Generated { bytes, .. } => Some(Pin::Bytes(Sha256::of(bytes))),
            _ => None,
        },
    }
}

/// The key that finds an inode again: a file's lane and path, anything else's [`DirKey`].
enum Key {
    Dir(DirKey),
    File((LaneRef, String)),
}

impl Key {
    fn of(inode: &Inode) -> Key {
        match &inode.node {
            Node::File { lane, path, .. } => Key::File((*lane, path.clone())),
            node => Key::Dir(dir_key(inode.parent, &inode.name, node)),
        }
    }

    fn insert(self, table: &mut Table, ino: u64) {
        match self {
            Key::Dir(key) => table.dirs.insert(key, ino),
            Key::File(key) => table.files.insert(key, ino),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ObjectRef;
    use crate::layout::Face;

    fn lane(seed: u8) -> LaneRef {
        LaneRef {
            commit: ObjectRef::of(&[seed]),
            face: Face::AsImported,
        }
    }

    #[test]
    fn restored_inodes_keep_their_numbers_and_are_found_again_by_their_keys() {
        let table = InodeTable::default();
        let org = table.dir(ROOT_INO, "acme", Node::Org { org: "acme".into() });
        let dir = table.dir(
            org.ino,
            "bf16",
            Node::LaneDir {
                lane: lane(1),
                path: String::new(),
            },
        );
        let file = table.file(
            dir.ino,
            &lane(1),
            "unet/w.safetensors",
            8,
            SystemTime::UNIX_EPOCH,
        );
        let given: Vec<Inode> = table
            .after(0)
            .iter()
            .map(|i| ciborium::from_reader(&to_cbor(i)[..]).unwrap())
            .collect();

        let again = InodeTable::default();
        again.restore(given.iter().map(copy)).unwrap();
        again.restore(given.iter().map(copy)).unwrap();
        assert_eq!(again.len(), 4, "restoring twice gives nothing out twice");
        let org2 = again.dir(ROOT_INO, "acme", Node::Org { org: "acme".into() });
        assert_eq!(org2.ino, org.ino);
        let file2 = again.file(
            dir.ino,
            &lane(1),
            "unet/w.safetensors",
            8,
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(file2.ino, file.ino);
        assert_eq!(file2.name, "w.safetensors");
        let other = again.dir(
            org.ino,
            "bf16",
            Node::LaneDir {
                lane: lane(2),
                path: String::new(),
            },
        );
        assert_eq!(
            other.ino, 5,
            "a folder moved to another commit is a new inode"
        );
    }

    #[test]
    fn a_restore_that_skips_or_contradicts_a_number_is_refused() {
        let org = |ino, name: &str| Inode {
            ino,
            parent: ROOT_INO,
            name: name.into(),
            node: Node::Org { org: name.into() },
        };
        let table = InodeTable::default();
        let err = table.restore([org(3, "a")]).unwrap_err();
        assert!(err.to_string().contains("before it are missing"), "{err}");
        table.restore([org(2, "a")]).unwrap();
        let err = table.restore([org(2, "b")]).unwrap_err();
        assert!(err.to_string().contains("another inode"), "{err}");
        let orphan = Inode {
            parent: 9,
            ..org(3, "c")
        };
        assert!(table.restore([orphan]).is_err());
    }

    fn to_cbor(inode: &Inode) -> Vec<u8> {
        let mut bytes = Vec::new();
        ciborium::into_writer(inode, &mut bytes).unwrap();
        bytes
    }

    fn copy(inode: &Inode) -> Inode {
        ciborium::from_reader(&to_cbor(inode)[..]).unwrap()
    }
}
