//! Locating tensors in the store (`tensorfs::extents`, `tensorfs locate REF FILE TENSOR`):
//! extents across chunks, encoded tensors' parts, the decoded view, and errors.

mod common;
mod fuse_support;

use std::fs::File;
use std::os::unix::fs::FileExt;

use common::*;
use tensorfs::extents::{self, FileTensors, LocateError, Located};
use tensorfs::format::{Dtype, ObjectRef};
use tensorfs::io::{BlobReader, BlobReaderConfig};
use tensorfs::layout::LaneView;
use tensorfs::store::Store;

/// The bytes of `length` at `offset` of a blob file.
fn blob_bytes(path: &std::path::Path, offset: u64, length: u64) -> Vec<u8> {
    let mut buf = vec![0u8; length as usize];
    File::open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .read_exact_at(&mut buf, offset)
        .unwrap();
    buf
}

/// The bytes of each part of `located`, read from its extents' blobs.
fn parts_from_blobs(located: &Located) -> Vec<Vec<u8>> {
    (0..located.parts.len())
        .map(|i| {
            located
                .part_extents(i)
                .iter()
                .flat_map(|x| blob_bytes(&x.path, x.offset, x.length))
                .collect()
        })
        .collect()
}

/// The bytes of `range` of `file` in `view`, as the mount shows them.
fn file_bytes(store: &Store, view: &LaneView, file: &str, range: std::ops::Range<u64>) -> Vec<u8> {
    let reader = BlobReader::new(store.clone(), BlobReaderConfig::default());
    let mut buf = vec![0u8; (range.end - range.start) as usize];
    let n = view
        .file(file)
        .unwrap()
        .content
        .read_at(&reader, range.start, &mut buf)
        .unwrap();
    assert_eq!(n, buf.len());
    buf
}

/// Every part's extents tile its range of the file in order, and hold the file's bytes there.
fn check_against_file(store: &Store, view: &LaneView, located: &Located) {
    let from_blobs = parts_from_blobs(located);
    for (i, part) in located.parts.iter().enumerate() {
        let mut at = part.file_range.start;
        for x in located.part_extents(i) {
            assert_eq!(x.part, i);
            assert_eq!(x.file_offset, at, "extents of part {i} are consecutive");
            assert_eq!(x.path, store.object_path(&x.blob));
            at += x.length;
        }
        assert_eq!(
            at, part.file_range.end,
            "part {i}'s extents cover its range"
        );
        let shown = file_bytes(store, view, &located.file, part.file_range.clone());
        assert!(
            from_blobs[i] == shown,
            "part {i} ({}) of {}: the blobs' bytes are not the file's",
            part.role,
            located.key
        );
    }
}

fn lane_view(store: &Store, commit: &ObjectRef) -> LaneView {
    let c = store.commit(commit).unwrap();
    LaneView::build(&c.id, &c.tree, &c.header).unwrap()
}

#[test]
fn a_plain_tensor_spanning_two_chunks_has_an_extent_in_each_and_pages() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let c = fuse_support::commit(&store, Some("f32"), 7);
    let view = lane_view(&store, &c.id);
    let b = extents::locate(&store, &view, "model.safetensors", "b.weight").unwrap();
    assert_eq!(b.key, "b.weight");
    assert_eq!(
        (b.dtype.clone(), b.shape.clone()),
        (Dtype::F32, vec![256, 1024])
    );
    assert_eq!(b.encoding, None);
    assert_eq!(b.parts.len(), 1);
    assert_eq!(b.parts[0].role, "weight");
    let spans: Vec<_> = b
        .extents
        .iter()
        .map(|x| (x.blob, x.offset, x.length))
        .collect();
    assert_eq!(
        spans,
        [(c.chunks[0], 1_572_864, 524_288), (c.chunks[1], 0, 524_288)]
    );
    assert_eq!(parts_from_blobs(&b)[0], c.tensors[1].bytes);
    check_against_file(&store, &view, &b);
    let a = extents::locate(&store, &view, "model.safetensors", "a.weight").unwrap();
    assert_eq!(
        a.extents.len(),
        1,
        "a tensor within one chunk has one extent"
    );
    assert_eq!(a.parts[0].file_range.end, b.parts[0].file_range.start);
    check_against_file(&store, &view, &a);

    // Paging, one extent a page.
    assert_eq!(b.pages(1), 2);
    assert_eq!(b.page(0, 1), &b.extents[..1]);
    assert_eq!(b.page(1, 1), &b.extents[1..]);
    assert!(b.page(2, 1).is_empty());
    assert!(b.page(u64::MAX, 1).is_empty());
    assert!(b.page(0, 0).is_empty());
    assert_eq!(b.page(0, 128), &b.extents[..]);
}

#[test]
fn errors_name_the_file_and_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let c = fuse_support::commit(&store, Some("f32"), 8);
    let view = lane_view(&store, &c.id);
    let err = extents::locate(&store, &view, "model.safetensors", "nope.weight").unwrap_err();
    assert_eq!(
        err,
        LocateError::NoTensor {
            file: "model.safetensors".into(),
            tensor: "nope.weight".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "model.safetensors: no tensor \"nope.weight\""
    );
    assert_eq!(err.errno(), libc::ENOENT);
    let err = FileTensors::new(&view, "config.json").unwrap_err();
    assert_eq!(
        err.to_string(),
        "config.json: not a safetensors file of the lane"
    );
    assert_eq!(err.errno(), libc::EOPNOTSUPP);
    let err = FileTensors::new(&view, "missing.safetensors").unwrap_err();
    assert!(
        err.to_string().starts_with("missing.safetensors: "),
        "{err}"
    );
}

#[test]
fn an_encoded_tensor_has_each_parts_extents_and_the_decoded_view_refuses_it() {
    use safetensors::Dtype::*;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let weights = safetensors_file(
        &[
            T("layer.0.dense.weight", F32, vec![32, 32], floats(1024, 1)),
            T("layer.0.dense.bias", F32, vec![32], floats(32, 2)),
        ],
        Some(&[("format", "pt")]),
    );
    write_tree(
        &src,
        &[
            (
                "config.json",
                br#"{"architectures": ["BertModel"], "hidden_size": 32}"#.to_vec(),
            ),
            ("model.safetensors", weights),
        ],
    );
    let root = dir.path().join("store");
    ok(
        &root,
        &["import", src.to_str().unwrap(), "--name", "local/tiny"],
    );
    let out = ok(
        &root,
        &[
            "quantize",
            "local/tiny",
            "--scheme",
            "nvfp4",
            "--name",
            "local/tiny",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let commit = report["commit"].as_str().unwrap().to_owned();
    let store = Store::open(&root).unwrap();
    let repo = store.repo("local/tiny").unwrap().unwrap();
    let (source, quantized) = (repo.commits[0], repo.commits[1]);
    assert_eq!(quantized.id(), commit);

    // The imported lane (its files re-created from the recipe) locates like any other.
    let view = lane_view(&store, &source);
    let bias = extents::locate(&store, &view, "model.safetensors", "layer.0.dense.bias").unwrap();
    assert_eq!(parts_from_blobs(&bias)[0], floats(32, 2));
    check_against_file(&store, &view, &bias);

    let view = lane_view(&store, &quantized);
    let w = extents::locate(&store, &view, "model.safetensors", "layer.0.dense.weight").unwrap();
    assert_eq!(
        (w.dtype.clone(), w.shape.clone()),
        (Dtype::F32, vec![32, 32])
    );
    let encoding = w.encoding.clone().expect("encoded");
    assert_eq!(encoding.scheme, "nvfp4");
    let params: serde_json::Value = serde_json::from_str(&encoding.params).unwrap();
    assert!(params.is_object(), "{params}");
    let roles: Vec<&str> = w.parts.iter().map(|p| p.role.as_str()).collect();
    assert_eq!(roles, ["weight", "scale", "scale_2"]);
    let header = store.commit(&quantized).unwrap().header;
    let stored = &header.components[0]
        .tensors
        .iter()
        .find(|t| t.key == "layer.0.dense.weight")
        .unwrap()
        .body;
    let tensorfs::format::Body::Encoded { parts, .. } = stored else {
        panic!("encoded in the header")
    };
    for (part, stored) in w.parts.iter().zip(parts) {
        assert_eq!((&part.dtype, &part.shape), (&stored.dtype, &stored.shape));
        assert_eq!(
            part.file_range.end - part.file_range.start,
            stored.location.length
        );
    }
    check_against_file(&store, &view, &w);
    // A part's own name in the file locates its tensor.
    let by_part = extents::locate(
        &store,
        &view,
        "model.safetensors",
        "layer.0.dense.weight_scale",
    )
    .unwrap();
    assert_eq!(by_part, w);

    // The decoded view shows the tensor decoded: no stored bytes hold it; its plain bias is
    // still located.
    let c = store.commit(&quantized).unwrap();
    let decoded = LaneView::build_decoded(&c.id, &c.tree, &c.header).unwrap();
    let err = extents::locate(
        &store,
        &decoded,
        "model.safetensors",
        "layer.0.dense.weight",
    )
    .unwrap_err();
    assert!(matches!(err, LocateError::Decoded { ref scheme, .. } if scheme == "nvfp4"));
    assert_eq!(err.errno(), libc::ENODATA);
    let message = err.to_string();
    assert!(
        message.starts_with("model.safetensors: tensor \"layer.0.dense.weight\" is decoded"),
        "{message}"
    );
    let err = extents::locate(
        &store,
        &decoded,
        "model.safetensors",
        "layer.0.dense.weight_scale",
    )
    .unwrap_err();
    assert_eq!(
        err.errno(),
        libc::ENOENT,
        "the decoded view has no part entries"
    );
    let bias =
        extents::locate(&store, &decoded, "model.safetensors", "layer.0.dense.bias").unwrap();
    check_against_file(&store, &decoded, &bias);

    // The command line, from the store.
    let reference = commit.clone();
    let args = |tensor: &str, more: &[&'static str]| {
        let mut args = vec![
            "locate".to_owned(),
            reference.clone(),
            "model.safetensors".to_owned(),
            tensor.to_owned(),
        ];
        args.extend(more.iter().map(|s| s.to_string()));
        args
    };
    let run_ok = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(&root, &args)
    };
    let json: serde_json::Value =
        serde_json::from_str(&run_ok(args("layer.0.dense.weight", &["--json"]))).unwrap();
    assert_eq!(json["key"], "layer.0.dense.weight");
    assert_eq!(json["encoding"]["scheme"], "nvfp4");
    assert_eq!(json["encoding"]["params"], params);
    assert_eq!(json["parts"].as_array().unwrap().len(), 3);
    let first = &json["parts"][0]["extents"][0];
    assert_eq!(first["path"], w.extents[0].path.to_str().unwrap());
    assert_eq!(first["offset"], w.extents[0].offset);
    assert_eq!(first["file_offset"], w.extents[0].file_offset);
    let text = run_ok(args("layer.0.dense.weight", &[]));
    assert!(
        text.starts_with("model.safetensors: layer.0.dense.weight F32 [32, 32] nvfp4 {"),
        "{text}"
    );
    assert!(text.contains("part 2 scale_2 "), "{text}");
    let failed = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(&root, &args)
    };
    let err = failed(args("layer.0.dense.weight", &["--decode"]));
    assert!(
        err.contains("model.safetensors: tensor \"layer.0.dense.weight\" is decoded"),
        "{err}"
    );
    assert!(err.contains("nvfp4@decoded"), "{err}");
    let err = failed(args("nope", &[]));
    assert!(
        err.contains("model.safetensors: no tensor \"nope\""),
        "{err}"
    );
}

/// A producer's companion arrays (GPTQ's `qweight`, `qzeros`, `scales`, `g_idx`) are located by
/// their own names in the re-created file, and each part's extents hold the file's bytes.
#[test]
fn a_producer_convention_tensor_is_located_by_its_producer_array_names() {
    let dir = tempfile::tempdir().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/conventions/gptq_int4/model");
    let root = dir.path().join("store");
    ok(
        &root,
        &["import", src.to_str().unwrap(), "--name", "local/g"],
    );
    let store = Store::open(&root).unwrap();
    let commit = store.repo("local/g").unwrap().unwrap().commits[0];
    let view = lane_view(&store, &commit);
    let file = FileTensors::new(&view, "model.safetensors").unwrap();
    let module = "model.layers.0.self_attn.q_proj";
    let by_key = file
        .locate(store.root(), &format!("{module}.weight"))
        .unwrap();
    let by_array = file
        .locate(store.root(), &format!("{module}.g_idx"))
        .unwrap();
    assert_eq!(by_key.key, by_array.key);
    let roles: Vec<&str> = by_key.parts.iter().map(|p| p.role.as_str()).collect();
    assert_eq!(roles, ["qweight", "qzeros", "scales", "g_idx"]);
    check_against_file(&store, &view, &by_key);
}
