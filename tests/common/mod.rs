//! Helpers shared by integration tests: building safetensors files and model folders,
//! running the binary, and snapshotting a store.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `tensorfs` binary under test. A mount started without `--log-file` logs under the
/// target folder (`XDG_STATE_HOME`), never into the user's own state folder.
pub fn tensorfs() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tensorfs"));
    command.env(
        "XDG_STATE_HOME",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("state"),
    );
    command
}

/// Runs `tensorfs --store <store> <args>`.
pub fn run(store: &Path, args: &[&str]) -> Output {
    tensorfs()
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .expect("the binary runs")
}

/// Runs and asserts success, returning stdout.
pub fn ok(store: &Path, args: &[&str]) -> String {
    succeeds(run(store, args), &format!("tensorfs {args:?}"))
}

/// Runs `command` and asserts success, returning stdout.
pub fn ok_command(command: &mut Command) -> String {
    let what = format!("{command:?}");
    succeeds(command.output().expect("the command runs"), &what)
}

fn succeeds(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Runs and asserts failure, returning stderr.
pub fn fails(store: &Path, args: &[&str]) -> String {
    let out = run(store, args);
    assert!(
        !out.status.success(),
        "tensorfs {args:?} succeeded but should fail"
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("panicked"),
        "tensorfs {args:?} panicked:\n{stderr}"
    );
    stderr
}

/// Mounts `store` at `mnt` in the background, logging to `log`, with `extra` flags; returns
/// the command's output.
pub fn mount_background(store: &Path, mnt: &Path, log: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "mount",
        mnt.to_str().unwrap(),
        "--log-file",
        log.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    ok(store, &args)
}

/// Unmounts its mount point lazily when dropped, if something is still mounted there, so a
/// failing test leaves no mount behind.
pub struct Unmount(pub PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// A safetensors file from raw header JSON text and a data buffer.
pub fn raw_safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// A tensor to write with the safetensors library: name, dtype, shape, bytes.
pub struct T<'a>(
    pub &'a str,
    pub safetensors::Dtype,
    pub Vec<usize>,
    pub Vec<u8>,
);

/// A safetensors file written by the safetensors crate (the producers' writer).
pub fn safetensors_file(tensors: &[T], metadata: Option<&[(&str, &str)]>) -> Vec<u8> {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|T(name, dtype, shape, data)| {
            (
                name.to_string(),
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), data)
                    .expect("a valid view"),
            )
        })
        .collect();
    let metadata = metadata.map(|m| {
        m.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
    safetensors::serialize(views, metadata).expect("serializes")
}

/// Deterministic bytes.
pub fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Finite F32 values in [-1, 1), little-endian: `n` of them (`4 * n` bytes), deterministic in
/// `seed`.
pub fn floats(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 2000) as f32 / 1000.0 - 1.0)
        .flat_map(|v: f32| v.to_le_bytes())
        .collect()
}

/// Writes `files` (relative path → bytes) under `root`.
pub fn write_tree(root: &Path, files: &[(&str, Vec<u8>)]) {
    for (path, data) in files {
        let dest = root.join(path);
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::write(dest, data).unwrap();
    }
}

/// Every file under `root` with its bytes (the whole state of a store).
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.insert(p.strip_prefix(root).unwrap().join(""), Vec::new());
                walk(&p, root, out);
            } else {
                out.insert(
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    fs::read(&p).unwrap(),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Every file under `root`, relative path → bytes (folders left out).
pub fn files_of(root: &Path) -> BTreeMap<String, Vec<u8>> {
    snapshot(root)
        .into_iter()
        .filter(|(p, _)| root.join(p).is_file())
        .map(|(p, b)| (p.to_string_lossy().into_owned(), b))
        .collect()
}

/// The names in the `tmp/` folder of the store at `root`, lock files left out: what unfinished
/// writes left behind.
pub fn temp_files(root: &Path) -> Vec<String> {
    fs::read_dir(root.join("tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".lock"))
        .collect()
}

/// A small Transformers folder: config, tokenizer files, README, and `model.safetensors`.
pub fn transformers_folder(root: &Path) {
    use safetensors::Dtype::*;
    let weights = safetensors_file(
        &[
            T(
                "embeddings.word_embeddings.weight",
                F32,
                vec![16, 8],
                bytes(512, 1),
            ),
            T(
                "encoder.layer.0.attention.self.query.weight",
                F32,
                vec![8, 8],
                bytes(256, 2),
            ),
            T(
                "encoder.layer.0.attention.self.query.bias",
                F32,
                vec![8],
                bytes(32, 3),
            ),
            T("embeddings.position_ids", I64, vec![1, 4], bytes(32, 4)),
        ],
        Some(&[("format", "pt")]),
    );
    write_tree(
        root,
        &[
            ("config.json", b"{\n  \"architectures\": [\"BertModel\"],\n  \"hidden_size\": 8,\n  \"layer_norm_eps\": 1e-12,\n  \"transformers_version\": \"4.8.2\"\n}\n".to_vec()),
            ("tokenizer.json", b"{\"version\": \"1.0\"}".to_vec()),
            ("vocab.txt", b"[PAD]\n[UNK]\nhello\n".to_vec()),
            ("README.md", b"# tiny\n".to_vec()),
            ("1_Pooling/config.json", b"{\"pooling_mode_mean_tokens\": true}".to_vec()),
            ("model.safetensors", weights),
        ],
    );
}

/// The commit ids `import` printed (`imported NAME@sha256:<hex> lane …` lines).
pub fn commits(said: &str) -> Vec<String> {
    said.lines()
        .filter_map(|l| l.strip_prefix("imported "))
        .filter_map(|l| l.split('@').nth(1)?.split(' ').next().map(str::to_owned))
        .collect()
}

/// A hub cache written by huggingface_hub itself (`tools/fixtures/hub_cache.py`: its
/// `snapshot_download` of `folder` as `repo` at `revision`, against a loopback server speaking
/// the hub's routes) into `cache`. Returns the fixture's JSON line: the commit, the snapshot
/// folder and each file's etag.
pub fn hub_cache(
    python: &Path,
    folder: &Path,
    repo: &str,
    revision: &str,
    cache: &Path,
) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/fixtures/hub_cache.py");
    let out = Command::new(python)
        .arg(script)
        .arg("--folder")
        .arg(folder)
        .args(["--repo", repo, "--revision", revision])
        .arg("--cache")
        .arg(cache)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "hub_cache.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().expect("a JSON line")).unwrap()
}

/// Whether an import into `store` is writing chunks: a temp file other than a lock is staged
/// in `tmp/` (its signal handlers are in place by then).
pub fn staging(store: &Path) -> bool {
    fs::read_dir(store.join("tmp")).is_ok_and(|d| {
        d.flatten()
            .any(|e| !e.file_name().to_string_lossy().ends_with(".lock"))
    })
}

/// Sets the mtime of every file under `dir` back by `by` (blobs, uses: past the grace, as a
/// collection judges them).
pub fn age(dir: &Path, by: std::time::Duration) {
    let then = std::time::SystemTime::now() - by;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            age(&p, by);
        } else if let Ok(f) = std::fs::File::open(&p) {
            let _ = f.set_modified(then);
        }
    }
}
