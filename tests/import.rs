//! Import through the binary: byte-exact round trips, lanes, and every refusal of bad input,
//! which must name the file and leave the store exactly as it was.

mod common;

use common::*;
use std::fs;
use std::path::Path;

/// A store that already holds one model, so a failed import has something to disturb.
fn seeded_store(dir: &Path) -> std::path::PathBuf {
    let store = dir.join("store");
    let model = dir.join("seed");
    transformers_folder(&model);
    ok(
        &store,
        &["import", model.to_str().unwrap(), "--name", "local/seed"],
    );
    store
}

/// Imports `files` as a folder and asserts the import fails naming `file` and `problem`,
/// leaving the store untouched.
fn refused(files: &[(&str, Vec<u8>)], file: &str, problem: &str) {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded_store(dir.path());
    let before = snapshot(&store);
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    write_tree(&src, files);
    let err = fails(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/bad"],
    );
    assert!(err.contains(file), "the error names {file:?}: {err}");
    assert!(
        err.to_lowercase().contains(&problem.to_lowercase()),
        "the error says {problem:?}: {err}"
    );
    assert_eq!(
        snapshot(&store),
        before,
        "the store changed after a refused import: {err}"
    );
}

fn export(store: &Path, reference: &str, lane: Option<&str>, dir: &Path) {
    let mut args = vec!["export", reference, dir.to_str().unwrap()];
    if let Some(lane) = lane {
        args.extend(["--lane", lane]);
    }
    ok(store, &args);
}

#[test]
fn a_transformers_folder_exports_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    transformers_folder(&src);
    let store = dir.path().join("store");
    ok(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/tiny"],
    );
    let out = dir.path().join("out");
    export(&store, "local/tiny", None, &out);
    assert_eq!(files_of(&out), files_of(&src));
}

#[test]
fn the_same_bytes_from_another_path_give_the_same_ids() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("elsewhere/b"));
    transformers_folder(&a);
    transformers_folder(&b);
    let store = dir.path().join("store");
    let first = ok(
        &store,
        &["import", a.to_str().unwrap(), "--name", "local/a", "--json"],
    );
    let second = ok(
        &store,
        &["import", b.to_str().unwrap(), "--name", "local/b", "--json"],
    );
    let ids = |text: &str| {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        (
            v["lanes"][0]["commit"].clone(),
            v["lanes"][0]["header"].clone(),
        )
    };
    assert_eq!(ids(&first), ids(&second));
}

#[test]
fn an_import_into_a_repo_named_in_other_case_reports_the_repos_own_name() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    transformers_folder(&model);
    let store = dir.path().join("store");
    ok(
        &store,
        &["import", model.to_str().unwrap(), "--name", "local/Mini"],
    );
    let again = ok(
        &store,
        &[
            "import",
            model.to_str().unwrap(),
            "--name",
            "local/MINI",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(report["name"], "local/Mini");
    let plain = ok(
        &store,
        &["import", model.to_str().unwrap(), "--name", "local/mini"],
    );
    assert!(plain.contains("imported local/Mini@"), "{plain}");
}

#[test]
fn an_sft_file_imports_as_the_safetensors_file_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let weights = safetensors_file(
        &[T(
            "conv_first.weight",
            safetensors::Dtype::F32,
            vec![4],
            floats(4, 3),
        )],
        None,
    );
    write_tree(
        dir.path(),
        &[
            ("a/upscaler.sft", weights.clone()),
            ("b/upscaler.safetensors", weights.clone()),
        ],
    );
    let store = dir.path().join("store");
    let import = |file: &str, name: &str| {
        let said = ok(
            &store,
            &[
                "import",
                &dir.path().join(file).to_string_lossy(),
                "--name",
                name,
                "--json",
            ],
        );
        serde_json::from_str::<serde_json::Value>(&said).unwrap()["lanes"][0]["commit"].clone()
    };
    // ComfyUI reads `.sft` as safetensors; so does the import, under the format's own name.
    assert_eq!(
        import("a/upscaler.sft", "local/sft"),
        import("b/upscaler.safetensors", "local/st")
    );
    let out = dir.path().join("out");
    export(&store, "local/sft", None, &out);
    assert_eq!(
        files_of(&out).into_iter().collect::<Vec<_>>(),
        [("upscaler.safetensors".to_owned(), weights)]
    );
    // Both at once would be one file twice.
    let err = fails(
        &store,
        &[
            "import",
            &dir.path().join("a/upscaler.sft").to_string_lossy(),
            &dir.path().join("b/upscaler.safetensors").to_string_lossy(),
            "--name",
            "local/both",
        ],
    );
    assert!(
        err.contains("upscaler.sft is also shown as upscaler.safetensors"),
        "{err}"
    );
}

#[test]
fn identical_tensors_are_stored_once_across_models() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let big = bytes(20 << 20, 7);
    let file = |extra: u8| {
        safetensors_file(
            &[
                T(
                    "big.weight",
                    safetensors::Dtype::U8,
                    vec![20 << 20],
                    big.clone(),
                ),
                T(
                    "small.weight",
                    safetensors::Dtype::U8,
                    vec![4],
                    vec![extra; 4],
                ),
            ],
            None,
        )
    };
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    fs::write(&a, file(1)).unwrap();
    fs::write(&b, file(2)).unwrap();
    ok(
        &store,
        &["import", a.to_str().unwrap(), "--name", "local/a"],
    );
    let size = |p: &Path| -> u64 { walk_size(&p.join("blobs")) };
    let after_a = size(&store);
    ok(
        &store,
        &["import", b.to_str().unwrap(), "--name", "local/b"],
    );
    let grown = size(&store) - after_a;
    assert!(
        grown < 1 << 20,
        "the second model added {grown} bytes; its 20 MiB tensor is the first's"
    );
}

fn walk_size(dir: &Path) -> u64 {
    let mut total = 0;
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        total += if p.is_dir() {
            walk_size(&p)
        } else {
            p.metadata().unwrap().len()
        };
    }
    total
}

#[test]
fn legal_edge_cases_round_trip_exactly() {
    use safetensors::Dtype::*;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "edges.safetensors",
            safetensors_file(
                &[
                    T("empty", F32, vec![0, 3], vec![]),
                    T("also_empty", BF16, vec![4, 0], vec![]),
                    T("scalar", F32, vec![], bytes(4, 1)),
                    T("mask", BOOL, vec![3], vec![0, 1, 1]),
                    T("e4m3", F8_E4M3, vec![5], bytes(5, 2)),
                    T("e5m2", F8_E5M2, vec![2, 2], bytes(4, 3)),
                    T("e8m0", F8_E8M0, vec![3], bytes(3, 4)),
                ],
                Some(&[]),
            ),
        ),
        ("odd_header.safetensors", raw_safetensors("{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},  \"a\":{\"shape\":[1],\"dtype\":\"U8\",\"data_offsets\":[2,3]},\"__metadata__\":{\"z\":\"1\",\"a\":\"2\"}}   ", &[1, 2, 3])),
    ];
    for (name, data) in &cases {
        let src = dir.path().join(name);
        fs::write(&src, data).unwrap();
        let repo = format!(
            "local/{}",
            name.trim_end_matches(".safetensors").replace('_', "-")
        );
        ok(&store, &["import", src.to_str().unwrap(), "--name", &repo]);
        let out = dir.path().join(format!("out-{name}"));
        export(&store, &repo, None, &out);
        assert_eq!(
            fs::read(out.join(name)).unwrap(),
            *data,
            "{name} round-trips byte for byte"
        );
    }
}

#[test]
fn a_file_without_tensors_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    for (name, data) in [
        ("empty.safetensors", raw_safetensors("{}      ", &[])),
        (
            "meta-only.safetensors",
            raw_safetensors("{\"__metadata__\":{\"format\":\"pt\"}}", &[]),
        ),
    ] {
        let src = dir.path().join(name);
        fs::write(&src, &data).unwrap();
        let repo = format!("local/{}", name.trim_end_matches(".safetensors"));
        ok(&store, &["import", src.to_str().unwrap(), "--name", &repo]);
        let out = dir.path().join(format!("out-{name}"));
        export(&store, &repo, None, &out);
        assert_eq!(fs::read(out.join(name)).unwrap(), data, "{name}");
    }
}

fn tensor_header(extra: &str) -> String {
    format!("{{\"w\":{{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}{extra}}}")
}

#[test]
fn a_truncated_file_is_refused() {
    let mut file = safetensors_file(
        &[T("w", safetensors::Dtype::F32, vec![4], bytes(16, 1))],
        None,
    );
    file.truncate(file.len() - 3);
    refused(
        &[("model.safetensors", file)],
        "model.safetensors",
        "past the end of the data",
    );
}

#[test]
fn a_header_length_past_the_end_is_refused() {
    let mut file = raw_safetensors(&tensor_header(""), &bytes(8, 1));
    file[..8].copy_from_slice(&(10_000u64).to_le_bytes());
    refused(
        &[("model.safetensors", file)],
        "model.safetensors",
        "past the end of",
    );
}

#[test]
fn a_header_over_100_mb_is_refused() {
    let mut file = raw_safetensors(&tensor_header(""), &bytes(8, 1));
    file[..8].copy_from_slice(&(100_000_001u64).to_le_bytes());
    refused(
        &[("model.safetensors", file)],
        "model.safetensors",
        "100000000-byte limit",
    );
}

#[test]
fn offsets_that_disagree_with_dtype_and_shape_are_refused() {
    let header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}";
    refused(
        &[("model.safetensors", raw_safetensors(header, &bytes(8, 1)))],
        "model.safetensors",
        "\"w\"",
    );
}

#[test]
fn overlapping_ranges_are_refused() {
    let header = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}";
    refused(
        &[("model.safetensors", raw_safetensors(header, &bytes(6, 1)))],
        "model.safetensors",
        "overlaps",
    );
}

/// safetensors (serde_json) reads `-0` as the float -0.0 and refuses it as a shape or an
/// offset; so does import, naming the tensor, rather than store a file safetensors cannot open.
#[test]
fn a_negative_zero_where_safetensors_wants_an_integer_is_refused() {
    for header in [
        "{\"w\":{\"dtype\":\"U8\",\"shape\":[-0],\"data_offsets\":[0,0]}}",
        "{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-0,2]}}",
    ] {
        refused(
            &[("model.safetensors", raw_safetensors(header, &bytes(2, 1)))],
            "model.safetensors",
            "\"w\"",
        );
    }
}

#[test]
fn holes_between_ranges_are_refused() {
    let header = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,8]}}";
    refused(
        &[("model.safetensors", raw_safetensors(header, &bytes(8, 1)))],
        "model.safetensors",
        "hole",
    );
}

#[test]
fn bytes_after_the_last_tensor_are_refused() {
    refused(
        &[(
            "model.safetensors",
            raw_safetensors(&tensor_header(""), &bytes(9, 1)),
        )],
        "model.safetensors",
        "follow the last tensor",
    );
}

#[test]
fn metadata_with_a_non_string_value_is_refused() {
    let header = tensor_header(",\"__metadata__\":{\"format\":\"pt\",\"step\":3}");
    refused(
        &[("model.safetensors", raw_safetensors(&header, &bytes(8, 1)))],
        "model.safetensors",
        "__metadata__",
    );
}

#[test]
fn a_tensor_named_metadata_is_refused() {
    let header = "{\"__metadata__\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    refused(
        &[("model.safetensors", raw_safetensors(header, &bytes(8, 1)))],
        "model.safetensors",
        "__metadata__",
    );
}

#[test]
fn repeated_json_keys_are_refused() {
    let header = tensor_header(",\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}");
    refused(
        &[("model.safetensors", raw_safetensors(&header, &bytes(8, 1)))],
        "model.safetensors",
        "\"w\"",
    );
}

#[test]
fn an_unknown_dtype_is_refused() {
    let header = "{\"w\":{\"dtype\":\"F12\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    refused(
        &[("model.safetensors", raw_safetensors(header, &bytes(8, 1)))],
        "model.safetensors",
        "F12",
    );
}

fn shard(name: &str, seed: u8) -> Vec<u8> {
    safetensors_file(
        &[T(name, safetensors::Dtype::U8, vec![4], bytes(4, seed))],
        None,
    )
}

#[test]
fn an_index_naming_a_missing_shard_is_refused() {
    let index = br#"{"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#;
    refused(
        &[
            ("model.safetensors.index.json", index.to_vec()),
            ("model-00001-of-00002.safetensors", shard("a", 1)),
        ],
        "model.safetensors.index.json",
        "model-00002-of-00002.safetensors",
    );
}

#[test]
fn an_index_naming_a_tensor_its_shard_lacks_is_refused() {
    let index = br#"{"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}}"#;
    refused(
        &[
            ("model.safetensors.index.json", index.to_vec()),
            ("model-00001-of-00002.safetensors", shard("a", 1)),
            ("model-00002-of-00002.safetensors", shard("b", 2)),
        ],
        "model.safetensors.index.json",
        "\"c\"",
    );
}

/// A shard may hold tensors its index does not list (Transformers loads every key of every
/// indexed shard, so they reach the model): imported byte-exact, with a warning naming the shard
/// and the tensors.
#[test]
fn a_shard_holding_tensors_its_index_does_not_list_imports_with_a_warning() {
    let index = br#"{"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#;
    let first = safetensors_file(
        &[
            T("a", safetensors::Dtype::U8, vec![4], bytes(4, 1)),
            T("extra", safetensors::Dtype::U8, vec![4], bytes(4, 3)),
        ],
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let files = [
        (
            "config.json",
            b"{\"architectures\": [\"BertModel\"]}".to_vec(),
        ),
        ("model.safetensors.index.json", index.to_vec()),
        ("model-00001-of-00002.safetensors", first),
        ("model-00002-of-00002.safetensors", shard("b", 2)),
    ];
    write_tree(&src, &files);
    let store = dir.path().join("store");
    let out = run(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/extra"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stderr);
    let warning = said
        .lines()
        .find(|l| l.contains("warning") && l.contains("model-00001-of-00002.safetensors"))
        .unwrap_or_else(|| panic!("no warning names the shard: {said}"));
    assert!(warning.contains("\"extra\""), "{warning}");
    assert!(
        warning.contains("model.safetensors.index.json"),
        "{warning}"
    );
    let out_dir = dir.path().join("out");
    ok(
        &store,
        &["export", "local/extra", out_dir.to_str().unwrap()],
    );
    for (name, bytes) in &files {
        assert_eq!(
            &fs::read(out_dir.join(name)).unwrap(),
            bytes,
            "{name} byte-exact"
        );
    }
}

#[test]
fn an_index_naming_a_shard_outside_the_folder_is_refused() {
    let index = br#"{"metadata":{},"weight_map":{"a":"../../etc/passwd"}}"#;
    refused(
        &[
            ("model.safetensors.index.json", index.to_vec()),
            ("model.safetensors", shard("a", 1)),
        ],
        "model.safetensors.index.json",
        "../../etc/passwd",
    );
}

#[test]
fn tensor_names_with_nul_or_control_characters_are_refused() {
    for name in ["a\\u0000b", "line\\nbreak", "bell\\u0007"] {
        let header =
            format!("{{\"{name}\":{{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}}}");
        refused(
            &[("model.safetensors", raw_safetensors(&header, &[1]))],
            "model.safetensors",
            "control characters",
        );
    }
}

#[test]
fn a_component_name_that_escapes_the_folder_is_refused() {
    let index = br#"{"_class_name":"StableDiffusionPipeline","_diffusers_version":"0.30.0","../evil":["diffusers","UNet2DConditionModel"]}"#;
    refused(
        &[("model_index.json", index.to_vec())],
        "model_index.json",
        "../evil",
    );
}

#[test]
fn file_names_with_control_characters_are_refused() {
    refused(
        &[
            ("model.safetensors", shard("a", 1)),
            ("bad\nname.txt", b"x".to_vec()),
        ],
        "bad\nname.txt",
        "control",
    );
}

#[test]
fn repo_names_that_are_not_local_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded_store(dir.path());
    let before = snapshot(&store);
    let src = dir.path().join("m.safetensors");
    fs::write(&src, shard("a", 1)).unwrap();
    for name in [
        "local/../x",
        "local/a/b",
        "other/x",
        "local/.hidden",
        "local/a b",
        "local/",
    ] {
        let err = fails(&store, &["import", src.to_str().unwrap(), "--name", name]);
        assert!(err.contains("name"), "{name:?}: {err}");
    }
    assert_eq!(snapshot(&store), before);
}

/// A small Diffusers folder: a sharded text encoder, a UNet with an fp16 variant, a scheduler
/// and a tokenizer.
fn diffusers_folder(root: &Path) {
    use safetensors::Dtype::*;
    let index = br#"{
  "metadata": {
    "total_size": 48
  },
  "weight_map": {
    "encoder.a": "model-00001-of-00002.safetensors",
    "encoder.b": "model-00002-of-00002.safetensors"
  }
}
"#;
    write_tree(
        root,
        &[
            ("model_index.json", br#"{"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.30.0", "scheduler": ["diffusers", "DDIMScheduler"], "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"], "unet": ["diffusers", "UNet2DConditionModel"], "safety_checker": [null, null]}"#.to_vec()),
            ("scheduler/scheduler_config.json", br#"{"_class_name": "DDIMScheduler", "beta_end": 0.012}"#.to_vec()),
            ("text_encoder/config.json", br#"{"architectures": ["CLIPTextModel"], "transformers_version": "4.44.0"}"#.to_vec()),
            ("text_encoder/model.safetensors.index.json", index.to_vec()),
            ("text_encoder/model-00001-of-00002.safetensors", safetensors_file(&[T("encoder.a", F32, vec![4], bytes(16, 1))], Some(&[("format", "pt")]))),
            ("text_encoder/model-00002-of-00002.safetensors", safetensors_file(&[T("encoder.b", F32, vec![8], bytes(32, 2))], Some(&[("format", "pt")]))),
            ("tokenizer/tokenizer_config.json", br#"{"tokenizer_class": "CLIPTokenizer"}"#.to_vec()),
            ("tokenizer/vocab.json", br#"{"a": 0}"#.to_vec()),
            ("tokenizer/merges.txt", b"#version: 0.2\n".to_vec()),
            ("unet/config.json", br#"{"_class_name": "UNet2DConditionModel", "_diffusers_version": "0.30.0"}"#.to_vec()),
            ("unet/diffusion_pytorch_model.safetensors", safetensors_file(&[T("conv_in.weight", F32, vec![2, 2], bytes(16, 3)), T("down_blocks.0.w", F32, vec![3], bytes(12, 4))], None)),
            ("unet/diffusion_pytorch_model.fp16.safetensors", safetensors_file(&[T("conv_in.weight", F16, vec![2, 2], bytes(8, 5)), T("down_blocks.0.w", F16, vec![3], bytes(6, 6))], None)),
            ("README.md", b"tiny pipeline\n".to_vec()),
        ],
    );
}

#[test]
fn a_diffusers_folder_imports_as_one_lane_per_variant() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    diffusers_folder(&src);
    let store = dir.path().join("store");
    let report = ok(
        &store,
        &[
            "import",
            src.to_str().unwrap(),
            "--name",
            "local/pipe",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    let lanes: Vec<&str> = report["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["lane"].as_str().unwrap())
        .collect();
    assert_eq!(lanes, ["f32", "fp16"]);

    let source = files_of(&src);
    let default = dir.path().join("f32");
    export(&store, "local/pipe", Some("f32"), &default);
    let mut expected = source.clone();
    expected.remove("unet/diffusion_pytorch_model.fp16.safetensors");
    assert_eq!(files_of(&default), expected);

    let fp16 = dir.path().join("fp16");
    export(&store, "local/pipe", Some("fp16"), &fp16);
    let mut expected = source;
    expected.remove("unet/diffusion_pytorch_model.safetensors");
    assert_eq!(
        files_of(&fp16),
        expected,
        "the fp16 lane falls back to default files where a component has no fp16 weights"
    );
}

/// Transformers writes `"model_max_length": 1000000000000000019884624838656` for a tokenizer
/// without a limit: a config's integer past [−2^63, 2^64) is read as the nearest float (spec
/// §4 lets configs hold floats; the reference reads it so too), and the file stays byte-exact.
#[test]
fn a_config_integer_past_the_integer_range_is_kept_as_a_float() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    diffusers_folder(&src);
    let unbounded = br#"{
  "model_max_length": 1000000000000000019884624838656,
  "tokenizer_class": "CLIPTokenizer"
}
"#;
    let encoder = br#"{"architectures": ["CLIPTextModel"], "below": -18446744073709551617, "transformers_version": "4.44.0"}"#;
    write_tree(
        &src,
        &[
            ("tokenizer/tokenizer_config.json", unbounded.to_vec()),
            ("text_encoder/config.json", encoder.to_vec()),
        ],
    );
    let store = dir.path().join("store");
    ok(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/pipe"],
    );
    let inspect = ok(
        &store,
        &["inspect", "local/pipe", "--lane", "f32", "--json"],
    );
    let inspect: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    let components = inspect[0]["header_json"]["components"].as_array().unwrap();
    let config = |name: &str| {
        components
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["config"].clone())
            .unwrap_or_else(|| panic!("no component {name}: {inspect}"))
    };
    assert_eq!(config("tokenizer")["model_max_length"].as_f64(), Some(1e30));
    assert!(config("tokenizer")["model_max_length"].is_f64());
    assert_eq!(
        config("text_encoder")["below"].as_f64(),
        Some(-18446744073709551617.0)
    );
    let out = dir.path().join("out");
    export(&store, "local/pipe", Some("f32"), &out);
    let mut expected = files_of(&src);
    expected.remove("unet/diffusion_pytorch_model.fp16.safetensors");
    assert_eq!(files_of(&out), expected);
}

/// `big.safetensors` in `dir`: `count` U8 tensors of `mib` MiB each, large enough that an
/// import is still writing chunks when a test stops it.
fn big_file(dir: &Path, count: usize, mib: usize) -> std::path::PathBuf {
    let src = dir.join("big.safetensors");
    let tensors: Vec<T> = (0..count)
        .map(|i| {
            T(
                Box::leak(format!("layer.{i}.weight").into_boxed_str()),
                safetensors::Dtype::U8,
                vec![mib << 20],
                bytes(mib << 20, i as u8),
            )
        })
        .collect();
    fs::write(&src, safetensors_file(&tensors, None)).unwrap();
    src
}

#[test]
fn a_process_killed_mid_import_leaves_a_store_the_next_import_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let src = big_file(dir.path(), 12, 24);
    for delay_ms in [50, 200, 600] {
        let mut child = tensorfs()
            .args([
                "--store",
                store.to_str().unwrap(),
                "import",
                src.to_str().unwrap(),
                "--name",
                "local/big",
            ])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
    }
    ok(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/big"],
    );
    ok(&store, &["verify"]);
    let out = dir.path().join("out");
    export(&store, "local/big", None, &out);
    assert_eq!(
        fs::read(out.join("big.safetensors")).unwrap(),
        fs::read(&src).unwrap()
    );
    let leftovers = temp_files(&store);
    assert!(
        leftovers.is_empty(),
        "temp files of killed imports were reaped: {leftovers:?}"
    );
}

/// Ctrl-C (SIGINT) or SIGTERM while chunks are written stops the import, removes what it
/// staged, and removes the store it made: the store is as it was, which here is none.
#[test]
fn an_interrupted_import_into_a_new_store_leaves_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_file(dir.path(), 16, 32);
    let mut interrupted = 0;
    for (round, signal) in [libc::SIGINT, libc::SIGTERM].into_iter().enumerate() {
        let store = dir.path().join(format!("store-{round}"));
        let child = tensorfs()
            .args(["--store", store.to_str().unwrap(), "import"])
            .arg(&src)
            .args(["--name", "local/big"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Once it writes chunks (a temp file in tmp/), its handlers are in place.
        let start = std::time::Instant::now();
        while !staging(&store) {
            assert!(
                start.elapsed().as_secs() < 30,
                "the import never wrote a chunk"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        // SAFETY: a signal to the child we spawned.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        let out = child.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            // It finished first: nothing to check this round.
            continue;
        }
        interrupted += 1;
        assert!(said.contains("interrupted"), "signal {signal}: {said}");
        assert!(
            !store.exists(),
            "signal {signal}: the new store is removed: {said}"
        );
    }
    assert!(interrupted > 0, "no import was interrupted");
}

/// Weights that are no regular file (a link to /dev/zero) are named as such, not only "no
/// weights".
#[test]
fn weights_that_are_a_link_to_a_device_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("config.json"), b"{}").unwrap();
    std::os::unix::fs::symlink("/dev/zero", src.join("model.safetensors")).unwrap();
    let said = fails(
        &dir.path().join("store"),
        &["import", src.to_str().unwrap(), "--name", "local/z"],
    );
    assert!(
        said.contains("model.safetensors is not a regular file"),
        "{said}"
    );
}

#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    use std::os::fd::FromRawFd;
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let store = seeded_store(dir.path());
    let mut fds = [0; 2];
    // SAFETY: pipe fills the two descriptors, which we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fds[0] and fds[1] are open and owned by nothing else.
    let (read_end, write_end) =
        unsafe { (fs::File::from_raw_fd(fds[0]), fs::File::from_raw_fd(fds[1])) };
    drop(read_end);
    let out = tensorfs()
        .args([
            "--store",
            store.to_str().unwrap(),
            "inspect",
            "local/seed",
            "--json",
        ])
        .stdout(write_end)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {stderr}",
        out.status
    );
}

#[test]
fn a_source_without_safetensors_weights_is_refused_saying_what_it_has() {
    refused(&[], "src", "no .safetensors weights");
    refused(
        &[
            ("config.json", b"{}".to_vec()),
            ("pytorch_model.bin", b"pickle".to_vec()),
        ],
        "src",
        "pytorch_model.bin",
    );
    refused(
        &[
            ("snapshots/abc/model.safetensors", shard("a", 1)),
            ("refs/main", b"abc".to_vec()),
        ],
        "src",
        "snapshots/abc/model.safetensors is in a subfolder",
    );
}

#[test]
fn a_pipeline_listing_a_missing_component_folder_is_refused() {
    let index = br#"{"_class_name":"StableDiffusionPipeline","_diffusers_version":"0.30.0","controlnet":["diffusers","ControlNetModel"],"unet":["diffusers","UNet2DConditionModel"],"safety_checker":[null,null]}"#;
    refused(
        &[
            ("model_index.json", index.to_vec()),
            ("unet/config.json", b"{}".to_vec()),
            ("unet/diffusion_pytorch_model.safetensors", shard("w", 1)),
        ],
        "model_index.json",
        "no controlnet/ folder",
    );
}

#[test]
fn special_files_are_skipped_with_a_message_and_missing_configs_warned() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let index = br#"{"_class_name":"StableDiffusionPipeline","_diffusers_version":"0.30.0","unet":["diffusers","UNet2DConditionModel"]}"#;
    write_tree(
        &src,
        &[
            ("model_index.json", index.to_vec()),
            ("unet/diffusion_pytorch_model.safetensors", shard("w", 1)),
        ],
    );
    let fifo = std::ffi::CString::new(src.join("pipe").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let out = run(
        &dir.path().join("store"),
        &["import", src.to_str().unwrap(), "--name", "local/p"],
    );
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("skipped pipe: neither a file nor a folder"),
        "{stderr}"
    );
    assert!(
        stderr.contains("warning: unet/ has no config file"),
        "{stderr}"
    );
}

#[test]
fn a_failed_export_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    transformers_folder(&src);
    let store = dir.path().join("store");
    ok(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/tiny"],
    );
    // Remove the largest blob: a chunk of model.safetensors.
    let mut blobs: Vec<_> = walk_files(&store.join("blobs"));
    blobs.sort_by_key(|p| fs::metadata(p).unwrap().len());
    fs::remove_file(blobs.last().unwrap()).unwrap();
    for existing in [false, true] {
        let out = dir.path().join(format!("out-{existing}"));
        if existing {
            fs::create_dir(&out).unwrap();
        }
        let err = fails(&store, &["export", "local/tiny", out.to_str().unwrap()]);
        assert!(err.contains("model.safetensors"), "{err}");
        assert_eq!(out.exists(), existing, "{err}");
        if existing {
            assert_eq!(
                fs::read_dir(&out).unwrap().count(),
                0,
                "the folder is left empty"
            );
        }
    }
}

fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}
