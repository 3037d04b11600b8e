//! An origin store for the lazy-mount and fault tests: a model of two loose safetensors files
//! (two components, `a` and `b`) imported by the binary and published as release 1.0 of
//! `acme/<name>`, served by `tensorfs serve` behind the fault-injecting proxy. A crate that
//! includes it includes `common`, `fuse_support`, `http` and `proxy` too.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use tensorfs::format::{Body, ObjectRef, Release};
use tensorfs::store::Store;

use crate::common::{ok, safetensors_file, T};
use crate::fuse_support::{noise, set_repo};
use crate::http::Server;
use crate::proxy::Proxy;

const MIB: usize = 1 << 20;

/// How big the model is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// `a`: 1 MiB + 1 MiB, `b`: 512 KiB + 512 KiB: one chunk each.
    Small,
    /// `a`: 17 MiB + 17 MiB + 1 MiB (three chunks), `b`: 2 MiB + 2 MiB (one chunk).
    Large,
    /// `a`: four tensors of 16 MiB (four chunks), `b`: 2 MiB + 2 MiB (one chunk).
    Wide,
}

/// A published model behind a proxy.
pub struct Origin {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    /// `acme/<name>`.
    pub name: String,
    pub commit: ObjectRef,
    pub header: ObjectRef,
    pub lane: String,
    /// The source files, by name (`a.safetensors`, `b.safetensors`).
    pub files: BTreeMap<String, Vec<u8>>,
    /// Each file's chunks.
    pub chunks: BTreeMap<String, Vec<ObjectRef>>,
    pub proxy: Proxy,
    pub server: Server,
}

impl Origin {
    /// Builds, imports and publishes the model `acme/<name>` (bytes from `seed`) and serves it.
    pub fn start(name: &str, seed: u64, size: Size) -> Origin {
        let dir = tempfile::tempdir().unwrap();
        let (a, b): (Vec<usize>, Vec<usize>) = match size {
            Size::Small => (vec![MIB, MIB], vec![MIB / 2, MIB / 2]),
            Size::Large => (vec![17 * MIB, 17 * MIB, MIB], vec![2 * MIB, 2 * MIB]),
            Size::Wide => (vec![16 * MIB; 4], vec![2 * MIB, 2 * MIB]),
        };
        let file = |sizes: &[usize], seed: u64| {
            const NAMES: [&str; 4] = [
                "layers.0.weight",
                "layers.1.weight",
                "layers.2.weight",
                "layers.3.weight",
            ];
            let tensors: Vec<T> = sizes
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    T(
                        NAMES[i],
                        safetensors::Dtype::F32,
                        vec![n / 4],
                        noise(*n, seed + i as u64),
                    )
                })
                .collect();
            safetensors_file(&tensors, Some(&[("format", "pt")]))
        };
        let files = BTreeMap::from([
            ("a.safetensors".to_owned(), file(&a, seed * 10)),
            ("b.safetensors".to_owned(), file(&b, seed * 10 + 5)),
        ]);
        let source = dir.path().join("source");
        std::fs::create_dir_all(&source).unwrap();
        for (file, bytes) in &files {
            std::fs::write(source.join(file), bytes).unwrap();
        }
        let root = dir.path().join("origin");
        let local = format!("local/{name}");
        let paths: Vec<String> = files
            .keys()
            .map(|f| source.join(f).to_str().unwrap().to_owned())
            .collect();
        let mut args: Vec<&str> = vec!["import"];
        args.extend(paths.iter().map(String::as_str));
        args.extend(["--name", &local]);
        ok(&root, &args);
        std::fs::remove_dir_all(&source).unwrap();
        let store = Store::open_existing(&root).unwrap();
        let commit = store.repo(&local).unwrap().unwrap().commits[0];
        let c = store.commit(&commit).unwrap();
        let lane = c.tree.lane.clone().expect("imports name a lane");
        let published = format!("acme/{name}");
        set_repo(
            &store,
            &published,
            vec![Release {
                version: "1.0".into(),
                lanes: BTreeMap::from([(lane.clone(), commit)]),
            }],
            vec![],
        );
        let mut chunks = BTreeMap::new();
        for component in &c.header.components {
            let indices: BTreeSet<u64> = component
                .tensors
                .iter()
                .filter_map(|t| match &t.body {
                    Body::Plain(location) => Some(location.chunk),
                    Body::Encoded { .. } => None,
                })
                .collect();
            let refs = indices
                .into_iter()
                .map(|i| c.header.chunks[i as usize])
                .collect();
            chunks.insert(format!("{}.safetensors", component.name), refs);
        }
        let server = Server::start(&root, &[], &[]);
        let proxy = Proxy::start(&server.url);
        Origin {
            dir,
            root,
            name: published,
            commit,
            header: c.header_ref,
            lane,
            files,
            chunks,
            proxy,
            server,
        }
    }

    /// A new empty store beside the origin.
    pub fn local_store(&self, name: &str) -> Store {
        Store::open(self.dir.path().join(name)).unwrap()
    }

    /// The path of `file` in a mount of the model's release 1.0.
    pub fn mounted(&self, mount: &Path, file: &str) -> PathBuf {
        mount
            .join(&self.name)
            .join("1.0")
            .join(&self.lane)
            .join(file)
    }

    /// Every object of the commit's closure, with the tree and header.
    pub fn closure(&self) -> Vec<ObjectRef> {
        let mut all: Vec<ObjectRef> = self.chunks.values().flatten().copied().collect();
        all.extend([self.commit, self.header]);
        all.sort();
        all.dedup();
        all
    }

    /// The blob path (`blobs/aa/bb/hex`) of `object`, as the proxy sees it.
    pub fn blob(object: &ObjectRef) -> String {
        format!("/{}", object.blob_path())
    }
}

/// Every blob of `store` hashes to its name, and `tmp/` holds no object being written.
pub fn store_is_clean(store: &Store) {
    let blobs = crate::common::files_of(&store.root().join("blobs"));
    for (path, bytes) in &blobs {
        let name = path.rsplit('/').next().unwrap();
        assert_eq!(
            ObjectRef::of(bytes).sha256.hex(),
            name,
            "blob {path} holds other bytes than its name's"
        );
    }
    let leftovers = crate::common::temp_files(store.root());
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}
