//! `cozytensors.repo/1` (spec §7): a model's releases and other commits.

use std::collections::BTreeMap;

use super::{FormatResult, ObjectRef};

/// The `format` tag a writer writes.
pub const REPO_FORMAT: &str = "cozytensors.repo/1";

/// A validated repo document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repo {
    /// `<org>/<name>` in the writer's spelling.
    pub name: String,
    /// Releases, oldest first.
    pub releases: Vec<Release>,
    /// Commits no release names, newest last.
    pub commits: Vec<ObjectRef>,
}

/// A release: one commit per lane under a version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// The version label (a PEP 440 version).
    pub version: String,
    /// The commit of each lane.
    pub lanes: BTreeMap<String, ObjectRef>,
}

impl Repo {
    /// Parses and validates a repo document; unknown fields are ignored.
    ///
    /// # Errors
    /// Strict-JSON errors, another kind or major, a name that is not `org/name`, a label that is
    /// not a label.
    pub fn from_json(bytes: &[u8]) -> FormatResult<Repo> {
        let _ = bytes;
        todo!("repo parse")
    }

    /// The canonical JSON bytes; empty `releases` and `commits` omitted.
    pub fn to_json(&self) -> Vec<u8> {
        todo!("repo write")
    }

    /// Every commit the repo names: each release's lanes, then the other commits.
    pub fn roots(&self) -> impl Iterator<Item = &ObjectRef> {
        self.releases
            .iter()
            .flat_map(|r| r.lanes.values())
            .chain(self.commits.iter())
    }
}
