//! [`RemoteCatalog`]: the store's refs merged with an endpoint's models.
//!
//! - **Which models.** Those the endpoint lists (`GET v1/models`, this implementation's
//!   addition), those named in [`LazyConfig::repos`](super::LazyConfig::repos), and the
//!   store's own repos outside the `local` org (so a model downloaded or looked up before shows
//!   the endpoint's newer releases).
//! - **Their documents.** Each model's repo document (`refs/<org>/<name>.json`); an endpoint
//!   without one answers the resolve route, whose newest release (or commit) stands in for it.
//!   They are read at mount, then in the background at most every
//!   [`LazyConfig::refresh_interval`](super::LazyConfig::refresh_interval) while the namespace
//!   checks its refs (a lookup or listing above the lanes);
//!   a model the endpoint stops serving keeps what the store names of it. When the endpoint
//!   cannot be reached, the last list stands (at first: the store's refs alone).
//! - **Merging.** A model in both shows the endpoint's releases and commits, then the store's
//!   releases, lanes and commits the endpoint does not name.
//! - **Commits.** A commit's tree and header are fetched (verified, admitted) when its lane is
//!   first needed (listing a revision folder reads each lane's tree and header); the commit is
//!   then named in the store's repo document as the endpoint names it (a release's lane, or
//!   among its commits), so a later mount without the endpoint shows it. Its chunks, assets
//!   and repo files are fetched when read ([`super::FetchingSource`]).

use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use super::{Fetcher, LazyConfig};
use crate::format::{ObjectRef, Release, Repo, Sha256};
use crate::fs::{
    Capacity, Catalog, CommitError, CommitLane, LaneContents, LaneRef, RepoEntry, StoreCatalog,
};
use crate::remote::is_local;
use crate::remote::origin::FetchError;
use crate::remote::origin::Origin;
use crate::store::{Store, StoreError};
use crate::sync::{lock, read, write};

/// The endpoint's models as last read.
#[derive(Debug, Default)]
struct RemoteRefs {
    /// By ASCII-lowered name: the document and when it was first seen as it is.
    repos: BTreeMap<String, (Repo, SystemTime)>,
    /// Moves whenever `repos` changes.
    generation: u64,
    /// Whether the last reading reached the endpoint.
    reachable: Option<bool>,
}

/// The [`Catalog`] of a lazy mount (see the module doc).
#[derive(Debug)]
pub struct RemoteCatalog {
    local: StoreCatalog,
    store: Store,
    fetcher: Arc<Fetcher>,
    named: Vec<String>,
    refresh_interval: Duration,
    remote: Arc<RwLock<RemoteRefs>>,
    /// When the endpoint was last read (or a reading started).
    last_refresh: Mutex<Instant>,
    refreshing: Arc<AtomicBool>,
    /// Commits whose documents are present and which the store's refs name as the endpoint
    /// does.
    recorded: Mutex<HashSet<Sha256>>,
}

impl RemoteCatalog {
    /// The catalog of `store` and the endpoint `fetcher` fetches from; reads the endpoint's
    /// models now, waiting at most `config.startup_wait`.
    pub fn new(store: Store, fetcher: Arc<Fetcher>, config: &LazyConfig) -> RemoteCatalog {
        let catalog = RemoteCatalog {
            local: StoreCatalog::new(store.clone()),
            store,
            fetcher,
            named: config.repos.clone(),
            refresh_interval: config.refresh_interval,
            remote: Arc::default(),
            last_refresh: Mutex::new(Instant::now()),
            refreshing: Arc::default(),
            recorded: Mutex::default(),
        };
        let (done, wait) = std::sync::mpsc::channel();
        catalog.start_refresh(Some(done));
        if wait.recv_timeout(config.startup_wait).is_err() {
            tracing::warn!(
                "{} did not list its models within {:.0} s; showing the store's refs until it does",
                catalog.fetcher.endpoint().url(),
                config.startup_wait.as_secs_f64()
            );
        }
        catalog
    }

    /// Whether the endpoint's last reading reached it; `None` while none has ended (an
    /// endpoint that does not answer within [`LazyConfig::startup_wait`]).
    pub fn reachable(&self) -> Option<bool> {
        read(&self.remote).reachable
    }

    /// Reads the endpoint's models in the background, unless a reading is under way; `done`
    /// hears when it ends.
    fn start_refresh(&self, done: Option<std::sync::mpsc::Sender<()>>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        *lock(&self.last_refresh) = Instant::now();
        let mut names: Vec<String> = self.named.clone();
        match self.store.repos() {
            Ok(repos) => names.extend(repos.into_iter().map(|r| r.name)),
            Err(e) => tracing::warn!("listing the store's refs: {e}"),
        }
        let endpoint = self.fetcher.endpoint().clone();
        let (remote, refreshing) = (self.remote.clone(), self.refreshing.clone());
        self.fetcher.runtime().spawn(async move {
            refresh(endpoint.as_ref(), names, &remote).await;
            refreshing.store(false, Ordering::Release);
            if let Some(done) = done {
                let _ = done.send(());
            }
        });
    }

    /// Makes commit `commit`'s tree and header present (fetching them) and names the commit
    /// in the store's refs as the endpoint does.
    fn ensure_commit(&self, commit: &ObjectRef) -> Result<(), CommitError> {
        if lock(&self.recorded).contains(&commit.sha256) {
            return Ok(());
        }
        // Held until the refs name the commit, so the collector never sweeps its documents.
        let _fence = self.store.fence()?;
        let fetch = |object: &ObjectRef| {
            self.fetcher
                .ensure(&[*object])
                .map_err(|e| CommitError::Fetch(Box::new(e)))
        };
        fetch(commit)?;
        let tree = self.store.tree(commit)?;
        fetch(tree.header().1)?;
        if let Err(e) = self.record(commit) {
            tracing::warn!(
                "commit {} is fetched but the store's refs could not name it (a mount without \
                 the endpoint will not show it): {e}",
                commit.id()
            );
        }
        lock(&self.recorded).insert(commit.sha256);
        Ok(())
    }

    /// Names `commit` in the store's repo document of every model the endpoint names it in,
    /// as the endpoint does.
    fn record(&self, commit: &ObjectRef) -> Result<(), StoreError> {
        let naming: Vec<Repo> = read(&self.remote)
            .repos
            .values()
            .filter(|(repo, _)| repo.roots().any(|c| c == commit))
            .map(|(repo, _)| repo.clone())
            .collect();
        for remote in naming {
            let here = self.store.repo(&remote.name)?;
            if here.is_some_and(|r| r.roots().any(|c| c == commit)) {
                continue;
            }
            let places: Vec<(String, String)> = remote
                .releases
                .iter()
                .flat_map(|r| {
                    r.lanes
                        .iter()
                        .filter(|(_, c)| *c == commit)
                        .map(|(lane, _)| (r.version.clone(), lane.clone()))
                })
                .collect();
            self.store.update_repo(&remote.name, |old| {
                let mut repo = old.unwrap_or_else(|| Repo {
                    name: remote.name.clone(),
                    releases: vec![],
                    commits: vec![],
                });
                if places.is_empty() {
                    repo.add_commit(*commit);
                }
                for (version, lane) in &places {
                    repo.set_lane(version, lane, *commit);
                }
                repo
            })?;
            tracing::info!("named commit {} in {}", commit.id(), remote.name);
        }
        Ok(())
    }
}

/// Reads the documents of `names` and of the models the endpoint lists into `remote` (see the
/// module doc).
async fn refresh(endpoint: &dyn Origin, mut names: Vec<String>, remote: &RwLock<RemoteRefs>) {
    let listed = match endpoint.models().await {
        Ok(listed) => listed,
        Err(e) => {
            note_reachable(remote, Err(&e), endpoint);
            return;
        }
    };
    names.extend(listed.unwrap_or_default());
    // One reading per model, whatever its spelling.
    let names: BTreeMap<String, String> = names
        .into_iter()
        .filter(|name| !is_local(name))
        .filter(|name| match crate::format::names::split_repo_name(name) {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!("skipping model {name:?} the endpoint lists: {e}");
                false
            }
        })
        .map(|name| (name.to_ascii_lowercase(), name))
        .collect();
    let mut found: BTreeMap<String, Option<Repo>> = BTreeMap::new();
    let mut failure = None;
    for name in names.into_values() {
        match document(endpoint, &name).await {
            Ok(repo) => {
                found.insert(name.to_ascii_lowercase(), repo);
            }
            Err(e) => {
                tracing::debug!("{e}");
                failure = Some(e);
            }
        }
    }
    let mut refs = write(remote);
    let mut changed = false;
    for (key, repo) in found {
        match repo {
            Some(repo) => {
                if refs.repos.get(&key).is_none_or(|(old, _)| *old != repo) {
                    refs.repos.insert(key, (repo, SystemTime::now()));
                    changed = true;
                }
            }
            None => changed |= refs.repos.remove(&key).is_some(),
        }
    }
    if changed {
        refs.generation += 1;
    }
    drop(refs);
    note_reachable(remote, failure.as_ref().map_or(Ok(()), Err), endpoint);
}

/// Logs when the endpoint stops or starts answering (once per change, not per reading).
fn note_reachable(
    remote: &RwLock<RemoteRefs>,
    result: Result<(), &FetchError>,
    endpoint: &dyn Origin,
) {
    let mut refs = write(remote);
    let before = refs.reachable.replace(result.is_ok());
    if before == Some(result.is_ok()) {
        return;
    }
    match result {
        Ok(()) if before.is_some() => tracing::info!("{} answers again", endpoint.url()),
        Ok(()) => {}
        Err(error) => tracing::warn!(
            "{} cannot list its models ({error}); showing what the store names and what was \
             read before",
            endpoint.url()
        ),
    }
}

/// A model's repo document at the endpoint: its `refs/…` document, else what its resolve
/// route names (the newest release's lane, or the newest commit); `None` when it has neither.
async fn document(endpoint: &dyn Origin, name: &str) -> Result<Option<Repo>, FetchError> {
    if let Some(repo) = endpoint.repo_document(name).await? {
        return Ok(Some(repo));
    }
    let resolved = match endpoint.resolve(name, None, None).await {
        Ok(Some(resolved)) => resolved,
        Ok(None) | Err(FetchError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let commit = resolved.commit.0;
    let mut repo = Repo {
        name: name.to_owned(),
        releases: vec![],
        commits: vec![],
    };
    match (resolved.release.is_empty(), resolved.lane.is_empty()) {
        (false, false) => repo.releases.push(Release {
            version: resolved.release,
            lanes: BTreeMap::from([(resolved.lane, commit)]),
        }),
        _ => repo.commits.push(commit),
    }
    Ok(Some(repo))
}

/// A model as both the endpoint and the store name it: the endpoint's document, then the
/// store's releases, lanes and commits it lacks; the store's spelling of the name.
pub fn merge(local: &Repo, remote: &Repo) -> Repo {
    let mut repo = remote.clone();
    repo.name = local.name.clone();
    for release in &local.releases {
        for (lane, commit) in &release.lanes {
            let named = repo
                .releases
                .iter()
                .any(|r| r.version == release.version && r.lanes.contains_key(lane));
            if !named {
                repo.set_lane(&release.version, lane, *commit);
            }
        }
    }
    for commit in &local.commits {
        repo.add_commit(*commit);
    }
    repo
}

impl Catalog for RemoteCatalog {
    fn refs_signature(&self) -> Result<u64, StoreError> {
        let local = self.local.refs_signature()?;
        if lock(&self.last_refresh).elapsed() >= self.refresh_interval {
            self.start_refresh(None);
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (local, read(&self.remote).generation).hash(&mut hasher);
        Ok(hasher.finish())
    }

    fn hub_records(&self) -> Result<Vec<crate::store::hub::HubRecord>, StoreError> {
        self.local.hub_records()
    }

    fn repos(&self) -> Result<Vec<RepoEntry>, StoreError> {
        let mut by_name: BTreeMap<String, RepoEntry> = self
            .local
            .repos()?
            .into_iter()
            .map(|entry| (entry.repo.name.to_ascii_lowercase(), entry))
            .collect();
        for (key, (remote, seen)) in &read(&self.remote).repos {
            match by_name.get_mut(key) {
                Some(entry) => {
                    entry.repo = merge(&entry.repo, remote);
                    entry.mtime = entry.mtime.max(*seen);
                }
                None => {
                    let entry = RepoEntry {
                        repo: remote.clone(),
                        mtime: *seen,
                    };
                    by_name.insert(key.clone(), entry);
                }
            }
        }
        let mut repos: Vec<RepoEntry> = by_name.into_values().collect();
        repos.sort_by(|a, b| a.repo.name.cmp(&b.repo.name));
        Ok(repos)
    }

    fn commit_lane(&self, commit: &ObjectRef) -> Result<CommitLane, CommitError> {
        self.ensure_commit(commit)?;
        self.local.commit_lane(commit)
    }

    fn lane(&self, lane: &LaneRef) -> Result<LaneContents, CommitError> {
        self.ensure_commit(&lane.commit)?;
        self.local.lane(lane)
    }

    fn capacity(&self) -> Option<Capacity> {
        self.local.capacity()
    }

    fn store_root(&self) -> Option<&Path> {
        self.local.store_root()
    }

    fn retain(
        &self,
        commit: &ObjectRef,
    ) -> Result<Option<crate::store::retention::Hold>, CommitError> {
        // Its documents are here once a lane of it was laid out; the hold lists the chunks
        // still to fetch too, so they are kept as they arrive.
        self.ensure_commit(commit)?;
        self.local.retain(commit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(seed: &str) -> ObjectRef {
        ObjectRef::of(seed.as_bytes())
    }

    #[test]
    fn a_merged_repo_is_the_endpoints_then_what_only_the_store_names() {
        let (a, b, c, d) = (object("a"), object("b"), object("c"), object("d"));
        let remote = Repo {
            name: "acme/tiny".into(),
            releases: vec![
                Release {
                    version: "1.0".into(),
                    lanes: BTreeMap::from([("bf16".into(), a)]),
                },
                Release {
                    version: "2.0".into(),
                    lanes: BTreeMap::from([("bf16".into(), b)]),
                },
            ],
            commits: vec![c],
        };
        let local = Repo {
            name: "Acme/Tiny".into(),
            releases: vec![
                Release {
                    version: "1.0".into(),
                    lanes: BTreeMap::from([("bf16".into(), a), ("fp8".into(), d)]),
                },
                Release {
                    version: "0.9".into(),
                    lanes: BTreeMap::from([("bf16".into(), d)]),
                },
            ],
            commits: vec![c, d],
        };
        let merged = merge(&local, &remote);
        assert_eq!(merged.name, "Acme/Tiny");
        let versions: Vec<&str> = merged.releases.iter().map(|r| r.version.as_str()).collect();
        assert_eq!(versions, ["0.9", "1.0", "2.0"]);
        assert_eq!(merged.releases[1].lanes.get("fp8"), Some(&d));
        assert_eq!(merged.commits, [c], "d is named by releases now");
        assert_eq!(merge(&remote, &remote), remote);
    }
}
