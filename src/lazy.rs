//! The lazy mount: a store's namespace merged with an endpoint's models, whose bytes are
//! fetched the first time something reads them, and kept.
//!
//! ```text
//! TensorFs ── Catalog ──────── RemoteCatalog: local refs ∪ the endpoint's repo documents;
//!    │                           a commit's tree and header fetched on first use, the commit
//!    │                           then named in the local repo document
//!    └──── ObjectSource ────── FetchingSource: a missing blob is fetched, then read through
//!                                the verifying BlobReader like any other
//!                                  └── Fetcher: one flight per object however many wait,
//!                                      prefetches bounded, bytes admitted by remote::admit
//!                                        └── Cache: room in the budget and above the
//!                                            reserve, least recently read evicted
//! ```
//!
//! Parts:
//! - [`fetcher`]: [`Fetcher`] runs transfers on its own tokio runtime. A reader that needs a
//!   missing object joins its flight (or starts one) and blocks until it lands; a prefetch
//!   starts a flight and returns. Each flight streams the object through a bounded buffer
//!   into the store's writer ([`crate::remote::admit`]), which publishes it only when its
//!   length and SHA-256 are right, under the collector's fence.
//! - [`objects`]: [`FetchingSource`], the mount's [`ObjectSource`](crate::io::ObjectSource).
//! - [`catalog`]: [`RemoteCatalog`], the mount's [`Catalog`](crate::fs::Catalog).
//! - [`cache`]: [`Cache`], the room each transfer needs in the budget and above the disk's
//!   reserve.
//!
//! Faults: transfers are retried until [`LazyConfig::fetch_deadline`] passes without a byte
//! received (a wrong copy is asked for again the same way), so a passing fault only delays a
//! reader (an `mmap` reader is not killed by it). After the deadline the read fails with EIO,
//! and the mount logs one line naming the file, the object and the endpoint; a failure is
//! remembered for [`FAILURE_MEMORY`] so the kernel's retry of the same read does not wait a
//! second deadline, then the next read asks again.
//!
//! Offline: everything fetched stays in the store and the commits looked up are named in its
//! refs, so a later mount without an endpoint shows them and reads what was fetched (what was
//! never read is absent there, and reads as EIO).
//!
//! Space: [`cache`] keeps what the store's cache holds within [`LazyConfig::cache_size`] and
//! above the disk's reserve, evicting least recently read objects (an open file reads an
//! evicted one again by fetching it again).
//!
//! Non-goals: byte ranges smaller than a chunk (a chunk is fetched whole, at most 64 MiB),
//! uploads.

pub mod cache;
pub mod catalog;
pub mod fetcher;
pub mod objects;

use std::sync::Arc;
use std::time::Duration;

pub use cache::{Cache, CacheStats};
pub use catalog::RemoteCatalog;
pub use fetcher::{FetchFailed, Fetcher, FetcherStats};
pub use objects::FetchingSource;

use crate::remote::client::ClientConfig;
use crate::remote::connect;
use crate::remote::origin::{Access, FetchError};
use crate::store::Store;

/// How long a failed fetch answers readers at once before the next read asks again.
pub const FAILURE_MEMORY: Duration = Duration::from_secs(2);

/// Settings of a lazy mount.
#[derive(Clone)]
pub struct LazyConfig {
    /// The endpoint: `https://…`, or `http://` on loopback.
    pub endpoint: String,
    /// A bearer token, sent to the endpoint's origin only.
    pub token: Option<String>,
    /// Models to show besides those the endpoint lists (an endpoint without the
    /// `GET v1/models` route, such as a static host, lists none), as `<org>/<name>`.
    pub repos: Vec<String>,
    /// How long a transfer may go without a byte received before the read waiting for it fails
    /// (default 60 s).
    pub fetch_deadline: Duration,
    /// How often the endpoint's repo documents are read again (default 30 s).
    pub refresh_interval: Duration,
    /// How long mounting waits for the endpoint's list before showing the local refs only
    /// (the list is read again in the background; default 10 s).
    pub startup_wait: Duration,
    /// Prefetches in flight at most (default 4); readers' own fetches are not limited.
    pub max_prefetches: usize,
    /// The most bytes the store's cache may hold (see [`cache`]); `None` (the default): what
    /// the disk holds above the reserve.
    pub cache_size: Option<u64>,
}

impl std::fmt::Debug for LazyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyConfig")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("repos", &self.repos)
            .field("fetch_deadline", &self.fetch_deadline)
            .field("refresh_interval", &self.refresh_interval)
            .field("startup_wait", &self.startup_wait)
            .field("max_prefetches", &self.max_prefetches)
            .field("cache_size", &self.cache_size)
            .finish()
    }
}

impl LazyConfig {
    /// The defaults for `endpoint`.
    pub fn new(endpoint: impl Into<String>) -> LazyConfig {
        LazyConfig {
            endpoint: endpoint.into(),
            token: None,
            repos: Vec::new(),
            fetch_deadline: crate::remote::client::DEFAULT_DEADLINE,
            refresh_interval: Duration::from_secs(30),
            startup_wait: Duration::from_secs(10),
            max_prefetches: 4,
            cache_size: None,
        }
    }
}

/// Why a lazy mount cannot start.
#[derive(Debug, thiserror::Error)]
pub enum LazyError {
    /// The endpoint URL is refused (not https, plain http off loopback) or the client cannot
    /// start.
    #[error(transparent)]
    Endpoint(#[from] FetchError),
    /// The transfers' runtime cannot start.
    #[error("starting the transfer threads: {0}")]
    Runtime(#[source] std::io::Error),
    /// A repo named to show is not `<org>/<name>`, or is in the `local` org.
    #[error("{0}")]
    Repo(String),
    /// The store's records cannot be read to size its cache.
    #[error("reading what the store's cache holds: {0}")]
    Cache(#[source] crate::store::StoreError),
}

/// The two halves of a lazy mount over one endpoint, sharing one [`Fetcher`].
#[derive(Debug)]
pub struct LazyMount {
    /// The namespace's catalog.
    pub catalog: Arc<RemoteCatalog>,
    /// The namespace's object source.
    pub objects: Arc<FetchingSource>,
    /// The transfers (for their counters).
    pub fetcher: Arc<Fetcher>,
}

impl LazyMount {
    /// Starts the transfers and reads the endpoint's models (waiting at most
    /// [`LazyConfig::startup_wait`] for them).
    ///
    /// # Errors
    /// See [`LazyError`].
    pub fn open(store: Store, config: LazyConfig) -> Result<LazyMount, LazyError> {
        for name in &config.repos {
            crate::format::names::split_repo_name(name)
                .map_err(|e| LazyError::Repo(format!("--repo {name}: {e}")))?;
            if crate::remote::is_local(name) {
                return Err(LazyError::Repo(format!(
                    "--repo {name}: the org `local` is a machine's own; endpoints never serve it"
                )));
            }
        }
        let client = ClientConfig {
            deadline: config.fetch_deadline,
            // A reader waits: retry soon after a passing fault.
            max_backoff: Duration::from_secs(2).min(config.fetch_deadline),
            ..ClientConfig::default()
        };
        let endpoint = connect::open(&config.endpoint, config.token.clone(), Access::Read, client)?;
        let objects = Arc::new(FetchingSource::new(
            store.clone(),
            config.cache_size,
            |cache| {
                Ok(Arc::new(Fetcher::new(
                    store.clone(),
                    cache,
                    endpoint,
                    config.max_prefetches,
                )?))
            },
        )?);
        let fetcher = objects.fetcher().clone();
        let catalog = Arc::new(RemoteCatalog::new(store, fetcher.clone(), &config));
        Ok(LazyMount {
            catalog,
            objects,
            fetcher,
        })
    }
}
