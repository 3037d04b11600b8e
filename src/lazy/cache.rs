//! [`Cache`]: what a lazy mount fetched, kept within its budget and above the disk's reserve.
//!
//! The budget counts the store's whole cache (every object no durable root keeps, what other
//! mounts hold open included, see [`crate::store::retention`]), whoever fetched it, so `du`
//! and the budget agree. A transfer
//! counts its bytes against the budget and the disk's reserve before it lands. One that does
//! not fit, if it is a reader's, waits until this mount's other transfers have landed, then
//! evicts cache objects least recently read first ([`Store::evict`]: this mount's reads rank
//! them, then their uses' times), freeing room for one more object of its size so the next
//! prefetch fits; a prefetch that does not fit is not made (its reader fetches when it reads).
//! Evicted objects an open file reads again are fetched again. Commit documents are never
//! evicted here (the mount lists from them), nor the objects reads are reading now
//! ([`Cache::pin`]: a read across two chunks never evicts one for the other). What cannot go
//! (those, what another process holds, what is younger than the grace and was not fetched
//! here) is left, and the reader's fetch goes over the budget (logged once) rather than fail.
//! The disk's reserve is never crossed: when evicting does not make room, the store's
//! collection runs, then the fetch fails with the store's "no space" error.
//!
//! Locks: `state` only to read or change the counts, never while evicting. Transfers admit
//! under the shared side of `gate`; an eviction takes it exclusively (then nothing of this
//! mount is reserved or being written), so this mount's own transfers never keep it from the
//! store's exclusive fence (`flock` favours no one).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::format::{ObjectRef, Sha256};
use crate::store::retention::{patiently, shortfall, Evict, GRACE};
use crate::store::{Capacity, Store, StoreError};
use crate::sync::lock;
use tokio::sync::{RwLock, RwLockReadGuard};

/// How long an eviction asks again for the store's fence before the reader's fetch goes over
/// the budget: a reader waits on it.
const FENCE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// Why a transfer gets no room.
#[derive(Debug, thiserror::Error)]
pub enum NoRoom {
    /// A prefetch would go over the budget, or under the disk's reserve: it is not made.
    #[error("a prefetch over the cache's budget")]
    Prefetch,
    /// The disk's reserve, or reading the store's records.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the cache holds and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// The cache's bytes on disk (at the last scan, plus what landed since).
    pub used_bytes: u64,
    /// The budget (`None`: bounded only by the disk's reserve).
    pub budget_bytes: Option<u64>,
    /// The most `used_bytes` was.
    pub peak_bytes: u64,
    /// Objects evicted.
    pub evicted: u64,
    /// Their bytes.
    pub evicted_bytes: u64,
}

#[derive(Debug, Default)]
struct State {
    used: u64,
    /// Bytes of transfers under way, counted before they land.
    reserved: u64,
    peak: u64,
    /// When this mount last read each object.
    read: HashMap<Sha256, SystemTime>,
    /// Objects reads are reading now, with how many.
    pinned: HashMap<Sha256, usize>,
    /// The mtime each object fetched here had when it landed.
    written: HashMap<Sha256, SystemTime>,
    /// Whether going over the budget was logged.
    warned: bool,
}

/// A lazy mount's cache of fetched objects (see the module doc).
pub struct Cache {
    store: Store,
    budget: Option<u64>,
    /// Closes this mount's descriptors of an object about to be evicted.
    release: Box<dyn Fn(&Sha256) + Send + Sync>,
    state: Mutex<State>,
    gate: RwLock<()>,
    evicted: AtomicU64,
    evicted_bytes: AtomicU64,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("store", &self.store.root())
            .field("stats", &self.stats())
            .finish()
    }
}

/// Room made for one transfer: its bytes count against the budget until it lands or fails.
/// Holds the shared side of the cache's gate.
pub struct Room<'a> {
    cache: &'a Cache,
    length: u64,
    _gate: RwLockReadGuard<'a, ()>,
}

impl Cache {
    /// The cache of `store` with `budget` bytes at most (`None`: the disk's reserve alone),
    /// scanning the store for what its cache holds now; `release` closes the caller's
    /// descriptors of an object about to be evicted.
    ///
    /// # Errors
    /// The store's records cannot be read.
    pub fn new(
        store: Store,
        budget: Option<u64>,
        release: Box<dyn Fn(&Sha256) + Send + Sync>,
    ) -> Result<Cache, StoreError> {
        let used = store.cache_objects()?.iter().map(|c| c.object.length).sum();
        let cache = Cache {
            store,
            budget,
            release,
            state: Mutex::new(State {
                used,
                peak: used,
                ..State::default()
            }),
            gate: RwLock::default(),
            evicted: AtomicU64::new(0),
            evicted_bytes: AtomicU64::new(0),
        };
        // A store left over the budget (a smaller budget than the last mount's, downloads
        // since) is brought within it now, not only at the first fetch.
        if let Some(over) = budget.and_then(|b| used.checked_sub(b)).filter(|o| *o > 0) {
            cache.evict(over)?;
        }
        Ok(cache)
    }

    /// What the cache holds and did.
    pub fn stats(&self) -> CacheStats {
        let state = lock(&self.state);
        CacheStats {
            used_bytes: state.used,
            budget_bytes: self.budget,
            peak_bytes: state.peak,
            evicted: self.evicted.load(Ordering::Relaxed),
            evicted_bytes: self.evicted_bytes.load(Ordering::Relaxed),
        }
    }

    /// Notes that `objects` are read now (their rank for eviction), and keeps them from
    /// eviction until the returned pin drops: a read that needs two objects never evicts one
    /// for the other.
    pub fn pin<'a>(&'a self, objects: &'a [ObjectRef]) -> Pin<'a> {
        let now = SystemTime::now();
        let mut state = lock(&self.state);
        for object in objects {
            state.read.insert(object.sha256, now);
            *state.pinned.entry(object.sha256).or_default() += 1;
        }
        Pin {
            cache: self,
            objects,
        }
    }

    /// Room for `object` in the budget and above the disk's reserve (see the module doc). A
    /// reader's transfer that does not fit waits for this mount's other transfers to land,
    /// then evicts; a prefetch that does not fit is not made. Call it on a multi-threaded
    /// runtime (the store's work blocks in place), before taking the store's fence.
    ///
    /// # Errors
    /// [`NoRoom::Prefetch`] for a prefetch that does not fit; the store's
    /// [`StoreError::NoSpace`] when the disk's reserve would be crossed; reading the store's
    /// records fails.
    pub async fn room(&self, object: &ObjectRef, prefetch: bool) -> Result<Room<'_>, NoRoom> {
        let length = object.length;
        {
            let shared = self.gate.read().await;
            let capacity = tokio::task::block_in_place(|| self.capacity())?;
            let mut state = lock(&self.state);
            let (budget, disk) = self.need(&state, &capacity, length);
            if budget == 0 && disk == 0 {
                state.reserved += length;
                return Ok(self.reserved(length, shared));
            }
        }
        if prefetch {
            return Err(NoRoom::Prefetch);
        }
        // Alone: no transfer of this mount is in flight, so nothing is reserved.
        let alone = self.gate.write().await;
        tokio::task::block_in_place(|| self.make_room(length))?;
        let mut state = lock(&self.state);
        if self.over_budget(&state, length) > 0 && !std::mem::replace(&mut state.warned, true) {
            tracing::warn!(
                "the cache of {} is over its budget of {} bytes: what it holds is being read, \
                 held by another process or younger than the grace and not fetched here; it is \
                 evicted once it can be (logged once)",
                self.store.root().display(),
                self.budget.unwrap_or(0)
            );
        }
        state.reserved += length;
        drop(state);
        Ok(self.reserved(length, alone.downgrade()))
    }

    fn reserved<'a>(&'a self, length: u64, gate: RwLockReadGuard<'a, ()>) -> Room<'a> {
        Room {
            cache: self,
            length,
            _gate: gate,
        }
    }

    fn over_budget(&self, state: &State, length: u64) -> u64 {
        match self.budget {
            Some(budget) => (state.used + state.reserved + length).saturating_sub(budget),
            None => 0,
        }
    }

    fn capacity(&self) -> Result<Capacity, StoreError> {
        let root = self.store.root();
        Capacity::of(root).map_err(crate::store::io_err("statvfs", root))
    }

    /// Bytes to free before `length` more fit: over the budget, and under the disk's reserve.
    fn need(&self, state: &State, capacity: &Capacity, length: u64) -> (u64, u64) {
        (
            self.over_budget(state, length),
            shortfall(capacity, state.reserved + length),
        )
    }

    /// Evicts what `length` more bytes need (for the budget, room for one more such object
    /// too, so the next prefetch fits), then runs the store's own rule for the reserve; with
    /// the gate's exclusive side held.
    fn make_room(&self, length: u64) -> Result<(), StoreError> {
        let capacity = self.capacity()?;
        let need = {
            let state = lock(&self.state);
            let (budget, disk) = self.need(&state, &capacity, length);
            let slack = if budget > 0 { length } else { 0 };
            (budget + slack).max(disk)
        };
        if need > 0 {
            self.evict(need)?;
        }
        // The disk's reserve is the store's rule: its collection, then "no space".
        self.store.make_room(length)
    }

    /// Evicts `need` bytes of cache objects, least recently read first, or what may go of them.
    fn evict(&self, need: u64) -> Result<(), StoreError> {
        let (read, written) = {
            let state = lock(&self.state);
            (state.read.clone(), state.written.clone())
        };
        let evict = || {
            self.store.evict(&Evict {
                need,
                last_read: &|d| read.get(d).copied(),
                // Pinned now, not at the snapshot: a read that started since keeps its objects.
                keep: &|d| lock(&self.state).pinned.contains_key(d),
                written: &|d| written.get(d).copied(),
                release: &*self.release,
                grace: GRACE,
                now: SystemTime::now(),
            })
        };
        let evicted = patiently(FENCE_PATIENCE, evict)?;
        if !evicted.skipped {
            let mut state = lock(&self.state);
            state.used = evicted.cache_bytes - evicted.removed_bytes;
            for object in &evicted.removed {
                state.read.remove(&object.sha256);
                state.written.remove(&object.sha256);
            }
            drop(state);
            self.evicted
                .fetch_add(evicted.removed.len() as u64, Ordering::Relaxed);
            self.evicted_bytes
                .fetch_add(evicted.removed_bytes, Ordering::Relaxed);
            if !evicted.removed.is_empty() {
                tracing::debug!(
                    "evicted {} objects ({} bytes) from the cache",
                    evicted.removed.len(),
                    evicted.removed_bytes
                );
            }
        }
        Ok(())
    }
}

/// Objects a read is reading, kept from eviction while it lives.
pub struct Pin<'a> {
    cache: &'a Cache,
    objects: &'a [ObjectRef],
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        self.cache.unpin(self.objects);
    }
}

/// Objects a reader outside the mount reads (the extents ioctl's ABI 2), kept from eviction
/// until dropped: [`Cache::pin`] for as long as a file stays open.
pub struct Kept {
    cache: Arc<Cache>,
    objects: Vec<ObjectRef>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.cache.unpin(&self.objects);
    }
}

impl Cache {
    /// [`Cache::pin`], owning its objects and the cache.
    pub fn keep(self: &Arc<Cache>, objects: Vec<ObjectRef>) -> Kept {
        std::mem::forget(self.pin(&objects));
        Kept {
            cache: self.clone(),
            objects,
        }
    }

    fn unpin(&self, objects: &[ObjectRef]) {
        let mut state = lock(&self.state);
        for object in objects {
            if let Some(count) = state.pinned.get_mut(&object.sha256) {
                *count -= 1;
                if *count == 0 {
                    state.pinned.remove(&object.sha256);
                }
            }
        }
    }
}

impl Room<'_> {
    /// The object landed in the store: its bytes count as the cache's, and its mtime is noted
    /// (while it keeps it, no other writer reused it, and it may be evicted young).
    pub fn landed(self, object: &ObjectRef) {
        let mtime = std::fs::metadata(self.cache.store.object_path(object))
            .and_then(|m| m.modified())
            .ok();
        let mut state = lock(&self.cache.state);
        if let Some(mtime) = mtime {
            state.written.insert(object.sha256, mtime);
            state.read.insert(object.sha256, SystemTime::now());
        }
        state.used += self.length;
        state.peak = state.peak.max(state.used + state.reserved - self.length);
        // `Drop` takes the reservation back.
    }
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.cache.state);
        state.reserved -= self.length;
    }
}
