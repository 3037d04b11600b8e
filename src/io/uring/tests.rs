use super::*;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;

/// A file of `len` patterned bytes on the disk (not a tmpfs, so cold reads take a while), and
/// its bytes.
fn file(len: usize) -> (tempfile::TempDir, File, Vec<u8>) {
    let dir = tempfile::Builder::new()
        .prefix("uring-test")
        .tempdir()
        .unwrap();
    let path = dir.path().join("blob");
    let bytes: Vec<u8> = (0..len as u64)
        .map(|i| (i.wrapping_mul(2654435761) >> 9) as u8)
        .collect();
    File::create(&path).unwrap().write_all(&bytes).unwrap();
    let f = File::open(&path).unwrap();
    evict(&f);
    (dir, f, bytes)
}

fn evict(f: &File) {
    // SAFETY: advice on an open descriptor.
    unsafe {
        libc::fdatasync(f.as_raw_fd());
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Pushes reads of 1 MiB of `f` into `bufs` through `batch`, as many as fit.
fn push_all(batch: &mut Batch<'_>, f: &File, bufs: &mut [Vec<u8>]) -> Vec<libc::iovec> {
    let iovecs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    for (i, v) in iovecs.iter().enumerate() {
        // SAFETY: the iovecs and buffers outlive the batch in every caller.
        unsafe { batch.readv(f.as_fd(), v, 1, (i << 20) as u64, i as u32) }.unwrap();
    }
    iovecs
}

#[test]
fn a_batch_dropped_early_waits_for_its_reads() {
    let (_dir, f, bytes) = file(16 << 20);
    let mut ring = Ring::new(64, Buffers::none(), false).unwrap();
    let mut bufs: Vec<Vec<u8>> = (0..16).map(|_| vec![0xEE; 1 << 20]).collect();
    let iovecs;
    {
        let mut batch = ring.batch();
        iovecs = push_all(&mut batch, &f, &mut bufs);
        // Dropped without a wait: the drop submits and waits for every read.
    }
    assert_eq!(ring.in_flight, 0);
    drop(iovecs);
    for (i, b) in bufs.iter().enumerate() {
        assert!(b[..] == bytes[i << 20..(i + 1) << 20], "read {i} complete");
    }
}

#[test]
fn a_panic_in_a_batch_drains_it_and_the_next_batch_reads_its_own_bytes() {
    let (_dir, f, bytes) = file(16 << 20);
    let mut ring = Ring::new(64, Buffers::none(), false).unwrap();
    let mut bufs: Vec<Vec<u8>> = (0..16).map(|_| vec![0xEE; 1 << 20]).collect();
    let mut iovecs = Vec::new();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut batch = ring.batch();
        iovecs = push_all(&mut batch, &f, &mut bufs);
        batch.ring.uring.submit().unwrap();
        panic!("a bug while reads are in flight");
    }));
    assert!(panicked.is_err());
    assert_eq!(ring.in_flight, 0, "the unwinding drop drained the batch");
    // The memory is the test's again: nothing writes it any more.
    for b in &mut bufs {
        b.fill(0xAA);
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(bufs.iter().all(|b| b.iter().all(|&x| x == 0xAA)));

    evict(&f);
    let mut again: Vec<Vec<u8>> = (0..4).map(|_| vec![0; 1 << 20]).collect();
    let mut batch = ring.batch();
    let _v = push_all(&mut batch, &f, &mut again);
    let mut seen = Vec::new();
    while !batch.idle() {
        seen.extend(batch.wait().unwrap());
    }
    drop(batch);
    seen.sort_by_key(|c| c.id);
    let ids: Vec<u32> = seen.iter().map(|c| c.id).collect();
    assert_eq!(ids, [0, 1, 2, 3], "only this batch's completions");
    assert!(seen.iter().all(|c| c.result == 1 << 20));
    for (i, b) in again.iter().enumerate() {
        assert!(b[..] == bytes[i << 20..(i + 1) << 20]);
    }
}

#[test]
fn ring_buffers_are_refused_while_a_read_fills_them() {
    let (_dir, f, bytes) = file(1 << 20);
    for register in [true, false] {
        let mut ring = Ring::new(8, Buffers::new(2, 8192).unwrap(), register).unwrap();
        assert_eq!(
            ring.fixed(),
            register,
            "this kernel registers anonymous mappings"
        );
        let mut batch = ring.batch();
        batch.read_buffer(f.as_fd(), 1, 100, 4000, 5000, 7).unwrap();
        assert!(batch.buffer(1).is_none(), "in flight");
        assert!(batch.buffer(0).is_some());
        let err = batch
            .read_buffer(f.as_fd(), 1, 8000, 4000, 0, 8)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        assert!(batch.read_buffer(f.as_fd(), 2, 0, 1, 0, 9).is_err());
        let done = batch.wait().unwrap();
        assert_eq!(
            done,
            [Completion {
                id: 7,
                result: 4000
            }]
        );
        assert!(batch.buffer(1).unwrap()[100..4100] == bytes[5000..9000]);
    }
}

#[test]
fn no_more_reads_than_entries_are_in_flight() {
    let (_dir, f, _) = file(1 << 20);
    let mut ring = Ring::new(4, Buffers::new(1, 4 << 10).unwrap(), true).unwrap();
    assert_eq!(ring.entries(), 4);
    let mut batch = ring.batch();
    for i in 0..4 {
        batch
            .read_buffer(f.as_fd(), 0, i * 1024, 1024, 0, i as u32)
            .unwrap();
    }
    assert!(!batch.has_room());
    let err = batch.read_buffer(f.as_fd(), 0, 0, 1, 0, 9).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
}

#[test]
fn a_ring_copied_by_fork_is_known_as_the_parents() {
    let ring = Ring::new(4, Buffers::none(), false).unwrap();
    assert!(!ring.inherited());
    assert_eq!(crate::sync::in_forked_child(|| ring.inherited()), 0);
}
