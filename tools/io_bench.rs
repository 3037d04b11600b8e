//! Chunk I/O backends side by side:
//! `cargo run --release --example io_bench [-- GIB [DIR] [--json] [--run K]]`.
//!
//! Writes GIB GiB (default 1; a fraction such as 0.25 is rounded to whole blobs, at least one)
//! of 64 MiB blobs into DIR (default: a temporary folder under target/), then reads them with
//! every backend (`pread`, `mmap`, `uring`, `uring-direct`, `auto`), warm (in the page cache)
//! and cold (evicted with `posix_fadvise(DONTNEED)`), in batches of 4 KiB requests at random
//! offsets and of sequential 128 KiB, 1 MiB and 8 MiB requests. Each backend reads through
//! descriptors of its own (pages a mapping holds are not evicted), in an order that each case
//! and each run (`--run K`) rotates. Prints GB/s and the ratio to `pread` in the same run, as a
//! table and as JSON (`--json`; `tools/bench --only io` runs it so). docs/io.md records a run
//! and the rule [`Backend::Auto`] follows from it.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Instant;

use tensorfs::io::backend::{self, Backend, Blob, Request};

const BLOB_BYTES: usize = 64 << 20;

/// The blobs at `paths`, newly opened (no descriptor or mapping shared with earlier runs).
fn open(paths: &[PathBuf]) -> Vec<Blob> {
    paths
        .iter()
        .map(|path| {
            let file = File::open(path).expect("opens a blob");
            Blob::new(file, path.clone(), BLOB_BYTES as u64)
        })
        .collect()
}

fn evict(blobs: &[Blob]) {
    for b in blobs {
        // Dirty pages are not dropped: write them back first.
        // SAFETY: a valid descriptor; write-back and advice only.
        unsafe {
            libc::fdatasync(b.file().as_raw_fd());
            libc::posix_fadvise(b.file().as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
}

/// Reads `total` bytes in requests of `size` (sequential, or at pseudo-random aligned offsets
/// when `random`), `batch` requests per call; returns GB/s.
fn run(backend: Backend, blobs: &[Blob], size: usize, random: bool, total: usize) -> f64 {
    let batch = (4 << 20) / size.max(1);
    let batch = batch.clamp(1, 64);
    let mut bufs: Vec<Vec<u8>> = (0..batch).map(|_| vec![0u8; size]).collect();
    let per_blob = BLOB_BYTES / size;
    let count = total / size;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let start = Instant::now();
    let mut done = 0;
    while done < count {
        let n = batch.min(count - done);
        let mut requests: Vec<Request<'_>> = bufs[..n]
            .iter_mut()
            .enumerate()
            .map(|(k, buf)| {
                let index = if random {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state % (blobs.len() * per_blob) as u64) as usize
                } else {
                    done + k
                };
                let blob = &blobs[(index / per_blob) % blobs.len()];
                Request {
                    blob,
                    offset: ((index % per_blob) * size) as u64,
                    buf,
                }
            })
            .collect();
        backend::read(backend, &mut requests).expect("reads");
        done += n;
    }
    (count * size) as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let round: usize = args.iter().position(|a| a == "--run").map_or(0, |i| {
        args.get(i + 1)
            .and_then(|k| k.parse().ok())
            .expect("--run K takes a number")
    });
    let mut rest = args
        .iter()
        .enumerate()
        .filter(|&(i, a)| !a.starts_with("--") && (i == 0 || args[i - 1] != "--run"))
        .map(|(_, a)| a);
    let gib: f64 = rest
        .next()
        .map_or(1.0, |a| a.parse().expect("GIB is a number"));
    let dir: PathBuf = rest.next().map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/io_bench")),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir).expect("a folder for the blobs");
    let count = ((gib * (1u64 << 30) as f64 / BLOB_BYTES as f64).round() as usize).max(1);
    let mut paths = Vec::new();
    let data: Vec<u8> = (0..BLOB_BYTES as u64)
        .map(|i| ((i * 2654435761) >> 11) as u8)
        .collect();
    for i in 0..count {
        let path = dir.join(format!("blob{i:03}"));
        if std::fs::metadata(&path).map(|m| m.len() as usize).ok() != Some(BLOB_BYTES) {
            File::create(&path)
                .and_then(|mut f| f.write_all(&data))
                .expect("writes a blob");
        }
        paths.push(path);
    }
    let total = count * BLOB_BYTES;
    let cases: [(&str, usize, bool, usize); 4] = [
        ("4 KiB random", 4096, true, total / 16),
        ("128 KiB", 128 << 10, false, total),
        ("1 MiB", 1 << 20, false, total),
        ("8 MiB", 8 << 20, false, total),
    ];
    let mut rows = Vec::new();
    for cache in ["warm", "cold"] {
        for (case, &(name, size, random, bytes)) in cases.iter().enumerate() {
            let mut speeds = Vec::new();
            // Each case starts at another backend, and each run (`--run K`) moves that start on:
            // on a virtual disk a cold read's speed depends on what was read just before it, so
            // a fixed order would favour one backend in every run.
            let start = case + round;
            let order = (0..Backend::ALL.len()).map(|k| (k + start) % Backend::ALL.len());
            for backend in order.map(|k| Backend::ALL[k]) {
                // Fresh descriptors for each backend: a blob the mmap backend mapped keeps its
                // pages mapped, and mapped pages are not evicted, so later cold runs would
                // read from the page cache.
                let blobs = open(&paths);
                if cache == "warm" {
                    run(backend, &blobs, size, random, bytes); // fill the cache
                } else {
                    evict(&blobs);
                }
                speeds.push((backend, run(backend, &blobs, size, random, bytes)));
            }
            speeds.sort_by_key(|(b, _)| Backend::ALL.iter().position(|a| a == b));
            rows.push((cache, name, speeds));
        }
    }
    if json {
        let out: Vec<String> = rows
            .iter()
            .map(|(cache, name, speeds)| {
                let s: Vec<String> = speeds
                    .iter()
                    .map(|(b, v)| format!("\"{b:?}\": {v:.3}"))
                    .collect();
                format!(
                    "{{\"cache\": \"{cache}\", \"request\": \"{name}\", \"gb_per_s\": {{{}}}}}",
                    s.join(", ")
                )
            })
            .collect();
        println!("[{}]", out.join(",\n "));
        return;
    }
    println!(
        "{:.2} GiB in {} blobs of 64 MiB; GB/s (ratio to pread)",
        (count * BLOB_BYTES) as f64 / (1u64 << 30) as f64,
        count
    );
    println!(
        "{:<6} {:<14} {:>14} {:>14} {:>14} {:>14} {:>14}",
        "cache", "requests", "pread", "mmap", "uring", "uring-direct", "auto"
    );
    for (cache, name, speeds) in rows {
        let base = speeds[0].1;
        let cells: Vec<String> = speeds
            .iter()
            .map(|(_, v)| format!("{v:.2} ({:.2}×)", v / base))
            .collect();
        println!(
            "{cache:<6} {name:<14} {:>14} {:>14} {:>14} {:>14} {:>14}",
            cells[0], cells[1], cells[2], cells[3], cells[4]
        );
    }
}
