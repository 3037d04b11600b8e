//! Downloading one commit of a model into the local store (distribution.md §2).
//!
//! 1. Resolve: a commit by id, else the resolve route, else (a static origin, whose resolve
//!    route answers a bare status) its `refs/<org>/<name>.json`, resolved here (§8): the
//!    release asked for (none: the newest), its lane asked for or its only lane; a model
//!    without releases gives its newest commit.
//! 2. The tree, then its header: documents read into memory and verified.
//! 3. The objects the store lacks (chunks, assets, repo files), [`DownloadConfig::jobs`] at a
//!    time, each streamed into the store's writer and admitted only when its length and
//!    SHA-256 are right ([`super::admit`]; a wrong copy is asked for again until the client's
//!    deadline). Objects present already are not fetched, so a second run after a
//!    failure fetches only what is missing.
//! 4. The header and the tree are admitted, then the repo document names the commit (as the
//!    release's lane, or among `commits`). Until then nothing names the new objects, so a
//!    failed download leaves the store as usable as before. The collector's fence is held
//!    throughout, so the reference's GC does not sweep objects not yet named.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::admit::{admit, AdmitError};
use super::origin::FetchError;
use super::origin::Origin;
use super::{is_local, Resolved, WireRef};
use crate::format::{FormatError, Header, ObjectRef, Repo, Sha256, Tree};
use crate::store::retention::{patiently, Collect, Collected, Hold, GRACE};
use crate::store::{Store, StoreError};

/// Which revision of the model to download.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Revision {
    /// The newest release (or, without releases, the newest commit).
    Newest,
    /// A release by version.
    Release(String),
    /// A commit by id.
    Commit(Sha256),
}

/// Settings of a download.
#[derive(Clone, Debug)]
pub struct DownloadConfig {
    /// Objects fetched at once (default 8).
    pub jobs: usize,
    /// The most bytes the store's cache (what no `local/` repo keeps) may hold once the
    /// commit is in: a collection drops the least recently used uses (whole models) first
    /// ([`Collect::cache_budget`]), and a commit that still does not fit is refused before
    /// anything is fetched; `None` (the default): what the disk holds above its reserve.
    pub cache_size: Option<u64>,
}

impl Default for DownloadConfig {
    fn default() -> Self {
        DownloadConfig {
            jobs: 8,
            cache_size: None,
        }
    }
}

/// Hears how many bytes are on their way.
pub trait Progress: Send + Sync {
    /// The bytes the download will fetch.
    fn start(&self, total_bytes: u64);
    /// `bytes` more arrived.
    fn advance(&self, bytes: u64);
}

/// A progress that hears nothing.
impl Progress for () {
    fn start(&self, _: u64) {}
    fn advance(&self, _: u64) {}
}

/// What a download did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DownloadReport {
    /// The repo, in the spelling asked for.
    pub name: String,
    /// The release (empty: a commit no release names).
    pub release: String,
    /// The commit's lane.
    pub lane: String,
    /// The commit's id, `sha256:<hex>`.
    pub commit: String,
    /// Objects in the commit's closure.
    pub objects: usize,
    /// Objects fetched (the others were here).
    pub fetched: usize,
    /// Bytes fetched.
    pub fetched_bytes: u64,
    /// Commits taken out of their repos to stay within `--cache-size`, whole models whose
    /// objects went (`ORG/NAME@sha256:<hex>`).
    pub evicted: Vec<String>,
    /// Bytes the collection that evicted them removed.
    pub evicted_bytes: u64,
}

/// Why a download failed.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// The endpoint refused, failed or lacks something.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The local store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Every copy of an object received was other bytes.
    #[error("{0}")]
    Mismatch(#[source] AdmitError),
    /// A document fetched breaks the format.
    #[error("{what}: {source}")]
    Format {
        /// Which document.
        what: String,
        /// The rule broken.
        #[source]
        source: FormatError,
    },
    /// What was asked for does not exist or is ambiguous.
    #[error("{0}")]
    Resolve(String),
    /// The commit does not fit the cache's budget.
    #[error("{0}")]
    Budget(String),
}

/// Result of a download.
pub type DownloadResult<T> = Result<T, DownloadError>;

impl From<AdmitError> for DownloadError {
    fn from(e: AdmitError) -> DownloadError {
        match e {
            AdmitError::Fetch(e) => DownloadError::Fetch(e),
            AdmitError::Store(e) => DownloadError::Store(e),
            e @ AdmitError::Mismatch { .. } => DownloadError::Mismatch(e),
        }
    }
}

/// Downloads revision `revision` (in `lane`) of model `name` from `endpoint` into `store`.
/// Runs on a multi-threaded tokio runtime (store writes block in place).
///
/// # Errors
/// See [`DownloadError`]; objects admitted before a failure stay in the store, unnamed.
pub async fn download(
    store: &Store,
    endpoint: Arc<dyn Origin>,
    name: &str,
    revision: &Revision,
    lane: Option<&str>,
    config: &DownloadConfig,
    progress: Arc<dyn Progress>,
) -> DownloadResult<DownloadReport> {
    if is_local(name) {
        return Err(DownloadError::Resolve(format!(
            "{name}: the org `local` is a machine's own; endpoints never serve it"
        )));
    }
    let target = resolve(&endpoint, name, revision, lane).await?;
    let commit = target.commit.0;
    let fence = store.fence()?;
    let documents_here = [store.contains(&commit), store.contains(&target.header.0)];
    let tree_bytes = document(store, &endpoint, &commit).await?;
    let tree = Tree::from_json(&tree_bytes).map_err(|source| DownloadError::Format {
        what: format!("the tree {}", commit.id()),
        source,
    })?;
    let header_ref = *tree.header().1;
    if target.header.0 != header_ref {
        return Err(DownloadError::Resolve(format!(
            "the endpoint named header {} for commit {}, whose tree cites {}",
            target.header.0.id(),
            commit.id(),
            header_ref.id()
        )));
    }
    let tree_lane = tree.lane.clone().unwrap_or_default();
    // The lane the release names the commit under, else the tree's own label.
    let named_lane = match target.lane.is_empty() {
        true => tree_lane.clone(),
        false => target.lane.clone(),
    };
    if let Some(lane) = lane.filter(|lane| *lane != named_lane) {
        return Err(DownloadError::Resolve(format!(
            "the endpoint answered commit {} in lane {named_lane:?}, not {lane:?}",
            commit.id()
        )));
    }
    let header_bytes = document(store, &endpoint, &header_ref).await?;
    let header = Header::from_cbor(&header_bytes).map_err(|source| DownloadError::Format {
        what: format!("the header {}", header_ref.id()),
        source,
    })?;
    let closure: BTreeSet<ObjectRef> = header
        .objects()
        .copied()
        .chain(tree.repo_files().map(|(_, o)| *o))
        .collect();
    let missing: Vec<ObjectRef> = closure
        .iter()
        .filter(|o| !store.contains(o))
        .copied()
        .collect();
    let leaf_bytes: u64 = missing.iter().map(|o| o.length).sum();
    // Room for what comes, evicting cache first; a collection skips while the fence is held,
    // and nothing of this download is in the store yet but documents younger than its grace.
    drop(fence);
    let incoming = leaf_bytes + (tree_bytes.len() + header_bytes.len()) as u64;
    let (_reused, evicted, evicted_bytes) = match config.cache_size {
        Some(budget) => {
            let (hold, collected) = tokio::task::block_in_place(|| {
                within_budget(store, name, &commit, &closure, incoming, budget)
            })?;
            (Some(hold), collected.evicted, collected.removed_bytes)
        }
        None => (None, Vec::new(), 0),
    };
    tokio::task::block_in_place(|| store.make_room(incoming))?;
    let _fence = store.fence()?;
    progress.start(leaf_bytes);
    fetch_all(store, &endpoint, &missing, config.jobs.max(1), &progress).await?;
    tokio::task::block_in_place(|| -> DownloadResult<()> {
        store.put_bytes(&header_bytes)?;
        store.put_bytes(&tree_bytes)?;
        let lane = named_lane.as_str();
        store.update_repo(name, |old| {
            let mut repo = old.unwrap_or_else(|| Repo {
                name: name.to_owned(),
                releases: vec![],
                commits: vec![],
            });
            match (target.release.is_empty(), lane.is_empty()) {
                (false, false) => repo.set_lane(&target.release, lane, commit),
                _ => {
                    repo.add_commit(commit);
                }
            }
            repo
        })?;
        Ok(())
    })?;
    Ok(DownloadReport {
        name: name.to_owned(),
        release: target.release,
        lane: named_lane,
        commit: commit.id(),
        objects: closure.len() + 2,
        fetched: missing.len() + documents_here.iter().filter(|here| !**here).count(),
        fetched_bytes: leaf_bytes
            + [commit.length, header_ref.length]
                .iter()
                .zip(documents_here)
                .filter(|(_, here)| !here)
                .map(|(length, _)| length)
                .sum::<u64>(),
        evicted,
        evicted_bytes,
    })
}

/// How long a download's collection asks again for the fence another process holds.
const FENCE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Makes the store's cache hold at most `budget` bytes once `incoming` more are in: a
/// collection drops the least recently used uses first (whole models: their commits leave
/// their repos). Returns the hold that keeps the closure's objects already here, so the
/// collection neither takes them for this download nor sweeps them before the commit is named,
/// and the collection's report.
///
/// # Errors
/// [`DownloadError::Budget`] when `incoming` alone is over the budget, or what the cache must
/// keep (held, used by a root, younger than the grace) leaves too little; the store's errors.
fn within_budget(
    store: &Store,
    name: &str,
    commit: &ObjectRef,
    closure: &BTreeSet<ObjectRef>,
    incoming: u64,
    budget: u64,
) -> DownloadResult<(Hold, Collected)> {
    let human = |n: u64| indicatif::BinaryBytes(n).to_string();
    let what = format!("{name}@{}", commit.id());
    if incoming > budget {
        return Err(DownloadError::Budget(format!(
            "{what}: its {} to fetch are more than the cache's budget of {}; give a larger \
             --cache-size, or none (the cache is then bounded by the disk's reserve)",
            human(incoming),
            human(budget)
        )));
    }
    let hold = store.hold(closure.iter().chain(std::iter::once(commit)))?;
    let collect = Collect {
        incoming,
        cache_budget: Some(budget),
        ..Collect::default()
    };
    // Dry first: a download refused must drop no use. A writer or another collection holds
    // the fence for a moment: asked again.
    let dry = Collect {
        dry_run: true,
        ..collect.clone()
    };
    let mut report = patiently(FENCE_PATIENCE, || store.collect(&dry))?;
    if !report.skipped && report.cache_bytes + incoming <= budget {
        report = patiently(FENCE_PATIENCE, || store.collect(&collect))?;
    }
    if report.skipped {
        return Err(DownloadError::Budget(format!(
            "{what}: the cache could not be brought within its budget of {}: another process \
             kept writing to the store or collecting it; nothing was fetched, try again",
            human(budget)
        )));
    }
    if report.cache_bytes + incoming > budget {
        return Err(DownloadError::Budget(format!(
            "{what}: {} to fetch do not fit the cache's budget of {}: the cache holds {} that \
             cannot go now (held by a running process, such as a mount's open files, or \
             younger than the grace of {} minutes); nothing was fetched",
            human(incoming),
            human(budget),
            human(report.cache_bytes),
            GRACE.as_secs() / 60
        )));
    }
    Ok((hold, report))
}

/// A document from the store when it is here, else from the endpoint (verified either way).
async fn document(
    store: &Store,
    endpoint: &Arc<dyn Origin>,
    object: &ObjectRef,
) -> DownloadResult<Vec<u8>> {
    if store.contains(object) {
        if let Ok(bytes) = tokio::task::block_in_place(|| store.read_verified(object)) {
            return Ok(bytes);
        }
    }
    Ok(endpoint.document(object).await?)
}

/// The commit `revision` names (see the module doc).
async fn resolve(
    endpoint: &Arc<dyn Origin>,
    name: &str,
    revision: &Revision,
    lane: Option<&str>,
) -> DownloadResult<Resolved> {
    let release = match revision {
        Revision::Commit(sha256) => {
            let length = endpoint.length_of(sha256).await?.ok_or_else(|| {
                DownloadError::Resolve(format!("no commit sha256:{sha256} at {}", endpoint.url()))
            })?;
            let commit = ObjectRef {
                sha256: *sha256,
                length,
            };
            return resolved_commit(endpoint, String::new(), commit, lane).await;
        }
        Revision::Release(version) => Some(version.as_str()),
        Revision::Newest => None,
    };
    if let Some(resolved) = endpoint.resolve(name, release, lane).await? {
        return Ok(resolved);
    }
    // A static origin: its repo document, resolved here.
    let repo = endpoint
        .repo_document(name)
        .await?
        .ok_or_else(|| DownloadError::Resolve(format!("no model {name} at {}", endpoint.url())))?;
    let found = match release {
        Some(version) => Some(
            repo.releases
                .iter()
                .find(|r| r.version == version)
                .ok_or_else(|| {
                    let versions: Vec<&str> =
                        repo.releases.iter().map(|r| r.version.as_str()).collect();
                    DownloadError::Resolve(format!(
                        "{name} has no release {version:?} (it has: {})",
                        versions.join(", ")
                    ))
                })?,
        ),
        None => repo.releases.last(),
    };
    let Some(found) = found else {
        // No releases: the newest commit (in the lane asked for).
        for commit in repo.commits.iter().rev() {
            let resolved = resolved_commit(endpoint, String::new(), *commit, None).await?;
            if lane.is_none_or(|lane| lane == resolved.lane) {
                return Ok(resolved);
            }
        }
        return Err(DownloadError::Resolve(match lane {
            Some(lane) => format!("{name} has no commit in lane {lane:?}"),
            None => format!("{name} has no commit"),
        }));
    };
    let lanes: Vec<&str> = found.lanes.keys().map(String::as_str).collect();
    let (lane, commit) = match lane {
        Some(lane) => found.lanes.get_key_value(lane),
        None if found.lanes.len() == 1 => found.lanes.iter().next(),
        None => {
            return Err(DownloadError::Resolve(format!(
                "{name}@{} has several lanes ({}); pick one with --lane",
                found.version,
                lanes.join(", ")
            )))
        }
    }
    .ok_or_else(|| {
        DownloadError::Resolve(format!(
            "{name}@{} has no lane {:?} (it has: {})",
            found.version,
            lane.unwrap_or_default(),
            lanes.join(", ")
        ))
    })?;
    let mut resolved = resolved_commit(endpoint, found.version.clone(), *commit, None).await?;
    resolved.lane = lane.clone();
    Ok(resolved)
}

/// A commit's resolution read from its tree.
async fn resolved_commit(
    endpoint: &Arc<dyn Origin>,
    release: String,
    commit: ObjectRef,
    lane: Option<&str>,
) -> DownloadResult<Resolved> {
    let bytes = endpoint.document(&commit).await?;
    let tree = Tree::from_json(&bytes).map_err(|source| DownloadError::Format {
        what: format!("the tree {}", commit.id()),
        source,
    })?;
    let tree_lane = tree.lane.clone().unwrap_or_default();
    if let Some(lane) = lane.filter(|lane| *lane != tree_lane) {
        return Err(DownloadError::Resolve(format!(
            "commit {} is in lane {tree_lane:?}, not {lane:?}",
            commit.id()
        )));
    }
    Ok(Resolved {
        release,
        lane: tree_lane,
        commit: WireRef(commit),
        header: WireRef(*tree.header().1),
        reasons: vec![],
    })
}

/// Fetches and admits `objects`, `jobs` at a time; the first failure stops the rest.
async fn fetch_all(
    store: &Store,
    endpoint: &Arc<dyn Origin>,
    objects: &[ObjectRef],
    jobs: usize,
    progress: &Arc<dyn Progress>,
) -> DownloadResult<()> {
    let permits = Arc::new(tokio::sync::Semaphore::new(jobs));
    let mut tasks = tokio::task::JoinSet::new();
    // Largest first, so the long transfers overlap the many small ones.
    let mut order = objects.to_vec();
    order.sort_by(|a, b| b.length.cmp(&a.length).then(a.cmp(b)));
    for object in order {
        let (store, endpoint, progress) = (store.clone(), endpoint.clone(), progress.clone());
        let permits = permits.clone();
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await.expect("never closed");
            fetch_one(&store, &endpoint, &object, progress.as_ref()).await
        });
    }
    while let Some(done) = tasks.join_next().await {
        let result = done.unwrap_or_else(|e| {
            Err(DownloadError::Resolve(format!(
                "a transfer task failed: {e}"
            )))
        });
        if let Err(e) = result {
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
            return Err(e);
        }
    }
    Ok(())
}

/// Fetches one object and admits it when its length and SHA-256 are right.
async fn fetch_one(
    store: &Store,
    endpoint: &Arc<dyn Origin>,
    object: &ObjectRef,
    progress: &dyn Progress,
) -> DownloadResult<()> {
    let heard = |bytes: u64| progress.advance(bytes);
    admit(store, endpoint.as_ref(), object, &heard).await?;
    Ok(())
}
