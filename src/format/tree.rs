//! `cozytensors.tree/1` (spec §3): a commit, one header and its repository files.

use std::collections::BTreeMap;

use super::{FormatResult, ObjectRef};

/// The `format` tag a writer writes.
pub const TREE_FORMAT: &str = "cozytensors.tree/1";

/// A validated tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    /// The lane label (`bf16`, `fp16`), if any.
    pub lane: Option<String>,
    /// Every file by path: exactly one ends in `.cozytensors` (the header), the rest are repo
    /// files. No path's first segment is `chunks`.
    pub files: BTreeMap<String, ObjectRef>,
}

impl Tree {
    /// Parses and validates a tree; unknown fields are ignored.
    ///
    /// # Errors
    /// Strict-JSON errors, another kind or major, a bad lane, a path that is not a path or
    /// starts with `chunks`, not exactly one `.cozytensors` file.
    pub fn from_json(bytes: &[u8]) -> FormatResult<Tree> {
        let _ = bytes;
        todo!("tree parse")
    }

    /// The canonical JSON bytes (spec §9), `lane` omitted when `None`.
    pub fn to_json(&self) -> Vec<u8> {
        todo!("tree write")
    }

    /// The header's path and object.
    pub fn header(&self) -> (&str, &ObjectRef) {
        self.files
            .iter()
            .find(|(path, _)| path.ends_with(".cozytensors"))
            .map(|(p, o)| (p.as_str(), o))
            .expect("a validated tree has one header")
    }

    /// The repo files: every file but the header.
    pub fn repo_files(&self) -> impl Iterator<Item = (&str, &ObjectRef)> {
        self.files
            .iter()
            .filter(|(path, _)| !path.ends_with(".cozytensors"))
            .map(|(p, o)| (p.as_str(), o))
    }
}
