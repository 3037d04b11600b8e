use super::*;
use proptest::prelude::*;
use std::io::Write;

/// A blob file of `len` patterned bytes in a temporary folder.
fn blob(len: usize) -> (tempfile::TempDir, Blob, Vec<u8>) {
    let dir = tempfile::Builder::new()
        .prefix("backend-test")
        .tempdir()
        .unwrap();
    let path = dir.path().join("blob");
    let bytes: Vec<u8> = (0..len as u64)
        .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
        .collect();
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&bytes)
        .unwrap();
    let file = File::open(&path).unwrap();
    (dir, Blob::new(file, path, len as u64), bytes)
}

/// Whether `path` is on a tmpfs, which refuses O_DIRECT.
fn on_tmpfs(path: &std::path::Path) -> bool {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and a zeroed struct the call fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type == libc::TMPFS_MAGIC }
}

/// Evicts the blob from the page cache, so reads go to the disk.
fn evict(blob: &Blob) {
    // Dirty pages are not dropped: write them back first.
    // SAFETY: a valid descriptor; write-back and advice only.
    unsafe {
        libc::fdatasync(blob.file().as_raw_fd());
        libc::posix_fadvise(blob.file().as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// A second blob over `blob`'s file, with descriptors and mapping of its own: a mapping made by
/// one backend keeps the file's pages mapped, and mapped pages are not evicted.
fn reopen(blob: &Blob) -> Blob {
    Blob::new(
        File::open(blob.path()).unwrap(),
        blob.path().to_owned(),
        blob.length,
    )
}

/// Evicts a fresh blob over `blob`'s file and checks that its first page is gone from the page
/// cache (a non-blocking read finds nothing), so a "cold" read really goes to the disk.
///
/// Right after a write, ext4 may keep some pages a moment longer (their buffers still in a
/// journal commit): advice that leaves them is given again, for up to a second.
fn cold(blob: &Blob) -> Blob {
    let fresh = reopen(blob);
    evict(&fresh);
    if !on_tmpfs(fresh.path()) {
        let mut page = [0u8; 4096];
        let n = page.len().min(fresh.length as usize);
        let mut cached = read_cached(&fresh, 0, &mut page[..n]).unwrap();
        for _ in 0..100 {
            if cached == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            evict(&fresh);
            cached = read_cached(&fresh, 0, &mut page[..n]).unwrap();
        }
        assert_eq!(cached, 0, "evicted pages are not in the page cache");
    }
    fresh
}

fn read_ranges(backend: Backend, blob: &Blob, ranges: &[(u64, usize)]) -> io::Result<Vec<Vec<u8>>> {
    let mut bufs: Vec<Vec<u8>> = ranges.iter().map(|&(_, n)| vec![0xEE; n]).collect();
    let mut requests: Vec<Request<'_>> = ranges
        .iter()
        .zip(bufs.iter_mut())
        .map(|(&(offset, _), buf)| Request { blob, offset, buf })
        .collect();
    read(backend, &mut requests)?;
    Ok(bufs)
}

#[test]
fn every_backend_reads_the_same_bytes_warm_and_cold() {
    let len = 5 * (1 << 20) + 12345;
    let (_dir, blob, bytes) = blob(len);
    let ranges = [
        (0, 1),
        (7, 4096),
        (4093, 3 * (1 << 20) + 17), // large, unaligned: O_DIRECT through bounce buffers
        (len as u64 - 10, 10),      // the tail
        ((1 << 20) as u64, (1 << 20)),
        (123, 0),
    ];
    for backend in Backend::ALL {
        for cold in [false, true] {
            let blob = if cold {
                self::cold(&blob)
            } else {
                reopen(&blob)
            };
            let got = read_ranges(backend, &blob, &ranges).unwrap();
            if backend == Backend::UringDirect && !on_tmpfs(blob.path()) {
                assert!(
                    blob.direct().is_some(),
                    "a disk filesystem takes O_DIRECT reads"
                );
            }
            for (&(offset, n), got) in ranges.iter().zip(&got) {
                assert!(
                    got[..] == bytes[offset as usize..offset as usize + n],
                    "{backend:?} cold={cold}: range {offset}+{n}"
                );
            }
        }
    }
}

#[test]
fn adjacent_ranges_coalesce_into_reads_of_at_most_a_mebibyte() {
    let (_dir, blob, _) = blob(8 << 20);
    let mut bufs: Vec<Vec<u8>> = (0..12).map(|_| vec![0; 512 << 10]).collect();
    let requests: Vec<Request<'_>> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, buf)| Request {
            blob: &blob,
            offset: (i * (512 << 10)) as u64,
            buf,
        })
        .collect();
    let lens: Vec<usize> = pieces(&requests, false).iter().map(Piece::len).collect();
    assert_eq!(lens, [COALESCE_MAX_BYTES; 6]);
}

#[test]
fn a_range_past_the_end_fails_naming_the_blob() {
    let (_dir, blob, _) = blob(1000);
    for backend in Backend::ALL {
        let err = read_ranges(backend, &blob, &[(990, 20)]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{backend:?}");
        assert!(err.to_string().contains("blob"), "{err}");
    }
}

#[test]
fn backends_parse_from_their_names() {
    assert_eq!("uring".parse::<Backend>(), Ok(Backend::Uring));
    assert_eq!("pread".parse::<Backend>(), Ok(Backend::Pread));
    assert!("disk"
        .parse::<Backend>()
        .unwrap_err()
        .to_string()
        .contains("pread, mmap"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any batch of ranges reads the file's bytes by every backend.
    #[test]
    fn any_batch_reads_the_files_bytes(
        ranges in proptest::collection::vec((0u64..3_000_000, 0usize..1_500_000), 1..12),
        cold in any::<bool>(),
    ) {
        let len = 3_000_000usize;
        let (_dir, blob, bytes) = blob(len);
        let ranges: Vec<(u64, usize)> = ranges
            .into_iter()
            .map(|(o, n)| (o, n.min(len - o as usize)))
            .collect();
        for backend in Backend::ALL {
            let blob = if cold { self::cold(&blob) } else { reopen(&blob) };
            let got = read_ranges(backend, &blob, &ranges).unwrap();
            for (&(offset, n), got) in ranges.iter().zip(&got) {
                prop_assert!(got[..] == bytes[offset as usize..offset as usize + n], "{:?} {}+{}", backend, offset, n);
            }
        }
    }
}

/// Sends SIGUSR1 (a no-op handler, installed without `SA_RESTART`) to one thread while armed,
/// so its waits on the ring are interrupted again and again.
struct SignalStorm {
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

extern "C" fn ignore_signal(_: libc::c_int) {}

impl SignalStorm {
    fn at_this_thread() -> SignalStorm {
        use std::sync::atomic::{AtomicBool, Ordering};
        // SAFETY: a handler that does nothing, for a signal nothing else in the tests uses.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ignore_signal as *const () as usize;
            action.sa_flags = 0;
            libc::sigemptyset(&mut action.sa_mask);
            assert_eq!(
                libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()),
                0
            );
        }
        // SAFETY: the id of the calling thread, which outlives the storm (joined in drop).
        let target = unsafe { libc::pthread_self() } as usize;
        let armed = std::sync::Arc::new(AtomicBool::new(false));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let thread = {
            let (armed, stop) = (armed.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if armed.load(Ordering::Relaxed) {
                        // SAFETY: the target thread lives until this thread is joined.
                        unsafe { libc::pthread_kill(target as libc::pthread_t, libc::SIGUSR1) };
                    }
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            })
        };
        SignalStorm {
            armed,
            stop,
            thread: Some(thread),
        }
    }

    fn arm(&self, on: bool) {
        self.armed.store(on, std::sync::atomic::Ordering::SeqCst);
        if !on {
            // A signal sent just before disarming lands now, not in the next step.
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

impl Drop for SignalStorm {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

/// A batch whose one read fails (a descriptor open only for writing) while cold 1 MiB reads of
/// the same batch are in flight, its waits interrupted by signals: the failure is reported,
/// nothing writes the caller's buffers after `read` returns, and the next batch on the same
/// thread reads exactly its own bytes. (Before the batches drained, an interrupted wait or the
/// failed completion returned at once: the cold reads landed in the reused buffers later, and
/// their completions were taken for the next batch's.)
#[test]
fn a_failed_read_leaves_no_read_in_flight_and_the_next_batch_exact() {
    let (_dir, blob, bytes) = blob(16 << 20);
    if on_tmpfs(blob.path()) {
        // Reads of a tmpfs complete at once: nothing would be in flight.
        eprintln!("a_failed_read_leaves_no_read_in_flight: the temporary folder is a tmpfs");
    }
    let unreadable = Blob::new(
        std::fs::OpenOptions::new()
            .write(true)
            .open(blob.path())
            .unwrap(),
        blob.path().to_owned(),
        blob.length,
    );
    let storm = SignalStorm::at_this_thread();
    for round in 0..8 {
        let fresh = cold(&blob);
        let mut bufs: Vec<Vec<u8>> = (0..16).map(|_| vec![0; 1 << 20]).collect();
        let mut bad = vec![0u8; 4096];
        {
            let mut requests: Vec<Request<'_>> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, buf)| Request {
                    blob: &fresh,
                    offset: (i << 20) as u64,
                    buf,
                })
                .collect();
            requests.push(Request {
                blob: &unreadable,
                offset: 0,
                buf: &mut bad,
            });
            storm.arm(true);
            let err = read(Backend::Uring, &mut requests).unwrap_err();
            storm.arm(false);
            assert!(
                err.to_string().contains("Bad file descriptor"),
                "round {round}: the failed read's own error, not an interrupted wait: {err}"
            );
        }
        for b in &mut bufs {
            b.fill(0xAA);
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(
            bufs.iter().all(|b| b.iter().all(|&x| x == 0xAA)),
            "round {round}: a read wrote the buffers after the batch returned"
        );

        let fresh = cold(&blob);
        storm.arm(true);
        let got = read_ranges(
            Backend::Uring,
            &fresh,
            &(0..8)
                .map(|i| ((i << 20) as u64 + 7, 1 << 20))
                .collect::<Vec<_>>(),
        );
        storm.arm(false);
        let got = got.unwrap_or_else(|e| panic!("round {round}: the next batch failed: {e}"));
        for (i, g) in got.iter().enumerate() {
            let at = (i << 20) + 7;
            assert!(
                g[..] == bytes[at..at + (1 << 20)],
                "round {round}: the next batch's read {i} holds other bytes"
            );
        }
    }
}

/// A range that runs past the file's end (a blob shorter than its object says): a short
/// completion, then a zero-length one for the rest, reported as the blob's end, with the bytes
/// before it read.
#[test]
fn short_and_zero_length_completions_end_in_the_blobs_end() {
    let (_dir, blob, bytes) = blob(3 << 20);
    let claims_more = Blob::new(
        File::open(blob.path()).unwrap(),
        blob.path().to_owned(),
        5 << 20,
    );
    for backend in [Backend::Uring, Backend::UringDirect] {
        let mut buf = vec![0u8; 2 << 20];
        let mut ok = vec![0u8; 1 << 20];
        let mut requests = vec![
            Request {
                blob: &claims_more,
                offset: (2 << 20) + 100,
                buf: &mut buf,
            },
            Request {
                blob: &claims_more,
                offset: 5,
                buf: &mut ok,
            },
        ];
        let err = read(backend, &mut requests).unwrap_err();
        assert_eq!(
            err.kind(),
            io::ErrorKind::UnexpectedEof,
            "{backend:?}: {err}"
        );
        assert!(
            err.to_string().contains("past its end"),
            "{backend:?}: {err}"
        );
        if backend == Backend::Uring {
            // Buffered reads land in place (O_DIRECT ones are copied out of bounce buffers
            // only while the batch goes on).
            let have = (1 << 20) - 100;
            assert!(
                buf[..have] == bytes[(2 << 20) + 100..],
                "the short read's bytes"
            );
        }
        // The same thread's next batch is whole.
        let got = read_ranges(backend, &reopen(&blob), &[(5, 1 << 20)]).unwrap();
        assert!(got[0][..] == bytes[5..5 + (1 << 20)], "{backend:?}");
    }
}
