//! Transfers of missing objects, one flight per object.
//!
//! Locks: `flights` is held only to look up, insert or remove a flight; a flight's `state` only
//! to read or set its result. They are never held together, nor while anything waits on the
//! network or the disk.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::cache::NoRoom;
use super::{Cache, LazyError, FAILURE_MEMORY};
use crate::format::{ObjectRef, Sha256};
use crate::remote::admit::{admit, AdmitError};
use crate::remote::origin::FetchError;
use crate::remote::origin::Origin;
use crate::store::Store;
use crate::sync::lock;

/// A transfer that failed: the object, the endpoint and why.
#[derive(Clone, Debug, thiserror::Error)]
#[error("fetching {object} from {endpoint}: {cause}")]
pub struct FetchFailed {
    /// The object.
    pub object: ObjectRef,
    /// The endpoint's URL.
    pub endpoint: String,
    /// Why.
    #[source]
    pub cause: Arc<AdmitError>,
}

impl FetchFailed {
    /// Whether the deadline passed (retried faults), rather than a final answer.
    pub fn timed_out(&self) -> bool {
        matches!(
            *self.cause,
            AdmitError::Fetch(FetchError::GaveUp { .. }) | AdmitError::Mismatch { .. }
        )
    }

    /// As an I/O error for a read: `TimedOut` after the deadline, else `Other` (never the
    /// kinds of a damaged or absent local blob, whose log names a local repair).
    pub fn to_io(&self) -> io::Error {
        let kind = match self.timed_out() {
            true => io::ErrorKind::TimedOut,
            false => io::ErrorKind::Other,
        };
        io::Error::new(kind, self.clone())
    }
}

/// What the transfers did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FetcherStats {
    /// Objects admitted.
    pub objects: u64,
    /// Bytes of the objects admitted.
    pub bytes: u64,
    /// Bytes received, copies asked for again included.
    pub received_bytes: u64,
    /// Flights that failed.
    pub failures: u64,
}

#[derive(Debug, Default)]
struct Counters {
    objects: AtomicU64,
    bytes: AtomicU64,
    received_bytes: AtomicU64,
    failures: AtomicU64,
}

/// How a flight ended.
#[derive(Clone, Debug)]
enum Outcome {
    /// The object is in the store.
    Landed,
    /// A prefetch the cache had no room for: not made (a reader waiting on it starts its own).
    Declined,
    /// The transfer failed.
    Failed(FetchFailed),
}

/// One object's transfer, which any number of readers wait for.
#[derive(Debug)]
struct Flight {
    /// `None` while it runs; then its outcome and when it ended.
    state: Mutex<Option<(Outcome, Instant)>>,
    done: Condvar,
}

impl Flight {
    fn wait(&self) -> Outcome {
        let mut state = lock(&self.state);
        loop {
            if let Some((outcome, _)) = &*state {
                return outcome.clone();
            }
            state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Whether to join it: it runs, or failed recently enough to answer with.
    fn joinable(&self) -> bool {
        match &*lock(&self.state) {
            None => true,
            Some((Outcome::Failed(_), at)) => at.elapsed() < FAILURE_MEMORY,
            Some(_) => false,
        }
    }
}

/// Fetches missing objects from one endpoint into one store.
#[derive(Debug)]
pub struct Fetcher {
    store: Store,
    cache: Arc<Cache>,
    endpoint: Arc<dyn Origin>,
    /// Dropped with `shutdown_background`, which is allowed inside another runtime.
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    flights: Arc<Mutex<HashMap<Sha256, Arc<Flight>>>>,
    max_prefetches: usize,
    prefetching: Arc<AtomicUsize>,
    counters: Arc<Counters>,
}

impl Fetcher {
    /// Transfers from `endpoint` into `store`, within `cache`'s budget, with at most
    /// `max_prefetches` prefetches in flight.
    ///
    /// # Errors
    /// The runtime cannot start.
    pub fn new(
        store: Store,
        cache: Arc<Cache>,
        endpoint: Arc<dyn Origin>,
        max_prefetches: usize,
    ) -> Result<Fetcher, LazyError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tensorfs-fetch")
            .enable_all()
            .build()
            .map_err(LazyError::Runtime)?;
        Ok(Fetcher {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
            store,
            cache,
            endpoint,
            flights: Arc::default(),
            max_prefetches,
            prefetching: Arc::default(),
            counters: Arc::default(),
        })
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Arc<dyn Origin> {
        &self.endpoint
    }

    /// The store objects are admitted into.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The cache objects are admitted into.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// The transfers' runtime, for other work on the endpoint.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// What the transfers did so far.
    pub fn stats(&self) -> FetcherStats {
        let c = &self.counters;
        FetcherStats {
            objects: c.objects.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            received_bytes: c.received_bytes.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
        }
    }

    /// Makes every object of `objects` present in the store: the missing ones are fetched
    /// (joining flights already under way), all at once; blocks until they land.
    ///
    /// # Errors
    /// The first failure among them (after the deadline, or a final answer).
    pub fn ensure(&self, objects: &[ObjectRef]) -> Result<(), FetchFailed> {
        let flights: Vec<(&ObjectRef, Arc<Flight>)> = objects
            .iter()
            .filter(|o| !self.store.contains(o))
            .map(|o| (o, self.flight(o, false)))
            .collect();
        let mut first = Ok(());
        for (object, flight) in flights {
            let mut outcome = flight.wait();
            while let Outcome::Declined = outcome {
                outcome = self.flight(object, false).wait();
            }
            if let (Outcome::Failed(e), true) = (outcome, first.is_ok()) {
                first = Err(e);
            }
        }
        first
    }

    /// Starts fetching those of `objects` that are missing and not in flight, while fewer than
    /// the limit of prefetches are; returns at once.
    pub fn prefetch(&self, objects: &[ObjectRef]) {
        for object in objects {
            if self.prefetching.load(Ordering::Relaxed) >= self.max_prefetches {
                return;
            }
            if lock(&self.flights).contains_key(&object.sha256) || self.store.contains(object) {
                continue;
            }
            self.flight(object, true);
        }
    }

    /// The flight of `object`: one running or failed recently, else a new one.
    fn flight(&self, object: &ObjectRef, prefetch: bool) -> Arc<Flight> {
        let mut flights = lock(&self.flights);
        if let Some(flight) = flights.get(&object.sha256) {
            if flight.joinable() {
                return flight.clone();
            }
        }
        let flight = Arc::new(Flight {
            state: Mutex::new(None),
            done: Condvar::new(),
        });
        flights.insert(object.sha256, flight.clone());
        drop(flights);
        if prefetch {
            self.prefetching.fetch_add(1, Ordering::Relaxed);
        }
        let (store, cache, endpoint) = (
            self.store.clone(),
            self.cache.clone(),
            self.endpoint.clone(),
        );
        let (counters, prefetching) = (self.counters.clone(), self.prefetching.clone());
        let flights = self.flights.clone();
        let (object, running) = (*object, flight.clone());
        let task = async move {
            let received = |n: u64| {
                counters.received_bytes.fetch_add(n, Ordering::Relaxed);
            };
            let outcome = transfer(
                &store,
                &cache,
                endpoint.as_ref(),
                &object,
                prefetch,
                &received,
            )
            .await;
            match &outcome {
                Outcome::Landed => {
                    counters.objects.fetch_add(1, Ordering::Relaxed);
                    counters.bytes.fetch_add(object.length, Ordering::Relaxed);
                }
                Outcome::Declined => {}
                Outcome::Failed(e) => {
                    counters.failures.fetch_add(1, Ordering::Relaxed);
                    // The read that waits for it logs the failure; a prefetch's is quiet.
                    tracing::debug!("{e}");
                }
            }
            if prefetch {
                prefetching.fetch_sub(1, Ordering::Relaxed);
            }
            let answered = !matches!(outcome, Outcome::Failed(_));
            *lock(&running.state) = Some((outcome, Instant::now()));
            running.done.notify_all();
            // A success is the store's to answer from now on, a declined prefetch nobody's; a
            // failure stays for FAILURE_MEMORY, then the next reader starts afresh.
            if answered {
                let mut flights = lock(&flights);
                if flights
                    .get(&object.sha256)
                    .is_some_and(|f| Arc::ptr_eq(f, &running))
                {
                    flights.remove(&object.sha256);
                }
            }
        };
        self.handle.spawn(task);
        flight
    }
}

/// One object fetched and admitted under the collector's fence, within the cache's budget.
async fn transfer(
    store: &Store,
    cache: &Cache,
    endpoint: &dyn Origin,
    object: &ObjectRef,
    prefetch: bool,
    received: &(dyn Fn(u64) + Sync),
) -> Outcome {
    let failed = |cause: AdmitError| {
        Outcome::Failed(FetchFailed {
            object: *object,
            endpoint: endpoint.url().to_string(),
            cause: Arc::new(cause),
        })
    };
    if store.contains(object) {
        return Outcome::Landed;
    }
    // Room for it in the budget and above the disk's reserve, evicting cache first. A
    // prefetch without room is not made; a reader then fetches and meets the error itself.
    let room = match cache.room(object, prefetch).await {
        Ok(room) => room,
        Err(_) if prefetch => return Outcome::Declined,
        Err(NoRoom::Store(e)) => return failed(e.into()),
        Err(NoRoom::Prefetch) => return Outcome::Declined,
    };
    let _fence = match tokio::task::block_in_place(|| store.fence()) {
        Ok(fence) => fence,
        Err(e) => return failed(e.into()),
    };
    if store.contains(object) {
        return Outcome::Landed;
    }
    match admit(store, endpoint, object, received).await {
        Ok(()) => {
            room.landed(object);
            Outcome::Landed
        }
        Err(e) => failed(e),
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        let stats = self.stats();
        if stats.objects > 0 || stats.failures > 0 {
            tracing::info!(
                "fetched {} objects ({} bytes; {} bytes received) from {}; {} transfers failed",
                stats.objects,
                stats.bytes,
                stats.received_bytes,
                self.endpoint.url(),
                stats.failures
            );
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
