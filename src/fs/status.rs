//! What a running mount says of itself: the `user.tensorfs.status` attribute of its root, a
//! JSON object that `tensorfs status` reads (documented in `docs/cli.md`, "status").
//!
//! The daemon answers it from memory on each `getxattr`, so it is never stale and needs no
//! file or socket of its own: whoever may look at the mount may read it, and a mount whose
//! daemon is gone answers `ENOTCONN`, as every other request does. Counters start at zero
//! when the mount does; reads the kernel serves from its page cache or passes through to a
//! view never reach the daemon and are not counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::TensorFs;
use crate::sync::lock;

/// The attribute of the mount's root holding its status.
pub const STATUS: &str = "user.tensorfs.status";

/// Requests the daemon answered, and what its reads served.
#[derive(Debug, Default)]
pub(super) struct Counters {
    requests: AtomicU64,
    reads: AtomicU64,
    bytes_served: AtomicU64,
    read_errors: AtomicU64,
    opens: AtomicU64,
}

impl Counters {
    pub(super) fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn open(&self) {
        self.opens.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn read(&self, result: Result<usize, ()>) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(n) => self.bytes_served.fetch_add(n as u64, Ordering::Relaxed),
            Err(()) => self.read_errors.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// What a layer above adds to the status (the daemon's pid, the mount point, an endpoint's
/// transfers and cache): an object whose fields are merged in.
pub type StatusExtra = Box<dyn Fn() -> Map<String, Value> + Send + Sync>;

impl TensorFs {
    /// Adds `extra`'s fields to every status (set once, by whoever mounts this namespace).
    pub fn set_status_extra(&self, extra: StatusExtra) {
        let _ = self.status_extra.set(extra);
    }

    /// Records the FUSE protocol version (major, minor) the kernel offered at `INIT`, which the
    /// status reports as `fuse_protocol` (`"7.45"`).
    pub fn set_protocol(&self, major: u32, minor: u32) {
        let _ = self.protocol.set((major, minor));
    }

    /// The mount's status: `store`, `started` and `uptime_s` (seconds), `requests`, `reads`,
    /// `bytes_served`, `read_errors`, `opens`, `open_files`, `holds` (`commits`, `objects`:
    /// what open files keep from collections), `blobs` (`proven`, `hashed`, `damaged`), `views`
    /// (`count`, `bytes`, `budget_bytes`; null without views), `fuse_protocol` (the kernel's
    /// FUSE protocol version, `"7.45"`), then the extra fields.
    pub fn status(&self) -> Value {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (commits, objects) = {
            let retained = lock(&self.retained);
            let objects: usize = retained
                .values()
                .filter_map(|(_, hold)| hold.as_ref())
                .map(|hold| hold.digests().count())
                .sum();
            (retained.len(), objects)
        };
        let started = self
            .mounted_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let uptime = SystemTime::now()
            .duration_since(self.mounted_at)
            .map_or(0, |d| d.as_secs());
        let views = self.views.as_ref().map(|views| {
            let (count, bytes) = views.usage();
            let (building, building_bytes) = views.building();
            json!({"count": count, "bytes": bytes, "budget_bytes": views.config().capacity_bytes,
                   "building": building, "building_bytes": building_bytes})
        });
        let mut status = json!({
            "store": self.catalog.store_root(),
            "started": started,
            "uptime_s": uptime,
            "requests": get(&c.requests),
            "reads": get(&c.reads),
            "bytes_served": get(&c.bytes_served),
            "read_errors": get(&c.read_errors),
            "opens": get(&c.opens),
            "open_files": self.open_files(),
            "holds": {"commits": commits, "objects": objects},
            "blobs": self.objects.stats(),
            "views": views,
            "fuse_protocol": self.protocol.get().map(|(major, minor)| format!("{major}.{minor}")),
        });
        if let (Some(extra), Value::Object(fields)) = (self.status_extra.get(), &mut status) {
            fields.extend(extra());
        }
        status
    }
}
