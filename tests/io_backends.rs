//! Chunk I/O backends (`tensorfs::io::backend`): positioned reads, mmap, io_uring and the
//! automatic choice all return the bytes a real mount shows, warm and cold, for whole files and
//! for ranges that cross chunks.

mod fuse_support;

use std::fs;
use std::os::fd::AsRawFd;

use fuse_support::*;
use tensorfs::io::{Backend, BlobReader, BlobReaderConfig};
use tensorfs::layout::LaneView;
use tensorfs::store::Store;

/// Evicts every blob of the store from the page cache.
fn evict(store: &Store) {
    for entry in walk(&store.root().join("blobs")) {
        if let Ok(f) = fs::File::open(&entry) {
            // Dirty pages are not dropped: write them back first.
            // SAFETY: a valid descriptor; write-back and advice only.
            unsafe {
                libc::fdatasync(f.as_raw_fd());
                libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn every_backend_reads_what_the_mount_shows() {
    let dir = tempfile::Builder::new()
        .prefix("io-backends")
        .tempdir()
        .unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let c = commit(&store, Some("f32"), 7);
    set_repo(&store, "local/io", vec![], vec![c.id]);
    let m = mount(&store);
    let shown = fs::read(m.path("local/io/latest/f32/model.safetensors")).unwrap();

    let commit = store.commit(&c.id).unwrap();
    let view = LaneView::build(&commit.id, &commit.tree, &commit.header).unwrap();
    let file = &view.file("model.safetensors").unwrap().content;
    // Whole file; ranges inside one chunk, across the chunk boundary, the last bytes.
    let len = shown.len() as u64;
    let ranges = [
        (0, len),
        (100, 4096),
        (1_000_000, 1_500_000),
        (len - 3000, 3000),
        (len - 1, 1),
    ];
    for backend in Backend::ALL {
        let reader = BlobReader::new(
            store.clone(),
            BlobReaderConfig {
                backend,
                ..BlobReaderConfig::default()
            },
        );
        for cold in [false, true] {
            if cold {
                evict(&store);
            }
            for &(offset, n) in &ranges {
                let mut buf = vec![0u8; n as usize];
                let got = file.read_at(&reader, offset, &mut buf).unwrap();
                assert_eq!(got, buf.len());
                assert!(
                    buf[..] == shown[offset as usize..(offset + n) as usize],
                    "{backend:?} (cold: {cold}) differs from the mount at {offset}+{n}"
                );
            }
        }
    }
    m.unmount();
}

/// `TENSORFS_IO` naming no backend stops a command before it does anything, naming the ones
/// there are.
#[test]
fn an_unknown_backend_in_the_environment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tensorfs"))
        .args(["--store", dir.path().to_str().unwrap(), "ls"])
        .env("TENSORFS_IO", "disk")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("TENSORFS_IO") && said.contains("\"disk\"") && said.contains("uring"),
        "{said}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tensorfs"))
        .args(["--store", dir.path().to_str().unwrap(), "ls"])
        .env("TENSORFS_IO", "pread")
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("TENSORFS_IO"),
        "a known backend is accepted"
    );
}
