use super::*;

/// Arrays (name, dtype, shape, bytes) laid one after another in one file.
fn arrays(spec: &[(&str, &str, &[u64], Vec<u8>)]) -> (Vec<SourceTensor>, Vec<Vec<u8>>) {
    let mut offset = 0;
    let mut out = Vec::new();
    let mut bytes = Vec::new();
    for (name, dtype, shape, b) in spec {
        let dtype = Dtype::parse(dtype).unwrap();
        assert_eq!(
            dtype.byte_len(shape).unwrap(),
            Some(b.len() as u64),
            "{name}"
        );
        out.push(SourceTensor {
            key: (*name).to_owned(),
            dtype,
            shape: shape.to_vec(),
            file: 0,
            offset,
            length: b.len() as u64,
        });
        offset += b.len() as u64;
        bytes.push(b.clone());
    }
    (out, bytes)
}

fn run(
    spec: &[(&str, &str, &[u64], Vec<u8>)],
    config: &str,
    converter: Option<&str>,
) -> Result<Vec<Item>, String> {
    let (tensors, bytes) = arrays(spec);
    let config: Config = match json::to_value(&json::parse(config.as_bytes()).unwrap()) {
        Value::Map(entries) => entries.into_iter().collect(),
        _ => panic!("a config object"),
    };
    let cx = Context {
        component: "model",
        config: &config,
        files: &BTreeMap::new(),
        metadata: &[],
        converter,
    };
    recognize(&cx, &tensors, &|i| Ok(bytes[i].clone()))
}

fn encoded(items: &[Item]) -> Vec<&EncodedModel> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Encoded(e) => Some(e),
            _ => None,
        })
        .collect()
}

fn f32s(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn i32s(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn the_table_parses_and_names_schemes_this_build_decodes() {
    let t = table();
    let mut names = BTreeSet::new();
    for c in &t.conventions {
        assert!(names.insert(&c.name), "{} twice", c.name);
        assert!(!c.declared_by.is_empty(), "{}", c.name);
        for d in &c.anchor_dtypes {
            assert!(Dtype::known(d).is_some(), "{}: {d}", c.name);
        }
        let roles: BTreeSet<&str> = c.parts.iter().map(|p| p.role.as_str()).collect();
        assert_eq!(roles.len(), c.parts.len(), "{}: roles repeat", c.name);
        for e in &c.encodings {
            if !e.scheme.contains('{') {
                assert!(
                    decode::scheme(&e.scheme).is_some(),
                    "{}: {}",
                    c.name,
                    e.scheme
                );
            }
        }
    }
    assert!(declaration_files().contains("hf_quant_config.json"));
}

#[test]
fn plain_checkpoints_stay_plain() {
    let items = run(
        &[
            ("a.weight", "BF16", &[2, 2], vec![0; 8]),
            ("a.weight_scale", "F32", &[], vec![0; 4]),
            ("b.weight", "F8_E4M3", &[2, 2], vec![0; 4]),
        ],
        "{}",
        None,
    )
    .unwrap();
    assert_eq!(items, vec![Item::Plain(0), Item::Plain(1), Item::Plain(2)]);
}

#[test]
fn a_scaled_fp8_marker_makes_tensorwise_fp8_with_its_input_scale() {
    let items = run(
        &[
            ("scaled_fp8", "F8_E4M3", &[0], vec![]),
            ("a.weight", "F8_E4M3", &[4, 32], vec![0x38; 128]),
            ("a.scale_weight", "F32", &[], f32s(&[0.5])),
            ("a.scale_input", "F32", &[], f32s(&[2.0])),
            ("a.bias", "BF16", &[4], vec![0; 8]),
        ],
        "{}",
        None,
    )
    .unwrap();
    assert_eq!(items[0], Item::Marker(0));
    assert_eq!(items[2], Item::Plain(4));
    let e = encoded(&items);
    assert_eq!(e.len(), 1);
    assert_eq!(
        (
            e[0].key.as_str(),
            e[0].scheme.as_str(),
            &e[0].dtype,
            &e[0].shape[..]
        ),
        ("a.weight", "fp8.tensorwise", &Dtype::BF16, &[4, 32][..])
    );
    let roles: Vec<&str> = e[0].parts.iter().map(|p| p.role.as_str()).collect();
    assert_eq!(roles, ["weight", "scale", "input_scale"]);
}

/// A scaled-fp8 file that declares no dtype anywhere (no config dtype, no plain float
/// tensor): F32, which holds every decoded value exactly, instead of a refusal.
#[test]
fn quantized_weights_that_nothing_dtypes_decode_to_f32() {
    let lone = [
        ("scaled_fp8", "F8_E4M3", &[0u64][..], vec![]),
        ("a.weight", "F8_E4M3", &[4, 32][..], vec![0x38; 128]),
        ("a.scale_weight", "F32", &[][..], f32s(&[0.5])),
    ];
    let items = run(&lone, "{}", None).unwrap();
    let e = encoded(&items);
    assert_eq!((e.len(), &e[0].dtype), (1, &Dtype::F32));
    // As many BF16 as F16 tensors tell nothing either.
    let mut tied = lone.to_vec();
    tied.push(("b.bias", "BF16", &[4][..], vec![0; 8]));
    tied.push(("c.bias", "F16", &[4][..], vec![0; 8]));
    let items = run(&tied, "{}", None).unwrap();
    assert_eq!(encoded(&items)[0].dtype, Dtype::F32);
    // A config dtype, or a majority of float tensors, still decides.
    let items = run(&lone, r#"{"torch_dtype": "bfloat16"}"#, None).unwrap();
    assert_eq!(encoded(&items)[0].dtype, Dtype::BF16);
    tied.push(("d.bias", "F16", &[4][..], vec![0; 8]));
    let items = run(&tied, "{}", None).unwrap();
    assert_eq!(encoded(&items)[0].dtype, Dtype::F16);
}

/// NVFP4 arrays as ModelOpt names them, `[128, 32]` logical.
fn nvfp4_arrays(with_scale: bool) -> Vec<(&'static str, &'static str, &'static [u64], Vec<u8>)> {
    let mut spec = vec![("x.weight", "U8", &[128u64, 16][..], vec![0x21; 128 * 16])];
    if with_scale {
        spec.push(("x.weight_scale", "F8_E4M3", &[128, 2], vec![0x38; 256]));
    }
    spec.push(("x.weight_scale_2", "F32", &[], f32s(&[1.0])));
    spec.push(("x.bias", "BF16", &[128], vec![0; 256]));
    spec
}

#[test]
fn undeclared_nvfp4_is_refused_as_ambiguous_until_a_converter_declares_it() {
    let err = run(&nvfp4_arrays(true), "{}", None).unwrap_err();
    for want in [
        "x.weight_scale",
        "modelopt.nvfp4",
        "comfy.nvfp4",
        "--converter",
    ] {
        assert!(err.contains(want), "{want} not in: {err}");
    }
    let items = run(&nvfp4_arrays(true), "{}", Some("modelopt.nvfp4")).unwrap();
    let e = encoded(&items);
    assert_eq!(e[0].shape, [128, 32]);
    assert_eq!(e[0].parts[0].dtype, Dtype::F4);
    assert_eq!(
        e[0].params.get("nibble_order"),
        Some(&Value::Text("low_first".into()))
    );
    // ComfyUI's cuBLAS scale layout needs [128, 4] scales: the declaration is checked.
    let err = run(&nvfp4_arrays(true), "{}", Some("comfy.nvfp4")).unwrap_err();
    assert!(
        err.contains("x.weight_scale") || err.contains("scale"),
        "{err}"
    );
    let err = run(&nvfp4_arrays(true), "{}", Some("nope")).unwrap_err();
    assert!(err.contains("modelopt.nvfp4"), "{err}");
}

#[test]
fn a_declared_module_missing_its_scales_is_refused_naming_the_array() {
    let config = r#"{"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}"#;
    let err = run(&nvfp4_arrays(false), config, None).unwrap_err();
    assert!(err.contains("x.weight_scale is missing"), "{err}");
    let items = run(&nvfp4_arrays(true), config, None).unwrap();
    assert_eq!(encoded(&items)[0].convention, "modelopt.nvfp4");
}

fn comfy_quant(doc: &str) -> Vec<(&'static str, &'static str, Vec<u64>, Vec<u8>)> {
    vec![
        ("x.weight", "F8_E4M3", vec![4, 32], vec![0x38; 128]),
        ("x.weight_scale", "F32", vec![], f32s(&[0.5])),
        (
            "x.comfy_quant",
            "U8",
            vec![doc.len() as u64],
            doc.as_bytes().to_vec(),
        ),
        ("x.bias", "BF16", vec![4], vec![0; 8]),
    ]
}

fn run_owned(
    spec: &[(&'static str, &'static str, Vec<u64>, Vec<u8>)],
) -> Result<Vec<Item>, String> {
    let spec: Vec<(&str, &str, &[u64], Vec<u8>)> = spec
        .iter()
        .map(|(n, d, s, b)| (*n, *d, &s[..], b.clone()))
        .collect();
    run(&spec, "{}", None)
}

#[test]
fn comfy_quant_markers_declare_each_module_and_unknown_ones_are_refused() {
    let items = run_owned(&comfy_quant(r#"{"format": "float8_e4m3fn"}"#)).unwrap();
    assert_eq!(items[1], Item::Marker(2));
    assert_eq!(encoded(&items)[0].scheme, "fp8.tensorwise");

    let err = run_owned(&comfy_quant(r#"{"format": "foo8"}"#)).unwrap_err();
    assert!(
        err.contains("x.comfy_quant") && err.contains("foo8"),
        "{err}"
    );

    let err = run_owned(&comfy_quant(r#"{"format": "float8_e4m3fn", "swizzle": 1}"#)).unwrap_err();
    assert!(err.contains("swizzle"), "{err}");

    // A marker over a weight that is not stored as declared.
    let mut spec = comfy_quant(r#"{"format": "nvfp4"}"#);
    spec.remove(2);
    spec.remove(1);
    spec.push((
        "x.comfy_quant",
        "U8",
        vec![18],
        br#"{"format":"nvfp4"}"#.to_vec(),
    ));
    let err = run_owned(&spec).unwrap_err();
    assert!(err.contains("x.weight is F8_E4M3"), "{err}");
}

/// A GPTQ module of `[8, 64]`, 4-bit, groups of 32, symmetric (v1 zeros of 7).
fn gptq(g_idx: &[i32]) -> Vec<(&'static str, &'static str, Vec<u64>, Vec<u8>)> {
    vec![
        ("m.qweight", "I32", vec![8, 8], i32s(&[0x1234_5678; 64])),
        ("m.qzeros", "I32", vec![2, 1], i32s(&[0x7777_7777; 2])),
        ("m.scales", "F16", vec![2, 8], [0x00, 0x3c].repeat(16)),
        ("m.g_idx", "I32", vec![64], i32s(g_idx)),
        ("m.bias", "F16", vec![8], vec![0; 16]),
    ]
}

#[test]
fn gptq_reads_its_config_and_refuses_a_g_idx_that_disagrees() {
    let config = r#"{"torch_dtype": "float16", "quantization_config": {"quant_method": "gptq",
        "bits": 4, "group_size": 32, "desc_act": false, "sym": true}}"#;
    let run_gptq = |g: &[i32]| {
        let spec = gptq(g);
        let spec: Vec<(&str, &str, &[u64], Vec<u8>)> = spec
            .iter()
            .map(|(n, d, s, b)| (*n, *d, &s[..], b.clone()))
            .collect();
        run(&spec, config, None)
    };
    let ordered: Vec<i32> = (0..64).map(|j| j / 32).collect();
    let items = run_gptq(&ordered).unwrap();
    let e = encoded(&items)[0];
    assert_eq!(
        (e.key.as_str(), e.scheme.as_str(), &e.shape[..], &e.dtype),
        ("m.weight", "gptq.int4", &[8, 64][..], &Dtype::F16)
    );
    assert_eq!(e.params.get("zero_offset"), Some(&Value::Uint(1)));
    assert_eq!(e.params.get("act_order"), Some(&Value::Bool(false)));

    let permuted: Vec<i32> = (0..64).map(|j| j % 2).collect();
    let err = run_gptq(&permuted).unwrap_err();
    assert!(err.contains("m") && err.contains("g_idx"), "{err}");
}

mod arbitrary {
    use super::*;
    use proptest::prelude::*;

    /// Suffixes from the table and a few of no convention.
    fn suffixes() -> Vec<String> {
        let mut all: BTreeSet<String> = table()
            .conventions
            .iter()
            .flat_map(|c| c.parts.iter().map(|p| p.suffix.clone()))
            .collect();
        all.extend(
            [
                ".bias",
                ".comfy_quant",
                ".weight.quant_state.bitsandbytes__nf4",
            ]
            .map(String::from),
        );
        all.extend(["scaled_fp8".to_owned()]);
        all.into_iter().collect()
    }

    const DTYPES: [&str; 8] = [
        "U8", "I8", "I32", "F32", "BF16", "F16", "F8_E4M3", "F8_E8M0",
    ];
    const DOCS: [&str; 6] = [
        r#"{"format": "nvfp4"}"#,
        r#"{"format": "float8_e4m3fn"}"#,
        r#"{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 16}"#,
        r#"{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 8]}"#,
        r#"{"format": 7}"#,
        "not json",
    ];
    const CONFIGS: [&str; 5] = [
        "{}",
        r#"{"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 8}}"#,
        r#"{"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}"#,
        r#"{"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"g": {"weights": {"num_bits": 4, "strategy": "group", "group_size": 8, "symmetric": true}}}}}"#,
        r#"{"torch_dtype": "float16", "quantization_config": {"quant_method": "fp8", "weight_block_size": [2, 2]}}"#,
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Whatever the arrays, declarations and values, recognition answers without panicking,
        /// and every array is accounted for exactly once.
        #[test]
        fn any_arrays_get_an_answer(
            picks in proptest::collection::vec((0usize..2, 0usize..64, 0usize..8, proptest::collection::vec(1u64..9, 0..3), any::<u8>()), 1..10),
            config in 0usize..CONFIGS.len(),
            doc in 0usize..DOCS.len(),
            converter in proptest::option::of(0usize..30),
        ) {
            let suffixes = suffixes();
            let mut spec: Vec<(String, String, Vec<u64>, Vec<u8>)> = Vec::new();
            for (module, suffix, dtype, shape, fill) in picks {
                let suffix = &suffixes[suffix % suffixes.len()];
                let name = if suffix.starts_with('.') { format!("m{module}{suffix}") } else { suffix.clone() };
                if spec.iter().any(|(n, ..)| *n == name) {
                    continue;
                }
                let (dtype, shape, bytes) = if suffix.ends_with("comfy_quant") || suffix.contains("quant_state") {
                    let d = DOCS[doc].as_bytes().to_vec();
                    ("U8", vec![d.len() as u64], d)
                } else {
                    let dtype = DTYPES[dtype];
                    let n: u64 = shape.iter().product::<u64>() * Dtype::parse(dtype).unwrap().bits().unwrap() as u64 / 8;
                    (dtype, shape, vec![fill; n as usize])
                };
                spec.push((name, dtype.to_owned(), shape, bytes));
            }
            let names = names();
            let converter = converter.and_then(|i| names.get(i).copied());
            let borrowed: Vec<(&str, &str, &[u64], Vec<u8>)> =
                spec.iter().map(|(n, d, s, b)| (n.as_str(), d.as_str(), &s[..], b.clone())).collect();
            if let Ok(items) = run(&borrowed, CONFIGS[config], converter) {
                let mut seen = BTreeSet::new();
                for item in &items {
                    let arrays: Vec<usize> = match item {
                        Item::Plain(i) | Item::Marker(i) | Item::Computed(i, _) => vec![*i],
                        Item::Encoded(e) => e.parts.iter().filter_map(|p| match p.source {
                            PartSource::Array(i) => Some(i),
                            PartSource::Bytes(_) => None,
                        }).collect(),
                    };
                    for i in arrays {
                        prop_assert!(seen.insert(i), "array {} twice", i);
                    }
                }
                prop_assert_eq!(seen.len(), spec.len());
            }
        }
    }
}

#[test]
fn gpt_oss_mxfp4_experts_read_as_transformers_transposed_parameters() {
    // Two experts, N = 4 outputs, K = 64 inputs: blocks [2, 4, 2, 16], scales [2, 4, 2].
    let config = r#"{"torch_dtype": "bfloat16", "quantization_config": {"quant_method": "mxfp4"}}"#;
    let items = run(
        &[
            (
                "m.experts.gate_up_proj_blocks",
                "U8",
                &[2, 4, 2, 16],
                vec![0x12; 256],
            ),
            (
                "m.experts.gate_up_proj_scales",
                "U8",
                &[2, 4, 2],
                vec![127; 16],
            ),
            ("m.experts.gate_up_proj_bias", "BF16", &[2, 4], vec![0; 16]),
        ],
        config,
        None,
    )
    .unwrap();
    let e = encoded(&items)[0];
    assert_eq!(
        (e.key.as_str(), e.scheme.as_str(), &e.shape[..]),
        ("m.experts.gate_up_proj", "mxfp4", &[2, 64, 4][..])
    );
    assert_eq!(e.params.get("transposed"), Some(&Value::Bool(true)));
    assert_eq!(
        (&e.parts[0].dtype, &e.parts[0].shape[..]),
        (&Dtype::F4, &[2, 4, 64][..])
    );
    assert_eq!(e.parts[1].dtype, Dtype::F8_E8M0);
    assert_eq!(items[1], Item::Plain(2));
}

/// Conventions whose producers do not install here, read from their documented configs.
#[test]
fn compressed_tensors_and_modelopt_configs_pick_their_schemes() {
    let ct = |format: &str, strategy: &str| {
        format!(
            r#"{{"torch_dtype": "bfloat16", "quantization_config": {{"quant_method": "compressed-tensors",
            "format": "{format}", "config_groups": {{"group_0": {{"weights": {{"num_bits": 8,
            "strategy": "{strategy}", "symmetric": true}}}}}}}}}}"#
        )
    };
    let fp8 = [
        ("l.weight", "F8_E4M3", &[4u64, 32][..], vec![0x38; 128]),
        ("l.weight_scale", "F32", &[4, 1], f32s(&[1.0; 4])),
        ("l.bias", "BF16", &[4], vec![0; 8]),
    ];
    let scheme = |config: &str, spec: &[(&str, &str, &[u64], Vec<u8>)]| {
        encoded(&run(spec, config, None).unwrap())[0].scheme.clone()
    };
    assert_eq!(
        scheme(&ct("float-quantized", "channel"), &fp8),
        "fp8.rowwise"
    );
    let int8 = [
        ("l.weight", "I8", &[4u64, 32][..], vec![1; 128]),
        ("l.weight_scale", "F32", &[4, 1], f32s(&[1.0; 4])),
        ("l.bias", "BF16", &[4], vec![0; 8]),
    ];
    assert_eq!(
        scheme(&ct("int-quantized", "channel"), &int8),
        "int8.rowwise"
    );
    // A tensor strategy with per-row scales does not fit, and says so.
    let err = run(&fp8, &ct("float-quantized", "tensor"), None).unwrap_err();
    assert!(err.contains("l") && err.contains("scale"), "{err}");

    let nvfp4 = [
        ("l.weight_packed", "U8", &[128u64, 16][..], vec![0x21; 2048]),
        ("l.weight_scale", "F8_E4M3", &[128, 2], vec![0x38; 256]),
        ("l.weight_global_scale", "F32", &[1], f32s(&[2.0])),
        ("l.bias", "BF16", &[128], vec![0; 256]),
    ];
    let config = r#"{"torch_dtype": "bfloat16", "quantization_config": {"quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized"}}"#;
    let items = run(&nvfp4, config, None).unwrap();
    let e = encoded(&items)[0];
    assert_eq!((e.key.as_str(), e.scheme.as_str()), ("l.weight", "nvfp4"));
    assert_eq!(
        e.params.get("global_scale"),
        Some(&Value::Text("divide".into()))
    );

    let mxfp8 = [
        ("l.weight", "F8_E4M3", &[4u64, 64][..], vec![0x38; 256]),
        ("l.weight_scale", "U8", &[4, 2], vec![127; 8]),
        ("l.bias", "BF16", &[4], vec![0; 8]),
    ];
    let config = r#"{"quantization_config": {"quant_method": "modelopt", "quant_algo": "MXFP8"}}"#;
    let items = run(&mxfp8, config, None).unwrap();
    let e = encoded(&items)[0];
    assert_eq!(e.scheme, "mxfp8");
    assert_eq!(e.parts[1].dtype, Dtype::F8_E8M0);
}
