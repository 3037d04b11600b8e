//! Eviction from the cache by object, least recently read first: how a process that fetches
//! objects (a lazy mount, `download`) keeps them within a byte budget, or above the disk's
//! reserve, without waiting for their uses to expire.
//!
//! The **cache** is every object on disk that no durable root keeps (see the module above): no
//! `local/` repo's closure, no live `files/` record. An object another process holds is cache
//! when a use names it (a cached model another mount has open: it counts against a budget but
//! cannot go now) and not cache when no use does (an import's objects before its commit is
//! named: a write in flight). The evicting process's own holds do not count: they are its open
//! files (a lazy mount's), and it fetches again what it evicted from them. (`download` keeps a
//! budget with [`Collect::cache_budget`] instead, dropping whole uses, since what it downloads
//! must stay whole; it counts held cache the same way.)
//!
//! What may go: any cache object older than the grace, and a younger one the evicting process
//! wrote itself whose mtime is still the one it had when it landed (no other writer has reused
//! it since). Commit documents (a use's tree and that tree's header) stay while their use
//! does, so a mount can still list and open what it evicted the bytes of. A blob a reader holds
//! a shared `flock` on is skipped. Each object goes as a collection sweeps one: renamed into
//! `tmp/gc/`, its mtime checked again, then removed, under the collector's exclusive fence, so
//! no writer of either implementation interleaves.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

#[cfg(doc)]
use super::{Collect, GRACE};
use super::{Collected, Swept};
use crate::format::{ObjectRef, Sha256};
use crate::store::{Store, StoreResult};

/// An object of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheObject {
    /// The object.
    pub object: ObjectRef,
    /// Its blob's mtime.
    pub mtime: SystemTime,
    /// The last use of the most recently used use that names it (`None`: no use does).
    pub last_use: Option<SystemTime>,
    /// A commit's tree or that tree's header, which a mount needs to list the commit.
    pub document: bool,
    /// Another process holds it: it counts as cache but cannot go now.
    pub held: bool,
}

/// Settings of [`Store::evict`].
pub struct Evict<'a> {
    /// Bytes to free.
    pub need: u64,
    /// When the caller last read an object (ranks above the object's `last_use`).
    pub last_read: &'a dyn Fn(&Sha256) -> Option<SystemTime>,
    /// Objects the caller needs now, which stay (what its reads are reading).
    pub keep: &'a dyn Fn(&Sha256) -> bool,
    /// The mtime an object had when the caller wrote it, for objects the caller wrote.
    pub written: &'a dyn Fn(&Sha256) -> Option<SystemTime>,
    /// Called with each object just before it goes, to close the caller's descriptors of it
    /// (their shared locks would keep it).
    pub release: &'a dyn Fn(&Sha256),
    /// Objects younger than this are kept unless the caller wrote them: [`GRACE`].
    pub grace: Duration,
    /// The time to judge ages by.
    pub now: SystemTime,
}

/// What an eviction did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Another collection or a writer held the fence: nothing was done.
    pub skipped: bool,
    /// The cache's bytes before.
    pub cache_bytes: u64,
    /// The objects removed.
    pub removed: Vec<ObjectRef>,
    /// Their bytes.
    pub removed_bytes: u64,
    /// Objects skipped because a reader held them.
    pub busy: usize,
}

impl Store {
    /// The cache as a process evicting from its own holds sees it: every object on disk no
    /// durable root keeps and no other process holds as a write in flight, this process's
    /// holds not counted (see the module doc). Reads the records; changes nothing.
    ///
    /// # Errors
    /// As [`Store::collect`]'s reading of the records.
    pub fn cache_objects(&self) -> StoreResult<Vec<CacheObject>> {
        let mut report = Collected::default();
        let roots = self.roots(true, false, &mut report)?;
        let uses = self.uses()?;
        let objects = self.objects_on_disk()?;
        let by_digest: HashMap<Sha256, ObjectRef> =
            objects.iter().map(|(o, _)| (o.sha256, *o)).collect();
        // Every digest a use names, with the latest of those uses' last use.
        let mut last_use: HashMap<Sha256, SystemTime> = HashMap::new();
        let mut documents: HashSet<Sha256> = HashSet::new();
        for u in &uses {
            for d in u.keeps.iter().chain(std::iter::once(&u.name)) {
                let at = last_use.entry(*d).or_insert(u.mtime);
                *at = (*at).max(u.mtime);
            }
            // A use named by a commit: its tree and header are the commit's documents.
            if let Some(tree) = by_digest.get(&u.name).and_then(|t| self.tree(t).ok()) {
                documents.insert(u.name);
                documents.insert(tree.header().1.sha256);
            }
        }
        Ok(objects
            .into_iter()
            .filter(|(o, _)| roots.is_cache(&o.sha256, |d| last_use.contains_key(d)))
            .map(|(object, mtime)| CacheObject {
                object,
                mtime,
                last_use: last_use.get(&object.sha256).copied(),
                document: documents.contains(&object.sha256),
                held: roots.held.contains(&object.sha256),
            })
            .collect())
    }

    /// Evicts cache objects, least recently read first, until `need` bytes are freed or none
    /// may go (see the module doc); skips, changing nothing, while a collection or a writer
    /// holds the fence.
    ///
    /// # Errors
    /// Reading the records, or removing, fails.
    pub fn evict(&self, options: &Evict<'_>) -> StoreResult<Evicted> {
        let mut report = Evicted::default();
        let Some(_fence) = self.fence_exclusive()? else {
            report.skipped = true;
            return Ok(report);
        };
        let cutoff = super::cutoff(options.now, options.grace);
        let cache = self.cache_objects()?;
        report.cache_bytes = cache.iter().map(|c| c.object.length).sum();
        let mut candidates: Vec<(SystemTime, &CacheObject, Option<SystemTime>)> = cache
            .iter()
            .filter(|c| !c.document && !c.held)
            .filter_map(|c| {
                let written = (options.written)(&c.object.sha256).filter(|w| *w == c.mtime);
                if c.mtime >= cutoff && written.is_none() {
                    return None;
                }
                if (options.keep)(&c.object.sha256) {
                    return None;
                }
                let rank = (options.last_read)(&c.object.sha256)
                    .into_iter()
                    .chain(c.last_use)
                    .max()
                    .unwrap_or(c.mtime);
                Some((rank, c, written))
            })
            .collect();
        candidates.sort_by_key(|(rank, c, _)| (*rank, c.object.sha256));
        for (_, c, written) in candidates {
            if report.removed_bytes >= options.need {
                break;
            }
            (options.release)(&c.object.sha256);
            // Young again (reused by a writer) unless it still has the mtime it was written with.
            let young = |mtime: SystemTime| mtime >= cutoff && Some(mtime) != written;
            match self.sweep(&c.object, &young)? {
                Swept::Removed => {
                    report.removed.push(c.object);
                    report.removed_bytes += c.object.length;
                }
                Swept::Busy => report.busy += 1,
                Swept::Young => {}
            }
        }
        let _ = std::fs::remove_dir(self.root.join("tmp").join("gc"));
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::retention::GRACE;
    use std::collections::HashMap;
    use std::time::Duration;

    /// Least recently read first, until the need is met; kept: what the caller keeps, and what
    /// is young and not the caller's.
    #[test]
    fn eviction_takes_the_least_recently_read_and_spares_what_it_must() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s")).unwrap();
        let put = |n: u8| store.put_bytes(&[n; 1000]).unwrap();
        let (a, b, c, d, e) = (put(1), put(2), put(3), put(4), put(5));
        let now = SystemTime::now();
        let old = now - GRACE * 2;
        for o in [a, b, c] {
            std::fs::File::open(store.object_path(&o))
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        let mtime = |o: &ObjectRef| {
            std::fs::metadata(store.object_path(o))
                .unwrap()
                .modified()
                .unwrap()
        };
        // d: young, fetched by the caller and unchanged since; e: young, another writer's.
        let written: HashMap<Sha256, SystemTime> = [(d.sha256, mtime(&d))].into();
        let read: HashMap<Sha256, SystemTime> = [
            (a.sha256, now - Duration::from_secs(30)),
            (b.sha256, now - Duration::from_secs(60)),
            (c.sha256, now - Duration::from_secs(90)),
            (d.sha256, now - Duration::from_secs(120)),
        ]
        .into();
        let released = std::sync::Mutex::new(Vec::new());
        let evict = |need: u64, keep: &dyn Fn(&Sha256) -> bool| {
            store
                .evict(&Evict {
                    need,
                    last_read: &|s| read.get(s).copied(),
                    keep,
                    written: &|s| written.get(s).copied(),
                    release: &|s| released.lock().unwrap().push(*s),
                    grace: GRACE,
                    now,
                })
                .unwrap()
        };
        // Two objects' worth, c kept: d (read longest ago, the caller's), then b.
        let first = evict(2000, &|s| *s == c.sha256);
        assert_eq!(first.cache_bytes, 5000);
        assert_eq!(first.removed, [d, b]);
        assert_eq!(*released.lock().unwrap(), [d.sha256, b.sha256]);
        // Everything: e (young, not the caller's) stays.
        let all = evict(u64::MAX, &|_| false);
        assert_eq!(all.removed, [c, a]);
        assert!(store.contains(&e));
        let left = store.cache_objects().unwrap();
        assert_eq!(left.len(), 1, "{left:?}");
    }
}
