//! Hugging Face hub caches as sources (`tensorfs import --hf-cache`): which folders are model
//! snapshots, and whether each snapshot's files are the bytes the hub named.
//!
//! A cache (huggingface_hub's layout, `file_download.py` and `_tree_cache.py`):
//!
//! ```text
//! <cache>/models--ORG--NAME/refs/<ref>                 a bare 40-hex commit (refs/pr/1 nests)
//!                          /snapshots/<commit>/<path>  a symlink to ../../blobs/<etag>
//!                          /blobs/<etag>               the file (or a link to <cache>/blobs/…)
//!                          /trees/<commit>.json        the commit's file listing, when written
//! <cache>/datasets--…, spaces--…, .locks/, blobs/      not models
//! ```
//!
//! An etag is the file's SHA-256 for an LFS file and its git blob SHA-1 (of `blob <len>\0`
//! and the bytes) otherwise. [`check`] hashes every file of a snapshot and compares it with
//! the etag its link names and with the listing's entry. The listing names the whole repo,
//! but a download may ask for part of it (`allow_patterns`, one Diffusers variant): a snapshot
//! is partial only when a download it lacks did not finish (its `<etag>.incomplete` blob is
//! there) or a weights index names a shard it lacks. Nothing in the cache is written.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use sha1::Digest;

use super::Progress;
use crate::store::hub::{HubId, TreeEntry};

/// Where huggingface_hub keeps its cache, in its order: `$HF_HUB_CACHE`,
/// `$HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`,
/// `~/.cache/huggingface/hub` (`constants.py`). `None` without even `$HOME`.
pub fn default_dir() -> Option<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/hub")))
}

/// A model repo of a cache.
#[derive(Clone, Debug)]
pub struct CacheRepo {
    /// The hub id (`ORG/NAME`, or `NAME`).
    pub id: String,
    /// Its folder, `<cache>/models--ORG--NAME`.
    pub folder: PathBuf,
    /// Its snapshots, oldest first: ones no ref names, by mtime; then named ones; the one
    /// `refs/main` names last.
    pub snapshots: Vec<CacheSnapshot>,
}

/// One snapshot folder of a cached repo.
#[derive(Clone, Debug)]
pub struct CacheSnapshot {
    /// The hub id and the snapshot's commit.
    pub hub: HubId,
    /// `<repo folder>/snapshots/<commit>`.
    pub path: PathBuf,
    /// The refs naming this commit (`main`, `pr/1`).
    pub refs: Vec<String>,
}

/// What [`scan`] found in a cache.
#[derive(Debug, Default)]
pub struct CacheListing {
    /// Model repos by hub id.
    pub repos: Vec<CacheRepo>,
    /// Folders that are no model repo, or cannot be read as one, with why.
    pub left_out: Vec<(PathBuf, String)>,
}

/// Lists the model repos of cache `dir` and their snapshots.
///
/// # Errors
/// `dir` cannot be listed.
pub fn scan(dir: &Path) -> io::Result<CacheListing> {
    let mut listing = CacheListing::default();
    let mut names: Vec<_> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let Some(name) = name.to_str() else {
            listing
                .left_out
                .push((path, "the name is not UTF-8".into()));
            continue;
        };
        // huggingface_hub's own files and folders beside the repos.
        if matches!(name, ".locks" | "blobs" | "CACHEDIR.TAG" | "version.txt") {
            continue;
        }
        if !path.is_dir() {
            continue;
        }
        let Some(folded) = name.strip_prefix("models--") else {
            let kind = match name.split("--").next() {
                Some("datasets") => "a dataset repo",
                Some("spaces") => "a Space",
                _ => "not a hub repo folder",
            };
            listing
                .left_out
                .push((path, format!("{kind}, not a model")));
            continue;
        };
        let id = folded.replacen("--", "/", 1);
        match repo(&path, &id) {
            Ok(repo) => listing.repos.push(repo),
            Err(why) => listing.left_out.push((path, why)),
        }
    }
    Ok(listing)
}

fn repo(folder: &Path, id: &str) -> Result<CacheRepo, String> {
    let snapshots_dir = folder.join("snapshots");
    let mut refs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    read_refs(&folder.join("refs"), "", &mut refs);
    let mut snapshots = Vec::new();
    let entries = match fs::read_dir(&snapshots_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err("no snapshots folder (nothing downloaded)".into())
        }
        Err(e) => return Err(format!("cannot list {}: {e}", snapshots_dir.display())),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(hub) = HubId::of_snapshot(&path) else {
            tracing::warn!("{}: not a snapshot of a commit; left out", path.display());
            continue;
        };
        let mtime = entry
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or(std::time::UNIX_EPOCH);
        let named = refs.remove(hub.revision.as_deref().unwrap_or_default());
        snapshots.push((
            mtime,
            CacheSnapshot {
                refs: named.unwrap_or_default(),
                hub,
                path,
            },
        ));
    }
    if snapshots.is_empty() {
        return Err("no snapshots (nothing downloaded)".into());
    }
    snapshots.sort_by(|(ta, a), (tb, b)| {
        let key = |s: &CacheSnapshot| (s.refs.iter().any(|r| r == "main"), !s.refs.is_empty());
        key(a)
            .cmp(&key(b))
            .then(ta.cmp(tb))
            .then(a.hub.revision.cmp(&b.hub.revision))
    });
    Ok(CacheRepo {
        id: id.to_owned(),
        folder: folder.to_path_buf(),
        snapshots: snapshots.into_iter().map(|(_, s)| s).collect(),
    })
}

/// Reads `refs/` (nested for `refs/pr/1`) into commit → ref names.
fn read_refs(dir: &Path, prefix: &str, out: &mut BTreeMap<String, Vec<String>>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let path = entry.path();
        if path.is_dir() {
            read_refs(&path, &format!("{prefix}{name}/"), out);
        } else if let Ok(text) = fs::read_to_string(&path) {
            let commit = text.trim().to_ascii_lowercase();
            if commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()) {
                out.entry(commit)
                    .or_default()
                    .push(format!("{prefix}{name}"));
            }
        }
    }
}

/// A file of a snapshot, before its bytes are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFile {
    /// Bytes (of the file the links end at).
    pub size: u64,
    /// The etag the snapshot's link names (its target's file name), when it is one.
    pub linked_etag: Option<String>,
}

/// Why a snapshot is not imported: damaged, dangling or partial. Names the file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {why}", path.display())]
pub struct SnapshotError {
    /// The file (or the snapshot folder).
    pub path: PathBuf,
    /// What is wrong.
    pub why: String,
}

fn refuse(path: &Path, why: impl Into<String>) -> SnapshotError {
    SnapshotError {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

/// The files of snapshot folder `path` by path, following links, with the etag each link
/// names. Reads no file's bytes.
///
/// # Errors
/// A link that leads nowhere, or a folder or file that cannot be read.
pub fn list(path: &Path) -> Result<BTreeMap<String, SnapshotFile>, SnapshotError> {
    let mut files = BTreeMap::new();
    walk(path, "", &mut files, 0)?;
    Ok(files)
}

fn walk(
    dir: &Path,
    prefix: &str,
    out: &mut BTreeMap<String, SnapshotFile>,
    depth: usize,
) -> Result<(), SnapshotError> {
    if depth > 32 {
        return Err(refuse(
            dir,
            "folders nest deeper than 32 levels (a link loop?)",
        ));
    }
    let entries = fs::read_dir(dir).map_err(|e| refuse(dir, format!("cannot list: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| refuse(dir, format!("cannot list: {e}")))?;
        let path = entry.path();
        let Ok(name) = entry.file_name().into_string() else {
            return Err(refuse(&path, "the name is not UTF-8"));
        };
        let meta = match fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let target = fs::read_link(&path)
                    .map(|t| t.display().to_string())
                    .unwrap_or_default();
                return Err(refuse(&path, format!("a dangling link (to {target})")));
            }
            Err(e) => return Err(refuse(&path, format!("cannot read: {e}"))),
        };
        let rel = format!("{prefix}{name}");
        if meta.is_dir() {
            walk(&path, &format!("{rel}/"), out, depth + 1)?;
        } else if meta.is_file() {
            let linked_etag = fs::read_link(&path)
                .ok()
                .and_then(|t| t.file_name()?.to_str().map(str::to_owned))
                .filter(|e| is_hex(e, 40) || is_hex(e, 64));
            out.insert(
                rel,
                SnapshotFile {
                    size: meta.len(),
                    linked_etag,
                },
            );
        } else {
            return Err(refuse(&path, "neither a file nor a folder"));
        }
    }
    Ok(())
}

fn is_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The listing huggingface_hub wrote for `commit` of the repo in `folder`
/// (`trees/<commit>.json`, `format_version` 1); `None` when there is none or it is of
/// another version, as huggingface_hub reads it.
///
/// # Errors
/// The file exists but is not JSON of that shape.
pub fn tree_listing(
    folder: &Path,
    commit: &str,
) -> Result<Option<BTreeMap<String, TreeEntry>>, SnapshotError> {
    #[derive(serde::Deserialize)]
    struct Listing {
        format_version: u32,
        files: BTreeMap<String, TreeEntry>,
    }
    let path = folder.join("trees").join(format!("{commit}.json"));
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(refuse(&path, format!("cannot read: {e}"))),
    };
    let listing: Listing = serde_json::from_slice(&bytes)
        .map_err(|e| refuse(&path, format!("not a tree listing: {e}")))?;
    Ok((listing.format_version == 1).then_some(listing.files))
}

/// A snapshot whose every file was read and matched what the cache names.
#[derive(Clone, Debug)]
pub struct Checked {
    /// Every file, described as the hub lists it.
    pub files: BTreeMap<String, TreeEntry>,
    /// Bytes read.
    pub bytes: u64,
    /// Files nothing named an etag for (copied in, not linked, and no listing): their hashes
    /// were taken, not checked.
    pub unchecked: Vec<String>,
    /// What was noticed and let pass: files of the listing that were not downloaded, a listing
    /// that could not be read.
    pub notes: Vec<String>,
}

/// Reads every file of `snapshot` and checks it against the etag its link names and against
/// the repo's listing for the commit, and the snapshot against the listing: a file it names
/// must be there. `progress` hears of the bytes read.
///
/// # Errors
/// A dangling link, an unreadable file, a size or hash that differs from the etag or the
/// listing, or a file the listing names that is missing (partial snapshot).
pub fn check(
    snapshot: &CacheSnapshot,
    folder: &Path,
    files: &BTreeMap<String, SnapshotFile>,
    progress: &dyn Progress,
) -> Result<Checked, SnapshotError> {
    let commit = snapshot.hub.revision.as_deref().unwrap_or_default();
    let mut notes = Vec::new();
    // As huggingface_hub does, a listing it cannot read is ignored.
    let listing = tree_listing(folder, commit).unwrap_or_else(|e| {
        notes.push(format!("{e}; checked without it"));
        None
    });
    if let Some(listing) = &listing {
        let missing: Vec<&str> = listing
            .iter()
            .filter(|(p, _)| !files.contains_key(*p))
            .map(|(p, _)| p.as_str())
            .collect();
        partial(snapshot, folder, listing, files, &missing)?;
        if !missing.is_empty() {
            // Downloads name what they want (allow_patterns; Diffusers asks for one variant):
            // the listing names the whole repo.
            notes.push(format!(
                "{} of the {} files its tree listing names were not downloaded ({}); the \
                 snapshot is imported as it is",
                missing.len(),
                listing.len(),
                shown(&missing)
            ));
        }
    }
    progress.start(files.values().map(|f| f.size).sum());
    let entries: Vec<(String, TreeEntry, bool)> = files
        .par_iter()
        .map(|(rel, file)| {
            let path = snapshot.path.join(rel);
            let listed = listing.as_ref().and_then(|l| l.get(rel));
            let expected = listed
                .map(|e| e.etag().to_owned())
                .or_else(|| file.linked_etag.clone());
            if let (Some(linked), Some(listed)) = (&file.linked_etag, listed) {
                if !linked.eq_ignore_ascii_case(listed.etag()) {
                    return Err(refuse(
                        &path,
                        format!(
                            "links to blob {linked}, but the tree listing names {}",
                            listed.etag()
                        ),
                    ));
                }
            }
            if let Some(listed) = listed {
                if listed.size != file.size {
                    return Err(refuse(
                        &path,
                        format!(
                            "{} bytes, but the tree listing says {}",
                            file.size, listed.size
                        ),
                    ));
                }
            }
            let lfs = match &expected {
                Some(etag) => etag.len() == 64,
                None => is_lfs_by_default(rel, file.size),
            };
            let hash = hash_file(&path, file.size, lfs, progress)?;
            if let Some(etag) = &expected {
                if !hash.eq_ignore_ascii_case(etag) {
                    let what = if lfs { "SHA-256" } else { "git blob SHA-1" };
                    return Err(refuse(
                        &path,
                        format!("damaged: its {what} is {hash}, but its etag is {etag}"),
                    ));
                }
            }
            let entry = match listed {
                Some(listed) => listed.clone(),
                None if lfs => TreeEntry {
                    size: file.size,
                    blob_id: lfs_pointer_blob_id(&hash, file.size),
                    lfs_sha256: Some(hash),
                    lfs_size: Some(file.size),
                },
                None => TreeEntry {
                    size: file.size,
                    blob_id: hash,
                    lfs_sha256: None,
                    lfs_size: None,
                },
            };
            Ok((rel.clone(), entry, expected.is_none()))
        })
        .collect::<Result<_, _>>()?;
    let unchecked = entries
        .iter()
        .filter(|(_, _, unchecked)| *unchecked)
        .map(|(rel, _, _)| rel.clone())
        .collect();
    Ok(Checked {
        bytes: files.values().map(|f| f.size).sum(),
        files: entries.into_iter().map(|(rel, e, _)| (rel, e)).collect(),
        unchecked,
        notes,
    })
}

/// The first three of `paths`, and how many more.
fn shown(paths: &[&str]) -> String {
    let first = paths.iter().take(3).copied().collect::<Vec<_>>().join(", ");
    match paths.len() {
        n if n > 3 => format!("{first} and {} more", n - 3),
        _ => first,
    }
}

/// Refuses a snapshot whose download did not finish: a file of the listing is missing and its
/// blob lies in the repo's `blobs/` as `<etag>.incomplete` (huggingface_hub's name while it
/// downloads), or a weights index in the snapshot names a shard it lacks. A file missing for
/// neither reason was not asked for.
fn partial(
    snapshot: &CacheSnapshot,
    folder: &Path,
    listing: &BTreeMap<String, TreeEntry>,
    files: &BTreeMap<String, SnapshotFile>,
    missing: &[&str],
) -> Result<(), SnapshotError> {
    let unfinished: Vec<&str> = missing
        .iter()
        .copied()
        .filter(|p| {
            let etag = listing[*p].etag();
            folder
                .join("blobs")
                .join(format!("{etag}.incomplete"))
                .exists()
        })
        .collect();
    if !unfinished.is_empty() {
        return Err(refuse(
            &snapshot.path,
            format!(
                "partial: the download of {} of the {} files its tree listing names did not \
                 finish ({})",
                unfinished.len(),
                listing.len(),
                shown(&unfinished)
            ),
        ));
    }
    for index in files.keys().filter(|p| p.contains(".safetensors.index")) {
        let path = snapshot.path.join(index);
        let Ok(text) = fs::read(&path) else { continue };
        let Ok(parsed) = serde_json::from_slice::<serde_json::Value>(&text) else {
            continue;
        };
        let dir = index.rsplit_once('/').map_or("", |(d, _)| d);
        let mut shards: Vec<String> = parsed["weight_map"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
            .filter_map(|v| v.as_str())
            .map(|f| match dir {
                "" => f.to_owned(),
                dir => format!("{dir}/{f}"),
            })
            .filter(|f| !files.contains_key(f))
            .collect();
        shards.sort();
        shards.dedup();
        if !shards.is_empty() {
            let names: Vec<&str> = shards.iter().map(String::as_str).collect();
            return Err(refuse(
                &path,
                format!(
                    "partial: it names {} shard(s) that the snapshot lacks ({})",
                    shards.len(),
                    shown(&names)
                ),
            ));
        }
    }
    Ok(())
}

/// Whether the hub would store a file as LFS when nothing says: its default
/// `.gitattributes` makes `*.safetensors` LFS, and it refuses plain files of 10 MiB or more.
fn is_lfs_by_default(path: &str, size: u64) -> bool {
    path.ends_with(".safetensors") || size >= 10 << 20
}

/// The git blob SHA-1 of the LFS pointer of a file with `sha256` and `size` (the git-lfs
/// spec v1 pointer: `version`, `oid`, `size` lines): the `blob_id` the hub lists for it.
pub fn lfs_pointer_blob_id(sha256: &str, size: u64) -> String {
    let pointer =
        format!("version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n");
    git_blob_sha1(pointer.as_bytes())
}

/// The git blob SHA-1 of `data`: SHA-1 of `blob <len>\0` and the bytes.
pub fn git_blob_sha1(data: &[u8]) -> String {
    let mut hasher = sha1::Sha1::new();
    hasher.update(format!("blob {}\0", data.len()).as_bytes());
    hasher.update(data);
    hex::encode(hasher.finalize())
}

/// The SHA-256 (`lfs`) or git blob SHA-1 of the file at `path`, which has `size` bytes.
fn hash_file(
    path: &Path,
    size: u64,
    lfs: bool,
    progress: &dyn Progress,
) -> Result<String, SnapshotError> {
    let mut file = File::open(path).map_err(|e| refuse(path, format!("cannot open: {e}")))?;
    let mut sha256 = sha2::Sha256::new();
    let mut sha1 = sha1::Sha1::new();
    if !lfs {
        sha1.update(format!("blob {size}\0").as_bytes());
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut read = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(refuse(path, format!("cannot read: {e}"))),
        };
        match lfs {
            true => sha256.update(&buf[..n]),
            false => sha1.update(&buf[..n]),
        }
        read += n as u64;
        progress.advance(n as u64);
    }
    if read != size {
        return Err(refuse(
            path,
            format!("changed while read: {read} bytes, {size} listed"),
        ));
    }
    Ok(match lfs {
        true => hex::encode(sha256.finalize()),
        false => hex::encode(sha1.finalize()),
    })
}

/// The local repo a hub repo is imported into when no record names one: `local/ORG--NAME`
/// (`local/NAME` for an id without an org). The hub allows no `--` in a segment, so no two
/// ids get one name.
pub fn local_name(id: &str) -> String {
    format!("local/{}", id.replace('/', "--"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_blob_ids_are_gits() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(
            git_blob_sha1(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(
            git_blob_sha1(b""),
            "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
        );
    }

    #[test]
    fn local_names_do_not_collide() {
        assert_eq!(local_name("a/bert"), "local/a--bert");
        assert_eq!(local_name("b/bert"), "local/b--bert");
        assert_eq!(local_name("gpt2"), "local/gpt2");
    }
}
