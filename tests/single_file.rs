//! Single-file checkpoints (`fs-layout/single_file.json`): a CompVis SD 1.x file imports as
//! Diffusers components, is re-created byte for byte, and exports as a Diffusers folder; files
//! no converter takes, or that one cannot convert, import as they are.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use common::{fails, files_of, floats, ok, safetensors_file, snapshot, T};
use safetensors::Dtype;

/// The tensors of a small SD 1.x file in the CompVis layout: a UNet of two levels (one
/// resnet each, attention in the first), a VAE of two levels with a mid attention as 1×1
/// kernels, a two-layer CLIP text encoder, and the arrays Diffusers leaves out.
fn sd1_tensors() -> Vec<(String, Vec<usize>)> {
    let mut t: Vec<(String, Vec<usize>)> = Vec::new();
    let mut add = |name: &str, shape: &[usize]| t.push((name.to_owned(), shape.to_vec()));
    let u = |k: &str| format!("model.diffusion_model.{k}");
    add(&u("input_blocks.0.0.weight"), &[8, 4, 3, 3]);
    add(&u("time_embed.0.weight"), &[32, 8]);
    add(&u("input_blocks.1.0.in_layers.2.weight"), &[8, 8, 3, 3]);
    add(&u("input_blocks.1.1.proj_in.weight"), &[8, 8, 1, 1]);
    add(
        &u("input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight"),
        &[8, 16],
    );
    add(&u("input_blocks.2.0.op.weight"), &[8, 8, 3, 3]);
    add(&u("input_blocks.3.0.in_layers.2.weight"), &[16, 8, 3, 3]);
    add(
        &u("input_blocks.3.0.skip_connection.weight"),
        &[16, 8, 1, 1],
    );
    add(&u("middle_block.0.in_layers.2.weight"), &[16, 16, 3, 3]);
    add(&u("middle_block.1.proj_in.weight"), &[16, 16, 1, 1]);
    add(&u("middle_block.2.in_layers.2.weight"), &[16, 16, 3, 3]);
    for i in 0..4 {
        add(
            &u(&format!("output_blocks.{i}.0.in_layers.2.weight")),
            &[16, 16, 3, 3],
        );
    }
    add(&u("output_blocks.1.1.conv.weight"), &[16, 16, 3, 3]);
    add(&u("output_blocks.2.1.proj_in.weight"), &[8, 8, 1, 1]);
    add(&u("out.2.weight"), &[4, 8, 3, 3]);
    let c = |k: &str| format!("cond_stage_model.transformer.text_model.{k}");
    add(&c("embeddings.token_embedding.weight"), &[100, 64]);
    add(&c("embeddings.position_embedding.weight"), &[77, 64]);
    add(&c("embeddings.position_ids"), &[1, 77]);
    clip_layers("cond_stage_model.transformer.text_model.", 64, 2, &mut t);
    ldm_vae("first_stage_model.", &[8, 16], 4, 1, &mut t);
    t.push(("alphas_cumprod".into(), vec![1000]));
    t
}

/// A whole VAE in the CompVis (LDM) layout under `prefix`: levels `channels` wide,
/// `latent` latent channels, `per_level` resnets a level in the encoder (one more in the
/// decoder), attention in the middle, and a post_quant_conv without a quant_conv.
fn ldm_vae(
    prefix: &str,
    channels: &[usize],
    latent: usize,
    per_level: usize,
    t: &mut Vec<(String, Vec<usize>)>,
) {
    let mut add = |name: String, shape: Vec<usize>| {
        t.push((format!("{prefix}{name}.bias"), vec![shape[0]]));
        t.push((format!("{prefix}{name}.weight"), shape));
    };
    let resnet = |add: &mut dyn FnMut(String, Vec<usize>), name: String, i: usize, o: usize| {
        add(format!("{name}.norm1"), vec![i]);
        add(format!("{name}.conv1"), vec![o, i, 3, 3]);
        add(format!("{name}.norm2"), vec![o]);
        add(format!("{name}.conv2"), vec![o, o, 3, 3]);
        if i != o {
            add(format!("{name}.nin_shortcut"), vec![o, i, 1, 1]);
        }
    };
    let (first, last) = (channels[0], channels[channels.len() - 1]);
    let mid = |add: &mut dyn FnMut(String, Vec<usize>), side: &str| {
        resnet(add, format!("{side}.mid.block_1"), last, last);
        add(format!("{side}.mid.attn_1.norm"), vec![last]);
        for l in ["q", "k", "v", "proj_out"] {
            add(format!("{side}.mid.attn_1.{l}"), vec![last, last, 1, 1]);
        }
        resnet(add, format!("{side}.mid.block_2"), last, last);
    };
    add("encoder.conv_in".into(), vec![first, 3, 3, 3]);
    let mut width = first;
    for (i, &c) in channels.iter().enumerate() {
        for j in 0..per_level {
            resnet(&mut add, format!("encoder.down.{i}.block.{j}"), width, c);
            width = c;
        }
        if i + 1 < channels.len() {
            add(
                format!("encoder.down.{i}.downsample.conv"),
                vec![c, c, 3, 3],
            );
        }
    }
    mid(&mut add, "encoder");
    add("encoder.norm_out".into(), vec![last]);
    add("encoder.conv_out".into(), vec![2 * latent, last, 3, 3]);
    add("post_quant_conv".into(), vec![latent, latent, 1, 1]);
    add("decoder.conv_in".into(), vec![last, latent, 3, 3]);
    mid(&mut add, "decoder");
    let mut width = last;
    for (i, &c) in channels.iter().enumerate().rev() {
        for j in 0..=per_level {
            resnet(&mut add, format!("decoder.up.{i}.block.{j}"), width, c);
            width = c;
        }
        if i > 0 {
            add(format!("decoder.up.{i}.upsample.conv"), vec![c, c, 3, 3]);
        }
    }
    add("decoder.norm_out".into(), vec![first]);
    add("decoder.conv_out".into(), vec![3, first, 3, 3]);
}

/// A CLIP text model's `layers` whole encoder layers, `hidden` wide, and its final layer norm,
/// under `prefix` (`text_model.`).
fn clip_layers(prefix: &str, hidden: usize, layers: usize, t: &mut Vec<(String, Vec<usize>)>) {
    let mut add = |name: String, shape: Vec<usize>| {
        t.push((format!("{prefix}{name}.bias"), vec![shape[0]]));
        t.push((format!("{prefix}{name}.weight"), shape));
    };
    for l in 0..layers {
        let layer = format!("encoder.layers.{l}");
        for p in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            add(format!("{layer}.self_attn.{p}"), vec![hidden, hidden]);
        }
        add(format!("{layer}.layer_norm1"), vec![hidden]);
        add(format!("{layer}.layer_norm2"), vec![hidden]);
        add(format!("{layer}.mlp.fc1"), vec![2 * hidden, hidden]);
        add(format!("{layer}.mlp.fc2"), vec![hidden, 2 * hidden]);
    }
    add("final_layer_norm".into(), vec![hidden]);
}

fn write(dir: &Path, name: &str, tensors: &[(String, Vec<usize>)]) -> std::path::PathBuf {
    write_with(dir, name, tensors, None)
}

/// [`write`] with `__metadata__`.
fn write_with(
    dir: &Path,
    name: &str,
    tensors: &[(String, Vec<usize>)],
    metadata: Option<&[(&str, &str)]>,
) -> std::path::PathBuf {
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .enumerate()
        .map(|(i, (_, shape))| floats(shape.iter().product(), i as u32 + 7))
        .collect();
    let views: Vec<T> = tensors
        .iter()
        .zip(&data)
        .map(|((name, shape), d)| T(name, Dtype::F32, shape.clone(), d.clone()))
        .collect();
    let path = dir.join(name);
    fs::write(&path, safetensors_file(&views, metadata)).unwrap();
    path
}

/// Every tensor of a safetensors file: name → (shape, bytes).
fn tensors_of(path: &Path) -> BTreeMap<String, (Vec<usize>, Vec<u8>)> {
    let bytes = fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, view)| (name, (view.shape().to_vec(), view.data().to_vec())))
        .collect()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

#[test]
fn an_sd1_file_becomes_diffusers_components_and_stays_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let file = write(tmp.path(), "tiny_sd1.safetensors", &sd1_tensors());
    let said = ok(
        &store,
        &[
            "import",
            file.to_str().unwrap(),
            "--name",
            "local/sd",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert_eq!(report["lanes"][0]["lane"], "f32");

    let plain = tmp.path().join("plain");
    ok(&store, &["export", "local/sd", plain.to_str().unwrap()]);
    let names: Vec<String> = fs::read_dir(&plain)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names,
        ["tiny_sd1.safetensors"],
        "the lane shows the file alone"
    );
    assert_eq!(
        fs::read(plain.join("tiny_sd1.safetensors")).unwrap(),
        fs::read(&file).unwrap(),
        "byte for byte"
    );

    let face = tmp.path().join("diffusers");
    ok(
        &store,
        &["export", "local/sd", face.to_str().unwrap(), "--diffusers"],
    );
    let index = json(&face.join("model_index.json"));
    assert_eq!(index["_class_name"], "StableDiffusionPipeline");
    assert_eq!(
        index["unet"],
        serde_json::json!(["diffusers", "UNet2DConditionModel"])
    );
    assert_eq!(
        index["tokenizer"],
        serde_json::json!(["transformers", "CLIPTokenizer"])
    );
    assert!(
        index.get("tiny_sd1").is_none(),
        "the file's own component is not listed"
    );
    assert!(!face.join("tiny_sd1").exists(), "nor shown");

    let unet = json(&face.join("unet/config.json"));
    assert_eq!(unet["in_channels"], 4);
    assert_eq!(unet["out_channels"], 4);
    assert_eq!(unet["block_out_channels"], serde_json::json!([8, 16]));
    assert_eq!(unet["layers_per_block"], 1);
    assert_eq!(
        unet["down_block_types"],
        serde_json::json!(["CrossAttnDownBlock2D", "DownBlock2D"])
    );
    assert_eq!(
        unet["up_block_types"],
        serde_json::json!(["UpBlock2D", "CrossAttnUpBlock2D"])
    );
    assert_eq!(unet["cross_attention_dim"], 16);
    assert_eq!(unet["attention_head_dim"], 8, "SD 1.x's family value");
    assert_eq!(
        unet["use_linear_projection"], false,
        "proj_in is a 1×1 kernel"
    );
    let vae = json(&face.join("vae/config.json"));
    assert_eq!(vae["block_out_channels"], serde_json::json!([8, 16]));
    assert_eq!(vae["latent_channels"], 4);
    assert_eq!(vae["use_quant_conv"], false, "it has no quant_conv");
    assert_eq!(vae["scaling_factor"], 0.18215);
    let text = json(&face.join("text_encoder/config.json"));
    assert_eq!(text["architectures"], serde_json::json!(["CLIPTextModel"]));
    assert_eq!(text["hidden_size"], 64);
    assert_eq!(text["num_attention_heads"], 1, "64-wide heads");
    assert_eq!(text["num_hidden_layers"], 2);
    assert_eq!(text["vocab_size"], 100);
    assert_eq!(text["hidden_act"], "quick_gelu");
    assert!(face.join("tokenizer/vocab.json").is_file());
    assert!(face.join("tokenizer/merges.txt").is_file());
    assert_eq!(
        json(&face.join("scheduler/scheduler_config.json"))["_class_name"],
        "PNDMScheduler"
    );

    // Each component's tensor is the source array's bytes under its Diffusers name.
    let source = tensors_of(&file);
    let unet_tensors = tensors_of(&face.join("unet/diffusion_pytorch_model.safetensors"));
    let pairs = [
        (
            "model.diffusion_model.input_blocks.0.0.weight",
            "conv_in.weight",
        ),
        (
            "model.diffusion_model.input_blocks.3.0.skip_connection.weight",
            "down_blocks.1.resnets.0.conv_shortcut.weight",
        ),
        (
            "model.diffusion_model.output_blocks.1.1.conv.weight",
            "up_blocks.0.upsamplers.0.conv.weight",
        ),
        (
            "model.diffusion_model.output_blocks.2.1.proj_in.weight",
            "up_blocks.1.attentions.0.proj_in.weight",
        ),
    ];
    for (from, to) in pairs {
        assert_eq!(source[from], unet_tensors[to], "{from} → {to}");
    }
    let vae_tensors = tensors_of(&face.join("vae/diffusion_pytorch_model.safetensors"));
    let (shape, bytes) = &vae_tensors["encoder.mid_block.attentions.0.to_q.weight"];
    assert_eq!(shape, &[16, 16], "a 1×1 kernel shown as a linear weight");
    assert_eq!(
        bytes,
        &source["first_stage_model.encoder.mid.attn_1.q.weight"].1
    );
    assert_eq!(
        vae_tensors["decoder.up_blocks.0.upsamplers.0.conv.weight"],
        source["first_stage_model.decoder.up.1.upsample.conv.weight"],
        "decoder levels count down"
    );
    let text_tensors = tensors_of(&face.join("text_encoder/model.safetensors"));
    assert!(text_tensors.contains_key("text_model.embeddings.token_embedding.weight"));
    assert!(!text_tensors.contains_key("text_model.embeddings.position_ids"));
    let total: usize = ["unet", "vae"]
        .iter()
        .map(|c| tensors_of(&face.join(format!("{c}/diffusion_pytorch_model.safetensors"))).len())
        .sum::<usize>()
        + text_tensors.len();
    assert_eq!(
        total,
        source.len() - 2,
        "all but position_ids and alphas_cumprod"
    );
}

#[test]
fn a_file_a_converter_cannot_take_imports_as_it_is_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let mut tensors = sd1_tensors();
    tensors.push(("model.diffusion_model.novel_block.weight".into(), vec![4]));
    let file = write(tmp.path(), "odd.safetensors", &tensors);
    let said = ok(
        &store,
        &[
            "import",
            file.to_str().unwrap(),
            "--name",
            "local/odd",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_str(&said).unwrap();
    let warnings = report["warnings"].to_string();
    assert!(warnings.contains("not converted"), "{warnings}");
    assert!(warnings.contains("novel_block"), "{warnings}");
    let out = tmp.path().join("out");
    ok(&store, &["export", "local/odd", out.to_str().unwrap()]);
    assert_eq!(
        fs::read(out.join("odd.safetensors")).unwrap(),
        fs::read(&file).unwrap()
    );
    let err = fails(
        &store,
        &[
            "export",
            "local/odd",
            tmp.path().join("d").to_str().unwrap(),
            "--diffusers",
        ],
    );
    assert!(err.contains("no Diffusers face"), "{err}");
    // Named, the converter's refusal is the import's.
    let err = fails(
        &store,
        &[
            "import",
            file.to_str().unwrap(),
            "--name",
            "local/odd2",
            "--converter",
            "sd1.single_file",
        ],
    );
    assert!(err.contains("--converter sd1.single_file"), "{err}");
    assert!(err.contains("novel_block"), "{err}");
}

#[test]
fn a_named_converter_takes_one_file_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let a = write(tmp.path(), "a.safetensors", &sd1_tensors());
    let b = write(tmp.path(), "b.safetensors", &[("x".to_owned(), vec![2])]);
    let err = fails(
        &store,
        &[
            "import",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--name",
            "local/two",
            "--converter",
            "sd1.single_file",
        ],
    );
    assert!(err.contains("imported alone"), "{err}");
    // A file no converter knows imports as it did.
    ok(
        &store,
        &["import", b.to_str().unwrap(), "--name", "local/b"],
    );
    let out = tmp.path().join("out");
    ok(&store, &["export", "local/b", out.to_str().unwrap()]);
    assert_eq!(
        fs::read(out.join("b.safetensors")).unwrap(),
        fs::read(&b).unwrap()
    );
}

#[test]
fn a_declared_prediction_type_overrides_the_files_and_needs_a_converted_file() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let sd1 = write(tmp.path(), "sd1.safetensors", &sd1_tensors());
    ok(
        &store,
        &[
            "import",
            sd1.to_str().unwrap(),
            "--name",
            "local/v",
            "--prediction-type",
            "v_prediction",
        ],
    );
    let out = tmp.path().join("v");
    ok(
        &store,
        &["export", "local/v", out.to_str().unwrap(), "--diffusers"],
    );
    let scheduler = json(&out.join("scheduler/scheduler_config.json"));
    assert_eq!(scheduler["prediction_type"], "v_prediction");
    // A file that is not converted has no scheduler to declare it for: refused, nothing stored.
    let plain = write(
        tmp.path(),
        "plain.safetensors",
        &[("x".to_owned(), vec![2])],
    );
    let err = fails(
        &store,
        &[
            "import",
            plain.to_str().unwrap(),
            "--name",
            "local/plain",
            "--prediction-type",
            "epsilon",
        ],
    );
    assert!(
        err.contains("--prediction-type epsilon") && err.contains("not converted"),
        "{err}"
    );
    let listed = ok(&store, &["ls"]);
    assert!(!listed.contains("local/plain"), "{listed}");
    // Nor a file a converter takes but cannot convert: the reason is given.
    let mut depth = sd1_tensors();
    depth[0].1 = vec![8, 5, 3, 3];
    let depth = write(tmp.path(), "depth.safetensors", &depth);
    let err = fails(
        &store,
        &[
            "import",
            depth.to_str().unwrap(),
            "--name",
            "local/depth",
            "--prediction-type",
            "epsilon",
        ],
    );
    assert!(
        err.contains("not converted") && err.contains("in_channels is 5"),
        "{err}"
    );
    // Nor a VAE alone: it has no scheduler.
    let vae = write(tmp.path(), "vae.safetensors", &vae_tensors());
    let err = fails(
        &store,
        &[
            "import",
            vae.to_str().unwrap(),
            "--name",
            "local/vae",
            "--prediction-type",
            "epsilon",
        ],
    );
    assert!(err.contains("no scheduler"), "{err}");
    let err = fails(
        &store,
        &[
            "import",
            sd1.to_str().unwrap(),
            "--name",
            "local/x",
            "--prediction-type",
            "sample",
        ],
    );
    assert!(
        err.contains("epsilon") && err.contains("v_prediction"),
        "{err}"
    );
}

#[test]
fn markers_set_what_the_weights_cannot_tell() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let scheduler = |name: &str, metadata: Option<&[(&str, &str)]>| {
        let mut tensors = sd1_tensors();
        tensors.push(("v_pred".to_owned(), vec![0]));
        let file = write_with(
            tmp.path(),
            &format!("{name}.safetensors"),
            &tensors,
            metadata,
        );
        let repo = format!("local/{name}");
        ok(&store, &["import", file.to_str().unwrap(), "--name", &repo]);
        let out = tmp.path().join(name);
        ok(
            &store,
            &["export", &repo, out.to_str().unwrap(), "--diffusers"],
        );
        assert_eq!(
            fs::read(tmp.path().join(format!("{name}.safetensors"))).unwrap(),
            {
                let plain = tmp.path().join(format!("{name}-plain"));
                ok(&store, &["export", &repo, plain.to_str().unwrap()]);
                fs::read(plain.join(format!("{name}.safetensors"))).unwrap()
            },
            "the marker stays in the file"
        );
        json(&out.join("scheduler/scheduler_config.json"))
    };
    // ComfyUI's marker array says v-prediction.
    assert_eq!(scheduler("vpred", None)["prediction_type"], "v_prediction");
    // The producer's metadata says otherwise, and wins.
    let said = [("modelspec.prediction_type", "epsilon")];
    assert_eq!(scheduler("eps", Some(&said))["prediction_type"], "epsilon");
}

#[test]
fn locate_finds_a_single_files_arrays_in_its_components_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let file = write(tmp.path(), "one.safetensors", &sd1_tensors());
    ok(
        &store,
        &["import", file.to_str().unwrap(), "--name", "local/one"],
    );
    let extents = |args: &[&str]| -> serde_json::Value {
        let said: serde_json::Value = serde_json::from_str(&ok(
            &store,
            &[&["locate", "local/one"], args, &["--json"]].concat(),
        ))
        .unwrap();
        said["parts"][0]["extents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| serde_json::json!([e["blob"], e["offset"], e["length"]]))
            .collect()
    };
    // The file's array is the UNet's tensor: the same bytes of the same blob.
    let on_file = extents(&["one.safetensors", "model.diffusion_model.out.2.weight"]);
    let on_face = extents(&[
        "unet/diffusion_pytorch_model.safetensors",
        "conv_out.weight",
        "--diffusers",
    ]);
    assert_eq!(on_file, on_face);
    assert_eq!(on_file.as_array().unwrap().len(), 1);
}

/// A CompVis VAE alone: the VAE of [`sd1_tensors`] without its prefix, and the training
/// loss's arrays its releases carry.
fn vae_tensors() -> Vec<(String, Vec<usize>)> {
    let mut t: Vec<(String, Vec<usize>)> = sd1_tensors()
        .into_iter()
        .filter_map(|(k, s)| Some((k.strip_prefix("first_stage_model.")?.to_owned(), s)))
        .collect();
    t.push(("loss.logvar".into(), vec![1]));
    t
}

#[test]
fn a_vae_named_vae_is_its_own_diffusers_model_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let file = write(tmp.path(), "vae.safetensors", &vae_tensors());
    let said = ok(
        &store,
        &[
            "import",
            file.to_str().unwrap(),
            "--name",
            "local/vae",
            "--json",
        ],
    );
    assert!(!said.contains("not converted"), "{said}");
    let plain = tmp.path().join("plain");
    ok(&store, &["export", "local/vae", plain.to_str().unwrap()]);
    assert_eq!(
        fs::read(plain.join("vae.safetensors")).unwrap(),
        fs::read(&file).unwrap()
    );
    let face = tmp.path().join("face");
    ok(
        &store,
        &["export", "local/vae", face.to_str().unwrap(), "--diffusers"],
    );
    let mut names: Vec<String> = fs::read_dir(&face)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["config.json", "diffusion_pytorch_model.safetensors"]
    );
    assert_eq!(
        json(&face.join("config.json"))["_class_name"],
        "AutoencoderKL"
    );
    let tensors = tensors_of(&face.join("diffusion_pytorch_model.safetensors"));
    assert!(
        !tensors.contains_key("loss.logvar"),
        "the loss stays in the file"
    );
    assert!(tensors.contains_key("decoder.up_blocks.1.resnets.1.conv1.weight"));
}

#[test]
fn an_inpainting_unet_makes_an_inpainting_pipeline() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let mut tensors = sd1_tensors();
    tensors[0].1 = vec![8, 9, 3, 3];
    let file = write(tmp.path(), "inpaint.safetensors", &tensors);
    ok(
        &store,
        &["import", file.to_str().unwrap(), "--name", "local/inpaint"],
    );
    let face = tmp.path().join("face");
    ok(
        &store,
        &[
            "export",
            "local/inpaint",
            face.to_str().unwrap(),
            "--diffusers",
        ],
    );
    assert_eq!(
        json(&face.join("model_index.json"))["_class_name"],
        "StableDiffusionInpaintPipeline"
    );
    assert_eq!(json(&face.join("unet/config.json"))["in_channels"], 9);
}

#[test]
fn a_level_without_attention_takes_the_mid_blocks_depth() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let mut tensors = sd1_tensors();
    let u = "model.diffusion_model.";
    tensors.push((
        format!("{u}input_blocks.1.1.transformer_blocks.1.attn2.to_k.weight"),
        vec![8, 16],
    ));
    tensors.push((
        format!("{u}middle_block.1.transformer_blocks.0.attn1.to_q.weight"),
        vec![16, 16],
    ));
    tensors.push((
        format!("{u}middle_block.1.transformer_blocks.1.attn1.to_q.weight"),
        vec![16, 16],
    ));
    let file = write(tmp.path(), "deep.safetensors", &tensors);
    ok(
        &store,
        &["import", file.to_str().unwrap(), "--name", "local/deep"],
    );
    let face = tmp.path().join("face");
    ok(
        &store,
        &[
            "export",
            "local/deep",
            face.to_str().unwrap(),
            "--diffusers",
        ],
    );
    assert_eq!(
        json(&face.join("unet/config.json"))["transformer_layers_per_block"],
        serde_json::json!([2, 2]),
        "Diffusers builds the mid block from the last entry"
    );
}

#[test]
fn files_a_converter_cannot_take_import_as_they_are_naming_why() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let u = "model.diffusion_model.";
    type Change = Box<dyn Fn(&mut Vec<(String, Vec<usize>)>)>;
    let cases: Vec<(&str, Change, &str)> = vec![
        (
            "huge_index",
            Box::new(move |t| {
                t.push((
                    format!("{u}output_blocks.4294967297.0.in_layers.0.weight"),
                    vec![4],
                ))
            }),
            "is there but not",
        ),
        (
            "missing_block",
            Box::new(move |t| t.retain(|(k, _)| !k.starts_with(&format!("{u}output_blocks.1.")))),
            "is there but not",
        ),
        (
            "leading_zero",
            Box::new(move |t| {
                t.push((format!("{u}input_blocks.01.0.in_layers.0.weight"), vec![4]))
            }),
            "has no rule",
        ),
        (
            "trailing_dot",
            Box::new(move |t| t.push((format!("{u}time_embed.0."), vec![4]))),
            "has no rule",
        ),
        (
            "conv_in_2d",
            Box::new(|t| t[0].1 = vec![8, 4]),
            "not 4 nonzero dimensions",
        ),
        (
            "attention_3d",
            Box::new(|t| {
                let q = t
                    .iter_mut()
                    .find(|(k, _)| k.ends_with("attn_1.q.weight"))
                    .unwrap();
                q.1 = vec![16, 16, 1];
            }),
            "no linear weight",
        ),
        (
            "text_96_wide",
            Box::new(|t| {
                for (k, s) in t.iter_mut() {
                    if k.contains("token_embedding") || k.contains("position_embedding") {
                        s[1] = 96;
                    }
                }
            }),
            "not heads 64 wide",
        ),
        (
            "no_downsampler",
            Box::new(move |t| t.retain(|(k, _)| !k.contains(".op."))),
            "none is like input_blocks.{i}.0.op.weight",
        ),
        // A depth UNet (5 input channels) is no model of SD's pipelines.
        (
            "depth_unet",
            Box::new(|t| t[0].1 = vec![8, 5, 3, 3]),
            "unet's in_channels is 5, and this converter takes 4 or 9",
        ),
        // Class embeddings (unCLIP) under an SD 1.x/2.x layout: no StableDiffusionPipeline.
        (
            "unclip",
            Box::new(move |t| t.push((format!("{u}label_emb.0.0.weight"), vec![32, 8]))),
            "label_emb.0.0.weight: a UNet with class or added embeddings",
        ),
        // A checkpoint saved without one of its models names the model it lacks.
        (
            "no_vae",
            Box::new(|t| t.retain(|(k, _)| !k.starts_with("first_stage_model."))),
            "like a checkpoint of sd1.single_file without its vae (no key starts with",
        ),
        (
            "no_text_encoder",
            Box::new(|t| t.retain(|(k, _)| !k.starts_with("cond_stage_model."))),
            "sd1.single_file without its text_encoder (no key starts with",
        ),
        // What it holds is no whole model either: said too.
        (
            "gap_and_no_vae",
            Box::new(move |t| {
                t.retain(|(k, _)| {
                    !k.starts_with("first_stage_model.")
                        && !k.starts_with(&format!("{u}output_blocks.1."))
                })
            }),
            "would not convert either (sd1.single_file: unet: model.diffusion_model.output_blocks.3 is there but not model.diffusion_model.output_blocks.1",
        ),
        // The gap names both keys whole.
        (
            "gap_prefix",
            Box::new(move |t| t.retain(|(k, _)| !k.starts_with(&format!("{u}output_blocks.1.")))),
            "model.diffusion_model.output_blocks.3 is there but not model.diffusion_model.output_blocks.1",
        ),
    ];
    for (name, change, why) in cases {
        let mut tensors = sd1_tensors();
        change(&mut tensors);
        let file = write(tmp.path(), &format!("{name}.safetensors"), &tensors);
        let repo = format!("local/{name}");
        let said = ok(
            &store,
            &["import", file.to_str().unwrap(), "--name", &repo, "--json"],
        );
        let report: serde_json::Value = serde_json::from_str(&said).unwrap();
        let warnings = report["warnings"].to_string();
        assert!(warnings.contains("not converted"), "{name}: {warnings}");
        assert!(warnings.contains(why), "{name}: {warnings}");
        assert!(!warnings.contains("Lit("), "{name}: {warnings}");
        let out = tmp.path().join(name);
        ok(&store, &["export", &repo, out.to_str().unwrap()]);
        assert_eq!(
            fs::read(out.join(format!("{name}.safetensors"))).unwrap(),
            fs::read(&file).unwrap(),
            "{name}"
        );
        let face = tmp.path().join(format!("{name}-face"));
        let err = fails(
            &store,
            &["export", &repo, face.to_str().unwrap(), "--diffusers"],
        );
        assert!(
            err.contains("has no Diffusers face") && err.contains("says why in its warning"),
            "{name}: {err}"
        );
    }
}

#[test]
fn a_diffusers_folder_exports_as_the_single_file_it_was_made_from() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let file = write(tmp.path(), "sd.safetensors", &sd1_tensors());
    ok(
        &store,
        &["import", file.to_str().unwrap(), "--name", "local/sd-file"],
    );
    // Its Diffusers face, imported as a Diffusers folder of its own.
    let folder = tmp.path().join("folder");
    ok(
        &store,
        &[
            "export",
            "local/sd-file",
            folder.to_str().unwrap(),
            "--diffusers",
        ],
    );
    ok(
        &store,
        &[
            "import",
            folder.to_str().unwrap(),
            "--name",
            "local/sd-folder",
        ],
    );
    let single = tmp.path().join("single");
    ok(
        &store,
        &[
            "export",
            "local/sd-folder",
            single.to_str().unwrap(),
            "--single",
        ],
    );
    let made = tensors_of(&single.join("model.safetensors"));
    let original = tensors_of(&file);
    // Every array of the file Diffusers loads, byte for byte (a VAE attention's 1×1 kernel
    // written as a kernel again); the rest (position_ids, alphas_cumprod) the folder lacks.
    let left_out: Vec<&String> = original.keys().filter(|k| !made.contains_key(*k)).collect();
    assert_eq!(
        left_out,
        [
            "alphas_cumprod",
            "cond_stage_model.transformer.text_model.embeddings.position_ids"
        ]
    );
    for (key, array) in &made {
        assert!(original.get(key) == Some(array), "{key}");
    }
    // A lane that is no pipeline a converter writes has no such face.
    let err = fails(
        &store,
        &[
            "export",
            "local/sd-file",
            tmp.path().join("no").to_str().unwrap(),
            "--single",
        ],
    );
    assert!(err.contains("has no single-file face"), "{err}");
}

/// The UNet of [`sd1_tensors`] alone, 8 times as wide (64 and 128 channels, so that heads
/// 64 wide divide them), its context `context` channels wide, its keys bare or under the
/// checkpoint's `model.diffusion_model.` (as ComfyUI saves a model alone).
fn unet_tensors(context: usize, prefixed: bool) -> Vec<(String, Vec<usize>)> {
    sd1_tensors()
        .into_iter()
        .filter_map(|(k, mut s)| {
            let bare = k.strip_prefix("model.diffusion_model.")?;
            for d in &mut s {
                if [8, 16, 32].contains(d) {
                    *d *= 8;
                }
            }
            if bare.ends_with("attn2.to_k.weight") {
                s[1] = context;
            }
            Some(match prefixed {
                true => (k.clone(), s),
                false => (bare.to_owned(), s),
            })
        })
        .collect()
}

/// The import's JSON report of `file`, as `local/<name>`, with `extra` arguments.
fn import_json(store: &Path, file: &Path, name: &str, extra: &[&str]) -> serde_json::Value {
    let args = [
        &["import", file.to_str().unwrap(), "--name", name, "--json"][..],
        extra,
    ]
    .concat();
    serde_json::from_str(&ok(store, &args)).unwrap()
}

#[test]
fn a_unet_alone_is_its_own_diffusers_model_folder_bare_or_under_its_checkpoint_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    // Bare, under the prefix, and under the prefix beside a loose array (`alphas_cumprod`,
    // kept in the file, left out of the face).
    for (prefixed, loose) in [(false, false), (true, false), (true, true)] {
        let mut tensors = unet_tensors(768, prefixed);
        if loose {
            tensors.push(("alphas_cumprod".into(), vec![1000]));
        }
        let file = write(tmp.path(), "unet.safetensors", &tensors);
        let case = format!("{prefixed}-{loose}");
        let name = format!("local/unet-{case}");
        let report = import_json(&store, &file, &name, &[]);
        let said = report.to_string();
        assert!(!said.contains("not converted"), "{said}");
        assert_eq!(
            report["lanes"][0]["single_file"]["converter"], "sd1_unet.single_file",
            "{said}"
        );
        let plain = tmp.path().join(format!("plain-{case}"));
        ok(&store, &["export", &name, plain.to_str().unwrap()]);
        assert_eq!(
            fs::read(plain.join("unet.safetensors")).unwrap(),
            fs::read(&file).unwrap()
        );
        let face = tmp.path().join(format!("face-{case}"));
        ok(
            &store,
            &["export", &name, face.to_str().unwrap(), "--diffusers"],
        );
        let config = json(&face.join("config.json"));
        assert_eq!(config["_class_name"], "UNet2DConditionModel");
        assert_eq!(config["cross_attention_dim"], 768);
        assert_eq!(config["attention_head_dim"], 8, "SD 1.x's head split");
        let made = tensors_of(&face.join("diffusion_pytorch_model.safetensors"));
        assert_eq!(made.len(), tensors.len() - usize::from(loose));
        let original = tensors_of(&file);
        let out = if prefixed {
            "model.diffusion_model.out.2.weight"
        } else {
            "out.2.weight"
        };
        assert_eq!(made["conv_out.weight"], original[out]);
    }
}

#[test]
fn a_unet_alone_is_told_by_its_context_width_and_an_sd2_one_needs_its_prediction_type() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let sd2 = write(tmp.path(), "sd2.safetensors", &unet_tensors(1024, false));
    let err = fails(
        &store,
        &["import", sd2.to_str().unwrap(), "--name", "local/sd2"],
    );
    assert!(
        err.contains("sd2_unet.single_file") && err.contains("--prediction-type"),
        "{err}"
    );
    let listed = ok(&store, &["ls"]);
    assert!(!listed.contains("local/sd2"), "nothing stored: {listed}");
    let report = import_json(
        &store,
        &sd2,
        "local/sd2",
        &["--prediction-type", "v_prediction"],
    );
    let said = &report["lanes"][0]["single_file"];
    assert_eq!(said["converter"], "sd2_unet.single_file", "{report}");
    assert_eq!(said["prediction_type"], "v_prediction", "{report}");
    let face = tmp.path().join("sd2-face");
    ok(
        &store,
        &["export", "local/sd2", face.to_str().unwrap(), "--diffusers"],
    );
    let config = json(&face.join("config.json"));
    assert_eq!(config["cross_attention_dim"], 1024);
    assert_eq!(config["upcast_attention"], true, "the 768-v models' upcast");
    assert_eq!(config["sample_size"], 96);
    // A context width no family has: imported as it is, saying why for each UNet converter.
    let odd = write(tmp.path(), "odd.safetensors", &unet_tensors(640, false));
    let report = import_json(&store, &odd, "local/odd", &[]);
    let warnings = report["warnings"].to_string();
    assert!(warnings.contains("not converted"), "{warnings}");
    assert!(
        warnings.contains("sd1_unet.single_file") && warnings.contains("sd2_unet.single_file"),
        "{warnings}"
    );
    assert!(warnings.contains("cross_attention_dim"), "{warnings}");
    // Class embeddings (SD 2.1 unCLIP) under the checkpoint's prefix rule an SD 1.x UNet out
    // as they do bare.
    let mut unclip = unet_tensors(768, true);
    unclip.push((
        "model.diffusion_model.label_emb.0.0.weight".into(),
        vec![256, 64],
    ));
    let unclip = write(tmp.path(), "unclip.safetensors", &unclip);
    let report = import_json(&store, &unclip, "local/unclip", &[]);
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("not converted")
            && warnings.contains("it holds model.diffusion_model.label_emb.0.0.weight"),
        "{warnings}"
    );
}

#[test]
fn a_checkpoint_lacking_a_model_is_named_by_the_family_its_models_are_of() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    // An SD 2.x-wide UNet (1024-wide context) and a VAE, without the text encoder: SD 1.x's
    // layout too, but only SD 2.x's UNets are 1024 wide.
    let mut tensors = unet_tensors(1024, true);
    ldm_vae("first_stage_model.", &[8, 16], 4, 1, &mut tensors);
    let file = write(tmp.path(), "sd2_no_text.safetensors", &tensors);
    let report = import_json(&store, &file, "local/sd2-no-text", &[]);
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("like a checkpoint of sd2.single_file without its text_encoder"),
        "{warnings}"
    );
    assert!(!warnings.contains("sd1.single_file"), "{warnings}");
    let out = tmp.path().join("out");
    ok(
        &store,
        &["export", "local/sd2-no-text", out.to_str().unwrap()],
    );
    assert_eq!(
        fs::read(out.join("sd2_no_text.safetensors")).unwrap(),
        fs::read(&file).unwrap()
    );
    // An SD 1.x-wide UNet with one stray key of SD 1.x's text encoder lacks no model of its
    // own family's checkpoint: not said to be an SD 2.x one lacking its text encoder.
    let mut tensors = unet_tensors(768, true);
    ldm_vae("first_stage_model.", &[8, 16], 4, 1, &mut tensors);
    tensors.push((
        "cond_stage_model.transformer.text_model.final_layer_norm.weight".into(),
        vec![64],
    ));
    let file = write(tmp.path(), "sd1_stray.safetensors", &tensors);
    let report = import_json(&store, &file, "local/sd1-stray", &[]);
    let warnings = report["warnings"].to_string();
    assert!(!warnings.contains("like a checkpoint"), "{warnings}");
    // Converters whose forbid rules the file out are not named.
    let mut tensors = sd1_tensors();
    tensors.retain(|(k, _)| !k.starts_with("cond_stage_model."));
    tensors.push((
        "model.diffusion_model.label_emb.0.0.weight".into(),
        vec![32, 8],
    ));
    let file = write(tmp.path(), "labelled.safetensors", &tensors);
    let report = import_json(&store, &file, "local/labelled", &[]);
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("like a checkpoint of sdxl") && !warnings.contains("sd1.single_file"),
        "{warnings}"
    );
}

/// A CLIP text encoder alone in Transformers' layout, `hidden` wide, with its projection or
/// not (ComfyUI's `clip_l` / `clip_g` files).
fn clip_tensors(hidden: usize, projection: bool) -> Vec<(String, Vec<usize>)> {
    let mut t: Vec<(String, Vec<usize>)> = Vec::new();
    let mut add = |name: &str, shape: &[usize]| t.push((name.to_owned(), shape.to_vec()));
    add(
        "text_model.embeddings.token_embedding.weight",
        &[100, hidden],
    );
    add(
        "text_model.embeddings.position_embedding.weight",
        &[77, hidden],
    );
    add("text_model.embeddings.position_ids", &[1, 77]);
    clip_layers("text_model.", hidden, 2, &mut t);
    if projection {
        t.push(("text_projection.weight".into(), vec![hidden, hidden]));
    }
    t
}

#[test]
fn a_text_encoder_alone_is_a_transformers_model_folder_told_by_width_and_projection() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    for (name, hidden, projection, converter, class, act) in [
        (
            "l",
            768,
            false,
            "clip_l.single_file",
            "CLIPTextModel",
            "quick_gelu",
        ),
        (
            "lp",
            768,
            true,
            "clip_l_projection.single_file",
            "CLIPTextModelWithProjection",
            "quick_gelu",
        ),
        (
            "g",
            1280,
            true,
            "clip_g.single_file",
            "CLIPTextModelWithProjection",
            "gelu",
        ),
    ] {
        let file = write(
            tmp.path(),
            &format!("clip_{name}.safetensors"),
            &clip_tensors(hidden, projection),
        );
        let report = import_json(&store, &file, &format!("local/clip-{name}"), &[]);
        assert_eq!(
            report["lanes"][0]["single_file"]["converter"], converter,
            "{report}"
        );
        let face = tmp.path().join(format!("face-{name}"));
        ok(
            &store,
            &[
                "export",
                &format!("local/clip-{name}"),
                face.to_str().unwrap(),
                "--diffusers",
            ],
        );
        let config = json(&face.join("config.json"));
        assert_eq!(config["architectures"][0], class, "{config}");
        assert_eq!(config["hidden_size"], hidden);
        assert_eq!(config["hidden_act"], act);
        assert_eq!(config["num_attention_heads"], hidden / 64);
        let weights = fs::read_dir(&face)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .unwrap();
        let made = tensors_of(&weights);
        let original = tensors_of(&file);
        assert_eq!(made.len(), original.len() - 1, "all but position_ids");
        for (key, value) in &made {
            assert_eq!(&original[key], value, "{key}");
        }
    }
    // A width no CLIP text encoder here has: imported as it is, saying why.
    let odd = write(tmp.path(), "odd.safetensors", &clip_tensors(512, false));
    let report = import_json(&store, &odd, "local/odd", &[]);
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("not converted") && warnings.contains("hidden_size"),
        "{warnings}"
    );
}

#[test]
fn a_vae_alone_under_its_checkpoint_prefix_is_converted_as_a_bare_one() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let prefixed: Vec<(String, Vec<usize>)> = vae_tensors()
        .into_iter()
        .map(|(k, s)| (format!("first_stage_model.{k}"), s))
        .collect();
    let file = write(tmp.path(), "vae.safetensors", &prefixed);
    let report = import_json(&store, &file, "local/vae", &[]);
    assert_eq!(
        report["lanes"][0]["single_file"]["converter"], "vae.single_file",
        "{report}"
    );
    let face = tmp.path().join("face");
    ok(
        &store,
        &["export", "local/vae", face.to_str().unwrap(), "--diffusers"],
    );
    let made = tensors_of(&face.join("diffusion_pytorch_model.safetensors"));
    let original = tensors_of(&file);
    assert_eq!(
        made["decoder.conv_in.weight"],
        original["first_stage_model.decoder.conv_in.weight"]
    );
}

/// A T5 encoder alone in Transformers' layout (ComfyUI's `t5xxl` files): `blocks` blocks, 32
/// wide, 4 heads of 8, gated (v1.1: `wi_0`, `wi_1`) or not (v1.0: `wi`), the relative
/// attention bias in the first block (in every block: UMT5), with a decoder or not.
fn t5_tensors(blocks: usize, gated: bool, bias_everywhere: bool) -> Vec<(String, Vec<usize>)> {
    let mut t: Vec<(String, Vec<usize>)> = vec![("shared.weight".into(), vec![300, 32])];
    for b in 0..blocks {
        let attention = format!("encoder.block.{b}.layer.0.SelfAttention");
        for w in ["q", "k", "v"] {
            t.push((format!("{attention}.{w}.weight"), vec![32, 32]));
        }
        t.push((format!("{attention}.o.weight"), vec![32, 32]));
        if b == 0 || bias_everywhere {
            t.push((
                format!("{attention}.relative_attention_bias.weight"),
                vec![32, 4],
            ));
        }
        t.push((
            format!("encoder.block.{b}.layer.0.layer_norm.weight"),
            vec![32],
        ));
        let ff = format!("encoder.block.{b}.layer.1.DenseReluDense");
        for wi in if gated {
            &["wi_0", "wi_1"][..]
        } else {
            &["wi"]
        } {
            t.push((format!("{ff}.{wi}.weight"), vec![64, 32]));
        }
        t.push((format!("{ff}.wo.weight"), vec![32, 64]));
        t.push((
            format!("encoder.block.{b}.layer.1.layer_norm.weight"),
            vec![32],
        ));
    }
    t.push(("encoder.final_layer_norm.weight".into(), vec![32]));
    t
}

#[test]
fn a_t5_encoder_alone_is_a_transformers_model_folder_v1_1_or_v1_0() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    for (name, gated, proj) in [("v11", true, "gated-gelu"), ("v10", false, "relu")] {
        let file = write(
            tmp.path(),
            &format!("t5_{name}.safetensors"),
            &t5_tensors(3, gated, false),
        );
        let report = import_json(&store, &file, &format!("local/t5-{name}"), &[]);
        assert_eq!(
            report["lanes"][0]["single_file"]["converter"], "t5.single_file",
            "{report}"
        );
        let face = tmp.path().join(format!("face-{name}"));
        let repo = format!("local/t5-{name}");
        ok(
            &store,
            &["export", &repo, face.to_str().unwrap(), "--diffusers"],
        );
        let config = json(&face.join("config.json"));
        assert_eq!(config["architectures"][0], "T5EncoderModel", "{config}");
        for (key, value) in [
            ("d_model", serde_json::json!(32)),
            ("d_kv", serde_json::json!(8)),
            ("num_heads", serde_json::json!(4)),
            ("d_ff", serde_json::json!(64)),
            ("num_layers", serde_json::json!(3)),
            ("vocab_size", serde_json::json!(300)),
            ("relative_attention_num_buckets", serde_json::json!(32)),
            ("feed_forward_proj", serde_json::json!(proj)),
        ] {
            assert_eq!(config[key], value, "{key}: {config}");
        }
        assert_eq!(
            tensors_of(&face.join("model.safetensors")),
            tensors_of(&file)
        );
    }
    // A bias in every block (UMT5) and a whole T5 (its decoder too) are not T5 encoders alone.
    let umt5 = write(tmp.path(), "umt5.safetensors", &t5_tensors(2, true, true));
    let mut whole = t5_tensors(2, true, false);
    whole.push((
        "decoder.block.0.layer.0.SelfAttention.q.weight".into(),
        vec![32, 32],
    ));
    let whole = write(tmp.path(), "t5_whole.safetensors", &whole);
    // Transformers would make up a missing tensor, and drop the blocks after a gap.
    let mut lacking = t5_tensors(3, true, false);
    lacking.retain(|(k, _)| k != "encoder.block.2.layer.1.DenseReluDense.wo.weight");
    let lacking = write(tmp.path(), "t5_lacking.safetensors", &lacking);
    let mut gap = t5_tensors(3, true, false);
    gap.retain(|(k, _)| !k.starts_with("encoder.block.1."));
    let gap = write(tmp.path(), "t5_gap.safetensors", &gap);
    for (file, why) in [
        (umt5, "UMT5"),
        (whole, "decoder"),
        (
            lacking,
            "no tensor encoder.block.2.layer.1.DenseReluDense.wo.weight",
        ),
        (gap, "block 1 is missing"),
    ] {
        let report = import_json(&store, &file, "local/not-t5", &[]);
        assert!(report["lanes"][0]["single_file"].is_null(), "{report}");
        let warnings = report["warnings"].to_string();
        assert!(warnings.contains(why), "{warnings}");
    }
}

#[test]
fn a_model_alone_joins_a_stored_pipeline_whose_other_components_are_stored_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let base = write(tmp.path(), "sd1.safetensors", &sd1_tensors());
    import_json(&store, &base, "local/base", &[]);
    // The base's own UNet, tuned: other bytes (its arrays written in another order draw other
    // values), the shapes that fit the pipeline.
    let mut tuned: Vec<(String, Vec<usize>)> = sd1_tensors()
        .into_iter()
        .filter(|(k, _)| k.starts_with("model.diffusion_model."))
        .collect();
    tuned.reverse();
    let unet = write(tmp.path(), "tuned.safetensors", &tuned);
    let report = import_json(
        &store,
        &unet,
        "local/tuned",
        &["--pipeline", "local/base@latest"],
    );
    let single = &report["lanes"][0]["single_file"];
    assert_eq!(single["converter"], "sd1_unet.single_file", "{report}");
    assert_eq!(single["pipeline"], "StableDiffusionPipeline", "{report}");
    // Only the UNet's chunks and the new commit's documents (its header lists every
    // component's tensors) are new; the text encoder alone is over 256 KiB.
    let added = report["new_bytes"].as_u64().unwrap();
    let unet_size = fs::metadata(&unet).unwrap().len();
    assert!(added < unet_size + 128 * 1024, "{added} of {unet_size}");

    // As imported: the file itself, alone.
    let plain = tmp.path().join("plain");
    ok(&store, &["export", "local/tuned", plain.to_str().unwrap()]);
    assert_eq!(
        files_of(&plain).keys().collect::<Vec<_>>(),
        ["tuned.safetensors"]
    );
    assert_eq!(
        fs::read(plain.join("tuned.safetensors")).unwrap(),
        fs::read(&unet).unwrap()
    );

    // Its Diffusers face: the base's pipeline with the file's UNet, and nothing of the base's
    // own component (its file's arrays Diffusers does not load).
    let face = tmp.path().join("face");
    ok(
        &store,
        &[
            "export",
            "local/tuned",
            face.to_str().unwrap(),
            "--diffusers",
        ],
    );
    let base_face = tmp.path().join("base-face");
    ok(
        &store,
        &[
            "export",
            "local/base",
            base_face.to_str().unwrap(),
            "--diffusers",
        ],
    );
    let (ours, theirs) = (files_of(&face), files_of(&base_face));
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    for (path, bytes) in &ours {
        if !path.starts_with("unet/") {
            assert_eq!(Some(bytes), theirs.get(path), "{path}");
        }
    }
    let weights = "unet/diffusion_pytorch_model.safetensors";
    let (made, base_unet) = (
        tensors_of(&face.join(weights)),
        tensors_of(&base_face.join(weights)),
    );
    let original = tensors_of(&unet);
    assert_eq!(
        made.keys().collect::<Vec<_>>(),
        base_unet.keys().collect::<Vec<_>>()
    );
    assert_eq!(
        made["conv_out.weight"],
        original["model.diffusion_model.out.2.weight"]
    );
    assert_ne!(made["conv_out.weight"], base_unet["conv_out.weight"]);
}

#[test]
fn a_pipeline_a_file_cannot_join_is_refused_by_name_and_nothing_is_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let base = write(tmp.path(), "sd1.safetensors", &sd1_tensors());
    import_json(&store, &base, "local/base", &[]);
    let unet = write(tmp.path(), "unet.safetensors", &unet_tensors(768, false));
    import_json(&store, &unet, "local/unet", &[]);
    let narrow: Vec<(String, Vec<usize>)> = sd1_tensors()
        .into_iter()
        .filter_map(|(k, s)| Some((k.strip_prefix("model.diffusion_model.")?.to_owned(), s)))
        .collect();
    let narrow = write(tmp.path(), "narrow.safetensors", &narrow);
    let t5 = write(tmp.path(), "t5.safetensors", &t5_tensors(2, true, false));
    // As wide as the base's text encoder, with its projection's width: only the class differs.
    let mut clip = clip_tensors(64, true);
    clip.last_mut().unwrap().1 = vec![768, 64];
    let clip = write(tmp.path(), "clip.safetensors", &clip);
    let unknown = write(
        tmp.path(),
        "unknown.safetensors",
        &t5_tensors(2, true, false)[1..],
    );
    let folder = tmp.path().join("folder");
    fs::create_dir(&folder).unwrap();
    fs::copy(&unet, folder.join("a.safetensors")).unwrap();
    fs::copy(&t5, folder.join("b.safetensors")).unwrap();
    let before = snapshot(&store);
    for (file, base, why) in [
        (
            &base,
            "local/base",
            "sd1.single_file makes a whole pipeline",
        ),
        (
            &t5,
            "local/base",
            "its StableDiffusionPipeline has no component text_encoder_2",
        ),
        (
            &clip,
            "local/base",
            "its text_encoder is of class CLIPTextModel, the file's of CLIPTextModelWithProjection",
        ),
        (&narrow, "local/unet", "it is no pipeline"),
        (
            &unet,
            "local/base",
            "unet's cross_attention_dim is 768, and the pipeline's unet has 16",
        ),
        (
            &unknown,
            "local/base",
            "not converted to Diffusers components",
        ),
        (&folder, "local/base", "import the file alone"),
        (&unet, "local/nothing", "local/nothing"),
    ] {
        let args = [
            "import",
            file.to_str().unwrap(),
            "--name",
            "local/joined",
            "--pipeline",
            base,
        ];
        let err = fails(&store, &args);
        assert!(err.contains(why), "{file:?} joining {base}: {err}");
    }
    assert!(
        snapshot(&store) == before,
        "a refused import changed the store"
    );
}

/// A model folder (a VAE repo, a text encoder's Transformers folder) has a single-file face
/// too: its one model in the layout ComfyUI loads it alone from (`vae/`, `text_encoders/`).
/// Made from a file alone's Diffusers face and imported as a folder of its own, it gives back
/// the file's arrays byte for byte (what the folder lacks aside), and shows in `@comfyui`.
#[test]
fn a_model_folder_exports_as_the_file_alone_it_was_made_from() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    for (name, tensors, lacks) in [
        ("vae", vae_tensors(), "loss.logvar"),
        (
            "clip",
            clip_tensors(768, false),
            "text_model.embeddings.position_ids",
        ),
    ] {
        let file = write(tmp.path(), &format!("{name}.safetensors"), &tensors);
        ok(
            &store,
            &[
                "import",
                file.to_str().unwrap(),
                "--name",
                &format!("local/{name}-file"),
            ],
        );
        let folder = tmp.path().join(format!("{name}-folder"));
        let (from, to) = (format!("local/{name}-file"), format!("local/{name}"));
        ok(
            &store,
            &["export", &from, folder.to_str().unwrap(), "--diffusers"],
        );
        ok(&store, &["import", folder.to_str().unwrap(), "--name", &to]);
        let single = tmp.path().join(format!("{name}-single"));
        ok(
            &store,
            &["export", &to, single.to_str().unwrap(), "--single"],
        );
        let made = tensors_of(&single.join("model.safetensors"));
        let original = tensors_of(&file);
        let left_out: Vec<&String> = original.keys().filter(|k| !made.contains_key(*k)).collect();
        assert_eq!(left_out, [lacks], "{name}");
        for (key, array) in &made {
            assert!(original.get(key) == Some(array), "{name}: {key}");
        }
    }
    // The file alone is ComfyUI's VAE, its training's loss.logvar and all; the folders show
    // their own weights files there, and nothing is left out.
    let listed = ok(&store, &["ls", "--comfyui"]);
    assert!(!listed.contains("left out"), "{listed}");
}

/// A VAE missing one tensor is not converted (Diffusers would make the tensor up, a random
/// one, and load another VAE than the file's): it imports as it is, and the warning names
/// the tensor.
#[test]
fn a_vae_missing_a_tensor_imports_as_it_is_naming_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let mut tensors = vae_tensors();
    tensors.retain(|(k, _)| k != "decoder.up.0.block.1.norm2.weight");
    let file = write(tmp.path(), "vae.safetensors", &tensors);
    let report = import_json(&store, &file, "local/vae", &[]);
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("not converted") && warnings.contains("norm2.weight"),
        "{warnings}"
    );
    assert!(report["lanes"][0]["single_file"].is_null(), "{report}");
}

/// A whole FLUX.1 checkpoint as ComfyUI saves one has no T5 tokenizer, and none ships
/// offline: without `--pipeline` it imports as it is, the warning saying why and naming the
/// flag; joining a pipeline of another class is refused, storing nothing. (Joining a stored
/// FluxPipeline is checked against diffusers by tools/e2e/flux_checkpoint_check.py.)
#[test]
fn a_whole_flux_checkpoint_converts_only_joining_a_stored_flux_pipeline() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let base = write(tmp.path(), "sd1.safetensors", &sd1_tensors());
    import_json(&store, &base, "local/base", &[]);
    let mut whole: Vec<(String, Vec<usize>)> = [
        ("img_in.weight", vec![128, 64]),
        ("double_blocks.0.img_attn.qkv.weight", vec![384, 128]),
        ("single_blocks.0.linear1.weight", vec![896, 128]),
        ("final_layer.adaLN_modulation.1.weight", vec![256, 128]),
    ]
    .into_iter()
    .map(|(k, s)| (format!("model.diffusion_model.{k}"), s))
    .collect();
    whole.push(("vae.decoder.conv_in.weight".into(), vec![64, 16, 3, 3]));
    whole.extend(
        clip_tensors(64, true)
            .into_iter()
            .map(|(k, s)| (format!("text_encoders.clip_l.transformer.{k}"), s)),
    );
    whole.extend(
        t5_tensors(1, true, false)
            .into_iter()
            .map(|(k, s)| (format!("text_encoders.t5xxl.transformer.{k}"), s)),
    );
    let file = write(tmp.path(), "flux1.safetensors", &whole);
    let report = import_json(&store, &file, "local/flux", &[]);
    assert!(report["lanes"][0]["single_file"].is_null(), "{report}");
    let warnings = report["warnings"].to_string();
    for said in [
        "flux.single_file: a whole FLUX.1 checkpoint needs a T5 tokenizer",
        "it converts joining a stored FluxPipeline (import --pipeline NAME)",
    ] {
        assert!(warnings.contains(said), "{warnings}");
    }
    let before = snapshot(&store);
    let args = [
        "import",
        file.to_str().unwrap(),
        "--name",
        "local/joined",
        "--pipeline",
        "local/base",
    ];
    let err = fails(&store, &args);
    assert!(
        err.contains("it is a StableDiffusionPipeline, and flux.single_file makes a FluxPipeline"),
        "{err}"
    );
    assert!(
        snapshot(&store) == before,
        "a refused import changed the store"
    );
}

/// `--component NAME=REF` puts a stored model's component in place of the joined pipeline's
/// own: a VAE file alone stands in for the pipeline's VAE, borrowed as its commit stores it,
/// while the file's UNet and the pipeline's text encoder stay theirs. A component of another
/// class or other widths, one the file holds itself, or a name the pipeline lacks is refused,
/// storing nothing.
#[test]
fn a_stored_models_component_stands_in_for_a_joined_pipelines_own() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let base = write(tmp.path(), "sd1.safetensors", &sd1_tensors());
    import_json(&store, &base, "local/base", &[]);
    let vae = write(tmp.path(), "vae.safetensors", &vae_tensors());
    import_json(&store, &vae, "local/vae", &[]);
    let mut wide = Vec::new();
    ldm_vae("", &[8, 16], 8, 1, &mut wide);
    let wide = write(tmp.path(), "wide.safetensors", &wide);
    let report = import_json(&store, &wide, "local/wide", &[]);
    assert_eq!(
        report["lanes"][0]["single_file"]["converter"], "vae.single_file",
        "{report}"
    );
    let unet: Vec<(String, Vec<usize>)> = sd1_tensors()
        .into_iter()
        .filter(|(k, _)| k.starts_with("model.diffusion_model."))
        .rev()
        .collect();
    let unet = write(tmp.path(), "tuned.safetensors", &unet);

    let before = snapshot(&store);
    for (declared, why) in [
        (
            "text_encoder=local/vae",
            "its vae has class AutoencoderKL, the pipeline's text_encoder has class CLIPTextModel",
        ),
        (
            "vae=local/wide",
            "its latent_channels is 8, and the pipeline's vae has 4",
        ),
        (
            "unet=local/vae",
            "the file holds its own unet, which --component unet=local/vae cannot stand in for",
        ),
        (
            "safety_checker=local/vae",
            "has no component safety_checker",
        ),
        ("vae=local/nothing", "local/nothing"),
        ("vae", "expected NAME=REF"),
    ] {
        let args = [
            "import",
            unet.to_str().unwrap(),
            "--name",
            "local/tuned",
            "--pipeline",
            "local/base",
            "--component",
            declared,
        ];
        let err = fails(&store, &args);
        assert!(err.contains(why), "--component {declared}: {err}");
    }
    assert!(
        snapshot(&store) == before,
        "a refused import changed the store"
    );

    let report = import_json(
        &store,
        &unet,
        "local/tuned",
        &["--pipeline", "local/base", "--component", "vae=local/vae"],
    );
    assert_eq!(
        report["lanes"][0]["single_file"]["pipeline"], "StableDiffusionPipeline",
        "{report}"
    );
    let export = |name: &str| {
        let out = tmp.path().join(format!("{}-face", name.replace('/', "-")));
        ok(
            &store,
            &["export", name, out.to_str().unwrap(), "--diffusers"],
        );
        out
    };
    let (face, base_face, vae_face) = (
        export("local/tuned"),
        export("local/base"),
        export("local/vae"),
    );
    let weights = |dir: &Path, file: &str| tensors_of(&dir.join(file));
    assert_eq!(
        weights(&face, "vae/diffusion_pytorch_model.safetensors"),
        weights(&vae_face, "diffusion_pytorch_model.safetensors")
    );
    assert_ne!(
        weights(&face, "vae/diffusion_pytorch_model.safetensors"),
        weights(&base_face, "vae/diffusion_pytorch_model.safetensors")
    );
    assert_eq!(
        json(&face.join("vae/config.json")),
        json(&vae_face.join("config.json"))
    );
    assert_eq!(
        weights(&face, "text_encoder/model.safetensors"),
        weights(&base_face, "text_encoder/model.safetensors")
    );
    assert_eq!(
        weights(&face, "unet/diffusion_pytorch_model.safetensors")["conv_out.weight"],
        tensors_of(&unet)["model.diffusion_model.out.2.weight"]
    );
    assert_eq!(
        fs::read(face.join("model_index.json")).unwrap(),
        fs::read(base_face.join("model_index.json")).unwrap()
    );
    // The lane is a single file itself: it has no other single-file face, and says why.
    let out = tmp.path().join("single");
    let err = fails(
        &store,
        &["export", "local/tuned", out.to_str().unwrap(), "--single"],
    );
    assert!(
        err.contains("it is a single-file checkpoint's lane, whose folder shows the file"),
        "{err}"
    );
}

#[test]
fn a_producer_convention_declared_for_a_file_with_nothing_quantized_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let as_gptq = |file: &Path, name: &str| {
        let args = [
            "import",
            file.to_str().unwrap(),
            "--name",
            name,
            "--converter",
            "gptq",
        ];
        fails(&store, &args)
    };
    let file = write(tmp.path(), "sd1.safetensors", &sd1_tensors());
    let err = as_gptq(&file, "local/sd1");
    assert!(
        err.contains("--converter gptq: no array of the source is read as gptq stores one"),
        "{err}"
    );
    let listed = ok(&store, &["ls"]);
    assert!(!listed.contains("local/sd1"), "nothing stored: {listed}");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/conventions");
    // Quantized arrays that declare their own convention (ComfyUI's `.comfy_quant`) are not
    // read as the one named either.
    let declared = data.join("comfy_quant_float8/model.safetensors");
    let err = as_gptq(&declared, "local/declared");
    assert!(
        err.contains("or they declare another convention themselves"),
        "{err}"
    );
    // Undeclared quantized arrays another convention would read: it says the named one does
    // not, rather than asking for the flag given.
    let other = data.join("converter_nvfp4_modelopt/model.safetensors");
    let err = as_gptq(&other, "local/other");
    assert!(
        err.contains("and --converter gptq does not read them"),
        "{err}"
    );
    let args = [
        "import",
        declared.to_str().unwrap(),
        "--name",
        "local/declared",
    ];
    ok(&store, &args);
}

#[test]
fn megabytes_no_diffusers_component_takes_are_noted_and_stay_in_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let mut tensors = sd1_tensors();
    // Another checkpoint's text encoder beside SD 1.x's models (keys of two families).
    tensors.push((
        "conditioner.embedders.1.model.token_embedding.weight".into(),
        vec![1024, 512],
    ));
    let file = write(tmp.path(), "two.safetensors", &tensors);
    let report = import_json(&store, &file, "local/two", &[]);
    assert_eq!(
        report["lanes"][0]["single_file"]["converter"],
        "sd1.single_file"
    );
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("3 arrays (2.0 MiB; the most under conditioner.* 2.0 MiB)")
            && warnings.contains("stay in the file only"),
        "{warnings}"
    );
    let out = tmp.path().join("out");
    ok(&store, &["export", "local/two", out.to_str().unwrap()]);
    assert_eq!(
        fs::read(out.join("two.safetensors")).unwrap(),
        fs::read(&file).unwrap()
    );
    // The kept arrays of a plain SD 1.x file (alphas_cumprod, position ids) are not noted.
    let plain = write(tmp.path(), "sd1.safetensors", &sd1_tensors());
    let report = import_json(&store, &plain, "local/sd1", &[]);
    assert!(
        !report["warnings"]
            .to_string()
            .contains("stay in the file only"),
        "{report}"
    );
}

#[test]
fn a_prediction_type_in_the_files_metadata_the_table_does_not_know_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let import = |name: &str, tensors: Vec<(String, Vec<usize>)>| {
        let said = [("modelspec.prediction_type", "flow")];
        let file = write_with(
            tmp.path(),
            &format!("{name}.safetensors"),
            &tensors,
            Some(&said),
        );
        let report = import_json(&store, &file, &format!("local/{name}"), &[]);
        report["warnings"].to_string()
    };
    let warnings = import("flow", sd1_tensors());
    assert!(
        warnings.contains(r#"modelspec.prediction_type \"flow\" is none the table knows"#)
            && warnings.contains("default is used"),
        "{warnings}"
    );
    let warnings = import("unet", unet_tensors(768, false));
    assert!(
        warnings.contains("is none the table knows; a model alone has no scheduler"),
        "{warnings}"
    );
}
