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
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Mutex;

use super::Store;
use crate::format::{ObjectRef, Sha256};
use crate::sync::lock;

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

    /// `[st_dev, st_ino, st_size, mtime, ctime]`, times in nanoseconds since the epoch: what a
    /// reader compares with its own `fstat` of the blob (the extents ioctl's ABI 2 gives it).
    pub fn fields(&self) -> [i128; 5] {
        [
            i128::from(self.dev),
            i128::from(self.ino),
            i128::from(self.length),
            self.mtime_ns,
            self.ctime_ns,
        ]
    }
}

/// The ledger of one store, loaded into memory; lines other processes append later are read
/// when a blob is not found.
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    stamps: Mutex<Stamps>,
}

#[derive(Debug, Default)]
struct Stamps {
    by_digest: HashMap<Sha256, Stamp>,
    /// Bytes of the file already read.
    read: u64,
}

impl Stamps {
    /// Reads lines appended since the last call.
    fn catch_up(&mut self, path: &PathBuf) {
        let Ok(mut file) = fs::File::open(path) else {
            return;
        };
        if file.seek(SeekFrom::Start(self.read)).is_err() {
            return;
        }
        let mut text = String::new();
        if file.read_to_string(&mut text).is_err() {
            return;
        }
        // Only whole lines: a writer may be mid-append.
        let whole = text.rfind('\n').map_or(0, |i| i + 1);
        for line in text[..whole].lines() {
            if let Some((digest, stamp)) = parse_line(line) {
                self.by_digest.insert(digest, stamp);
            }
        }
        self.read += whole as u64;
    }
}

impl Ledger {
    /// Loads `<root>/verified` (empty when absent or unreadable).
    pub fn load(store: &Store) -> Ledger {
        let path = store.root().join("verified");
        let mut stamps = Stamps::default();
        stamps.catch_up(&path);
        Ledger {
            path,
            stamps: Mutex::new(stamps),
        }
    }

    /// Whether `object`'s blob, with metadata `meta`, is the one that was verified.
    pub fn proves(&self, object: &ObjectRef, meta: &Metadata) -> bool {
        let mut stamps = lock(&self.stamps);
        let now = Stamp::of(meta);
        if now.length != object.length {
            return false;
        }
        if stamps.by_digest.get(&object.sha256) != Some(&now) {
            stamps.catch_up(&self.path);
        }
        stamps.by_digest.get(&object.sha256) == Some(&now)
    }

    /// Notes that `object`'s blob, with metadata `meta`, was just verified.
    ///
    /// # Errors
    /// Appending to the ledger file fails (the in-memory note is kept regardless).
    pub fn note(&self, object: &ObjectRef, meta: &Metadata) -> io::Result<()> {
        lock(&self.stamps)
            .by_digest
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
    fn blobs_admitted_after_loading_are_proven_from_appended_lines() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s")).unwrap();
        let ledger = Ledger::load(&store);
        let object = store.put_bytes(b"later").unwrap();
        assert!(ledger.proves(&object, &fs::metadata(store.object_path(&object)).unwrap()));
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
