//! `tools/gpu_load.py` on a real mount: every tensor loaded through the extents ioctl and
//! direct blob reads equals safetensors' `safe_open(...).get_tensor` (with `--device cpu`, the
//! same path into CPU memory); without CUDA a cuda device is refused with "CUDA not available".
//! Runs the dev venv's python, `$TENSORFS_TEST_PYTHON` (tools/test.sh sets it).

mod fuse_support;
mod skip;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use fuse_support::*;
use tensorfs::format::{Body, Dtype, Encoding, Location, Part, Tensor};
use tensorfs::store::Store;

/// `local/q`, lane `int8`: `w` int8.rowwise ([4, 1024] BF16) whose int8 weight fills chunk 0
/// and continues into chunk 1, where its scales follow; `b` plain F32 in chunk 1.
fn encoded_repo(store: &Store) {
    let weight = noise(4096, 41);
    let scale: Vec<u8> = [0.5f32, 2.0, -1.0, 0.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let bias = noise(64, 42);
    let chunk0 = weight[..3000].to_vec();
    let mut chunk1 = weight[3000..].to_vec();
    chunk1.resize(4096, 0);
    chunk1.extend_from_slice(&scale);
    chunk1.resize(8192, 0);
    chunk1.extend_from_slice(&bias);
    let chunks = vec![
        store.put_bytes(&chunk0).unwrap(),
        store.put_bytes(&chunk1).unwrap(),
    ];
    let location = |chunk, offset, length| Location {
        chunk,
        offset,
        length,
    };
    let tensors = vec![
        Tensor {
            key: "w".into(),
            dtype: Dtype::BF16,
            shape: vec![4, 1024],
            body: Body::Encoded {
                encoding: 0,
                parts: vec![
                    Part {
                        role: "weight".into(),
                        dtype: Dtype::I8,
                        shape: vec![4, 1024],
                        location: location(0, 0, 4096),
                    },
                    Part {
                        role: "scale".into(),
                        dtype: Dtype::F32,
                        shape: vec![4],
                        location: location(1, 4096, 16),
                    },
                ],
            },
        },
        Tensor {
            key: "b".into(),
            dtype: Dtype::F32,
            shape: vec![16],
            body: Body::Plain(location(1, 8192, 64)),
        },
    ];
    let encodings = vec![Encoding {
        scheme: "int8.rowwise".into(),
        params: BTreeMap::new(),
    }];
    let commit = bert_commit(store, Some("int8"), chunks, encodings, tensors);
    set_repo(store, "local/q", vec![], vec![commit]);
}

fn gpu_load(python: &Path, file: &Path, more: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/gpu_load.py");
    Command::new(python)
        .arg(script)
        .arg(file)
        .args(more)
        .output()
        .expect("python runs")
}

/// Runs with `--device cpu --json`, requires success, and returns the JSON summary.
fn on_cpu(python: &Path, file: &Path) -> serde_json::Value {
    let out = gpu_load(python, file, &["--device", "cpu", "--json", "-v"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "gpu_load.py {} failed ({}):\n{stdout}\n{stderr}",
        file.display(),
        out.status
    );
    eprintln!("{stdout}");
    let last = stdout.lines().last().expect("a summary");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}\n{stdout}"))
}

#[test]
fn gpu_load_py_loads_every_tensor_through_the_extents_as_safetensors_does() {
    let Some(python) = std::env::var_os("TENSORFS_TEST_PYTHON") else {
        skip::missing(
            "TENSORFS_TEST_PYTHON is not set; tools/test.sh sets it to the dev venv's python \
             (torch, safetensors)",
        );
        return;
    };
    let python = Path::new(&python);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let plain = commit(&store, Some("f32"), 51);
    set_repo(
        &store,
        "local/x",
        vec![release("1.0", &[("f32", &plain)])],
        vec![],
    );
    encoded_repo(&store);
    let mounted = mount(&store);

    // Plain tensors, one continuing from chunk 0 into chunk 1; small buffers so that the
    // staging buffers are reused many times.
    let file = mounted.path("local/x/1.0/f32/model.safetensors");
    let summary = on_cpu(python, &file);
    assert_eq!(summary["tensors"], 3, "{summary}");
    assert_eq!(summary["arrays_compared"], 3, "{summary}");
    assert_eq!(summary["differ"], serde_json::json!([]), "{summary}");
    let out = gpu_load(python, &file, &["--device", "cpu", "--buffer-mib", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An encoded tensor: its parts are moved raw and each compared with the file's array.
    let latest = mounted.path("local/q/latest");
    let summary = on_cpu(python, &latest.join("int8/model.safetensors"));
    assert_eq!(
        (&summary["tensors"], &summary["encoded"]),
        (&serde_json::json!(2), &serde_json::json!(1)),
        "{summary}"
    );
    assert_eq!(
        summary["arrays_compared"], 3,
        "w, its scale and b: {summary}"
    );
    assert_eq!(summary["differ"], serde_json::json!([]), "{summary}");
    // The decoded view: the encoded tensor has no stored bytes (ENODATA); the plain one loads.
    let summary = on_cpu(python, &latest.join("int8@decoded/model.safetensors"));
    assert_eq!(summary["decoded_not_located"], serde_json::json!(["w"]));
    assert_eq!(summary["arrays_compared"], 1, "{summary}");

    // The default device is cuda: refused clearly where torch has no CUDA.
    let cuda = Command::new(python)
        .args(["-c", "import torch; print(torch.cuda.is_available())"])
        .output()
        .unwrap();
    let has_cuda = String::from_utf8_lossy(&cuda.stdout).trim() == "True";
    let out = gpu_load(python, &file, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if has_cuda {
        assert!(out.status.success(), "{stderr}");
    } else {
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        assert!(
            stderr.contains("gpu_load: CUDA not available: ") && stderr.contains("--device cpu"),
            "{stderr}"
        );
        assert!(!stderr.contains("Traceback"), "{stderr}");
    }
    mounted.unmount();

    // A file outside a mount has no extents ioctl.
    let outside = dir.path().join("plain.safetensors");
    let header = br#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.push(7);
    std::fs::write(&outside, bytes).unwrap();
    let out = gpu_load(python, &outside, &["--device", "cpu"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not a file of a TensorFS mount"),
        "{stderr}"
    );
}
