//! Producer conventions through the binary, on the checkpoints in `tests/data/conventions`
//! (made by the producers themselves where they install; `tools/fixtures/conventions.py`).
//!
//! For each case: `tensorfs import` either refuses it (naming what `expect.json` lists, leaving
//! the store without a repo) or makes the encoded tensors `expect.json` lists (scheme, params,
//! logical dtype and shape, the role of each producer array), keeps the other arrays plain,
//! exports the source files byte for byte, and `export --decode` gives each encoded tensor the
//! bytes the reference implementation decodes (their SHA-256).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value as J;
use sha2::{Digest, Sha256};
use tensorfs::format::json as tjson;
use tensorfs::format::{Body, Header, Tensor};
use tensorfs::store::Store;

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/conventions");
    let mut cases: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expect.json").is_file())
        .collect();
    cases.sort();
    cases
}

fn tensors(header: &Header) -> BTreeMap<&str, &Tensor> {
    header
        .components
        .iter()
        .flat_map(|c| &c.tensors)
        .map(|t| (t.key.as_str(), t))
        .collect()
}

/// Every file under `root` (or `root` itself), by path relative to it.
fn files(root: &Path) -> BTreeMap<String, Vec<u8>> {
    if root.is_file() {
        let name = root.file_name().unwrap().to_string_lossy().into_owned();
        return BTreeMap::from([(name, fs::read(root).unwrap())]);
    }
    files_of(root)
}

/// The tensors of every safetensors file under `root`: key → (dtype, bytes).
fn decoded(root: &Path) -> BTreeMap<String, (String, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for (path, bytes) in files_of(root) {
        if !path.ends_with(".safetensors") {
            continue;
        }
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, view) in st.tensors() {
            out.insert(name, (format!("{:?}", view.dtype()), view.data().to_vec()));
        }
    }
    out
}

/// Checks one case; returns what is wrong.
fn check(case: &Path) -> Vec<String> {
    let mut wrong = Vec::new();
    let expect: J = serde_json::from_slice(&fs::read(case.join("expect.json")).unwrap()).unwrap();
    let source = case.join(expect["source"].as_str().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let store_root = dir.path().join("store");
    let name = "local/case";
    let mut args = vec!["import", source.to_str().unwrap(), "--name", name, "--json"];
    if let Some(c) = expect["converter"].as_str() {
        args.extend(["--converter", c]);
    }

    if let Some(refuse) = expect["refuse"].as_array() {
        let out = run(&store_root, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return vec!["imported, but should be refused".into()];
        }
        for want in refuse {
            let want = want.as_str().unwrap();
            if !stderr.contains(want) {
                wrong.push(format!("the refusal lacks {want:?}: {stderr}"));
            }
        }
        let store = Store::open(&store_root).unwrap();
        if store.repo(name).unwrap().is_some() {
            wrong.push("a refused import made its repo".into());
        }
        return wrong;
    }

    let out = run(&store_root, &args);
    if !out.status.success() {
        return vec![format!("refused: {}", String::from_utf8_lossy(&out.stderr))];
    }
    let report: J = serde_json::from_slice(&out.stdout).unwrap();
    let store = Store::open(&store_root).unwrap();
    let id = report["lanes"][0]["commit"].as_str().unwrap();
    let repo = store.repo(name).unwrap().unwrap();
    let commit = *repo.commits.iter().find(|c| c.id() == id).unwrap();
    let header = store.commit(&commit).unwrap().header;
    let by_key = tensors(&header);

    for (key, want) in expect["tensors"].as_object().unwrap() {
        let Some(t) = by_key.get(key.as_str()) else {
            wrong.push(format!("{key}: no such tensor"));
            continue;
        };
        let Body::Encoded { encoding, parts } = &t.body else {
            wrong.push(format!("{key}: plain, not {}", want["scheme"]));
            continue;
        };
        let e = &header.encodings[*encoding];
        if e.scheme != want["scheme"].as_str().unwrap() {
            wrong.push(format!("{key}: scheme {} not {}", e.scheme, want["scheme"]));
        }
        let params = tjson::canonical(&tjson::from_value(&tensorfs::format::Value::map(
            e.params.iter().map(|(k, v)| (k.clone(), v.clone())),
        )))
        .unwrap();
        let want_params =
            tjson::canonical(&tjson::parse(want["params"].to_string().as_bytes()).unwrap())
                .unwrap();
        if params != want_params {
            wrong.push(format!("{key}: params {params} not {want_params}"));
        }
        if t.dtype.name() != want["dtype"].as_str().unwrap() {
            wrong.push(format!("{key}: dtype {} not {}", t.dtype, want["dtype"]));
        }
        let shape: Vec<u64> = serde_json::from_value(want["shape"].clone()).unwrap();
        if t.shape != shape {
            wrong.push(format!("{key}: shape {:?} not {shape:?}", t.shape));
        }
        let roles: BTreeSet<&str> = parts.iter().map(|p| p.role.as_str()).collect();
        let want_roles: BTreeSet<&str> = want["parts"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .chain(
                want.get("synth_parts")
                    .and_then(J::as_object)
                    .into_iter()
                    .flat_map(|m| m.keys().map(String::as_str)),
            )
            .collect();
        if roles != want_roles {
            wrong.push(format!("{key}: parts {roles:?} not {want_roles:?}"));
        }
        for (role, dtype) in want
            .get("part_dtypes")
            .and_then(J::as_object)
            .into_iter()
            .flatten()
        {
            match parts.iter().find(|p| p.role == *role) {
                Some(p) if p.dtype.name() == dtype.as_str().unwrap() => {}
                Some(p) => wrong.push(format!("{key}: part {role} is {} not {dtype}", p.dtype)),
                None => {}
            }
        }
    }
    for (key, want) in expect["tensors"].as_object().unwrap() {
        let Some(Body::Encoded { parts, .. }) = by_key.get(key.as_str()).map(|t| &t.body) else {
            continue;
        };
        let shapes = want
            .get("part_shapes")
            .and_then(J::as_object)
            .into_iter()
            .flatten()
            .map(|(role, shape)| (role.clone(), shape.clone()))
            .chain(
                want.get("synth_parts")
                    .and_then(J::as_object)
                    .into_iter()
                    .flatten()
                    .map(|(role, synth)| (role.clone(), synth["shape"].clone())),
            );
        for (role, shape) in shapes {
            let shape: Vec<u64> = serde_json::from_value(shape).unwrap();
            if let Some(p) = parts.iter().find(|p| p.role == role) {
                if p.shape != shape {
                    wrong.push(format!("{key}: part {role} is {:?} not {shape:?}", p.shape));
                }
            }
        }
    }
    for plain in expect["plain"].as_array().into_iter().flatten() {
        let plain = plain.as_str().unwrap();
        match by_key.get(plain) {
            Some(t) if matches!(t.body, Body::Plain(_)) => {}
            Some(_) => wrong.push(format!("{plain}: encoded, not plain")),
            None => wrong.push(format!("{plain}: no such tensor")),
        }
    }

    // The lane folder re-creates the source files.
    let out = dir.path().join("out");
    ok(&store_root, &["export", name, out.to_str().unwrap()]);
    let exported = files_of(&out);
    for (path, bytes) in files(&source) {
        match exported.get(&path) {
            Some(b) if *b == bytes => {}
            Some(_) => wrong.push(format!("export: {path} differs from the source")),
            None if path.ends_with(".safetensors") || path.ends_with("config.json") => {
                wrong.push(format!("export: {path} is missing"))
            }
            None => {}
        }
    }

    // The decoded view decodes as the reference does.
    let dec = dir.path().join("decoded");
    ok(
        &store_root,
        &["export", name, dec.to_str().unwrap(), "--decode"],
    );
    let dense = decoded(&dec);
    for (key, want) in expect["tensors"].as_object().unwrap() {
        let dtype = want["dtype"].as_str().unwrap();
        let Some(sha) = want
            .get("decoded_sha256")
            .and_then(|s| s.get(dtype))
            .and_then(J::as_str)
        else {
            continue;
        };
        match dense.get(key) {
            Some((_, bytes)) if hex::encode(Sha256::digest(bytes)) == sha => {}
            Some((d, _)) => wrong.push(format!(
                "{key}: decoded {d} bytes differ from the reference's"
            )),
            None => wrong.push(format!("{key}: not in the decoded view")),
        }
    }
    for marker in expect["markers"].as_array().into_iter().flatten() {
        if dense.contains_key(marker.as_str().unwrap()) {
            wrong.push(format!("decoded view: marker {marker} is still there"));
        }
    }
    wrong
}

#[test]
fn producer_checkpoints_import_as_their_conventions_say() {
    let cases = cases();
    assert!(!cases.is_empty(), "no cases in tests/data/conventions");
    let mut failures = Vec::new();
    for case in &cases {
        for why in check(case) {
            failures.push(format!(
                "{}: {why}",
                case.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
