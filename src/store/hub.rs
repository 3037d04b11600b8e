//! Hub identities: which Hugging Face repo (`ORG/NAME`) and revision (a 40-hex git commit) a
//! local repo's commits were imported from, so a hub cache view can show them under the names
//! code asks for (`from_pretrained("ORG/NAME")`).
//!
//! One record per local repo, `hub/<org>/<name>.json` (segments folded or hashed as refs' are),
//! written like a ref (temp file, rename, under the refs lock):
//!
//! ```json
//! {"format": "tensorfs.hub/1", "repo": "local/minilm", "hub_id": "sentence-transformers/all-MiniLM-L6-v2",
//!  "revisions": [{"revision": "c9745ed1d9f207416be6d2e6f8de32d1f16199bf",
//!                  "commits": [{"sha256": "…", "length": 1234}],
//!                  "refs": ["main"],
//!                  "files": {"config.json": {"size": 612, "blob_id": "<git sha1>"},
//!                            "model.safetensors": {"size": 90868376, "blob_id": "<git sha1>",
//!                                                  "lfs_sha256": "<sha256>", "lfs_size": 90868376}}}]}
//! ```
//!
//! `refs` (the hub cache's ref names that pointed at the revision) and `files` (the revision's
//! file listing, in the shape of huggingface_hub's `trees/<commit>.json` entries) are written by
//! `import --hf-cache` and absent otherwise. A ref names one revision: recording it for one
//! removes it from the others.
//!
//! Why a record of our own: the repo document is rewritten by the reference, whose parser drops
//! fields it does not know, and a hub id in a header's metadata would change header and commit
//! ids. Revisions are listed oldest first; an import of a revision already recorded adds its
//! commits to it and makes it the newest. A revision is `None` when the source named none.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;

use serde::{Deserialize, Serialize};

use super::objects::replace_file;
use super::{io_err, ref_key, Store, StoreError, StoreResult};
use crate::format::names::split_repo_name;
use crate::format::ObjectRef;

/// The record format's name.
pub const HUB_FORMAT: &str = "tensorfs.hub/1";

/// A Hugging Face repo id and, when known, the revision (40 lowercase hex digits).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubId {
    /// `ORG/NAME`, or `NAME` for the hub's few models without an org (`gpt2`).
    pub id: String,
    /// The git commit of the hub repo.
    pub revision: Option<String>,
}

impl HubId {
    /// Parses `ORG/NAME[@REV]` (the `--hf-id` argument). `REV` must be a 40-hex commit: a
    /// branch name would say nothing stable about the bytes.
    ///
    /// # Errors
    /// An id with empty or more than two segments, characters the hub refuses, or a revision
    /// that is not 40 hex digits.
    pub fn parse(text: &str) -> Result<HubId, HubIdError> {
        let (id, revision) = match text.split_once('@') {
            Some((id, rev)) => (id, Some(rev)),
            None => (text, None),
        };
        check_id(id)?;
        let revision = revision.map(check_revision).transpose()?;
        Ok(HubId {
            id: id.to_owned(),
            revision,
        })
    }

    /// The id and revision of a hub cache snapshot folder,
    /// `…/models--ORG--NAME/snapshots/<40-hex commit>`, as huggingface_hub lays it out; `None`
    /// for any other path.
    pub fn of_snapshot(path: &std::path::Path) -> Option<HubId> {
        let revision = path.file_name()?.to_str()?;
        let snapshots = path.parent()?;
        if snapshots.file_name()? != "snapshots" {
            return None;
        }
        let folder = snapshots.parent()?.file_name()?.to_str()?;
        let id = folder.strip_prefix("models--")?.replacen("--", "/", 1);
        check_id(&id).ok()?;
        let revision = check_revision(revision).ok()?;
        Some(HubId {
            id,
            revision: Some(revision),
        })
    }
}

impl std::fmt::Display for HubId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.revision {
            Some(rev) => write!(f, "{}@{rev}", self.id),
            None => f.write_str(&self.id),
        }
    }
}

/// Why a hub id is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("hub id {text:?}: {why}")]
pub struct HubIdError {
    /// What was given.
    pub text: String,
    /// What is wrong.
    pub why: String,
}

/// Checks a repo id as the hub names repos: one or two segments of ASCII letters, digits,
/// `-`, `_` and `.`, no `--` or `..`, not starting or ending with `-` or `.`, at most 96
/// characters (huggingface_hub's `validate_repo_id`).
fn check_id(id: &str) -> Result<(), HubIdError> {
    let refuse = |why: &str| HubIdError {
        text: id.to_owned(),
        why: why.to_owned(),
    };
    let segments: Vec<&str> = id.split('/').collect();
    if segments.len() > 2 {
        return Err(refuse("more than ORG/NAME"));
    }
    if id.len() > 96 {
        return Err(refuse("longer than 96 characters"));
    }
    for s in segments {
        if s.is_empty() {
            return Err(refuse("an empty segment"));
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(refuse("only letters, digits, '-', '_' and '.' are allowed"));
        }
        if s.contains("--") || s.contains("..") {
            return Err(refuse("'--' and '..' are not allowed"));
        }
        if s.starts_with(['-', '.']) || s.ends_with(['-', '.']) {
            return Err(refuse("a segment starts or ends with '-' or '.'"));
        }
    }
    Ok(())
}

fn check_revision(rev: &str) -> Result<String, HubIdError> {
    match rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit()) {
        true => Ok(rev.to_ascii_lowercase()),
        false => Err(HubIdError {
            text: rev.to_owned(),
            why: "a revision is a 40-hex commit".into(),
        }),
    }
}

/// A local repo's hub identity (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HubRecord {
    /// Always [`HUB_FORMAT`].
    pub format: String,
    /// The local repo (`local/NAME`).
    pub repo: String,
    /// The hub repo id.
    pub hub_id: String,
    /// Revisions imported, oldest first.
    pub revisions: Vec<HubRevision>,
}

/// One hub revision and the local commits (one per lane) imported from it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HubRevision {
    /// The 40-hex git commit, or `None` when the source named none.
    pub revision: Option<String>,
    /// The commits (`{"sha256": "<hex>", "length": N}`), in import order.
    #[serde(with = "commit_ids")]
    pub commits: Vec<ObjectRef>,
    /// The hub cache refs (`main`, `v1.0`, `refs/pr/1` as `pr/1`) that named this revision
    /// when it was imported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<String>,
    /// The revision's files by path, as the hub lists them; `None` when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<BTreeMap<String, TreeEntry>>,
}

impl HubRevision {
    /// A revision with `commits` and nothing else known.
    pub fn new(revision: Option<String>, commits: Vec<ObjectRef>) -> HubRevision {
        HubRevision {
            revision,
            commits,
            refs: Vec::new(),
            files: None,
        }
    }
}

/// One file of a hub revision, as huggingface_hub's tree cache (`trees/<commit>.json`,
/// `format_version` 1) and the hub's `/tree` route describe it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeEntry {
    /// Bytes.
    pub size: u64,
    /// The git blob SHA-1 (40 hex) of the file, or of its LFS pointer for an LFS file.
    pub blob_id: String,
    /// An LFS file's SHA-256 (64 hex), its etag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lfs_sha256: Option<String>,
    /// An LFS file's size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lfs_size: Option<u64>,
}

impl TreeEntry {
    /// The etag huggingface_hub names the file's blob by: the SHA-256 for an LFS file, the
    /// git blob SHA-1 otherwise.
    pub fn etag(&self) -> &str {
        self.lfs_sha256.as_deref().unwrap_or(&self.blob_id)
    }
}

mod commit_ids {
    use crate::format::{ObjectRef, Sha256};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// An object reference as the record writes it: `{"sha256": "<hex>", "length": N}`.
    #[derive(Serialize, Deserialize)]
    struct Wire {
        sha256: String,
        length: u64,
    }

    pub fn serialize<S: Serializer>(commits: &[ObjectRef], s: S) -> Result<S::Ok, S::Error> {
        commits
            .iter()
            .map(|c| Wire {
                sha256: c.sha256.hex(),
                length: c.length,
            })
            .collect::<Vec<_>>()
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ObjectRef>, D::Error> {
        Vec::<Wire>::deserialize(d)?
            .into_iter()
            .map(|w| {
                Ok(ObjectRef {
                    sha256: w
                        .sha256
                        .parse::<Sha256>()
                        .map_err(serde::de::Error::custom)?,
                    length: w.length,
                })
            })
            .collect()
    }
}

impl Store {
    /// Where the hub record of local repo `name` lives: `hub/<org>/<name>.json`.
    fn hub_path(&self, name: &str) -> StoreResult<std::path::PathBuf> {
        let key = ref_key(name)?;
        let rest = key
            .strip_prefix("refs/")
            .expect("ref keys start with refs/");
        Ok(self.root.join("hub").join(rest))
    }

    /// The hub record of local repo `name`, if one was written.
    ///
    /// # Errors
    /// The record exists but cannot be read or is malformed.
    pub fn hub_record(&self, name: &str) -> StoreResult<Option<HubRecord>> {
        let path = self.hub_path(name)?;
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("read", &path)(e)),
        };
        let record: HubRecord = serde_json::from_slice(&bytes)
            .map_err(|e| StoreError::Ref(format!("{}: {e}", path.display())))?;
        if record.format != HUB_FORMAT {
            return Err(StoreError::Ref(format!(
                "{}: a {} record; this build reads {HUB_FORMAT}",
                path.display(),
                record.format
            )));
        }
        Ok(Some(record))
    }

    /// Records that `imported.commits` of local repo `name` were imported from revision
    /// `imported.revision` of hub repo `hub_id`, under the refs lock. A record naming another
    /// hub id is replaced: the local repo now stands for `hub_id`. A revision recorded before
    /// keeps its commits (the new ones are added) and becomes the newest, unless no commits
    /// are given: then only its refs and listing change. `refs` replace the revision's and are
    /// taken from every other revision; `files` replace its listing when given.
    ///
    /// # Errors
    /// `name` is not `org/name`; the record cannot be read or written.
    pub fn record_hub(&self, name: &str, hub_id: &str, imported: HubRevision) -> StoreResult<()> {
        split_repo_name(name).map_err(|e| StoreError::Ref(e.to_string()))?;
        let path = self.hub_path(name)?;
        let refs = self.root.join("refs");
        let lock = File::open(&refs).map_err(io_err("open", &refs))?;
        lock.lock().map_err(io_err("lock", &refs))?;
        let mut record = match self.hub_record(name)? {
            Some(r) if r.hub_id == hub_id => r,
            _ => HubRecord {
                format: HUB_FORMAT.to_owned(),
                repo: name.to_owned(),
                hub_id: hub_id.to_owned(),
                revisions: Vec::new(),
            },
        };
        for other in &mut record.revisions {
            if other.revision != imported.revision {
                other.refs.retain(|r| !imported.refs.contains(r));
            }
        }
        let found = record
            .revisions
            .iter()
            .position(|r| r.revision == imported.revision);
        match found {
            // Nothing imported: the revision's refs and listing change where it is.
            Some(i) if imported.commits.is_empty() => {
                let revision = &mut record.revisions[i];
                revision.refs = imported.refs;
                if imported.files.is_some() {
                    revision.files = imported.files;
                }
            }
            found => {
                let mut revision = match found {
                    Some(i) => record.revisions.remove(i),
                    None => HubRevision::new(imported.revision.clone(), Vec::new()),
                };
                revision.commits.retain(|c| !imported.commits.contains(c));
                revision.commits.extend(imported.commits);
                revision.refs = imported.refs;
                if imported.files.is_some() {
                    revision.files = imported.files;
                }
                record.revisions.push(revision);
            }
        }
        let parent = path.parent().expect("record paths have parents");
        fs::create_dir_all(parent).map_err(io_err("create", parent))?;
        let json = serde_json::to_vec(&record).expect("a record serializes");
        replace_file(&self.root.join("tmp"), &path, &json, 0o644)
    }

    /// Drops `commits` from local repo `name`'s hub record (revisions left without commits go
    /// with them), or the whole record when `commits` is `None` or none are left. The caller
    /// holds the refs lock ([`Store::edit_repo`]).
    ///
    /// # Errors
    /// The record cannot be read, written or removed.
    pub(crate) fn forget_hub(&self, name: &str, commits: Option<&[ObjectRef]>) -> StoreResult<()> {
        let path = self.hub_path(name)?;
        let Some(mut record) = self.hub_record(name)? else {
            return Ok(());
        };
        if let Some(commits) = commits {
            for revision in &mut record.revisions {
                revision.commits.retain(|c| !commits.contains(c));
            }
            record.revisions.retain(|r| !r.commits.is_empty());
        }
        if commits.is_none() || record.revisions.is_empty() {
            return match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("remove", &path)(e)),
                _ => Ok(()),
            };
        }
        let json = serde_json::to_vec(&record).expect("a record serializes");
        replace_file(&self.root.join("tmp"), &path, &json, 0o644)
    }

    /// Every hub record in the store, by local repo name. Unreadable records are skipped with
    /// a warning (one bad file must not hide the others).
    ///
    /// # Errors
    /// `hub/` cannot be listed.
    pub fn hub_records(&self) -> StoreResult<Vec<HubRecord>> {
        let root = self.root.join("hub");
        let mut out = Vec::new();
        let orgs = match fs::read_dir(&root) {
            Ok(orgs) => orgs,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_err("list", &root)(e)),
        };
        for org in orgs {
            let org = org.map_err(io_err("list", &root))?.path();
            for entry in fs::read_dir(&org).map_err(io_err("list", &org))? {
                let path = entry.map_err(io_err("list", &org))?.path();
                let parsed = fs::read(&path).map_err(|e| e.to_string()).and_then(|b| {
                    serde_json::from_slice::<HubRecord>(&b).map_err(|e| e.to_string())
                });
                match parsed {
                    Ok(r) if r.format == HUB_FORMAT => out.push(r),
                    Ok(r) => tracing::warn!("skipping {}: a {} record", path.display(), r.format),
                    Err(e) => tracing::warn!("skipping {}: {e}", path.display()),
                }
            }
        }
        out.sort_by(|a, b| a.repo.cmp(&b.repo));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REV: &str = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf";

    #[test]
    fn hub_ids_parse_as_the_hub_names_repos() {
        let id = HubId::parse(&format!("sentence-transformers/all-MiniLM-L6-v2@{REV}")).unwrap();
        assert_eq!(id.id, "sentence-transformers/all-MiniLM-L6-v2");
        assert_eq!(id.revision.as_deref(), Some(REV));
        assert_eq!(HubId::parse("gpt2").unwrap().revision, None);
        for bad in [
            "a/b/c", "a//b", "a--b/c", "a/b..c", "-a/b", "a/b.", "a b/c", "a/b@main", "/b",
        ] {
            assert!(HubId::parse(bad).is_err(), "{bad}");
        }
        let upper = HubId::parse(&format!("a/b@{}", REV.to_uppercase())).unwrap();
        assert_eq!(
            upper.revision.as_deref(),
            Some(REV),
            "revisions fold to lowercase"
        );
    }

    #[test]
    fn snapshot_folders_name_their_hub_repo_and_revision() {
        let path =
            format!("/c/hub/models--sentence-transformers--all-MiniLM-L6-v2/snapshots/{REV}");
        let id = HubId::of_snapshot(std::path::Path::new(&path)).unwrap();
        assert_eq!(
            id.to_string(),
            format!("sentence-transformers/all-MiniLM-L6-v2@{REV}")
        );
        let bare = format!("/c/models--gpt2/snapshots/{REV}");
        assert_eq!(
            HubId::of_snapshot(std::path::Path::new(&bare)).unwrap().id,
            "gpt2"
        );
        for other in [
            format!("/c/datasets--a--b/snapshots/{REV}"),
            format!("/c/models--a--b/blobs/{REV}"),
            "/c/models--a--b/snapshots/main".to_owned(),
            "/home/me/all-MiniLM-L6-v2".to_owned(),
        ] {
            assert_eq!(
                HubId::of_snapshot(std::path::Path::new(&other)),
                None,
                "{other}"
            );
        }
    }

    #[test]
    fn records_keep_revisions_newest_last_and_survive_a_rewritten_repo_document() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s")).unwrap();
        let c1 = store.put_bytes(b"one").unwrap();
        let c2 = store.put_bytes(b"two").unwrap();
        let hub = HubId::parse(&format!("acme/bert@{REV}")).unwrap();
        assert_eq!(store.hub_record("local/bert").unwrap(), None);
        let rev = |r: &str, commits: &[ObjectRef]| HubRevision::new(Some(r.into()), commits.into());
        store
            .record_hub("local/bert", &hub.id, rev(REV, &[c1]))
            .unwrap();
        let older = HubRevision {
            refs: vec!["main".into()],
            ..rev(&"0".repeat(40), &[c2])
        };
        store.record_hub("local/bert", &hub.id, older).unwrap();
        let newer = HubRevision {
            refs: vec!["main".into()],
            ..rev(REV, &[c1])
        };
        store.record_hub("local/bert", &hub.id, newer).unwrap();
        let record = store.hub_record("local/bert").unwrap().unwrap();
        assert_eq!(record.hub_id, "acme/bert");
        let revs: Vec<_> = record
            .revisions
            .iter()
            .map(|r| r.revision.clone())
            .collect();
        assert_eq!(revs, [Some("0".repeat(40)), Some(REV.to_owned())]);
        assert_eq!(record.revisions[1].commits, [c1]);
        // A ref names one revision: the newest that recorded it.
        assert!(record.revisions[0].refs.is_empty());
        assert_eq!(record.revisions[1].refs, ["main"]);
        // The repo document is another file: rewriting it leaves the record.
        store
            .update_repo("local/bert", |_| crate::format::Repo {
                name: "local/bert".into(),
                releases: vec![],
                commits: vec![c1],
            })
            .unwrap();
        assert_eq!(store.hub_record("local/bert").unwrap().unwrap(), record);
        assert_eq!(store.hub_records().unwrap(), [record]);
        // Another hub id replaces the record.
        store
            .record_hub("local/bert", "other/bert", HubRevision::new(None, vec![c2]))
            .unwrap();
        let record = store.hub_record("local/bert").unwrap().unwrap();
        assert_eq!(
            (record.hub_id.as_str(), record.revisions.len()),
            ("other/bert", 1)
        );
    }
}
