//! io_uring reads through a real mount (`TENSORFS_IO=uring`, one daemon thread, so every
//! request shares one ring): a request whose batch holds a read past a truncated blob's end
//! fails with EIO, and the thread's next requests return exactly the file's bytes.
//!
//! One test in its own binary: the backend is chosen from the environment when the mount
//! starts, which would reach every other mount of a shared test binary.

mod fuse_support;

use std::fs;
use std::os::unix::fs::{FileExt, PermissionsExt};

use fuse_support::*;
use tensorfs::store::Store;

#[test]
fn a_failed_uring_read_in_a_mount_leaves_the_next_requests_exact() {
    // SAFETY: the only test of this binary sets it before any thread reads the environment.
    unsafe { std::env::set_var("TENSORFS_IO", "uring") };
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let c = commit(&store, Some("f32"), 41);
    let other = commit(&store, Some("f16"), 42);
    set_repo(
        &store,
        "local/x",
        vec![release("1.0", &[("f32", &c), ("f16", &other)])],
        vec![],
    );
    let m = mount_with(&store, |config| config.threads = 1);
    let file = m.path("local/x/latest/f32/model.safetensors");
    let good = fs::read(&file).unwrap();
    let other_file = m.path("local/x/latest/f16/model.safetensors");
    let other_good = fs::read(&other_file).unwrap();

    // Chunk 1 (the end of b.weight and c.bias) cut in half after the mount proved it: a read
    // across the chunk boundary is one batch of a range of chunk 0 and one that runs past the
    // blob's end (a short, then a zero-length completion).
    let blob = store.object_path(&c.chunks[1]);
    let whole = fs::read(&blob).unwrap();
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o644)).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&blob)
        .unwrap()
        .set_len(whole.len() as u64 / 2)
        .unwrap();
    let boundary = good.len() as u64 - whole.len() as u64;
    for round in 0..4 {
        drop_cached_pages(&file);
        let mut buf = vec![0u8; 1 << 20];
        let err = fs::File::open(&file)
            .unwrap()
            .read_exact_at(&mut buf, boundary - (512 << 10))
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "round {round}: {err}");
        // The same (only) daemon thread serves the next requests exactly.
        drop_cached_pages(&other_file);
        assert!(
            fs::read(&other_file).unwrap() == other_good,
            "round {round}: another file's bytes after the failed batch"
        );
        let mut head = vec![0u8; 1 << 20];
        drop_cached_pages(&file);
        fs::File::open(&file)
            .unwrap()
            .read_exact_at(&mut head, 4096)
            .unwrap();
        assert!(head[..] == good[4096..4096 + (1 << 20)], "round {round}");
    }

    // Restored, the blob serves again.
    fs::write(&blob, &whole).unwrap();
    drop_cached_pages(&file);
    assert!(fs::read(&file).unwrap() == good);
    m.unmount();
}
