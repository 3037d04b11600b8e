//! The `fs` layer without FUSE: an in-memory catalog and object source, with failure injection.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::format::Header;
use crate::format::{ObjectRef, Release, Repo, Sha256};
use crate::fs::LaneRef;
use crate::io::ObjectSource;
use crate::layout::{Content, LaneFile, LaneView, Owner};
use crate::store::StoreError;

/// Objects in memory; a damaged one fails as `BlobReader` fails. Prefetch hints are recorded.
#[derive(Default)]
struct MockObjects {
    bytes: Mutex<HashMap<Sha256, Vec<u8>>>,
    damaged: Mutex<HashSet<Sha256>>,
    prefetched: Mutex<Vec<Vec<ObjectRef>>>,
    /// The blobs known proven, with their stamps.
    proven: Mutex<HashMap<Sha256, crate::store::verified::Stamp>>,
}

impl MockObjects {
    fn put(&self, bytes: &[u8]) -> ObjectRef {
        let object = ObjectRef::of(bytes);
        self.bytes
            .lock()
            .unwrap()
            .insert(object.sha256, bytes.to_vec());
        object
    }
}

impl ObjectSource for MockObjects {
    fn read_object(&self, object: &ObjectRef, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.damaged.lock().unwrap().contains(&object.sha256) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "damaged blob"));
        }
        let objects = self.bytes.lock().unwrap();
        let bytes = objects
            .get(&object.sha256)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "absent blob"))?;
        let start = offset as usize;
        buf.copy_from_slice(&bytes[start..start + buf.len()]);
        Ok(())
    }

    fn prefetch(&self, objects: &[ObjectRef]) {
        self.prefetched.lock().unwrap().push(objects.to_vec());
    }

    fn proven_stamp(&self, object: &ObjectRef) -> Option<crate::store::verified::Stamp> {
        self.proven.lock().unwrap().get(&object.sha256).copied()
    }
}

struct MockCommit {
    lane: Option<String>,
    /// `None`: the commit's header is damaged.
    files: Option<Vec<(String, Content)>>,
    header: ObjectRef,
    /// A view built from a real header (extents queries need one), shown as it is.
    view: Option<LaneView>,
}

/// Repos and commits in memory.
#[derive(Default)]
struct MockCatalog {
    repos: Mutex<(u64, Vec<RepoEntry>)>,
    commits: Mutex<HashMap<Sha256, MockCommit>>,
    lane_builds: AtomicUsize,
}

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

impl MockCatalog {
    fn set_repos(&self, repos: Vec<Repo>) {
        let mut state = self.repos.lock().unwrap();
        state.0 += 1;
        state.1 = repos
            .into_iter()
            .map(|repo| RepoEntry {
                repo,
                mtime: t(1000),
            })
            .collect();
    }

    /// A commit (its id made up from `seed`) with `files`.
    fn commit(
        &self,
        seed: &str,
        lane: Option<&str>,
        files: Option<Vec<(&str, Content)>>,
    ) -> ObjectRef {
        let id = ObjectRef::of(format!("tree {seed}").as_bytes());
        let commit = MockCommit {
            lane: lane.map(str::to_owned),
            files: files.map(|f| f.into_iter().map(|(p, c)| (p.to_owned(), c)).collect()),
            header: ObjectRef::of(format!("header {seed}").as_bytes()),
            view: None,
        };
        self.commits.lock().unwrap().insert(id.sha256, commit);
        id
    }

    /// A commit of lane `lane` showing `view`.
    fn commit_view(&self, seed: &str, lane: &str, view: LaneView) -> ObjectRef {
        let id = self.commit(seed, Some(lane), Some(vec![]));
        self.commits
            .lock()
            .unwrap()
            .get_mut(&id.sha256)
            .unwrap()
            .view = Some(view);
        id
    }
}

fn absent(object: &ObjectRef) -> CommitError {
    CommitError::Store(StoreError::Absent {
        object: *object,
        path: format!("blobs/{}", object.sha256).into(),
    })
}

fn empty_header() -> Header {
    Header {
        format: crate::format::header::HEADER_FORMAT.into(),
        chunks: vec![],
        encodings: vec![],
        pipeline: None,
        components: vec![],
        metadata: Default::default(),
    }
}

impl Catalog for MockCatalog {
    fn refs_signature(&self) -> Result<u64, StoreError> {
        Ok(self.repos.lock().unwrap().0)
    }

    fn repos(&self) -> Result<Vec<RepoEntry>, StoreError> {
        Ok(self.repos.lock().unwrap().1.clone())
    }

    fn commit_lane(&self, commit: &ObjectRef) -> Result<CommitLane, CommitError> {
        let commits = self.commits.lock().unwrap();
        let c = commits.get(&commit.sha256).ok_or_else(|| absent(commit))?;
        Ok(CommitLane {
            lane: c.lane.clone(),
            mtime: t(2000),
            encoded: false,
            single_file: false,
            single_face: false,
        })
    }

    fn lane(&self, lane: &LaneRef) -> Result<LaneContents, CommitError> {
        let commit = &lane.commit;
        self.lane_builds.fetch_add(1, Ordering::Relaxed);
        let commits = self.commits.lock().unwrap();
        let c = commits.get(&commit.sha256).ok_or_else(|| absent(commit))?;
        if let Some(view) = &c.view {
            return Ok(LaneContents {
                view: view.clone(),
                mtime: t(2000),
            });
        }
        let files = c.files.as_ref().ok_or_else(|| absent(&c.header))?;
        let mut files: Vec<LaneFile> = files
            .iter()
            .map(|(path, content)| LaneFile {
                path: path.clone(),
                content: content.clone(),
                owner: Owner::Repo,
            })
            .collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(LaneContents {
            view: LaneView {
                files,
                commit: *commit,
                header_ref: c.header,
                header: Arc::new(empty_header()),
                folders: Vec::new(),
            },
            mtime: t(2000),
        })
    }
}

struct Fixture {
    fs: TensorFs,
    catalog: Arc<MockCatalog>,
    objects: Arc<MockObjects>,
}

fn fixture(config: FsConfig) -> Fixture {
    let catalog = Arc::new(MockCatalog::default());
    let objects = Arc::new(MockObjects::default());
    let config = FsConfig {
        refs_check_interval: Duration::ZERO,
        ..config
    };
    let fs = TensorFs::new(catalog.clone(), objects.clone(), config);
    Fixture {
        fs,
        catalog,
        objects,
    }
}

fn inline(text: &str) -> Content {
    Content::Inline(text.as_bytes().into())
}

fn release(version: &str, lanes: &[(&str, ObjectRef)]) -> Release {
    Release {
        version: version.to_owned(),
        lanes: lanes
            .iter()
            .map(|(l, c)| (l.to_string(), *c))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn names(fs: &TensorFs, ino: u64) -> Vec<String> {
    let fh = fs.opendir(ino).unwrap();
    let mut names = Vec::new();
    fs.readdir(ino, fh, 0, |e| {
        names.push(e.name.clone());
        false
    })
    .unwrap();
    fs.release(fh);
    names
}

/// Looks up a `/`-separated path from the root.
fn walk(fs: &TensorFs, path: &str) -> FsResult<Entry> {
    let mut entry = fs.getattr(ROOT_INO)?;
    for name in path.split('/').filter(|s| !s.is_empty()) {
        entry = fs.lookup(entry.attr.ino, name)?;
    }
    Ok(entry)
}

fn read_all(fs: &TensorFs, ino: u64) -> FsResult<Vec<u8>> {
    let opened = fs.open(ino, false)?;
    let mut out = vec![0u8; fs.getattr(ino)?.attr.size as usize + 10];
    let n = fs.read(opened.fh, 0, &mut out)?;
    out.truncate(n);
    fs.release(opened.fh);
    Ok(out)
}

/// A repo with two releases and unreleased commits, as most tests use it.
fn sample(f: &Fixture) -> (ObjectRef, ObjectRef, ObjectRef) {
    let weights = f
        .objects
        .put(&(0..=255u8).cycle().take(10_000).collect::<Vec<_>>());
    let old = f.catalog.commit(
        "old",
        Some("bf16"),
        Some(vec![("config.json", inline("{\"v\":1}"))]),
    );
    let new = f.catalog.commit(
        "new",
        Some("bf16"),
        Some(vec![
            ("config.json", inline("{\"v\":2}")),
            ("unet/model.safetensors", Content::Object(weights)),
            ("unet/config.json", inline("{}")),
        ]),
    );
    let draft = f
        .catalog
        .commit("draft", None, Some(vec![("README.md", inline("draft"))]));
    f.catalog.set_repos(vec![Repo {
        name: "acme/sd".into(),
        releases: vec![
            release("1.0", &[("bf16", old)]),
            release("2.0", &[("bf16", new)]),
        ],
        commits: vec![draft],
    }]);
    (old, new, draft)
}

#[test]
fn every_level_lists_its_children() {
    let f = fixture(FsConfig::default());
    let (old, new, draft) = sample(&f);
    assert_eq!(
        names(&f.fs, ROOT_INO),
        [".", "..", "acme", "@hf", "@comfyui"]
    );
    let acme = walk(&f.fs, "acme").unwrap().attr.ino;
    assert_eq!(names(&f.fs, acme), [".", "..", "sd"]);
    let sd = walk(&f.fs, "acme/sd").unwrap().attr.ino;
    let expected = [".", "..", "latest", "1.0", "2.0"]
        .into_iter()
        .map(str::to_owned)
        .chain([old, new, draft].iter().map(|c| c.sha256.hex()))
        .collect::<Vec<_>>();
    assert_eq!(names(&f.fs, sd), expected);
    let lane = walk(&f.fs, "acme/sd/2.0/bf16").unwrap().attr.ino;
    assert_eq!(names(&f.fs, lane), [".", "..", "config.json", "unet"]);
    let unet = walk(&f.fs, "acme/sd/2.0/bf16/unet").unwrap().attr.ino;
    assert_eq!(
        names(&f.fs, unet),
        [".", "..", "config.json", "model.safetensors"]
    );
}

#[test]
fn dot_dot_names_the_parent_folder() {
    let f = fixture(FsConfig::default());
    sample(&f);
    let sd = walk(&f.fs, "acme/sd").unwrap().attr.ino;
    let acme = walk(&f.fs, "acme").unwrap().attr.ino;
    let fh = f.fs.opendir(sd).unwrap();
    let mut dots = Vec::new();
    f.fs.readdir(sd, fh, 0, |e| {
        dots.push((e.name.clone(), e.ino));
        dots.len() == 2
    })
    .unwrap();
    assert_eq!(dots, [(".".to_owned(), sd), ("..".to_owned(), acme)]);
}

#[test]
fn latest_is_the_newest_release_and_versions_and_commits_alias_it() {
    let f = fixture(FsConfig::default());
    let (_, new, _) = sample(&f);
    let latest = walk(&f.fs, "acme/sd/latest/bf16/config.json").unwrap();
    let version = walk(&f.fs, "acme/sd/2.0/bf16/config.json").unwrap();
    let by_hex = walk(&f.fs, &format!("acme/sd/{}/bf16/config.json", new.sha256)).unwrap();
    assert_eq!(read_all(&f.fs, latest.attr.ino).unwrap(), b"{\"v\":2}");
    // One file inode across aliases (one page cache), one folder inode per path.
    assert_eq!(latest.attr.ino, version.attr.ino);
    assert_eq!(latest.attr.ino, by_hex.attr.ino);
    let folder = |p: &str| walk(&f.fs, p).unwrap().attr.ino;
    assert_ne!(folder("acme/sd/latest/bf16"), folder("acme/sd/2.0/bf16"));
    assert_ne!(
        folder("acme/sd/latest/bf16/unet"),
        folder("acme/sd/2.0/bf16/unet")
    );
    assert_eq!(
        read_all(
            &f.fs,
            walk(&f.fs, "acme/sd/1.0/bf16/config.json")
                .unwrap()
                .attr
                .ino
        )
        .unwrap(),
        b"{\"v\":1}"
    );
}

#[test]
fn latest_without_releases_takes_the_newest_commit_of_each_lane() {
    let f = fixture(FsConfig::default());
    let a1 = f
        .catalog
        .commit("a1", Some("bf16"), Some(vec![("x", inline("a1"))]));
    let b1 = f
        .catalog
        .commit("b1", Some("fp8"), Some(vec![("x", inline("b1"))]));
    let a2 = f
        .catalog
        .commit("a2", Some("bf16"), Some(vec![("x", inline("a2"))]));
    let u = f.catalog.commit("u", None, Some(vec![("x", inline("u"))]));
    f.catalog.set_repos(vec![Repo {
        name: "acme/llm".into(),
        releases: vec![],
        commits: vec![a1, b1, a2, u],
    }]);
    let latest = walk(&f.fs, "acme/llm/latest").unwrap().attr.ino;
    assert_eq!(names(&f.fs, latest), [".", "..", "_", "bf16", "fp8"]);
    for (lane, text) in [("bf16", "a2"), ("fp8", "b1"), ("_", "u")] {
        let file = walk(&f.fs, &format!("acme/llm/latest/{lane}/x"))
            .unwrap()
            .attr
            .ino;
        assert_eq!(read_all(&f.fs, file).unwrap(), text.as_bytes());
    }
    let one = walk(&f.fs, &format!("acme/llm/{}", a1.sha256))
        .unwrap()
        .attr
        .ino;
    assert_eq!(names(&f.fs, one), [".", "..", "bf16"]);
    let unlabelled = walk(&f.fs, &format!("acme/llm/{}", u.sha256))
        .unwrap()
        .attr
        .ino;
    assert_eq!(names(&f.fs, unlabelled), [".", "..", "_"]);
}

#[test]
fn attributes_are_read_only_with_sizes_mtimes_and_ttls() {
    let f = fixture(FsConfig::default());
    sample(&f);
    let file = walk(&f.fs, "acme/sd/latest/bf16/unet/model.safetensors").unwrap();
    assert_eq!(file.attr.kind, Kind::File);
    assert_eq!(file.attr.size, 10_000);
    assert_eq!(file.attr.perm, 0o444);
    assert_eq!(file.attr.blksize, 1 << 20);
    assert_eq!(file.attr.mtime, t(2000));
    assert_eq!(file.ttl, Duration::from_secs(3600));
    let lane = walk(&f.fs, "acme/sd/latest/bf16").unwrap();
    assert_eq!(
        (lane.attr.kind, lane.attr.perm, lane.attr.mtime),
        (Kind::Directory, 0o555, t(2000))
    );
    assert_eq!(
        lane.ttl,
        Duration::from_secs(1),
        "the lane's entry in a revision follows refs"
    );
    assert_eq!(
        f.fs.getattr(lane.attr.ino).unwrap().ttl,
        Duration::from_secs(3600)
    );
    let repo = walk(&f.fs, "acme/sd").unwrap();
    assert_eq!(
        (repo.attr.mtime, repo.ttl),
        (t(1000), Duration::from_secs(1))
    );
}

#[test]
fn reads_return_the_requested_range_and_stop_at_the_end() {
    let f = fixture(FsConfig::default());
    sample(&f);
    let expected: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    let ino = walk(&f.fs, "acme/sd/latest/bf16/unet/model.safetensors")
        .unwrap()
        .attr
        .ino;
    assert_eq!(read_all(&f.fs, ino).unwrap(), expected);
    let fh = f.fs.open(ino, false).unwrap().fh;
    let mut buf = [0u8; 100];
    assert_eq!(f.fs.read(fh, 4000, &mut buf).unwrap(), 100);
    assert_eq!(buf[..], expected[4000..4100]);
    assert_eq!(f.fs.read(fh, 9950, &mut buf).unwrap(), 50);
    assert_eq!(buf[..50], expected[9950..]);
    assert_eq!(f.fs.read(fh, 10_000, &mut buf).unwrap(), 0);
    assert_eq!(f.fs.read(fh, u64::MAX, &mut buf).unwrap(), 0);
    f.fs.release(fh);
    assert_eq!(f.fs.read(fh, 0, &mut buf).unwrap_err().errno(), libc::EBADF);
}

#[test]
fn a_damaged_blob_reads_as_eio_while_other_files_still_read() {
    let f = fixture(FsConfig::default());
    sample(&f);
    let weights = walk(&f.fs, "acme/sd/latest/bf16/unet/model.safetensors")
        .unwrap()
        .attr
        .ino;
    let object = ObjectRef::of(&(0..=255u8).cycle().take(10_000).collect::<Vec<_>>());
    f.objects.damaged.lock().unwrap().insert(object.sha256);
    let err = read_all(&f.fs, weights).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    assert!(err.to_string().contains("unet/model.safetensors"), "{err}");
    let config = walk(&f.fs, "acme/sd/latest/bf16/config.json")
        .unwrap()
        .attr
        .ino;
    assert_eq!(read_all(&f.fs, config).unwrap(), b"{\"v\":2}");
}

#[test]
fn a_lane_that_cannot_be_laid_out_is_eio_and_other_lanes_still_show() {
    let f = fixture(FsConfig::default());
    let good = f
        .catalog
        .commit("good", Some("bf16"), Some(vec![("x", inline("ok"))]));
    let bad = f.catalog.commit("bad", Some("fp8"), None);
    f.catalog.set_repos(vec![Repo {
        name: "acme/m".into(),
        releases: vec![release("1", &[("bf16", good), ("fp8", bad)])],
        commits: vec![],
    }]);
    let bad_lane = walk(&f.fs, "acme/m/1/fp8").unwrap().attr.ino;
    assert_eq!(f.fs.lookup(bad_lane, "x").unwrap_err().errno(), libc::EIO);
    assert_eq!(f.fs.opendir(bad_lane).unwrap_err().errno(), libc::EIO);
    assert_eq!(
        f.fs.getxattr(bad_lane, XATTR_HEADER, 0)
            .unwrap_err()
            .errno(),
        libc::EIO
    );
    let x = walk(&f.fs, "acme/m/1/bf16/x").unwrap().attr.ino;
    assert_eq!(read_all(&f.fs, x).unwrap(), b"ok");
}

#[test]
fn a_ref_added_while_mounted_appears_and_latest_moves_to_a_new_inode() {
    let f = fixture(FsConfig::default());
    let (_, new, draft) = sample(&f);
    let old_latest = walk(&f.fs, "acme/sd/latest/bf16").unwrap().attr.ino;
    assert!(walk(&f.fs, "beta").is_err());

    let newer = f.catalog.commit(
        "newer",
        Some("bf16"),
        Some(vec![("config.json", inline("{\"v\":3}"))]),
    );
    let other = f
        .catalog
        .commit("other", None, Some(vec![("y", inline("y"))]));
    f.catalog.set_repos(vec![
        Repo {
            name: "acme/sd".into(),
            releases: vec![
                release("2.0", &[("bf16", new)]),
                release("3.0", &[("bf16", newer)]),
            ],
            commits: vec![draft],
        },
        Repo {
            name: "beta/x".into(),
            releases: vec![],
            commits: vec![other],
        },
    ]);
    assert_eq!(
        names(&f.fs, ROOT_INO),
        [".", "..", "acme", "beta", "@hf", "@comfyui"]
    );
    let y = walk(&f.fs, "beta/x/latest/_/y").unwrap().attr.ino;
    assert_eq!(read_all(&f.fs, y).unwrap(), b"y");
    let latest = walk(&f.fs, "acme/sd/latest/bf16").unwrap().attr.ino;
    assert_ne!(latest, old_latest);
    let config = f.fs.lookup(latest, "config.json").unwrap().attr.ino;
    assert_eq!(read_all(&f.fs, config).unwrap(), b"{\"v\":3}");
    // Whoever still holds the old lane folder sees the old commit.
    let config = f.fs.lookup(old_latest, "config.json").unwrap().attr.ino;
    assert_eq!(read_all(&f.fs, config).unwrap(), b"{\"v\":2}");
    assert_eq!(
        walk(&f.fs, "acme/sd/1.0").unwrap_err().errno(),
        libc::ENOENT
    );
}

#[test]
fn refs_are_not_re_read_before_the_check_interval() {
    let catalog = Arc::new(MockCatalog::default());
    let objects = Arc::new(MockObjects::default());
    let config = FsConfig {
        refs_check_interval: Duration::from_secs(3600),
        ..FsConfig::default()
    };
    let fs = TensorFs::new(catalog.clone(), objects, config);
    catalog.set_repos(vec![]);
    assert_eq!(names(&fs, ROOT_INO), [".", "..", "@hf", "@comfyui"]);
    let c = catalog.commit("c", None, Some(vec![]));
    catalog.set_repos(vec![Repo {
        name: "a/b".into(),
        releases: vec![],
        commits: vec![c],
    }]);
    assert_eq!(names(&fs, ROOT_INO), [".", "..", "@hf", "@comfyui"]);
}

#[test]
fn readdir_resumes_at_the_offset_it_was_given() {
    let f = fixture(FsConfig::default());
    sample(&f);
    let sd = walk(&f.fs, "acme/sd").unwrap().attr.ino;
    let all = names(&f.fs, sd);
    let fh = f.fs.opendir(sd).unwrap();
    let mut got = Vec::new();
    let mut offset = 0;
    loop {
        let mut batch = Vec::new();
        f.fs.readdir(sd, fh, offset, |e| {
            batch.push(e.clone());
            batch.len() == 2
        })
        .unwrap();
        let Some(last) = batch.last() else { break };
        offset = last.next_offset;
        got.extend(batch.into_iter().map(|e| e.name));
    }
    assert_eq!(got, all);
}

#[test]
fn xattrs_name_the_commit_and_header_with_the_size_protocol() {
    let f = fixture(FsConfig::default());
    let (_, new, _) = sample(&f);
    let file = walk(&f.fs, "acme/sd/latest/bf16/unet/config.json")
        .unwrap()
        .attr
        .ino;
    let id = new.id();
    assert_eq!(
        f.fs.getxattr(file, XATTR_COMMIT, 0).unwrap(),
        XattrReply::Size(id.len() as u32)
    );
    assert_eq!(
        f.fs.getxattr(file, XATTR_COMMIT, 200).unwrap(),
        XattrReply::Data(id.clone().into_bytes())
    );
    assert_eq!(
        f.fs.getxattr(file, XATTR_COMMIT, 10).unwrap_err().errno(),
        libc::ERANGE
    );
    let header = ObjectRef::of(b"header new").id();
    let lane = walk(&f.fs, "acme/sd/latest/bf16").unwrap().attr.ino;
    assert_eq!(
        f.fs.getxattr(lane, XATTR_HEADER, 100).unwrap(),
        XattrReply::Data(header.into_bytes())
    );
    assert_eq!(
        f.fs.getxattr(file, "user.other", 100).unwrap_err().errno(),
        libc::ENODATA
    );
    let list = b"user.tensorfs.commit\0user.tensorfs.header\0".to_vec();
    assert_eq!(
        f.fs.listxattr(file, 0).unwrap(),
        XattrReply::Size(list.len() as u32)
    );
    assert_eq!(f.fs.listxattr(file, 100).unwrap(), XattrReply::Data(list));
    assert_eq!(f.fs.listxattr(file, 5).unwrap_err().errno(), libc::ERANGE);
    let repo = walk(&f.fs, "acme/sd").unwrap().attr.ino;
    assert_eq!(f.fs.listxattr(repo, 0).unwrap(), XattrReply::Size(0));
    assert_eq!(
        f.fs.getxattr(repo, XATTR_COMMIT, 100).unwrap_err().errno(),
        libc::ENODATA
    );
}

#[test]
fn writes_ioctls_and_misuse_get_their_errnos() {
    let f = fixture(FsConfig::default());
    sample(&f);
    let file = walk(&f.fs, "acme/sd/latest/bf16/config.json")
        .unwrap()
        .attr
        .ino;
    let lane = walk(&f.fs, "acme/sd/latest/bf16").unwrap().attr.ino;
    assert_eq!(f.fs.open(file, true).unwrap_err().errno(), libc::EROFS);
    assert_eq!(f.fs.open(lane, false).unwrap_err().errno(), libc::EISDIR);
    assert_eq!(f.fs.lookup(file, "x").unwrap_err().errno(), libc::ENOTDIR);
    assert_eq!(f.fs.opendir(file).unwrap_err().errno(), libc::ENOTDIR);
    let fh = f.fs.open(file, false).unwrap().fh;
    assert_eq!(
        f.fs.ioctl(fh, 0x5401, &[], 60).unwrap_err().errno(),
        libc::ENOTTY
    );
    // An extents query on a file that is not a safetensors file, on a folder, malformed.
    use crate::extents::ioctl::{TENSOR, TENSOR_BYTES};
    let mut query = vec![0u8; TENSOR_BYTES];
    query[..4].copy_from_slice(&1u32.to_le_bytes());
    query[16] = b'x';
    let size = TENSOR_BYTES as u32;
    let errno = |fh, query: &[u8], size| f.fs.ioctl(fh, TENSOR, query, size).unwrap_err().errno();
    assert_eq!(errno(fh, &query, size), libc::EOPNOTSUPP);
    let dir = f.fs.opendir(lane).unwrap();
    assert_eq!(errno(dir, &query, size), libc::EOPNOTSUPP);
    assert_eq!(errno(fh, &query[1..], size), libc::EINVAL);
    query[0] = 9;
    assert_eq!(errno(fh, &query, size), libc::EPROTO);
    assert_eq!(f.fs.getattr(999_999).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(
        f.fs.lookup(lane, "missing").unwrap_err().errno(),
        libc::ENOENT
    );
    assert_eq!(
        f.fs.access(file, libc::W_OK).unwrap_err().errno(),
        libc::EROFS
    );
    f.fs.access(file, libc::R_OK).unwrap();
    assert!(f.fs.open(file, false).unwrap().keep_cache);
}

#[test]
fn an_evicted_lane_is_built_again_and_its_inodes_stay_valid() {
    let f = fixture(FsConfig {
        max_cached_lanes: 1,
        ..FsConfig::default()
    });
    sample(&f);
    let a = walk(&f.fs, "acme/sd/1.0/bf16/config.json")
        .unwrap()
        .attr
        .ino;
    let b = walk(&f.fs, "acme/sd/2.0/bf16/config.json")
        .unwrap()
        .attr
        .ino;
    let builds = f.catalog.lane_builds.load(Ordering::Relaxed);
    assert_eq!(read_all(&f.fs, a).unwrap(), b"{\"v\":1}");
    assert_eq!(read_all(&f.fs, b).unwrap(), b"{\"v\":2}");
    assert_eq!(f.catalog.lane_builds.load(Ordering::Relaxed), builds + 2);
    assert_eq!(read_all(&f.fs, b).unwrap(), b"{\"v\":2}");
    assert_eq!(
        f.catalog.lane_builds.load(Ordering::Relaxed),
        builds + 2,
        "cached"
    );
}

/// A weights file of `n` tensors of `len` bytes, each in its own chunk, with its chunks.
fn chunked_weights(f: &Fixture, n: usize, len: usize) -> (Content, Vec<ObjectRef>) {
    let (view, chunks) = chunked_view(f, n, len);
    let content = view.file("model.safetensors").unwrap().content.clone();
    (content, chunks)
}

/// The inode of `model.safetensors` of `commit`, a lane `u8` released as `acme/chunked` 1.0.
fn chunked_file(f: &Fixture, commit: ObjectRef) -> u64 {
    f.catalog.set_repos(vec![Repo {
        name: "acme/chunked".into(),
        releases: vec![release("1.0", &[("u8", commit)])],
        commits: vec![],
    }]);
    walk(&f.fs, "acme/chunked/1.0/u8/model.safetensors")
        .unwrap()
        .attr
        .ino
}

/// The view of a lane of [`chunked_weights`]' file, and its chunks.
fn chunked_view(f: &Fixture, n: usize, len: usize) -> (LaneView, Vec<ObjectRef>) {
    use crate::format::{Body, ClassRef, Component, Dtype, Location, Tensor, Tree};
    let chunks: Vec<ObjectRef> = (0..n).map(|i| f.objects.put(&vec![i as u8; len])).collect();
    const NAMES: [&str; 8] = ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"];
    let tensors = (0..n)
        .map(|i| Tensor {
            key: NAMES[i].into(),
            dtype: Dtype::U8,
            shape: vec![len as u64],
            body: Body::Plain(Location {
                chunk: i as u64,
                offset: 0,
                length: len as u64,
            }),
        })
        .collect();
    let header = Header {
        chunks: chunks.clone(),
        components: vec![Component {
            name: "model".into(),
            class: ClassRef::default(),
            config: BTreeMap::new(),
            tensors,
            assets: BTreeMap::new(),
            config_file: None,
        }],
        ..empty_header()
    };
    let tree = Tree {
        lane: Some("u8".into()),
        files: BTreeMap::from([("model.cozytensors".to_owned(), ObjectRef::of(b"header"))]),
    };
    let view = LaneView::build(&ObjectRef::of(b"chunked"), &tree, &header).unwrap();
    (view, chunks)
}

#[test]
fn reads_in_order_prefetch_the_next_chunks_and_jumps_do_not() {
    let f = fixture(FsConfig::default());
    const MIB: usize = 1 << 20;
    // Chunks of more than half the slack: a jump over three of them is beyond it.
    let chunk = SEQUENTIAL_SLACK_BYTES as usize / 2 + MIB;
    let (content, chunks) = chunked_weights(&f, 4, chunk);
    let commit = f.catalog.commit(
        "chunked",
        Some("u8"),
        Some(vec![("model.safetensors", content.clone())]),
    );
    let ino = chunked_file(&f, commit);
    let prefix = content.size() - 4 * chunk as u64;
    let last = prefix + 3 * chunk as u64;
    let fh = f.fs.open(ino, false).unwrap().fh;
    let mut buf = vec![0u8; MIB];
    let hints = || f.objects.prefetched.lock().unwrap().clone();

    // A first read is no pattern yet.
    f.fs.read(fh, 0, &mut buf).unwrap();
    assert!(hints().is_empty());
    // The next one continues it: the chunk it ends in and the two after.
    f.fs.read(fh, MIB as u64, &mut buf).unwrap();
    assert_eq!(hints(), [chunks[0..3].to_vec()]);
    // A jump of more than the slack is not in order.
    f.fs.read(fh, last + MIB as u64, &mut buf).unwrap();
    assert_eq!(hints().len(), 1);
    // Going on from there: only what is left of the file.
    f.fs.read(fh, last + 2 * MIB as u64, &mut buf).unwrap();
    assert_eq!(hints()[1], [chunks[3]]);
    assert_eq!(buf, vec![3u8; MIB]);
    // Another handle starts afresh.
    let other = f.fs.open(ino, false).unwrap().fh;
    f.fs.read(other, 2 * MIB as u64, &mut buf).unwrap();
    assert_eq!(hints().len(), 2);
    // Files without chunks (configs, assets) hint nothing.
    f.fs.release(fh);
    f.fs.release(other);
}

#[test]
fn the_whole_file_answer_is_given_again_until_a_blob_is_proven() {
    use crate::extents::ioctl::{FILE, FILE_BYTES, FILE_PAGE_BYTES};
    // struct tensorfs_file: the answer's length at byte 16, its text after the fields.
    const TEXT: usize = FILE_BYTES - FILE_PAGE_BYTES;
    let f = fixture(FsConfig::default());
    let (view, chunks) = chunked_view(&f, 3, 4096);
    let commit = f.catalog.commit_view("chunked", "u8", view);
    let ino = chunked_file(&f, commit);
    let mut query = vec![0u8; FILE_BYTES];
    query[..4].copy_from_slice(&2u32.to_le_bytes());
    let answer = |fh| -> serde_json::Value {
        let out = f.fs.ioctl(fh, FILE, &query, FILE_BYTES as u32).unwrap();
        let length = u64::from_le_bytes(out[16..24].try_into().unwrap()) as usize;
        serde_json::from_slice(&out[TEXT..TEXT + length]).unwrap()
    };
    let stamps = |doc: &serde_json::Value| -> Vec<bool> {
        let blobs = doc["blobs"].as_array().unwrap();
        blobs.iter().map(|b| !b[2].is_null()).collect()
    };
    let first = f.fs.open(ino, false).unwrap().fh;
    let before = answer(first);
    assert_eq!(stamps(&before), [false, false, false]);
    // Another open asks again: the same answer, from the lane's index.
    let second = f.fs.open(ino, false).unwrap().fh;
    assert_eq!(answer(second), before);
    // A blob proven since: a new answer gives its stamp; an open handle keeps its own.
    let stamp = crate::store::verified::Stamp::of(&std::fs::metadata("/").unwrap());
    f.objects
        .proven
        .lock()
        .unwrap()
        .insert(chunks[1].sha256, stamp);
    let third = f.fs.open(ino, false).unwrap().fh;
    let after = answer(third);
    assert_eq!(stamps(&after), [false, true, false]);
    assert_eq!(after["tensors"], before["tensors"]);
    assert_eq!(answer(first), before);
    for fh in [first, second, third] {
        f.fs.release(fh);
    }
}

#[test]
fn remote_failures_name_no_local_repair() {
    let read = |kind| FsError::Read {
        commit: "c".into(),
        path: "p".into(),
        source: io::Error::new(kind, "x"),
    };
    assert!(read(io::ErrorKind::InvalidData).is_local_damage());
    assert!(read(io::ErrorKind::NotFound).is_local_damage());
    assert!(!read(io::ErrorKind::TimedOut).is_local_damage());
    assert!(!read(io::ErrorKind::Other).is_local_damage());
    let fetch = FsError::Commit {
        commit: "c".into(),
        source: CommitError::Fetch("the endpoint is down".into()),
    };
    assert!(!fetch.is_local_damage());
}

#[test]
fn errnos_are_decided_per_variant() {
    let cases = [
        (
            FsError::NotFound {
                parent: 1,
                name: "x".into(),
            },
            libc::ENOENT,
        ),
        (FsError::UnknownInode(9), libc::ENOENT),
        (FsError::NotADirectory(2), libc::ENOTDIR),
        (FsError::IsADirectory(2), libc::EISDIR),
        (FsError::ReadOnly, libc::EROFS),
        (FsError::BadHandle(3), libc::EBADF),
        (FsError::NoAttribute("a".into()), libc::ENODATA),
        (
            FsError::Range {
                needed: 2,
                capacity: 1,
            },
            libc::ERANGE,
        ),
        (FsError::NoIoctl(1), libc::ENOTTY),
        (FsError::Unsupported("lseek"), libc::ENOSYS),
        (
            FsError::Read {
                commit: "c".into(),
                path: "p".into(),
                source: io::Error::new(io::ErrorKind::InvalidData, "bad"),
            },
            libc::EIO,
        ),
    ];
    for (err, errno) in cases {
        assert_eq!(err.errno(), errno, "{err}");
    }
}

/// The hub view of a repo without hub records: releases and `latest` as snapshots under
/// derived names, refs for each, and a snapshot of two lanes holding both lanes' files, a
/// shared path taken from the newer commit.
#[test]
fn hub_snapshots_merge_lanes_and_name_releases_and_commits() {
    let f = fixture(FsConfig::default());
    let (old, new, draft) = sample(&f);
    let fp16 = f.catalog.commit(
        "fp16",
        Some("fp16"),
        Some(vec![
            ("config.json", inline("{\"v\":3}")),
            ("unet/model.fp16.safetensors", inline("half")),
        ]),
    );
    f.catalog.set_repos(vec![Repo {
        name: "acme/sd".into(),
        releases: vec![
            release("1.0", &[("bf16", old)]),
            release("2.0", &[("bf16", new), ("fp16", fp16)]),
        ],
        commits: vec![draft, fp16],
    }]);
    let repo = "@hf/models--acme--sd";
    let read_ref = |name: &str| {
        let ino = walk(&f.fs, &format!("{repo}/refs/{name}"))
            .unwrap()
            .attr
            .ino;
        String::from_utf8(read_all(&f.fs, ino).unwrap()).unwrap()
    };
    let main = read_ref("main");
    assert_eq!(main, read_ref("2.0"), "latest is the newest release");
    assert_eq!(
        main,
        super::hub::group_id(&[fp16, new]),
        "newest commit first"
    );
    let v1 = read_ref("1.0");
    assert_eq!(v1, super::hub::group_id(&[old]));
    // Each commit's id names a snapshot holding it; one no release holds is alone.
    assert_eq!(read_ref(&new.sha256.hex()), main);
    assert_eq!(
        read_ref(&draft.sha256.hex()),
        super::hub::group_id(&[draft])
    );
    let mut snapshots = [main.clone(), v1, super::hub::group_id(&[draft])];
    snapshots.sort();
    let listed = names(
        &f.fs,
        walk(&f.fs, &format!("{repo}/snapshots")).unwrap().attr.ino,
    );
    assert_eq!(listed[2..], snapshots[..]);
    let snap = format!("{repo}/snapshots/{main}");
    let unet = walk(&f.fs, &format!("{snap}/unet")).unwrap().attr.ino;
    assert_eq!(
        names(&f.fs, unet),
        [
            ".",
            "..",
            "config.json",
            "model.fp16.safetensors",
            "model.safetensors"
        ]
    );
    let config = walk(&f.fs, &format!("{snap}/config.json"))
        .unwrap()
        .attr
        .ino;
    assert_eq!(
        read_all(&f.fs, config).unwrap(),
        b"{\"v\":3}",
        "the newer commit's"
    );
    // The lane folder's file is the same inode.
    let in_lane = walk(&f.fs, "acme/sd/2.0/bf16/unet/model.safetensors").unwrap();
    let in_hub = walk(&f.fs, &format!("{snap}/unet/model.safetensors")).unwrap();
    assert_eq!(in_lane.attr.ino, in_hub.attr.ino);
    assert!(
        walk(&f.fs, &format!("{repo}/trees")).is_err(),
        "no listing recorded"
    );
}
