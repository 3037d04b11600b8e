//! Quick decode speed of a few schemes on synthetic data (development aid; the benchmark
//! against the reference is tools/decode_bench.py).
use std::collections::BTreeMap;
use std::time::Instant;
use tensorfs::decode::{decode, Encoded, Part};
use tensorfs::format::Dtype;

fn main() {
    let (rows, cols) = (4096u64, 4096u64);
    let weight: Vec<u8> = (0..rows * cols)
        .map(|i| (i * 2654435761 >> 7) as u8)
        .collect();
    let scale: Vec<u8> = (0..rows)
        .flat_map(|i| (1.0f32 + i as f32 / 1000.0).to_le_bytes())
        .collect();
    let params = BTreeMap::new();
    for (scheme, wdtype) in [("int8.rowwise", Dtype::I8), ("fp8.rowwise", Dtype::F8_E4M3)] {
        let shape = [rows, cols];
        let sshape = [rows];
        for threads in [1, 0] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let tensor = Encoded {
                scheme,
                params: &params,
                dtype: &Dtype::BF16,
                shape: &shape,
                parts: vec![
                    Part {
                        role: "weight",
                        dtype: &wdtype,
                        shape: &shape,
                        bytes: &weight,
                    },
                    Part {
                        role: "scale",
                        dtype: &Dtype::F32,
                        shape: &sshape,
                        bytes: &scale,
                    },
                ],
            };
            let mut out = vec![0u8; (rows * cols * 2) as usize];
            let best = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    pool.install(|| decode(&tensor, &mut out)).unwrap();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::MAX, f64::min);
            println!(
                "{scheme} threads={} {:.0} MB/s of BF16",
                pool.current_num_threads(),
                out.len() as f64 / best / 1e6
            );
        }
    }
}
