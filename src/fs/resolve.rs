//! How the namespace resolves names to refs and commits: the refs snapshot (re-read when it
//! changed), commits' lane labels, lane views, and the rate-limited log of commits and files
//! that cannot be served.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::catalog::CommitLane;
use super::lanes::Lane;
use super::namespace::Snapshot;
use super::{
    CommitError, FsError, FsResult, LaneRef, TensorFs, DECODED_SUFFIX, DIFFUSERS_SUFFIX,
    SINGLE_SUFFIX,
};
use crate::format::ObjectRef;
use crate::layout::Face;
use crate::revisions;
use crate::sync::{lock, read, write};

/// How long an error about one commit or file is not logged again.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// What a read or lookup that fails does, for error logs.
pub(super) const ANSWERED: &str = "answering EIO";

/// What the repair of a damaged store is, for error logs.
const REPAIR: &str = "; run `tensorfs verify --repair` to remove damaged blobs, then import or \
                      download the model again";

impl TensorFs {
    /// The current refs, re-read first when the check interval passed and they changed.
    pub(super) fn snapshot(&self) -> FsResult<Arc<Snapshot>> {
        {
            let mut state = lock(&self.refresh);
            let due = state
                .checked
                .is_none_or(|at| at.elapsed() >= self.config.refs_check_interval);
            if due {
                state.checked = Some(Instant::now());
                let signature = self.catalog.refs_signature().map_err(FsError::Refs)?;
                if state.signature != Some(signature) {
                    let repos = self.catalog.repos().map_err(FsError::Refs)?;
                    let records = self.catalog.hub_records().map_err(FsError::Refs)?;
                    *write(&self.snapshot) = Arc::new(Snapshot::new(repos, records));
                    state.signature = Some(signature);
                }
            }
        }
        Ok(read(&self.snapshot).clone())
    }

    /// The lane folders of revision `rev` of repo `org/name`, each lane with encoded tensors
    /// followed by its decoded view (`<lane>@decoded`), each single-file checkpoint's by its
    /// Diffusers folder (`<lane>@diffusers`), and each Diffusers pipeline a converter writes as
    /// one file by that file (`<lane>@single`); `None` when there is no such repo or revision
    /// (any more).
    pub(super) fn revision_lanes(
        &self,
        org: &str,
        name: &str,
        rev: &str,
    ) -> FsResult<Option<Vec<(String, LaneRef)>>> {
        let snapshot = self.snapshot()?;
        let Some(entry) = snapshot.repo(org, name) else {
            return Ok(None);
        };
        let Some(revision) = revisions::revision(&entry.repo, rev) else {
            return Ok(None);
        };
        let lanes = revisions::lanes(&entry.repo, revision, |c| {
            self.commit_lane(c).map(|l| l.lane)
        })?;
        let mut out = Vec::with_capacity(lanes.len());
        for (name, commit) in lanes {
            let lane = self.commit_lane(&commit)?;
            let face = |face| LaneRef { commit, face };
            out.push((name.clone(), face(Face::AsImported)));
            if lane.encoded {
                out.push((format!("{name}{DECODED_SUFFIX}"), face(Face::Decoded)));
            }
            if lane.single_file {
                out.push((format!("{name}{DIFFUSERS_SUFFIX}"), face(Face::Diffusers)));
            }
            if lane.single_face {
                out.push((format!("{name}{SINGLE_SUFFIX}"), face(Face::Single)));
            }
        }
        Ok(Some(out))
    }

    /// The lane label and parents of `commit`, cached; an error is logged as answered EIO.
    pub(super) fn commit_lane(&self, commit: &ObjectRef) -> FsResult<CommitLane> {
        self.try_commit_lane(commit)
            .map_err(|source| self.commit_error(commit, source, ANSWERED))
    }

    /// [`Self::commit_lane`] without logging, for a caller that says what the error leads to.
    pub(super) fn try_commit_lane(&self, commit: &ObjectRef) -> Result<CommitLane, CommitError> {
        if let Some(lane) = lock(&self.commit_lanes).get(&commit.sha256) {
            return Ok(lane.clone());
        }
        let lane = self.catalog.commit_lane(commit)?;
        lock(&self.commit_lanes).insert(commit.sha256, lane.clone());
        Ok(lane)
    }

    /// The view of `lane`, cached; an error is logged as answered EIO.
    pub(super) fn lane(&self, lane: &LaneRef) -> FsResult<Arc<Lane>> {
        self.try_lane(lane)
            .map_err(|source| self.commit_error(&lane.commit, source, ANSWERED))
    }

    /// [`Self::lane`] without logging, for a caller that says what the error leads to.
    pub(super) fn try_lane(&self, lane: &LaneRef) -> Result<Arc<Lane>, CommitError> {
        self.lanes.get_or_build(lane, || self.catalog.lane(lane))
    }

    /// The error of `commit`, logged (rate-limited) with what it led to: `consequence`.
    pub(super) fn commit_error(
        &self,
        commit: &ObjectRef,
        source: CommitError,
        consequence: &str,
    ) -> FsError {
        let err = FsError::Commit {
            commit: commit.id(),
            source,
        };
        self.report(commit.id(), &err, consequence);
        err
    }

    /// Logs `err` once per [`REPORT_EVERY`] for `key`, so a reader retrying a broken file
    /// does not flood the log.
    pub(super) fn report(&self, key: String, err: &FsError, consequence: &str) {
        let mut reported = lock(&self.reported);
        let now = Instant::now();
        if reported
            .get(&key)
            .is_some_and(|at| now.duration_since(*at) < REPORT_EVERY)
        {
            return;
        }
        reported.insert(key, now);
        // A damaged blob's error already says how to repair it: advise once per line. A missing
        // blob has nothing to remove: it is imported or downloaded again.
        let text = err.to_string();
        let advice = match err.is_local_damage() && !text.contains("verify --repair") {
            false => "",
            true if err.is_missing_object() => "; import or download the model again",
            true => REPAIR,
        };
        tracing::error!(errno = err.errno(), "{text}; {consequence}{advice}");
    }
}
