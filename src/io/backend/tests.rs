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
fn cold(blob: &Blob) -> Blob {
    let fresh = reopen(blob);
    evict(&fresh);
    if !on_tmpfs(fresh.path()) {
        let mut page = [0u8; 4096];
        let n = page.len().min(fresh.length as usize);
        assert_eq!(
            read_cached(&fresh, 0, &mut page[..n]).unwrap(),
            0,
            "evicted pages are not in the page cache"
        );
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
