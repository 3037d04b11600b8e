//! Refs: `refs/<org>/<name>.json`, one `cozytensors.repo/1` document per model.
//!
//! A ref changes under an exclusive `flock` on the `refs/` directory, by a temp file and a
//! rename, so readers see the old document or the new. While publishing, a shared `flock` on
//! `holds/gc.lock` keeps the reference's collector (which takes it exclusively) from sweeping
//! objects between their admission and the ref that names them.
//!
//! File names fold ASCII case; a segment other than ASCII letters, digits, `.`, `_` and `-`
//! (or one starting with `.`, ending with `.`, longer than 128 bytes, or a device name such as
//! `con`) is `%` and the SHA-256 of the folded segment (distribution.md §1).

use std::fs::{self, File};
use std::io;
use std::path::PathBuf;

use super::objects::replace_file;
use super::{io_err, Store, StoreError, StoreResult};
use crate::format::names::{is_portable, split_repo_name};
use crate::format::{Repo, Sha256};

/// A held `flock`, released on drop.
#[derive(Debug)]
pub struct Lock(#[allow(dead_code)] pub(super) File);

fn ref_segment(segment: &str) -> String {
    let folded = segment.to_ascii_lowercase();
    let stem = folded.split('.').next().unwrap_or("");
    let device = matches!(stem, "con" | "prn" | "aux" | "nul")
        || (stem.len() == 4
            && (stem.starts_with("com") || stem.starts_with("lpt"))
            && matches!(stem.as_bytes()[3], b'1'..=b'9'));
    if is_portable(&folded) && !folded.ends_with('.') && !device {
        folded
    } else {
        format!("%{}", Sha256::of(folded.as_bytes()))
    }
}

/// Where the repo document of `name` (`org/name`) lives under a store or static origin:
/// `refs/<org>/<name>.json`, each segment folded or hashed (distribution.md §1).
///
/// # Errors
/// `name` is not `<org>/<name>` with two segments.
pub fn ref_key(name: &str) -> StoreResult<String> {
    let (org, model) = split_repo_name(name).map_err(|e| StoreError::Ref(e.to_string()))?;
    Ok(format!(
        "refs/{}/{}.json",
        ref_segment(org),
        ref_segment(model)
    ))
}

impl Store {
    /// The ref file of repo `name` (`org/name`).
    ///
    /// # Errors
    /// `name` is not `<org>/<name>` with two segments.
    pub fn ref_path(&self, name: &str) -> StoreResult<PathBuf> {
        Ok(self.root.join(ref_key(name)?))
    }

    /// Takes the shared side of the collector's fence (`holds/gc.lock`): while held, the
    /// reference's GC does not run.
    ///
    /// # Errors
    /// The lock file cannot be opened or locked.
    pub fn fence(&self) -> StoreResult<Lock> {
        let (path, file) = self.fence_file()?;
        file.lock_shared().map_err(io_err("lock", &path))?;
        Ok(Lock(file))
    }

    /// [`Store::fence`] without waiting: `None` while a collection holds the fence.
    ///
    /// # Errors
    /// The lock file cannot be opened or locked.
    pub fn try_fence(&self) -> StoreResult<Option<Lock>> {
        let (path, file) = self.fence_file()?;
        match file.try_lock_shared() {
            Ok(()) => Ok(Some(Lock(file))),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(io_err("lock", &path)(e)),
        }
    }

    /// `holds/gc.lock`, opened (created empty when absent, never truncated), unlocked.
    ///
    /// # Errors
    /// It cannot be opened.
    pub(super) fn fence_file(&self) -> StoreResult<(PathBuf, File)> {
        let path = self.root.join("holds").join("gc.lock");
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err("open", &path))?;
        Ok((path, file))
    }

    /// The repo document of `name`, if the store has one.
    ///
    /// # Errors
    /// The ref exists but cannot be read, is malformed, or names another repo.
    pub fn repo(&self, name: &str) -> StoreResult<Option<Repo>> {
        let path = self.ref_path(name)?;
        let repo = read_ref(&path)?;
        if let Some(repo) = &repo {
            if !repo.name.eq_ignore_ascii_case(name) {
                return Err(StoreError::Ref(format!(
                    "{}: names repo {:?}, not {name:?}",
                    path.display(),
                    repo.name
                )));
            }
        }
        Ok(repo)
    }

    /// Every repo document in the store, sorted by name. A malformed ref is skipped with a
    /// warning, so one bad file does not hide the others.
    ///
    /// # Errors
    /// `refs/` cannot be listed.
    pub fn repos(&self) -> StoreResult<Vec<Repo>> {
        let mut repos = Vec::new();
        for path in self.ref_files()? {
            match read_ref(&path) {
                Ok(Some(repo)) => repos.push(repo),
                Ok(None) => {}
                Err(e) => tracing::warn!("skipping ref: {e}"),
            }
        }
        repos.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(repos)
    }

    /// Every ref file, `refs/<org>/<name>.json`.
    ///
    /// # Errors
    /// `refs/` or an org folder cannot be listed.
    pub(super) fn ref_files(&self) -> StoreResult<Vec<PathBuf>> {
        let dir = self.root.join("refs");
        let mut out = Vec::new();
        for org in fs::read_dir(&dir).map_err(io_err("list", &dir))? {
            let org = org.map_err(io_err("list", &dir))?.path();
            if !org.is_dir() {
                continue;
            }
            for entry in fs::read_dir(&org).map_err(io_err("list", &org))? {
                let path = entry.map_err(io_err("list", &org))?.path();
                if path.extension().is_some_and(|e| e == "json") {
                    out.push(path);
                }
            }
        }
        Ok(out)
    }

    /// Changes the ref of `name` to what `change` makes of the current document (`None` when
    /// there is none), under the refs lock and the collector's fence. Every object the new
    /// document names must already be in the store and durable: this syncs the filesystem
    /// before the ref is written.
    ///
    /// # Errors
    /// Locking, reading or writing the ref fails, or `change` returns a repo of another name.
    pub fn update_repo(
        &self,
        name: &str,
        change: impl FnOnce(Option<Repo>) -> Repo,
    ) -> StoreResult<Repo> {
        let path = self.ref_path(name)?;
        let _fence = self.fence()?;
        let refs = self.root.join("refs");
        let lock = File::open(&refs).map_err(io_err("open", &refs))?;
        lock.lock().map_err(io_err("lock", &refs))?;
        let old = self.repo(name)?;
        let named: std::collections::HashSet<Sha256> = old
            .iter()
            .flat_map(|r| r.roots().map(|c| c.sha256))
            .collect();
        let new = change(old);
        if !new.name.eq_ignore_ascii_case(name) {
            return Err(StoreError::Ref(format!(
                "repo {:?} cannot be written as ref {name:?}",
                new.name
            )));
        }
        // Each newly named commit gets its use first, as the reference's writers do: outside
        // `local/` a use is all that keeps a commit (a download, a lazy mount's fetch).
        for commit in new.roots().filter(|c| !named.contains(&c.sha256)) {
            if let Err(e) = self.record_commit_use(commit) {
                tracing::warn!("no use recorded for commit {} of {name}: {e}", commit.id());
            }
        }
        self.sync()?;
        let parent = path.parent().expect("ref paths have parents");
        fs::create_dir_all(parent).map_err(io_err("create", parent))?;
        replace_file(&self.root.join("tmp"), &path, &new.to_json(), 0o644)?;
        Ok(new)
    }
}

impl Store {
    /// Takes commits out of repo `name`: `change` makes the new document of the current one
    /// (`None`: remove the ref) or refuses with a reason, under the refs lock and the fence.
    /// The hub record drops the commits the repo no longer names (all of it with the ref).
    /// Only unreferences: objects stay until a collection finds nothing else keeps them.
    /// Returns the document before and after; `Ok(None)` when there is no such repo.
    ///
    /// # Errors
    /// `name` is not `org/name`, `change` refused (`StoreError::Ref` with its reason), or
    /// reading or writing fails.
    pub fn edit_repo(
        &self,
        name: &str,
        change: impl FnOnce(&Repo) -> Result<Option<Repo>, String>,
    ) -> StoreResult<Option<(Repo, Option<Repo>)>> {
        let path = self.ref_path(name)?;
        let _fence = self.fence()?;
        let refs = self.root.join("refs");
        let lock = File::open(&refs).map_err(io_err("open", &refs))?;
        lock.lock().map_err(io_err("lock", &refs))?;
        let Some(old) = self.repo(name)? else {
            return Ok(None);
        };
        let new = change(&old).map_err(StoreError::Ref)?;
        match &new {
            Some(repo) => replace_file(&self.root.join("tmp"), &path, &repo.to_json(), 0o644)?,
            None => fs::remove_file(&path).map_err(io_err("remove", &path))?,
        }
        let gone: Vec<_> = old
            .roots()
            .filter(|c| new.as_ref().is_none_or(|n| !n.roots().any(|k| k == *c)))
            .copied()
            .collect();
        self.forget_hub(name, new.as_ref().map(|_| gone.as_slice()))?;
        Ok(Some((old, new)))
    }
}

fn read_ref(path: &PathBuf) -> StoreResult<Option<Repo>> {
    match fs::read(path) {
        Ok(bytes) => Repo::from_json(&bytes)
            .map(Some)
            .map_err(|source| StoreError::Format {
                path: path.clone(),
                source,
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_segments_fold_case_and_hash_unportable_names() {
        assert_eq!(ref_segment("Acme"), "acme");
        assert_eq!(ref_segment("sd-xl_1.0"), "sd-xl_1.0");
        for odd in ["con", "COM1", "a b", ".hidden", "trailing.", "ünï"] {
            let hashed = ref_segment(odd);
            assert!(
                hashed.starts_with('%') && hashed.len() == 65,
                "{odd}: {hashed}"
            );
        }
        assert_eq!(ref_segment("ACME"), ref_segment("acme"));
    }
}
