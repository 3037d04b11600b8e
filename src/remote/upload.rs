//! Uploading a repo's commits from the local store to an endpoint (distribution.md §3, §4, §8).
//!
//! 1. **Commits.** The newest commit of each lane of the source repo (its `latest` revision),
//!    or of the one lane asked for.
//! 2. **What the endpoint holds.** A `HEAD` of each commit's tree: a tree present implies its
//!    closure was sent (§3), so that commit needs nothing. Then a `HEAD` of each remaining
//!    commit's header, whose presence vouches for its chunks and assets.
//! 3. **Objects, in the spec's order**: chunks, assets and repo files, then headers, then
//!    trees, so that an object never names one the endpoint lacks. Each gets a `HEAD` (present:
//!    skipped), then a `PUT` of its bytes and the confirming `HEAD` ([`Origin::put`]);
//!    [`UploadConfig::jobs`] at a time, largest first. Bytes are sent from the mapped blob after
//!    the verified ledger proves it unchanged since it was hashed, or after hashing it, so a
//!    damaged blob is never sent.
//! 4. **Commits recorded**, in the source repo's order: the server's commits route, or a static
//!    origin's repo document, among the commits no release names.
//!
//! Nothing is recorded before every object of its closure is there, so an interrupted upload
//! leaves only unnamed objects; a rerun asks again and sends only what is missing.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;

use super::download::Progress;
use super::is_local;
use super::origin::{FetchError, Head, Origin, Put, Recorded};
use crate::format::names::split_repo_name;
use crate::format::ObjectRef;
use crate::revisions::{self, Revision};
use crate::store::verified::Ledger;
use crate::store::{Commit, Store, StoreError, StoreResult};

/// Settings of an upload.
#[derive(Clone, Debug)]
pub struct UploadConfig {
    /// Objects sent at once (default 8).
    pub jobs: usize,
}

impl Default for UploadConfig {
    fn default() -> Self {
        UploadConfig { jobs: 8 }
    }
}

/// One commit an upload recorded.
#[derive(Clone, Debug, serde::Serialize)]
pub struct UploadedCommit {
    /// Its lane label.
    pub lane: String,
    /// Its id, `sha256:<hex>`.
    pub commit: String,
    /// Whether the endpoint's repo named it only now (else it named it already).
    pub new: bool,
}

/// What an upload did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct UploadReport {
    /// The source repo in the store.
    pub from: String,
    /// The repo at the endpoint.
    pub name: String,
    /// The commits, in the order they were recorded.
    pub commits: Vec<UploadedCommit>,
    /// Objects in the commits' closures.
    pub objects: usize,
    /// Objects sent (the others were at the endpoint).
    pub sent: usize,
    /// Bytes sent.
    pub sent_bytes: u64,
}

/// Why an upload failed.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// The endpoint refused, failed or answered wrongly.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The local store failed, or holds a damaged blob.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// What was asked for is not in the store, or cannot be uploaded.
    #[error("{0}")]
    Refused(String),
}

/// Result of an upload.
pub type UploadResult<T> = Result<T, UploadError>;

/// A commit to upload: its lane folder's name and its documents.
struct Chosen {
    lane: String,
    commit: Commit,
}

/// Uploads the newest commit of each lane (or of `lane`) of repo `from` in `store` to
/// `origin` as commits of repo `name`. Runs on a multi-threaded tokio runtime (store reads
/// block in place).
///
/// # Errors
/// See [`UploadError`]; what was stored at the endpoint before a failure stays there, unnamed.
pub async fn upload(
    store: &Store,
    origin: Arc<dyn Origin>,
    from: &str,
    name: &str,
    lane: Option<&str>,
    config: &UploadConfig,
    progress: Arc<dyn Progress>,
) -> UploadResult<UploadReport> {
    split_repo_name(name).map_err(|e| UploadError::Refused(e.to_string()))?;
    if is_local(name) {
        return Err(UploadError::Refused(format!(
            "{name}: the org `local` is a machine's own; endpoints never serve it"
        )));
    }
    let chosen = tokio::task::block_in_place(|| choose(store, from, lane))?;

    // What the endpoint holds: a whole commit, or a header and what it cites.
    let mut trees = BTreeMap::new();
    let mut headers = BTreeMap::new();
    let mut leaves = BTreeSet::new();
    let mut closure = BTreeSet::new();
    for Chosen { commit, .. } in &chosen {
        let leaves_of_header: Vec<ObjectRef> = commit.header.objects().copied().collect();
        let repo_files: Vec<ObjectRef> = commit.tree.repo_files().map(|(_, o)| *o).collect();
        closure.extend([commit.id, commit.header_ref]);
        closure.extend(leaves_of_header.iter().chain(&repo_files));
        let tree_head = origin.head(&commit.id.sha256).await?;
        if holds(&tree_head, &commit.id)? {
            continue;
        }
        trees.insert(commit.id, tree_head);
        leaves.extend(repo_files);
        if headers.contains_key(&commit.header_ref) {
            continue;
        }
        let header_head = origin.head(&commit.header_ref.sha256).await?;
        if !holds(&header_head, &commit.header_ref)? {
            leaves.extend(leaves_of_header);
            headers.insert(commit.header_ref, header_head);
        }
    }
    let total: u64 = (trees.keys().chain(headers.keys()).chain(&leaves))
        .map(|o| o.length)
        .sum();
    progress.start(total);

    let ledger = Arc::new(Ledger::load(store));
    let sender = Sender {
        store: store.clone(),
        origin: origin.clone(),
        ledger,
        progress,
        jobs: config.jobs.max(1),
    };
    let mut tally = Tally::default();
    let leaves = leaves.into_iter().map(|o| (o, None)).collect();
    for batch in [leaves, some(headers), some(trees)] {
        tally.add(sender.send_all(batch).await?);
    }

    let mut commits = Vec::new();
    for Chosen { lane, commit } in &chosen {
        let recorded = origin.record(name, &commit.id).await?;
        commits.push(UploadedCommit {
            lane: lane.clone(),
            commit: commit.id.id(),
            new: recorded == Recorded::New,
        });
    }
    Ok(UploadReport {
        from: from.to_owned(),
        name: name.to_owned(),
        commits,
        objects: closure.len(),
        sent: tally.sent,
        sent_bytes: tally.sent_bytes,
    })
}

/// The commits to upload, in the order the source repo names them (see the module doc).
fn choose(store: &Store, from: &str, lane: Option<&str>) -> UploadResult<Vec<Chosen>> {
    let repo = store.repo(from)?.ok_or_else(|| {
        UploadError::Refused(format!(
            "no repo {from} in the store at {}",
            store.root().display()
        ))
    })?;
    let lanes = revisions::lanes(&repo, Revision::Latest, |c| {
        store.tree(c).map(|tree| tree.lane)
    })?;
    let names: Vec<&str> = lanes.iter().map(|(lane, _)| lane.as_str()).collect();
    let picked: Vec<(String, ObjectRef)> = match lane {
        None => lanes.clone(),
        Some(lane) => lanes.iter().filter(|(l, _)| l == lane).cloned().collect(),
    };
    if picked.is_empty() {
        return Err(UploadError::Refused(match lane {
            Some(lane) => format!(
                "{from} has no lane {lane:?} in its newest revision (it has: {})",
                names.join(", ")
            ),
            None => format!("{from} names no commit"),
        }));
    }
    let order: Vec<ObjectRef> = repo.roots().copied().collect();
    let mut chosen = picked
        .into_iter()
        .map(|(lane, id)| {
            Ok(Chosen {
                lane,
                commit: store.commit(&id)?,
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    chosen.sort_by_key(|c| order.iter().position(|o| *o == c.commit.id));
    Ok(chosen)
}

/// Whether a `HEAD` found `object` whole; an object of another length under its digest is a
/// damaged endpoint.
fn holds(head: &Head, object: &ObjectRef) -> UploadResult<bool> {
    match head {
        Head::Present { length } if *length == object.length => Ok(true),
        Head::Present { length } => Err(UploadError::Fetch(FetchError::Protocol {
            what: format!("HEAD {}", object.id()),
            why: format!("the endpoint holds {length} bytes under its digest"),
        })),
        Head::Absent { .. } => Ok(false),
    }
}

/// Objects whose `HEAD` answered already.
fn some(known: BTreeMap<ObjectRef, Head>) -> Vec<(ObjectRef, Option<Head>)> {
    known.into_iter().map(|(o, h)| (o, Some(h))).collect()
}

/// Objects sent by an upload.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    sent: usize,
    sent_bytes: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.sent += other.sent;
        self.sent_bytes += other.sent_bytes;
    }
}

/// What sending one object needs, shared by its tasks.
#[derive(Clone)]
struct Sender {
    store: Store,
    origin: Arc<dyn Origin>,
    ledger: Arc<Ledger>,
    progress: Arc<dyn Progress>,
    jobs: usize,
}

impl Sender {
    /// Sends `objects` (with their `HEAD`, when asked already), `jobs` at a time, largest first;
    /// the first failure stops the rest.
    async fn send_all(&self, mut objects: Vec<(ObjectRef, Option<Head>)>) -> UploadResult<Tally> {
        objects.sort_by(|(a, _), (b, _)| b.length.cmp(&a.length).then(a.cmp(b)));
        let permits = Arc::new(tokio::sync::Semaphore::new(self.jobs));
        let mut tasks = tokio::task::JoinSet::new();
        for (object, head) in objects {
            let (sender, permits) = (self.clone(), permits.clone());
            tasks.spawn(async move {
                let _permit = permits.acquire_owned().await.expect("never closed");
                let put = sender.send_one(&object, head).await?;
                sender.progress.advance(object.length);
                Ok::<_, UploadError>((object, put))
            });
        }
        let mut tally = Tally::default();
        while let Some(done) = tasks.join_next().await {
            let result = done.unwrap_or_else(|e| {
                Err(UploadError::Refused(format!("an upload task failed: {e}")))
            });
            match result {
                Ok((object, Some(Put::Stored))) => {
                    tally.sent += 1;
                    tally.sent_bytes += object.length;
                }
                Ok(_) => {}
                Err(e) => {
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    return Err(e);
                }
            }
        }
        Ok(tally)
    }

    /// Sends `object` unless the endpoint holds it; `None` when it did.
    async fn send_one(&self, object: &ObjectRef, head: Option<Head>) -> UploadResult<Option<Put>> {
        let head = match head {
            Some(head) => head,
            None => self.origin.head(&object.sha256).await?,
        };
        if holds(&head, object)? {
            return Ok(None);
        }
        let Head::Absent { put_to } = head else {
            unreachable!("a present object is held")
        };
        let bytes = tokio::task::block_in_place(|| blob_bytes(&self.store, &self.ledger, object))?;
        Ok(Some(self.origin.put(object, bytes, put_to).await?))
    }
}

/// A blob's bytes, mapped, with its file (and its shared lock) open while they are in use.
struct MappedBlob {
    map: memmap2::Mmap,
    _file: File,
}

impl AsRef<[u8]> for MappedBlob {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

/// The bytes of `object`'s blob, proven by the ledger or hashed now.
///
/// # Errors
/// Absent, of another length, damaged ([`StoreError::Mismatch`]), or unreadable.
fn blob_bytes(store: &Store, ledger: &Ledger, object: &ObjectRef) -> StoreResult<Bytes> {
    let file = store.open_object(object)?;
    if object.length == 0 {
        return Ok(Bytes::new());
    }
    let path = store.object_path(object);
    let meta = file
        .metadata()
        .map_err(crate::store::io_err("stat", &path))?;
    // SAFETY: admitted blobs are read-only files that are never written in place; the shared
    // `flock` taken by `open_object` and held by the mapping's owner keeps the reference's
    // collector from removing it. A blob truncated behind the store's back would fault the
    // upload, not corrupt what is sent: the bytes are hashed (or the inode proven unchanged)
    // before any is sent.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(crate::store::io_err("map", &path))?;
    if !ledger.proves(object, &meta) {
        let found = ObjectRef::of(&map);
        if found != *object {
            return Err(StoreError::Mismatch {
                expected: *object,
                found: format!("sha256 {} ({} bytes)", found.sha256, found.length),
                path,
            });
        }
        if let Err(e) = ledger.note(object, &meta) {
            tracing::debug!("could not note verified blob {}: {e}", path.display());
        }
    }
    Ok(Bytes::from_owner(MappedBlob { map, _file: file }))
}
