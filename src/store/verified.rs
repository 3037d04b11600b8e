//! The ledger of verified blobs: proof that a blob is unchanged since its SHA-256 was checked.
//!
//! Spec §1 lets a reader reuse a prior verification when it can rely on the bytes being
//! unchanged. A blob is admitted read-only and never rewritten in place; any write, `chmod` or
//! rename of it moves its inode's `ctime`, which no user-space call can set back. So a blob
//! whose `(dev, ino, size, mtime, ctime)` equal those noted right after it was hashed holds the
//! hashed bytes. Anything else (a blob the reference wrote, one touched by its collector, one
//! copied from elsewhere) is hashed again before it is served, and noted.
//!
//! `<root>/verified` is an append-only text file, one line per noted blob:
//! `<sha256> <length> <dev> <ino> <mtime_ns> <ctime_ns>`. Appends are single `write(2)` calls
//! on an `O_APPEND` descriptor, so concurrent writers never interleave a line. Unreadable lines
//! are skipped: the ledger only ever saves work.

use std::collections::HashMap;
use std::fs::{self, Metadata, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Mutex;

use super::Store;
use crate::format::{ObjectRef, Sha256};

/// The identity and change times of a blob's inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    length: u64,
    dev: u64,
    ino: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    /// The stamp of a blob's metadata.
    pub fn of(meta: &Metadata) -> Stamp {
        let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
        Stamp {
            length: meta.len(),
            dev: meta.dev(),
            ino: meta.ino(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// The ledger of one store, loaded into memory.
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    stamps: Mutex<HashMap<Sha256, Stamp>>,
}

impl Ledger {
    /// Loads `<root>/verified` (empty when absent or unreadable).
    pub fn load(store: &Store) -> Ledger {
        let path = store.root().join("verified");
        let mut stamps = HashMap::new();
        if let Ok(text) = fs::read_to_string(&path) {
            for line in text.lines() {
                if let Some((digest, stamp)) = parse_line(line) {
                    stamps.insert(digest, stamp);
                }
            }
        }
        Ledger {
            path,
            stamps: Mutex::new(stamps),
        }
    }

    /// Whether `object`'s blob, with metadata `meta`, is the one that was verified.
    pub fn proves(&self, object: &ObjectRef, meta: &Metadata) -> bool {
        let stamps = self.stamps.lock().unwrap_or_else(|e| e.into_inner());
        let now = Stamp::of(meta);
        now.length == object.length && stamps.get(&object.sha256) == Some(&now)
    }

    /// Notes that `object`'s blob, with metadata `meta`, was just verified.
    ///
    /// # Errors
    /// Appending to the ledger file fails (the in-memory note is kept regardless).
    pub fn note(&self, object: &ObjectRef, meta: &Metadata) -> io::Result<()> {
        self.stamps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(object.sha256, Stamp::of(meta));
        append_lines(&self.path, &[(*object, meta.clone())])
    }

    /// Notes blobs verified by another component (admission) straight into the store's file.
    ///
    /// # Errors
    /// Appending fails.
    pub fn append(store: &Store, entries: &[(ObjectRef, Metadata)]) -> io::Result<()> {
        append_lines(&store.root().join("verified"), entries)
    }
}

fn append_lines(path: &PathBuf, entries: &[(ObjectRef, Metadata)]) -> io::Result<()> {
    let mut text = String::new();
    for (object, meta) in entries {
        let s = Stamp::of(meta);
        text.push_str(&format!(
            "{} {} {} {} {} {}\n",
            object.sha256, s.length, s.dev, s.ino, s.mtime_ns, s.ctime_ns
        ));
    }
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    file.write_all(text.as_bytes())
}

fn parse_line(line: &str) -> Option<(Sha256, Stamp)> {
    let mut fields = line.split(' ');
    let digest = fields.next()?.parse().ok()?;
    let stamp = Stamp {
        length: fields.next()?.parse().ok()?,
        dev: fields.next()?.parse().ok()?,
        ino: fields.next()?.parse().ok()?,
        mtime_ns: fields.next()?.parse().ok()?,
        ctime_ns: fields.next()?.parse().ok()?,
    };
    fields.next().is_none().then_some((digest, stamp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_rewritten_after_its_note_is_not_proven() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s")).unwrap();
        let object = store.put_bytes(b"hello").unwrap();
        let path = store.object_path(&object);
        let ledger = Ledger::load(&store);
        assert!(ledger.proves(&object, &fs::metadata(&path).unwrap()));

        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut perms = fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o644);
        fs::set_permissions(&path, perms).unwrap();
        fs::write(&path, b"jello").unwrap();
        let reloaded = Ledger::load(&store);
        assert!(!reloaded.proves(&object, &fs::metadata(&path).unwrap()));
    }

    #[test]
    fn malformed_ledger_lines_are_skipped() {
        assert!(parse_line("zz 1 2 3 4 5").is_none());
        let digest = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert!(parse_line(&format!("{digest} 0 1 2 3 4")).is_some());
        assert!(parse_line(&format!("{digest} 0 1 2 3 4 5")).is_none());
        assert!(parse_line(&format!("{digest} 0 1 2 3")).is_none());
    }
}
