//! `tensorfs quantize`: deterministic new lanes that share unchanged tensors' chunks and decode
//! back close to the source.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::fs;

use tensorfs::format::{Body, Header, Repo, Tree};
use tensorfs::store::Store;

fn header_of(store: &Store, commit: &tensorfs::format::ObjectRef) -> Header {
    store.commit(commit).unwrap().header
}

fn commits(store: &Store) -> Vec<tensorfs::format::ObjectRef> {
    let repo: Repo = store.repo("local/tiny").unwrap().unwrap();
    repo.commits
}

/// A Transformers folder with finite weights, one holding a NaN.
fn model(root: &std::path::Path) {
    use safetensors::Dtype::*;
    let mut nan = floats(64, 9);
    nan[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
    let weights = safetensors_file(
        &[
            T(
                "embeddings.word_embeddings.weight",
                F32,
                vec![16, 8],
                floats(128, 1),
            ),
            T(
                "encoder.layer.0.attention.self.query.weight",
                F32,
                vec![8, 8],
                floats(64, 2),
            ),
            T(
                "encoder.layer.0.attention.self.query.bias",
                F32,
                vec![8],
                floats(8, 3),
            ),
            T(
                "encoder.layer.0.attention.self.key.weight",
                F32,
                vec![8, 8],
                nan,
            ),
            T("embeddings.position_ids", I64, vec![1, 4], bytes(32, 4)),
        ],
        Some(&[("format", "pt")]),
    );
    write_tree(
        root,
        &[
            (
                "config.json",
                br#"{"architectures": ["BertModel"], "hidden_size": 8}"#.to_vec(),
            ),
            ("model.safetensors", weights),
        ],
    );
}

#[test]
fn a_quantized_lane_shares_the_chunks_of_its_kept_tensors_and_decodes_close() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src);
    let root = dir.path().join("store");
    ok(
        &root,
        &["import", src.to_str().unwrap(), "--name", "local/tiny"],
    );
    let first = ok(
        &root,
        &[
            "quantize",
            "local/tiny",
            "--scheme",
            "int8.rowwise",
            "--name",
            "local/tiny",
            "--json",
        ],
    );
    let again = ok(
        &root,
        &[
            "quantize",
            "local/tiny",
            "--from-lane",
            "f32",
            "--scheme",
            "int8.rowwise",
            "--name",
            "local/tiny",
            "--json",
        ],
    );
    let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
    assert_eq!(
        json(&first)["commit"],
        json(&again)["commit"],
        "the same source and scheme give the same commit"
    );
    let left = &json(&first)["left_plain"];
    assert_eq!(
        left[0][0], "model/encoder.layer.0.attention.self.key.weight",
        "{left}"
    );

    let store = Store::open(&root).unwrap();
    let all = commits(&store);
    let (source, quantized) = (header_of(&store, &all[0]), header_of(&store, &all[1]));
    let tree: Tree = store.commit(&all[1]).unwrap().tree;
    assert_eq!(tree.lane.as_deref(), Some("int8.rowwise"));
    let c = &quantized.components[0];
    let encoded: Vec<&str> = c
        .tensors
        .iter()
        .filter(|t| matches!(t.body, Body::Encoded { .. }))
        .map(|t| t.key.as_str())
        .collect();
    assert_eq!(
        encoded,
        [
            "embeddings.word_embeddings.weight",
            "encoder.layer.0.attention.self.query.weight"
        ]
    );
    let source_chunks: BTreeSet<_> = source.chunks.iter().collect();
    for t in &c.tensors {
        if let Body::Plain(location) = t.body {
            assert!(
                source_chunks.contains(&quantized.chunks[location.chunk as usize]),
                "{} keeps a source chunk",
                t.key
            );
        }
    }
    assert!(quantized.metadata.contains_key("provenance"));
    assert!(!quantized.metadata.contains_key("source_files"));

    let out = dir.path().join("decoded");
    ok(
        &root,
        &[
            "export",
            "local/tiny",
            out.to_str().unwrap(),
            "--lane",
            "int8.rowwise",
            "--decode",
        ],
    );
    let decoded = fs::read(out.join("model.safetensors")).unwrap();
    let decoded = safetensors::SafeTensors::deserialize(&decoded).unwrap();
    let original = fs::read(src.join("model.safetensors")).unwrap();
    let original = safetensors::SafeTensors::deserialize(&original).unwrap();
    for name in [
        "embeddings.word_embeddings.weight",
        "encoder.layer.0.attention.self.query.weight",
    ] {
        let floats = |b: &[u8]| {
            b.chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect::<Vec<_>>()
        };
        let (a, b) = (
            floats(original.tensor(name).unwrap().data()),
            floats(decoded.tensor(name).unwrap().data()),
        );
        let amax = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= amax / 127.0,
            "{name}: worst error {worst} of amax {amax}"
        );
    }
    assert_eq!(
        decoded.tensor("embeddings.position_ids").unwrap().data(),
        original.tensor("embeddings.position_ids").unwrap().data()
    );
}

#[test]
fn bad_schemes_lanes_and_names_are_refused_without_changing_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src);
    let root = dir.path().join("store");
    ok(
        &root,
        &["import", src.to_str().unwrap(), "--name", "local/tiny"],
    );
    let before = snapshot(&root);
    for (args, fragment) in [
        (
            vec!["--scheme", "gptq.int4", "--name", "local/tiny"],
            "gptq.int4",
        ),
        (
            vec!["--scheme", "int8.rowwise", "--name", "acme/tiny"],
            "local/<name>",
        ),
        (
            vec![
                "--scheme",
                "int8.rowwise",
                "--name",
                "local/tiny",
                "--lane",
                "_bad",
            ],
            "label",
        ),
    ] {
        let mut all = vec!["quantize", "local/tiny"];
        all.extend(args);
        let err = fails(&root, &all);
        assert!(err.contains(fragment), "{err}");
    }
    assert_eq!(snapshot(&root), before);
}

#[test]
fn a_damaged_source_blob_stops_the_quantize_and_leaves_the_store_as_it_was() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src);
    let root = dir.path().join("store");
    ok(
        &root,
        &["import", src.to_str().unwrap(), "--name", "local/tiny"],
    );
    let store = Store::open(&root).unwrap();
    let chunk = header_of(&store, &commits(&store)[0]).chunks[0];
    let blob = store.object_path(&chunk);
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = fs::read(&blob).unwrap();
    bytes[0] ^= 0xFF;
    fs::write(&blob, &bytes).unwrap();
    // The verification ledger is a cache of proofs, not content; everything else must stay.
    let content = |root: &std::path::Path| {
        let mut files = snapshot(root);
        files.retain(|p, _| p != std::path::Path::new("verified"));
        files
    };
    let before = content(&root);
    let err = fails(
        &root,
        &[
            "quantize",
            "local/tiny",
            "--scheme",
            "int8.rowwise",
            "--name",
            "local/tiny",
        ],
    );
    assert!(
        err.contains("damaged blob") && err.contains(&chunk.sha256.hex()),
        "{err}"
    );
    assert_eq!(content(&root), before);
}
