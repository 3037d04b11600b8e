//! The upper levels: orgs and repos from a snapshot of the refs. What each revision folder
//! holds is [`crate::revisions`]'s, shared with the command line.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::hub::HubRepo;
use super::RepoEntry;
use crate::store::hub::HubRecord;

/// The repos of one org.
#[derive(Debug)]
pub struct Org {
    /// The newest ref mtime among its repos (the org folder's mtime).
    pub mtime: SystemTime,
    /// Repos by the second part of their name.
    pub repos: BTreeMap<String, Arc<RepoEntry>>,
}

/// The refs and hub records as read at one moment.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Orgs by name (the first part of repo names, in the documents' spelling).
    pub orgs: BTreeMap<String, Org>,
    /// The hub cache view's repo folders by name ([`super::hub`]).
    pub hub: BTreeMap<String, Arc<HubRepo>>,
}

impl Snapshot {
    /// Groups `repos` by org and lays out the hub view from them and `records`. A name that is
    /// not `<org>/<name>` is skipped with a warning.
    pub fn new(repos: Vec<RepoEntry>, records: Vec<HubRecord>) -> Snapshot {
        let mut orgs: BTreeMap<String, Org> = BTreeMap::new();
        let mut shown = Vec::with_capacity(repos.len());
        for entry in repos {
            let Ok((org, name)) = crate::format::names::split_repo_name(&entry.repo.name) else {
                tracing::warn!("skipping repo {:?}: not <org>/<name>", entry.repo.name);
                continue;
            };
            let (org, name) = (org.to_owned(), name.to_owned());
            let folder = orgs.entry(org).or_insert_with(|| Org {
                mtime: UNIX_EPOCH,
                repos: BTreeMap::new(),
            });
            folder.mtime = folder.mtime.max(entry.mtime);
            let entry = Arc::new(entry);
            folder.repos.insert(name, entry.clone());
            shown.push(entry);
        }
        let hub = super::hub::repo_folders(&shown, records);
        Snapshot { orgs, hub }
    }

    /// The repo `org/name`.
    pub fn repo(&self, org: &str, name: &str) -> Option<&Arc<RepoEntry>> {
        self.orgs.get(org)?.repos.get(name)
    }
}
