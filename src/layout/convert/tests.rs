use super::*;

fn keys(names: &[(&str, &[u64])]) -> Vec<(String, Vec<u64>)> {
    names
        .iter()
        .map(|(k, s)| ((*k).to_owned(), s.to_vec()))
        .collect()
}

fn source(owned: &[(String, Vec<u64>)]) -> Vec<SourceKey<'_>> {
    owned
        .iter()
        .map(|(k, s)| SourceKey { key: k, shape: s })
        .collect()
}

#[test]
fn the_bundled_table_parses() {
    let t = table();
    assert!(named("sd1.single_file").is_some());
    assert!(named("vae.single_file").is_some());
    assert!(named("comfy.nvfp4").is_none());
    assert!(t.families.contains_key("sd1"));
}

#[test]
fn expressions_follow_integer_arithmetic() {
    let env: HashMap<String, i64> = [("i".to_owned(), 7), ("n".to_owned(), 3)].into();
    let eval = |text: &str| parse_expr(text).unwrap().eval(&env);
    assert_eq!(eval("(i-1)/n"), Some(2));
    assert_eq!(eval("(i-1)%n"), Some(0));
    assert_eq!(eval("i/n"), Some(2));
    assert_eq!(eval("n-1-i"), None, "no index is negative");
    assert_eq!(eval("i/0"), None);
    assert_eq!(eval("2+3*4"), Some(14));
    assert_eq!(eval("x"), None, "an unbound name");
    assert!(parse_expr("(i").is_err());
    assert!(parse_expr("i+").is_err());
    assert!(parse_expr("i$").is_err());
}

#[test]
fn patterns_bind_digits_and_the_rest() {
    let p = parse_pattern("input_blocks.{i}.0.*").unwrap();
    let m = |k: &str| matches(&p, &k.split('.').collect::<Vec<_>>(), &HashMap::new());
    let (captures, rest) = m("input_blocks.4.0.in_layers.0.weight").unwrap();
    assert_eq!(captures, vec![("i".to_owned(), 4)]);
    assert_eq!(rest.as_deref(), Some("in_layers.0.weight"));
    assert!(m("input_blocks.x.0.weight").is_none());
    assert!(
        m("input_blocks.4.0").is_none(),
        "* takes at least one segment"
    );
    assert!(parse_pattern("a.*.b").is_err());
}

#[test]
fn a_computed_index_matches_only_its_value() {
    let p = parse_pattern("resblocks.{L-1}.*").unwrap();
    let vars: HashMap<String, i64> = [("L".to_owned(), 24)].into();
    let m =
        |k: &str, vars: &HashMap<String, i64>| matches(&p, &k.split('.').collect::<Vec<_>>(), vars);
    assert_eq!(
        m("resblocks.23.ln_1.weight", &vars),
        Some((vec![], Some("ln_1.weight".into())))
    );
    assert!(m("resblocks.22.ln_1.weight", &vars).is_none());
    assert!(
        m("resblocks.023.ln_1.weight", &vars).is_none(),
        "as Python writes an index"
    );
    assert!(
        m("resblocks.23.ln_1.weight", &HashMap::new()).is_none(),
        "L unbound"
    );
    assert!(parse_pattern("resblocks.{L-}.*").is_err());
}

#[test]
fn a_family_is_its_base_with_its_own_entries_over_it() {
    let t = table();
    let refiner = &t.families["sdxl_refiner"];
    let sdxl = &t.families["sdxl"];
    assert_eq!(refiner["scheduler"], sdxl["scheduler"]);
    assert_eq!(refiner["unet"], sdxl["unet"]);
    assert!(
        refiner.get("tokenizer").is_none() && refiner.get("text_encoder").is_none(),
        "null removes"
    );
    assert!(refiner.get("base").is_none());
    assert_eq!(refiner["pipeline"]["requires_aesthetics_score"], true);
    let cycle = r#"{"about": "", "keymaps": {}, "markers": [], "converters": [],
        "families": {"a": {"base": "b"}, "b": {"base": "a"}}}"#;
    let Err(err) = parse_table(cycle) else {
        panic!("a cycle of bases parsed");
    };
    assert!(err.contains("cycle"), "{err}");
}

/// The OpenCLIP text encoder of an SD 2.x file, `layers` deep, as `cond_stage_model.model.`
/// keys (hidden width 8).
fn sd2_text_encoder(layers: usize) -> Vec<(String, Vec<u64>)> {
    let t = "cond_stage_model.model.";
    let mut k = vec![
        (format!("{t}token_embedding.weight"), vec![49408, 8]),
        (format!("{t}positional_embedding"), vec![77, 8]),
        (format!("{t}text_projection"), vec![8, 8]),
        (format!("{t}logit_scale"), vec![]),
        (format!("{t}ln_final.weight"), vec![8]),
    ];
    for i in 0..layers {
        let r = format!("{t}transformer.resblocks.{i}.");
        k.push((format!("{r}attn.in_proj_weight"), vec![24, 8]));
        k.push((format!("{r}ln_1.weight"), vec![8]));
        k.push((format!("{r}mlp.c_fc.weight"), vec![32, 8]));
    }
    k
}

#[test]
fn an_sd2_file_leaves_its_text_encoders_last_layer_and_projection_in_the_file() {
    let mut owned: Vec<(String, Vec<u64>)> = sd1_like()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("cond_stage_model."))
        .collect();
    owned.extend(sd2_text_encoder(3));
    let arrays = source(&owned);
    let Outcome::Converted(c) = recognise(table(), &arrays, None, &|_| Ok(())).unwrap() else {
        panic!("not converted");
    };
    assert_eq!(c.converter.name, "sd2.single_file");
    let text = c
        .components
        .iter()
        .find(|x| x.rule.name == "text_encoder")
        .unwrap();
    let layers: BTreeSet<&str> = text
        .tensors
        .iter()
        .filter_map(|r| r.key.strip_prefix("text_model.encoder.layers."))
        .filter_map(|k| k.split('.').next())
        .collect();
    assert_eq!(
        layers,
        ["0", "1"].into(),
        "the penultimate layer's output: layer 2 is unused"
    );
    assert!(text
        .tensors
        .iter()
        .any(|r| r.key == "text_model.encoder.layers.1.layer_norm1.weight"));
    let kept: Vec<&str> = c.kept.iter().map(|&i| owned[i].0.as_str()).collect();
    for k in [
        "text_projection",
        "logit_scale",
        "transformer.resblocks.2.ln_1.weight",
    ] {
        assert!(
            kept.contains(&format!("cond_stage_model.model.{k}").as_str()),
            "{k}: {kept:?}"
        );
    }
}

#[test]
fn an_sdxl_refiner_file_is_its_own_converters() {
    let mut owned: Vec<(String, Vec<u64>)> = sd1_like()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("cond_stage_model."))
        .collect();
    owned.push((
        "model.diffusion_model.label_emb.0.0.weight".into(),
        vec![128, 2560],
    ));
    for (k, shape) in sd2_text_encoder(2) {
        let k = k.replace("cond_stage_model.model.", "conditioner.embedders.0.model.");
        owned.push((k, shape));
    }
    let arrays = source(&owned);
    let Outcome::Converted(c) = recognise(table(), &arrays, None, &|_| Ok(())).unwrap() else {
        panic!("not converted");
    };
    assert_eq!(c.converter.name, "sdxl_refiner.single_file");
    let names: Vec<&str> = c.components.iter().map(|x| x.rule.name.as_str()).collect();
    assert_eq!(names, ["text_encoder_2", "unet", "vae"]);
    let text = &c.components[0];
    assert!(text
        .tensors
        .iter()
        .any(|r| r.key == "text_projection.weight" && r.transposed));
    assert!(text
        .tensors
        .iter()
        .any(|r| r.key == "text_model.encoder.layers.1.mlp.fc1.weight"));
}

/// A UNet with two resnets per level, attention in the second of three levels, a mid block,
/// and a VAE with two levels, as a CompVis file names them.
fn sd1_like() -> Vec<(String, Vec<u64>)> {
    let mut k: Vec<(String, Vec<u64>)> = Vec::new();
    let mut add = |name: String, shape: &[u64]| k.push((name, shape.to_vec()));
    let u = "model.diffusion_model.";
    add(format!("{u}input_blocks.0.0.weight"), &[32, 4, 3, 3]);
    add(format!("{u}time_embed.0.weight"), &[128, 32]);
    for i in [1, 2, 4, 5, 7, 8] {
        add(format!("{u}input_blocks.{i}.0.in_layers.0.weight"), &[32]);
        add(
            format!("{u}input_blocks.{i}.0.in_layers.2.weight"),
            &[32, 32, 3, 3],
        );
    }
    for i in [4, 5] {
        add(
            format!("{u}input_blocks.{i}.1.proj_in.weight"),
            &[32, 32, 1, 1],
        );
    }
    for i in [3, 6] {
        add(format!("{u}input_blocks.{i}.0.op.weight"), &[32, 32, 3, 3]);
    }
    add(format!("{u}middle_block.0.in_layers.0.weight"), &[32]);
    add(format!("{u}middle_block.1.proj_in.weight"), &[32, 32, 1, 1]);
    for i in 0..9 {
        add(
            format!("{u}output_blocks.{i}.0.out_layers.3.weight"),
            &[32, 32, 3, 3],
        );
    }
    add(format!("{u}output_blocks.2.1.conv.weight"), &[32, 32, 3, 3]);
    add(format!("{u}output_blocks.4.1.norm.weight"), &[32]);
    add(format!("{u}output_blocks.5.2.conv.weight"), &[32, 32, 3, 3]);
    add(format!("{u}out.2.weight"), &[4, 32, 3, 3]);
    let v = "first_stage_model.";
    add(format!("{v}encoder.conv_in.weight"), &[32, 3, 3, 3]);
    add(
        format!("{v}encoder.down.0.block.0.conv1.weight"),
        &[32, 32, 3, 3],
    );
    add(
        format!("{v}encoder.down.1.block.0.nin_shortcut.weight"),
        &[64, 32, 1, 1],
    );
    add(format!("{v}encoder.mid.attn_1.q.weight"), &[64, 64, 1, 1]);
    add(format!("{v}decoder.conv_in.weight"), &[64, 4, 3, 3]);
    add(
        format!("{v}decoder.up.0.block.0.conv1.weight"),
        &[32, 32, 3, 3],
    );
    add(
        format!("{v}decoder.up.1.block.0.conv1.weight"),
        &[64, 64, 3, 3],
    );
    add(
        format!("{v}decoder.up.1.upsample.conv.weight"),
        &[64, 64, 3, 3],
    );
    let t = "cond_stage_model.transformer.";
    add(
        format!("{t}text_model.embeddings.token_embedding.weight"),
        &[49408, 32],
    );
    add(format!("{t}text_model.embeddings.position_ids"), &[1, 77]);
    add("alphas_cumprod".to_owned(), &[1000]);
    k
}

#[test]
fn an_sd1_file_becomes_diffusers_keys() {
    let owned = sd1_like();
    let arrays = source(&owned);
    let Outcome::Converted(c) = recognise(table(), &arrays, None, &|_| Ok(())).unwrap() else {
        panic!("not converted");
    };
    assert_eq!(c.converter.name, "sd1.single_file");
    let renamed = |component: &str| -> BTreeMap<String, (String, Vec<u64>)> {
        let conv = c
            .components
            .iter()
            .find(|x| x.rule.name == component)
            .unwrap();
        conv.tensors
            .iter()
            .map(|r| (owned[r.source].0.clone(), (r.key.clone(), r.shape.clone())))
            .collect()
    };
    let unet = renamed("unet");
    let to = |k: &str| unet[&format!("model.diffusion_model.{k}")].0.clone();
    assert_eq!(to("input_blocks.0.0.weight"), "conv_in.weight");
    assert_eq!(
        to("input_blocks.5.0.in_layers.2.weight"),
        "down_blocks.1.resnets.1.conv1.weight"
    );
    assert_eq!(
        to("input_blocks.7.0.in_layers.0.weight"),
        "down_blocks.2.resnets.0.norm1.weight"
    );
    assert_eq!(
        to("input_blocks.4.1.proj_in.weight"),
        "down_blocks.1.attentions.0.proj_in.weight"
    );
    assert_eq!(
        to("input_blocks.6.0.op.weight"),
        "down_blocks.1.downsamplers.0.conv.weight"
    );
    assert_eq!(
        to("middle_block.1.proj_in.weight"),
        "mid_block.attentions.0.proj_in.weight"
    );
    assert_eq!(
        to("output_blocks.5.0.out_layers.3.weight"),
        "up_blocks.1.resnets.2.conv2.weight"
    );
    assert_eq!(
        to("output_blocks.2.1.conv.weight"),
        "up_blocks.0.upsamplers.0.conv.weight"
    );
    assert_eq!(
        to("output_blocks.5.2.conv.weight"),
        "up_blocks.1.upsamplers.0.conv.weight"
    );
    assert_eq!(
        to("output_blocks.4.1.norm.weight"),
        "up_blocks.1.attentions.1.norm.weight"
    );
    assert_eq!(to("out.2.weight"), "conv_out.weight");
    let vae = renamed("vae");
    let v = |k: &str| vae[&format!("first_stage_model.{k}")].clone();
    assert_eq!(
        v("decoder.up.0.block.0.conv1.weight").0,
        "decoder.up_blocks.1.resnets.0.conv1.weight"
    );
    assert_eq!(
        v("decoder.up.1.upsample.conv.weight").0,
        "decoder.up_blocks.0.upsamplers.0.conv.weight"
    );
    assert_eq!(
        v("encoder.down.1.block.0.nin_shortcut.weight").0,
        "encoder.down_blocks.1.resnets.0.conv_shortcut.weight"
    );
    assert_eq!(
        v("encoder.mid.attn_1.q.weight"),
        (
            "encoder.mid_block.attentions.0.to_q.weight".to_owned(),
            vec![64, 64]
        ),
        "a 1×1 kernel becomes a linear weight"
    );
    let kept: Vec<&str> = c.kept.iter().map(|&i| owned[i].0.as_str()).collect();
    assert_eq!(
        kept,
        vec![
            "cond_stage_model.transformer.text_model.embeddings.position_ids",
            "alphas_cumprod"
        ]
    );
}

#[test]
fn a_key_no_rule_takes_leaves_the_file_as_it_is() {
    let mut owned = sd1_like();
    owned.push(("model.diffusion_model.extra.weight".to_owned(), vec![1]));
    let arrays = source(&owned);
    match recognise(table(), &arrays, None, &|_| Ok(())).unwrap() {
        Outcome::Unconverted(why) => {
            assert!(why.contains("extra.weight"), "{why}");
            assert!(why.contains("sd1.single_file"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    let err = recognise(table(), &arrays, named("sd1.single_file"), &|_| Ok(())).unwrap_err();
    assert!(err.starts_with("--converter sd1.single_file"), "{err}");
}

#[test]
fn a_file_no_converter_knows_is_unknown() {
    let owned = keys(&[("transformer.blocks.0.weight", &[4, 4])]);
    assert!(matches!(
        recognise(table(), &source(&owned), None, &|_| Ok(())).unwrap(),
        Outcome::Unknown
    ));
}

#[test]
fn a_checkpoint_without_one_of_its_models_lacks_it_and_a_truncated_model_is_unknown() {
    let mut owned = sd1_like();
    owned.retain(|(k, _)| !k.starts_with("first_stage_model."));
    match recognise(table(), &source(&owned), None, &|_| Ok(())).unwrap() {
        Outcome::Lacking(why) => assert!(
            why.contains(
                "sd1.single_file without its vae (no key starts with \"first_stage_model.\")"
            ) && !why.contains("sd2"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    // Part of the VAE is there: no model is missing, the file is no checkpoint's.
    let mut owned = sd1_like();
    owned.retain(|(k, _)| k != "first_stage_model.decoder.conv_in.weight");
    assert!(matches!(
        recognise(table(), &source(&owned), None, &|_| Ok(())).unwrap(),
        Outcome::Unknown
    ));
}

#[test]
fn two_matching_converters_are_refused() {
    let mut raw: serde_json::Value = serde_json::from_str(TABLE).unwrap();
    let converters = raw["converters"].as_array_mut().unwrap();
    let vae = converters
        .iter()
        .position(|c| c["name"] == "vae.single_file")
        .unwrap();
    let mut twin = converters[vae].clone();
    twin["name"] = "vae.twin".into();
    converters.push(twin);
    let t = parse_table(&raw.to_string()).unwrap();
    let owned = keys(&[
        ("encoder.conv_in.weight", &[32, 3, 3, 3]),
        ("decoder.conv_in.weight", &[32, 4, 3, 3]),
        ("encoder.down.0.block.0.conv1.weight", &[32, 32, 3, 3]),
    ]);
    let err = recognise(&t, &source(&owned), None, &|_| Ok(())).unwrap_err();
    assert!(err.contains("vae.single_file, vae.twin"), "{err}");
    assert!(err.contains("--converter"), "{err}");
}

#[test]
fn openclip_splits_fused_qkv_into_row_parts_and_transposes_the_projection() {
    let t = table();
    let vars = HashMap::new();
    let none = |_: &str| false;
    let Some(Mapped::Keys { keys, op, .. }) = t.map(
        "open_clip",
        "transformer.resblocks.3.attn.in_proj_weight",
        &vars,
        &none,
    ) else {
        panic!("not mapped");
    };
    assert_eq!(
        keys,
        [
            "text_model.encoder.layers.3.self_attn.q_proj.weight",
            "text_model.encoder.layers.3.self_attn.k_proj.weight",
            "text_model.encoder.layers.3.self_attn.v_proj.weight",
        ]
    );
    assert_eq!(op, Op::Same);
    assert_eq!(
        t.map("open_clip", "text_projection", &vars, &none),
        Some(Mapped::Keys {
            keys: vec!["text_projection.weight".into()],
            op: Op::Transpose,
            with: vec![],
            rows: vec![],
        })
    );
    assert_eq!(
        t.map("open_clip", "logit_scale", &vars, &none),
        Some(Mapped::Kept)
    );
}

#[test]
fn fused_rows_that_do_not_split_evenly_are_refused_by_name() {
    let prefix = "conditioner.embedders.1.model.";
    let owned = keys(&[
        (
            "conditioner.embedders.0.transformer.text_model.embeddings.token_embedding.weight",
            &[10, 4],
        ),
        (&format!("{prefix}token_embedding.weight"), &[10, 6]),
        (
            &format!("{prefix}transformer.resblocks.0.attn.in_proj_weight"),
            &[17, 6],
        ),
    ]);
    let converter = named("sdxl.single_file").unwrap();
    let err = convert(table(), converter, &source(&owned)).unwrap_err();
    assert!(
        err.contains("in_proj_weight") && err.contains("split in 3"),
        "{err}"
    );
}

/// A header of the Diffusers lane a conversion makes (each converted tensor F32, plain), as
/// a Diffusers folder's import stores it, with `pipeline` and its text encoder's `hidden_act`.
fn lane_of(c: &Conversion<'_>, pipeline: &str, hidden_act: &str) -> crate::format::Header {
    use crate::format::{
        Body, ClassRef, Component, Config, Dtype, Header, Location, Pipeline, Tensor, Value,
    };
    let class = |library: &str, name: &str| ClassRef {
        library: library.into(),
        version: "1".into(),
        name: name.into(),
    };
    let components = c
        .components
        .iter()
        .map(|x| {
            let mut config = Config::new();
            if x.rule.name.starts_with("text_encoder") {
                config.insert("hidden_act".into(), Value::Text(hidden_act.into()));
            }
            Component {
                name: x.rule.name.clone(),
                class: class(&x.rule.class.0, &x.rule.class.1),
                config,
                tensors: x
                    .tensors
                    .iter()
                    .map(|r| Tensor {
                        key: r.key.clone(),
                        dtype: Dtype::F32,
                        shape: r.shape.clone(),
                        body: Body::Plain(Location {
                            chunk: 0,
                            offset: 0,
                            length: 0,
                        }),
                    })
                    .collect(),
                assets: Default::default(),
                config_file: None,
            }
        })
        .collect();
    Header {
        format: "cozytensors/1".into(),
        chunks: vec![],
        encodings: vec![],
        pipeline: Some(Pipeline {
            class: class("diffusers", pipeline),
            config: Config::new(),
        }),
        components,
        metadata: Config::new(),
    }
}

/// The one file of a whole pipeline's reversal.
fn whole(reversed: Result<Vec<Reversed<'_>>, String>) -> Reversed<'_> {
    let mut files = reversed.unwrap();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = files.remove(0);
    assert_eq!(file.name, "model.safetensors");
    file
}

#[test]
fn a_diffusers_lane_becomes_the_single_file_it_came_from() {
    let owned = sd1_like();
    let arrays = source(&owned);
    let Outcome::Converted(c) = recognise(table(), &arrays, None, &|_| Ok(())).unwrap() else {
        panic!("not converted");
    };
    let header = lane_of(&c, "StableDiffusionPipeline", "quick_gelu");
    let reversed = whole(reverse(table(), &header));
    assert_eq!(reversed.converter.name, "sd1.single_file");
    let mut got: Vec<(String, Vec<u64>)> = reversed
        .arrays
        .iter()
        .map(|a| (a.key.clone(), a.shape.clone()))
        .collect();
    got.sort();
    // Every array of the file but those Diffusers does not load, with its own shape (the
    // VAE's attention a 1×1 kernel again).
    let mut want: Vec<(String, Vec<u64>)> = c
        .components
        .iter()
        .flat_map(|x| x.tensors.iter().map(|r| owned[r.source].clone()))
        .collect();
    want.sort();
    assert_eq!(got, want);
    // SD 2.x's text encoder is GELU: no SD 1.x file of it.
    let err = reverse(table(), &lane_of(&c, "StableDiffusionPipeline", "gelu")).unwrap_err();
    assert!(err.contains("no converter"), "{err}");
}

#[test]
fn openclips_q_k_v_fuse_back_and_the_projection_transposes_back() {
    let mut owned: Vec<(String, Vec<u64>)> = sd1_like()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("cond_stage_model.") && k != "alphas_cumprod")
        .collect();
    owned.push((
        "model.diffusion_model.label_emb.0.0.weight".into(),
        vec![128, 2560],
    ));
    for (k, shape) in sd2_text_encoder(2) {
        owned.push((
            k.replace("cond_stage_model.model.", "conditioner.embedders.0.model."),
            shape,
        ));
    }
    owned.retain(|(k, _)| !k.ends_with("logit_scale"));
    let arrays = source(&owned);
    let Outcome::Converted(c) = recognise(table(), &arrays, None, &|_| Ok(())).unwrap() else {
        panic!("not converted");
    };
    let header = lane_of(&c, "StableDiffusionXLImg2ImgPipeline", "gelu");
    let reversed = whole(reverse(table(), &header));
    assert_eq!(reversed.converter.name, "sdxl_refiner.single_file");
    let fused = reversed
        .arrays
        .iter()
        .find(|a| {
            a.key == "conditioner.embedders.0.model.transformer.resblocks.1.attn.in_proj_weight"
        })
        .unwrap();
    assert_eq!(fused.shape, [24, 8]);
    assert_eq!(
        fused.pieces,
        ["q", "k", "v"].map(|x| TensorRows::whole(format!(
            "text_model.encoder.layers.1.self_attn.{x}_proj.weight"
        )))
    );
    let projection = reversed
        .arrays
        .iter()
        .find(|a| a.key == "conditioner.embedders.0.model.text_projection")
        .unwrap();
    assert!(
        projection.transposed && projection.pieces == [TensorRows::whole("text_projection.weight")]
    );
    let mut got: Vec<String> = reversed.arrays.iter().map(|a| a.key.clone()).collect();
    got.sort();
    let mut want: Vec<String> = owned.iter().map(|(k, _)| k.clone()).collect();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn a_lane_whose_tensors_would_not_convert_back_has_no_single_file() {
    let owned = sd1_like();
    let arrays = source(&owned);
    let Outcome::Converted(c) = recognise(table(), &arrays, None, &|_| Ok(())).unwrap() else {
        panic!("not converted");
    };
    // A tensor no reverse rule takes.
    let mut header = lane_of(&c, "StableDiffusionPipeline", "quick_gelu");
    let unet = header
        .components
        .iter_mut()
        .find(|x| x.name == "unet")
        .unwrap();
    let mut extra = unet.tensors[0].clone();
    extra.key = "extra.weight".into();
    unet.tensors.push(extra);
    let err = reverse(table(), &header).unwrap_err();
    assert!(err.contains("unet: no rule takes extra.weight"), "{err}");
    // A level whose resnets Diffusers would not build: the file would not convert back.
    let mut header = lane_of(&c, "StableDiffusionPipeline", "quick_gelu");
    let unet = header
        .components
        .iter_mut()
        .find(|x| x.name == "unet")
        .unwrap();
    unet.tensors
        .retain(|t| !t.key.starts_with("up_blocks.0.resnets.1."));
    assert!(reverse(table(), &header).is_err());
}

/// Rows of a FLUX.1 transformer of width 8 (one double and one single block): each fused
/// projection, the final adaLN projection and the image input, under ComfyUI's prefix.
fn flux_like(linear1_rows: u64) -> Vec<(String, Vec<u64>)> {
    keys(&[
        ("model.diffusion_model.img_in.weight", &[8, 4]),
        (
            "model.diffusion_model.double_blocks.0.img_attn.qkv.weight",
            &[24, 8],
        ),
        (
            "model.diffusion_model.single_blocks.0.linear1.weight",
            &[linear1_rows, 8],
        ),
        (
            "model.diffusion_model.single_blocks.0.linear1.bias",
            &[linear1_rows],
        ),
        (
            "model.diffusion_model.final_layer.adaLN_modulation.1.weight",
            &[16, 8],
        ),
    ])
}

#[test]
fn flux_splits_its_fused_projections_by_proportion_and_swaps_the_final_adaln_halves() {
    let owned = flux_like(56);
    let Outcome::Converted(c) = recognise(table(), &source(&owned), None, &|_| Ok(())).unwrap()
    else {
        panic!("not converted");
    };
    assert_eq!(c.converter.name, "flux_transformer.single_file");
    // Each tensor's shape and rows of its array.
    type Taken<'a> = (&'a [u64], &'a [(u64, u64)]);
    let got: BTreeMap<&str, Taken<'_>> = c.components[0]
        .tensors
        .iter()
        .map(|r| (r.key.as_str(), (r.shape.as_slice(), r.rows.as_slice())))
        .collect();
    let b = "single_transformer_blocks.0";
    assert_eq!(
        got[&*format!("{b}.attn.to_q.weight")],
        (&[8, 8][..], &[(0, 8)][..])
    );
    assert_eq!(
        got[&*format!("{b}.attn.to_v.weight")],
        (&[8, 8][..], &[(16, 24)][..])
    );
    assert_eq!(
        got[&*format!("{b}.proj_mlp.weight")],
        (&[32, 8][..], &[(24, 56)][..])
    );
    assert_eq!(
        got[&*format!("{b}.proj_mlp.bias")],
        (&[32][..], &[(24, 56)][..])
    );
    assert_eq!(
        got["transformer_blocks.0.attn.to_k.weight"],
        (&[8, 8][..], &[(8, 16)][..])
    );
    // Diffusers' scale rows are the file's second half, its shift rows the first.
    assert_eq!(
        got["norm_out.linear.weight"],
        (&[16, 8][..], &[(8, 16), (0, 8)][..])
    );
    assert_eq!(got["x_embedder.weight"], (&[8, 4][..], &[][..]));

    // 50 rows are no q/k/v and an MLP four times as wide.
    let owned = flux_like(50);
    let Outcome::Unconverted(why) = recognise(table(), &source(&owned), None, &|_| Ok(())).unwrap()
    else {
        panic!("converted");
    };
    assert!(
        why.contains("linear1.weight") && why.contains("split 1:1:1:4"),
        "{why}"
    );
}

#[test]
fn sd3_swaps_only_the_last_blocks_context_adaln() {
    let owned = keys(&[
        ("pos_embed", &[1, 16, 8]),
        ("x_embedder.proj.weight", &[8, 4, 2, 2]),
        ("joint_blocks.0.x_block.attn.qkv.weight", &[24, 8]),
        (
            "joint_blocks.0.context_block.adaLN_modulation.1.weight",
            &[48, 8],
        ),
        ("joint_blocks.0.context_block.mlp.fc1.weight", &[32, 8]),
        ("joint_blocks.1.x_block.attn.qkv.weight", &[24, 8]),
        (
            "joint_blocks.1.context_block.adaLN_modulation.1.weight",
            &[16, 8],
        ),
        ("final_layer.adaLN_modulation.1.weight", &[16, 8]),
    ]);
    let Outcome::Converted(c) = recognise(table(), &source(&owned), None, &|_| Ok(())).unwrap()
    else {
        panic!("not converted");
    };
    assert_eq!(c.converter.name, "sd3_transformer.single_file");
    let rows = |key: &str| {
        let r = c.components[0].tensors.iter().find(|r| r.key == key);
        r.unwrap_or_else(|| panic!("no {key}")).rows.clone()
    };
    assert_eq!(rows("pos_embed.pos_embed"), []);
    assert_eq!(rows("transformer_blocks.0.norm1_context.linear.weight"), []);
    assert_eq!(
        rows("transformer_blocks.1.norm1_context.linear.weight"),
        [(8, 16), (0, 8)]
    );
    assert_eq!(rows("norm_out.linear.weight"), [(8, 16), (0, 8)]);
}

#[test]
fn rules_give_proportions_for_their_keys_and_swap_alone() {
    let rule = |r: serde_json::Value| parse_rule(r.as_array().unwrap());
    assert!(rule(serde_json::json!(["a.*", ["b.*", "c.*"], null, null, {"rows": [1, 3]}])).is_ok());
    let err = rule(serde_json::json!(["a.*", ["b.*", "c.*"], null, null, {"rows": [1, 2, 3]}]))
        .err()
        .unwrap();
    assert!(err.contains("proportion"), "{err}");
    let err = rule(serde_json::json!(["a.*", ["b.*", "c.*"], null, null, {"rows": [1, 0]}]))
        .err()
        .unwrap();
    assert!(err.contains("positive"), "{err}");
    let err = rule(serde_json::json!(["a.*", ["b.*", "c.*"], null, "swap"]))
        .err()
        .unwrap();
    assert!(err.contains("no op"), "{err}");
    // Odd rows do not halve.
    let owned = keys(&[("a", &[3, 2])]);
    let err = row_parts(source(&owned)[0], Op::Swap, 1, &[]).unwrap_err();
    assert!(err.contains("halve"), "{err}");
}

/// The bundled table with a FLUX.1 pipeline converter whose transformer reverses by
/// `reverse_rules`.
fn flux_pipeline_table(reverse_rules: serde_json::Value) -> Table {
    let mut raw: serde_json::Value = serde_json::from_str(TABLE).unwrap();
    raw["keymaps"]["flux_test_reverse"] = serde_json::json!({ "rules": reverse_rules });
    raw["converters"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "name": "flux_test.single_file",
            "about": "a test",
            "family": "flux",
            "pipeline": "FluxTestPipeline",
            "require": ["img_in.weight"],
            "components": [{
                "name": "transformer",
                "prefix": "model.diffusion_model.",
                "keymap": "flux_transformer",
                "reverse": "flux_test_reverse",
                "class": ["diffusers", "FluxTransformer2DModel"]
            }]
        }));
    parse_table(&raw.to_string()).unwrap()
}

#[test]
fn unequal_fused_rows_and_swapped_halves_reverse_to_the_original_arrays() {
    let b = "single_transformer_blocks.{i}";
    let fused = |w: &str| {
        serde_json::json!([format!("{b}.attn.to_q.{w}"), format!("single_blocks.{{i}}.linear1.{w}"),
            null, null, {"with": [format!("{b}.attn.to_k.{w}"), format!("{b}.attn.to_v.{w}"),
            format!("{b}.proj_mlp.{w}")]}])
    };
    let qkv = serde_json::json!(["transformer_blocks.{i}.attn.to_q.weight",
        "double_blocks.{i}.img_attn.qkv.weight", null, null,
        {"with": ["transformer_blocks.{i}.attn.to_k.weight", "transformer_blocks.{i}.attn.to_v.weight"]}]);
    let rules = |adaln: serde_json::Value| {
        serde_json::json!([
            ["x_embedder.*", "img_in.*"],
            qkv,
            fused("weight"),
            fused("bias"),
            adaln
        ])
    };
    let t = flux_pipeline_table(rules(serde_json::json!([
        "norm_out.linear.*",
        "final_layer.adaLN_modulation.1.*",
        null,
        "swap"
    ])));
    let owned = flux_like(56);
    let converter = t
        .converters
        .iter()
        .find(|c| c.name == "flux_test.single_file")
        .unwrap();
    let c = convert(&t, converter, &source(&owned)).unwrap();
    let header = lane_of(&c, "FluxTestPipeline", "");
    let reversed = whole(reverse(&t, &header));
    let array = |key: &str| {
        let a = reversed.arrays.iter().find(|a| a.key.ends_with(key));
        a.unwrap_or_else(|| panic!("no {key}")).clone()
    };
    let linear1 = array("single_blocks.0.linear1.weight");
    assert_eq!(linear1.shape, [56, 8]);
    let names: Vec<&str> = linear1.pieces.iter().map(|p| p.tensor.as_str()).collect();
    assert_eq!(
        names,
        ["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"]
            .map(|x| format!("single_transformer_blocks.0.{x}.weight"))
    );
    let adaln = array("final_layer.adaLN_modulation.1.weight");
    assert_eq!(
        adaln.pieces,
        [(8, 16), (0, 8)].map(|r| TensorRows::part("norm_out.linear.weight", r))
    );
    let mut got: Vec<&str> = reversed.arrays.iter().map(|a| a.key.as_str()).collect();
    got.sort_unstable();
    let mut want: Vec<&str> = owned.iter().map(|(k, _)| k.as_str()).collect();
    want.sort_unstable();
    assert_eq!(got, want);

    // Without the swap, the halves would come back in the other order: no single file.
    let t = flux_pipeline_table(rules(serde_json::json!([
        "norm_out.linear.*",
        "final_layer.adaLN_modulation.1.*"
    ])));
    let err = reverse(&t, &header).unwrap_err();
    assert!(err.contains("adaLN_modulation.1.weight"), "{err}");
}

#[test]
fn a_whole_sd3_file_gives_clip_l_an_identity_projection_and_keeps_its_own_and_the_t5() {
    let owned = keys(&[
        ("model.diffusion_model.pos_embed", &[1, 16, 8]),
        (
            "model.diffusion_model.x_embedder.proj.weight",
            &[8, 4, 2, 2],
        ),
        (
            "model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight",
            &[24, 8],
        ),
        ("first_stage_model.decoder.conv_in.weight", &[32, 16, 3, 3]),
        (
            "text_encoders.clip_l.transformer.text_model.embeddings.token_embedding.weight",
            &[100, 64],
        ),
        (
            "text_encoders.clip_l.transformer.text_model.final_layer_norm.weight",
            &[64],
        ),
        (
            "text_encoders.clip_l.transformer.text_projection.weight",
            &[64, 64],
        ),
        (
            "text_encoders.clip_g.transformer.text_model.embeddings.token_embedding.weight",
            &[100, 128],
        ),
        (
            "text_encoders.clip_g.transformer.text_projection.weight",
            &[48, 128],
        ),
        ("text_encoders.t5xxl.transformer.shared.weight", &[300, 32]),
    ]);
    // As the import checks a file that joins no pipeline: the converter that would take the
    // T5 too needs one.
    let alone = |c: &Conversion<'_>| match &c.converter.needs_pipeline {
        Some(why) => Err(why.clone()),
        None => Ok(()),
    };
    let Outcome::Converted(c) = recognise(table(), &source(&owned), None, &alone).unwrap() else {
        panic!("not converted");
    };
    assert_eq!(c.converter.name, "sd3.single_file");
    assert_eq!(
        c.passed_over,
        ["sd3_t5.single_file: its T5 needs a T5 tokenizer, and none ships offline"]
    );
    let component = |name: &str| c.components.iter().find(|x| x.rule.name == name).unwrap();
    let clip_l = component("text_encoder");
    assert_eq!(
        clip_l
            .identities
            .iter()
            .map(|r| (r.key.as_str(), r.shape.as_slice()))
            .collect::<Vec<_>>(),
        [("text_projection.weight", &[64, 64][..])]
    );
    assert!(!clip_l
        .tensors
        .iter()
        .any(|r| r.key == "text_projection.weight"));
    let kept: Vec<&str> = c.kept.iter().map(|&i| owned[i].0.as_str()).collect();
    assert_eq!(
        kept,
        [
            "text_encoders.clip_l.transformer.text_projection.weight",
            "text_encoders.t5xxl.transformer.shared.weight"
        ]
    );
    // OpenCLIP-G keeps its own projection.
    assert!(component("text_encoder_2")
        .tensors
        .iter()
        .any(|r| r.key == "text_projection.weight"));
}

#[test]
fn a_component_that_makes_identities_has_no_reverse_keymap() {
    let mut raw: serde_json::Value = serde_json::from_str(TABLE).unwrap();
    let sd3 = raw["converters"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["name"] == "sd3.single_file")
        .unwrap();
    sd3["components"][2]["reverse"] = "clip_text_reverse".into();
    let Err(err) = parse_table(&raw.to_string()) else {
        panic!("parsed");
    };
    assert!(err.contains("identity matrices"), "{err}");
}

#[test]
fn an_agree_expression_that_does_not_parse_is_refused_with_the_table() {
    let mut raw: serde_json::Value = serde_json::from_str(TABLE).unwrap();
    let flux = raw["converters"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["name"] == "flux.single_file")
        .unwrap();
    flux["agree"]["transformer.in_channels"] = "4 * (vae.latent_channels".into();
    let Err(err) = parse_table(&raw.to_string()) else {
        panic!("parsed");
    };
    assert!(
        err.contains("flux.single_file: agree transformer.in_channels"),
        "{err}"
    );
}

#[test]
fn models_that_do_not_fit_each_other_are_named_by_their_values() {
    let converter = crate::layout::convert::named("flux.single_file").unwrap();
    let config = |pairs: &[(&str, i64)]| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::json!(v)))
            .collect::<serde_json::Map<_, _>>()
    };
    let mut derived = BTreeMap::from([
        (
            "transformer".to_owned(),
            config(&[("in_channels", 64), ("joint_attention_dim", 32)]),
        ),
        ("vae".to_owned(), config(&[("latent_channels", 16)])),
        ("text_encoder_2".to_owned(), config(&[("d_model", 32)])),
    ]);
    assert!(converter.agrees(&derived).is_ok());
    derived.get_mut("vae").unwrap()["latent_channels"] = 4.into();
    let err = converter.agrees(&derived).unwrap_err();
    assert!(
        err.contains("transformer.in_channels is 64, and 4 * vae.latent_channels is 16"),
        "{err}"
    );
}

#[test]
fn a_pipeline_no_converter_writes_whole_is_a_file_per_component_in_its_alone_layout() {
    let owned = flux_like(56);
    let Outcome::Converted(c) = recognise(table(), &source(&owned), None, &|_| Ok(())).unwrap()
    else {
        panic!("not converted");
    };
    let header = lane_of(&c, "FluxPipeline", "");
    let files = reverse(table(), &header).unwrap();
    let [file] = files.as_slice() else {
        panic!("{files:?}");
    };
    assert_eq!(file.name, "transformer.safetensors");
    assert_eq!(file.converter.name, "flux_transformer.single_file");
    // The original keys, bare, as Black Forest Labs ship them.
    let mut got: Vec<&str> = file.arrays.iter().map(|a| a.key.as_str()).collect();
    got.sort_unstable();
    let mut want: Vec<&str> = owned
        .iter()
        .map(|(k, _)| k.strip_prefix("model.diffusion_model.").unwrap())
        .collect();
    want.sort_unstable();
    assert_eq!(got, want);
    let adaln = file
        .arrays
        .iter()
        .find(|a| a.key == "final_layer.adaLN_modulation.1.weight")
        .unwrap();
    assert_eq!(
        adaln.pieces,
        [(8, 16), (0, 8)].map(|r| TensorRows::part("norm_out.linear.weight", r))
    );
    // A component no model-alone converter writes leaves the pipeline without one.
    let mut with_unet = header.clone();
    let mut unet = with_unet.components[0].clone();
    unet.name = "unet".into();
    unet.class.name = "UNet2DConditionModel".into();
    with_unet.components.push(unet);
    let err = reverse(table(), &with_unet).unwrap_err();
    assert!(
        err.contains("no converter writes a UNet2DConditionModel alone back to a single file"),
        "{err}"
    );
}

#[test]
fn a_whole_checkpoints_component_is_named_in_its_files_keys_by_its_keymaps_reverse() {
    let whole = named("flux.single_file").unwrap();
    let rule = &whole.components[0];
    assert!(
        rule.reverse.is_none(),
        "the test needs a rule without its own reverse"
    );
    let keys = [
        "x_embedder.weight",
        "single_transformer_blocks.0.attn.norm_k.weight",
    ];
    assert_eq!(
        table()
            .file_key(
                rule,
                &keys,
                "single_transformer_blocks.0.attn.norm_k.weight"
            )
            .as_deref(),
        Some("model.diffusion_model.single_blocks.0.norm.key_norm.scale")
    );
}

#[test]
fn a_model_alone_named_for_a_file_with_another_models_array_says_which() {
    let mut owned = sd1_like();
    owned.retain(|(k, _)| {
        k.starts_with("model.diffusion_model.") || k == "first_stage_model.decoder.conv_in.weight"
    });
    owned.push(("alphas_cumprod".to_owned(), vec![1000]));
    let err = recognise(
        table(),
        &source(&owned),
        named("sd1_unet.single_file"),
        &|_| Ok(()),
    )
    .unwrap_err();
    assert!(
        err.contains("first_stage_model.decoder.conv_in.weight carries another model's"),
        "{err}"
    );
}

#[test]
fn a_checkpoint_lacking_a_model_is_named_by_the_converter_that_takes_most_of_it() {
    // Two checkpoints that each lack one model of the file: A, SD 1.x with a second text
    // encoder the file lacks, takes its text encoder; B, SD 1.x whose text encoder lies
    // elsewhere, would leave it in the file. Only A is named.
    let mut raw: serde_json::Value = serde_json::from_str(TABLE).unwrap();
    let converters = raw["converters"].as_array_mut().unwrap();
    let sd1 = converters
        .iter()
        .find(|c| c["name"] == "sd1.single_file")
        .unwrap()
        .clone();
    let mut a = sd1.clone();
    a["name"] = "a.single_file".into();
    let mut second = a["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "text_encoder")
        .unwrap()
        .clone();
    second["name"] = "text_encoder_2".into();
    second["prefix"] = "extra_a.".into();
    a["components"].as_array_mut().unwrap().push(second);
    a["require"]
        .as_array_mut()
        .unwrap()
        .push("extra_a.text_model.embeddings.token_embedding.weight".into());
    let mut b = sd1;
    b["name"] = "b.single_file".into();
    for r in b["components"].as_array_mut().unwrap() {
        if r["name"] == "text_encoder" {
            r["prefix"] = "extra_b.".into();
        }
    }
    for k in b["require"].as_array_mut().unwrap() {
        if let Some(rest) = k
            .as_str()
            .unwrap()
            .strip_prefix("cond_stage_model.transformer.")
        {
            *k = format!("extra_b.{rest}").into();
        }
    }
    *converters = vec![a, b];
    let t = parse_table(&raw.to_string()).unwrap();
    match recognise(&t, &source(&sd1_like()), None, &|_| Ok(())).unwrap() {
        Outcome::Lacking(why) => assert!(
            why.contains("a.single_file without its text_encoder_2 (")
                && !why.contains("b.single_file"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
}
