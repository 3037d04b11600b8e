//! Which objects anonymous callers may read when the server has a token: the closures of
//! released commits (distribution.md §2, §5; cozytensors.md §7).
//!
//! The set grows as releases appear: a lookup that misses rescans the repo documents (at most
//! once per [`RESCAN_AFTER`]) and adds the closure of each released commit not seen before.
//! Releases are public for good (§4), so nothing is ever taken out.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::format::{ObjectRef, Sha256};
use crate::store::Store;

/// The least time between two rescans of the repo documents.
pub const RESCAN_AFTER: Duration = Duration::from_secs(1);

/// Objects of released commits, found so far.
#[derive(Debug, Default)]
pub struct Visibility {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    public: HashSet<Sha256>,
    /// Released commits whose whole closure is in `public`.
    closed: HashSet<ObjectRef>,
    scanned: Option<Instant>,
}

impl Visibility {
    /// Whether a release reaches `object` (reads the store; call from a blocking thread).
    pub fn is_public(&self, store: &Store, object: &Sha256) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.public.contains(object) {
            return true;
        }
        if state.scanned.is_some_and(|at| at.elapsed() < RESCAN_AFTER) {
            return false;
        }
        state.scanned = Some(Instant::now());
        let repos = match store.repos() {
            Ok(repos) => repos,
            Err(e) => {
                tracing::warn!("listing repos: {e}");
                return false;
            }
        };
        for repo in repos.iter().filter(|r| !crate::remote::is_local(&r.name)) {
            for commit in repo.releases.iter().flat_map(|r| r.lanes.values()) {
                if state.closed.contains(commit) {
                    continue;
                }
                match closure(store, commit) {
                    Ok(objects) => {
                        state.public.extend(objects);
                        state.closed.insert(*commit);
                    }
                    // Not whole here yet: tried again at the next rescan.
                    Err(e) => tracing::debug!("release of {}: {e}", repo.name),
                }
            }
        }
        state.public.contains(object)
    }
}

/// The digests of commit `commit`'s closure: the tree, its files, its header and what the
/// header cites.
fn closure(store: &Store, commit: &ObjectRef) -> crate::store::StoreResult<Vec<Sha256>> {
    let read = store.commit(commit)?;
    let mut out = vec![commit.sha256, read.header_ref.sha256];
    out.extend(read.tree.repo_files().map(|(_, o)| o.sha256));
    out.extend(read.header.objects().map(|o| o.sha256));
    Ok(out)
}
