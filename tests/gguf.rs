//! GGUF files as an import source, through the binary: the lane folder gives each file back
//! byte for byte, the decoded view gives the tensors gguf-py (or the reference) decodes, and a
//! malformed file is refused naming it, leaving the store as it was.
//!
//! The files are `tests/data/gguf/*.gguf`, written by `tools/fixtures/gguf_files.py` with
//! gguf-py; `expect.json` says what each tensor should read as.

mod common;
mod skip;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value as J;
use sha2::{Digest, Sha256};
use tensorfs::format::gguf::{self, Gguf, KvArray, KvValue, TensorInfo};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gguf")
        .join(name)
}

fn expect() -> Vec<J> {
    let text = fs::read_to_string(data("expect.json")).unwrap();
    let doc: J = serde_json::from_str(&text).unwrap();
    doc["files"].as_array().unwrap().clone()
}

fn expected(file: &str) -> J {
    expect()
        .into_iter()
        .find(|f| f["file"] == file)
        .unwrap_or_else(|| panic!("{file} in expect.json"))
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn import(store: &Path, files: &[PathBuf], name: &str) -> String {
    let mut args = vec!["import".to_owned()];
    args.extend(files.iter().map(|p| p.to_str().unwrap().to_owned()));
    args.extend(["--name".into(), name.into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(store, &args)
}

fn export(store: &Path, name: &str, out: &Path, decode: bool) {
    let mut args = vec!["export", name, out.to_str().unwrap()];
    if decode {
        args.push("--decode");
    }
    ok(store, &args);
}

/// The safetensors dtype name ggml type `ty` becomes.
fn dtype_of(ty: &str) -> &'static str {
    match ty {
        "f32" => "F32",
        "f16" => "F16",
        "bf16" => "BF16",
        "f64" => "F64",
        "i8" => "I8",
        "i16" => "I16",
        "i32" => "I32",
        "i64" => "I64",
        _ => "F32",
    }
}

/// Checks the decoded view's `<stem>.safetensors` against `expect.json`'s entry for `file`.
fn check_decoded(dir: &Path, file: &str) {
    let e = expected(file);
    let stem = file.strip_suffix(".gguf").unwrap();
    let bytes = fs::read(dir.join(format!("{stem}.safetensors"))).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut seen = 0;
    for t in e["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        if t.get("part_of").is_some() {
            assert!(st.tensor(name).is_err(), "{name} is a part, not a tensor");
            continue;
        }
        seen += 1;
        let view = st
            .tensor(name)
            .unwrap_or_else(|e| panic!("{file}: {name}: {e}"));
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(view.shape(), shape, "{file}: {name}");
        let ty = t["type"].as_str().unwrap();
        assert_eq!(
            format!("{:?}", view.dtype()),
            dtype_of(ty),
            "{file}: {name}"
        );
        let want = t
            .get("decoded_sha256")
            .or_else(|| t.get("stored_sha256").filter(|_| t.get("scheme").is_none()))
            .unwrap_or_else(|| panic!("{file}: {name} has no expected bytes"));
        assert_eq!(
            sha(view.data()),
            want.as_str().unwrap(),
            "{file}: {name} ({ty}, by {})",
            t["oracle"]
        );
    }
    assert_eq!(
        st.len(),
        seen,
        "{file}: the decoded file holds other tensors"
    );
}

#[test]
fn gguf_files_export_byte_for_byte_and_decode_to_the_expected_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let files = ["tiny-llama.gguf", "comfy-flux.gguf"];
    for f in files {
        assert_eq!(
            sha(&fs::read(data(f)).unwrap()),
            expected(f)["sha256"].as_str().unwrap(),
            "{f} is the file expect.json describes"
        );
    }
    let sources: Vec<PathBuf> = files.iter().map(|f| data(f)).collect();
    import(&store, &sources, "local/tiny");

    let out = dir.path().join("out");
    export(&store, "local/tiny", &out, false);
    let exported = files_of(&out);
    assert_eq!(exported.len(), 2, "{:?}", exported.keys());
    for f in files {
        assert!(
            exported[f] == fs::read(data(f)).unwrap(),
            "{f} comes back byte for byte"
        );
    }

    let decoded = dir.path().join("decoded");
    export(&store, "local/tiny", &decoded, true);
    for f in files {
        check_decoded(&decoded, f);
    }

    // The same bytes from another path give the same commit.
    let again = dir.path().join("again");
    fs::create_dir_all(&again).unwrap();
    let copies: Vec<PathBuf> = files
        .iter()
        .map(|f| {
            let p = again.join(f);
            fs::copy(data(f), &p).unwrap();
            p
        })
        .collect();
    let first = ok(&store, &["inspect", "local/tiny", "--json"]);
    import(&store, &copies, "local/tiny");
    assert_eq!(ok(&store, &["inspect", "local/tiny", "--json"]), first);

    reference_verify(&store, "local/tiny");
}

#[test]
fn types_the_decoder_does_not_know_are_stored_and_shown_but_not_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let file = "unknown-types.gguf";
    import(&store, &[data(file)], "local/unknown");
    let out = dir.path().join("out");
    export(&store, "local/unknown", &out, false);
    assert!(files_of(&out)[file] == fs::read(data(file)).unwrap());
    let inspect = ok(&store, &["inspect", "local/unknown"]);
    for t in expected(file)["tensors"].as_array().unwrap() {
        if let Some(scheme) = t.get("scheme") {
            assert!(inspect.contains(scheme.as_str().unwrap()), "{inspect}");
        }
    }
    let decoded = dir.path().join("decoded");
    let err = fails(
        &store,
        &[
            "export",
            "local/unknown",
            decoded.to_str().unwrap(),
            "--decode",
        ],
    );
    assert!(
        err.contains("scheme \"gguf.") && err.contains("is not one this build decodes"),
        "{err}"
    );
    reference_verify(&store, "local/unknown");
}

#[test]
fn gguf_and_safetensors_files_import_side_by_side() {
    use safetensors::Dtype::F32;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let weights = safetensors_file(&[T("w", F32, vec![2, 2], bytes(16, 9))], None);
    write_tree(&src, &[("vae.safetensors", weights)]);
    fs::copy(data("comfy-flux.gguf"), src.join("comfy-flux.gguf")).unwrap();
    let store = dir.path().join("store");
    import(
        &store,
        &[src.join("vae.safetensors"), src.join("comfy-flux.gguf")],
        "local/mixed",
    );
    let out = dir.path().join("out");
    export(&store, "local/mixed", &out, false);
    assert_eq!(files_of(&out), files_of(&src));
    let inspect = ok(&store, &["inspect", "local/mixed"]);
    assert!(
        inspect.contains("comfy-flux:") && inspect.contains("vae:"),
        "{inspect}"
    );

    // Two files that would be one component are refused.
    fs::copy(data("comfy-flux.gguf"), src.join("vae.gguf")).unwrap();
    let err = fails(
        &store,
        &[
            "import",
            src.join("vae.gguf").to_str().unwrap(),
            src.join("vae.safetensors").to_str().unwrap(),
            "--name",
            "local/clash",
        ],
    );
    assert!(err.contains("component \"vae\""), "{err}");
}

#[test]
fn a_gguf_in_a_folder_is_skipped_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::copy(data("comfy-flux.gguf"), src.join("model.gguf")).unwrap();
    let err = fails(
        &dir.path().join("store"),
        &["import", src.to_str().unwrap(), "--name", "local/f"],
    );
    assert!(
        err.contains("a .gguf file imports when named itself"),
        "{err}"
    );
}

// ---- Refusals --------------------------------------------------------------------------

/// A small valid GGUF: two keys, an f32 tensor and a q8_0 tensor, with its header.
fn small() -> (Gguf, Vec<u8>) {
    let g = Gguf {
        version: 3,
        kv: vec![
            (
                "general.architecture".into(),
                KvValue::String("llama".into()),
            ),
            (
                "tokenizer.ggml.scores".into(),
                KvValue::Array(KvArray::F32(vec![1.5f32.to_bits(); 3])),
            ),
        ],
        tensors: vec![
            TensorInfo {
                name: "a".into(),
                ne: vec![4],
                ggml_type: 0,
                offset: 0,
            },
            TensorInfo {
                name: "b.weight".into(),
                ne: vec![32],
                ggml_type: 8,
                offset: 32,
            },
        ],
    };
    (g.clone(), file_of(&g))
}

/// `g` as a whole file: its header, `a` as 16 bytes of 1s at 0, `b` as 34 bytes of 2s at 32,
/// then padding to 96.
fn file_of(g: &Gguf) -> Vec<u8> {
    let mut out = gguf::write(g).unwrap();
    let start = out.len();
    out.resize(start + 96, 0);
    out[start..start + 16].fill(1);
    out[start + 32..start + 66].fill(2);
    out
}

/// A store holding one import, so a refused import has something to disturb.
fn seeded(dir: &Path) -> PathBuf {
    let store = dir.join("store");
    import(&store, &[data("comfy-flux.gguf")], "local/seed");
    store
}

/// Imports `bytes` as `bad.gguf` and asserts it is refused naming the file and `problem`,
/// leaving the store as it was; returns the message.
fn refused(bytes: &[u8], problem: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path());
    let before = snapshot(&store);
    let path = dir.path().join("bad.gguf");
    fs::write(&path, bytes).unwrap();
    let err = fails(
        &store,
        &["import", path.to_str().unwrap(), "--name", "local/bad"],
    );
    assert!(err.contains("bad.gguf"), "names the file: {err}");
    assert!(err.contains(problem), "says {problem:?}: {err}");
    assert_eq!(snapshot(&store), before, "the store changed: {err}");
    err
}

#[test]
fn the_small_file_imports() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let path = dir.path().join("small.gguf");
    let (_, bytes) = small();
    fs::write(&path, &bytes).unwrap();
    import(&store, std::slice::from_ref(&path), "local/small");
    let out = dir.path().join("out");
    export(&store, "local/small", &out, false);
    assert!(files_of(&out)["small.gguf"] == bytes);
}

#[test]
fn a_malformed_file_is_refused_naming_it_and_the_store_is_untouched() {
    let (g, bytes) = small();
    refused(&bytes[..bytes.len() - 40], "\"b.weight\"");
    refused(&bytes[..20], "past the end");
    let mut magic = bytes.clone();
    magic[..4].copy_from_slice(b"GGML");
    refused(&magic, "not a GGUF file");
    let mut counts = bytes.clone();
    counts[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    refused(&counts, "claims");
    let mut counts = bytes.clone();
    counts[16..24].copy_from_slice(&(1u64 << 50).to_le_bytes());
    refused(&counts, "claims");

    let mut past = g.clone();
    past.tensors[1].offset = 1 << 40;
    let m = refused(&file_of(&past), "\"b.weight\"");
    assert!(m.contains("past the end"), "{m}");
    let mut unknown = g.clone();
    unknown.tensors[1].ggml_type = 99;
    let m = refused(&file_of(&unknown), "\"b.weight\"");
    assert!(m.contains("ggml type 99"), "{m}");
    let mut overlap = g.clone();
    overlap.tensors[1].offset = 0;
    refused(&file_of(&overlap), "overlaps");

    let mut utf8 = bytes.clone();
    let at = utf8.windows(5).position(|w| w == b"llama").unwrap();
    utf8[at] = 0xff;
    refused(&utf8, "\"general.architecture\"");

    // Padding that is not zero cannot be re-created.
    let data_start = gguf::write(&g).unwrap().len();
    let mut padding = bytes.clone();
    padding[data_start + 20] = 7;
    let m = refused(&padding, "cannot be re-created exactly");
    assert!(m.contains("after tensor \"a\""), "{m}");
    let mut tail = bytes.clone();
    tail.push(0);
    tail.push(5);
    refused(&tail, "after tensor \"b.weight\"");

    // An original shape that does not hold the tensor's elements.
    let mut shaped = g.clone();
    shaped.kv.push((
        "comfy.gguf.orig_shape.b.weight".into(),
        KvValue::Array(KvArray::I32(vec![3, 11])),
    ));
    refused(&file_of(&shaped), "does not hold its 32 elements");
}

#[test]
fn a_refused_import_into_a_new_store_leaves_it_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let path = dir.path().join("cut.gguf");
    let (_, bytes) = small();
    fs::write(&path, &bytes[..bytes.len() - 40]).unwrap();
    let err = fails(
        &store,
        &["import", path.to_str().unwrap(), "--name", "local/cut"],
    );
    assert!(err.contains("cut.gguf"), "{err}");
    let held: BTreeMap<String, Vec<u8>> = files_of(&store)
        .into_iter()
        .filter(|(p, _)| p.starts_with("blobs/") || p.starts_with("refs/"))
        .collect();
    assert!(held.is_empty(), "{:?}", held.keys());
}

// ---- The reference --------------------------------------------------------------------

/// The reference `tfs`: `$TENSORFS_REFERENCE_TFS`, else `/work/cache/refvenv/bin/tfs`.
fn reference_tfs() -> Option<PathBuf> {
    let path = std::env::var_os("TENSORFS_TEST_PYTHON")
        .map(PathBuf::from)
        .and_then(|python| Some(python.parent()?.join("tfs")))?;
    path.is_file().then_some(path)
}

/// `tfs verify` of `name` in `store` must pass, when the reference is installed.
fn reference_verify(store: &Path, name: &str) {
    let Some(tfs) = reference_tfs() else {
        skip::missing(&format!(
            "the reference `tfs verify` of {name}: no `tfs` beside TENSORFS_TEST_PYTHON \
             (tools/test.sh sets it to the dev venv's python)"
        ));
        return;
    };
    let out = Command::new(&tfs)
        .arg("--store")
        .arg(store)
        .args(["verify", name])
        .output()
        .expect("tfs runs");
    assert!(
        out.status.success(),
        "tfs verify {name}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
