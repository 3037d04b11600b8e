//! Decode speed of encoded tensors described by manifests (tools/decode_bench.py writes them
//! and runs this; it is not meant to be run alone).
//!
//! ```sh
//! cargo run --release --example decode_bench -- RUNS MANIFEST.json...
//! ```
//! A manifest is `{"scheme", "params", "shape", "dtype", "parts": [{"role", "dtype", "shape",
//! "file"}]}` with part files beside it. For each, prints one JSON line: the output bytes and
//! the best time of RUNS decodes on one thread and on every core.

use std::path::Path;
use std::time::Instant;

use tensorfs::decode::{decode, Encoded, Part};
use tensorfs::format::json::{self, Json};
use tensorfs::format::{Config, Dtype, Value};

fn field<'a>(fields: &'a [(String, Json)], name: &str) -> &'a Json {
    &fields
        .iter()
        .find(|(k, _)| k == name)
        .expect("manifest field")
        .1
}

fn text(j: &Json) -> &str {
    match j {
        Json::Text(t) => t,
        _ => panic!("text"),
    }
}

fn shape(j: &Json) -> Vec<u64> {
    match j {
        Json::Array(items) => items
            .iter()
            .map(|i| match i {
                Json::Uint(n) => *n,
                _ => panic!("extent"),
            })
            .collect(),
        _ => panic!("shape"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().and_then(|r| r.parse().ok()).expect("RUNS");
    for manifest in args {
        let dir = Path::new(&manifest).parent().expect("a folder");
        let Json::Object(fields) = json::parse(&std::fs::read(&manifest).unwrap()).unwrap() else {
            panic!("manifest")
        };
        let params: Config = match json::to_value(field(&fields, "params")) {
            Value::Map(entries) => entries.into_iter().collect(),
            _ => panic!("params"),
        };
        let Json::Array(parts) = field(&fields, "parts") else {
            panic!("parts")
        };
        let parts: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = parts
            .iter()
            .map(|p| {
                let Json::Object(p) = p else { panic!("part") };
                (
                    text(field(p, "role")).to_owned(),
                    Dtype::parse(text(field(p, "dtype"))).unwrap(),
                    shape(field(p, "shape")),
                    std::fs::read(dir.join(text(field(p, "file")))).unwrap(),
                )
            })
            .collect();
        let dtype = Dtype::parse(text(field(&fields, "dtype"))).unwrap();
        let logical_shape = shape(field(&fields, "shape"));
        let scheme = text(field(&fields, "scheme")).to_owned();
        let tensor = Encoded {
            scheme: &scheme,
            params: &params,
            dtype: &dtype,
            shape: &logical_shape,
            parts: parts
                .iter()
                .map(|(role, dtype, shape, bytes)| Part {
                    role,
                    dtype,
                    shape,
                    bytes,
                })
                .collect(),
        };
        let bytes = dtype.byte_len(&logical_shape).unwrap().unwrap() as usize;
        let mut out = vec![0u8; bytes];
        let mut best = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            (0..runs)
                .map(|_| {
                    let start = Instant::now();
                    pool.install(|| decode(&tensor, &mut out)).unwrap();
                    start.elapsed().as_secs_f64()
                })
                .fold(f64::MAX, f64::min)
        };
        let one = best(1);
        let all = best(std::thread::available_parallelism().map_or(1, |n| n.get()));
        println!("{{\"scheme\":\"{scheme}\",\"bytes\":{bytes},\"one_core_s\":{one},\"all_cores_s\":{all}}}");
    }
}
