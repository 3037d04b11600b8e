use super::*;
use crate::layout::convert::table;

#[test]
fn the_clip_vocabulary_has_clips_ids() {
    let vocab: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&configs::clip_vocab(include_str!(
            "../../../fs-layout/tokenizers/clip/merges.txt"
        )))
        .unwrap();
    assert_eq!(vocab.len(), 49408);
    assert_eq!(vocab["!"], 0);
    assert_eq!(vocab["<|startoftext|>"], 49406);
    assert_eq!(vocab["<|endoftext|>"], 49407);
    assert_eq!(
        vocab["in"], 512,
        "the first merge follows the 512 byte tokens"
    );
}

#[test]
fn an_sd2_file_needs_its_prediction_type_declared_or_marked() {
    let t = table();
    let family = &t.families["sd2"];
    let mut marked = Marked::new();
    let err = decide(family, &mut marked, None, &[]).unwrap_err();
    assert!(
        err.contains("--prediction-type epsilon|v_prediction"),
        "{err}"
    );
    decide(family, &mut marked, Some("v_prediction"), &[]).unwrap();
    assert_eq!(marked["scheduler"]["prediction_type"], "v_prediction");
    assert_eq!(marked["unet"]["sample_size"], 96);
    assert_eq!(marked["vae"]["sample_size"], 768);
    // A file's marker answers too (`v_pred`, modelspec.prediction_type), and the flag
    // overrides it.
    let mut marked = Marked::new();
    marked
        .entry("scheduler".into())
        .or_default()
        .insert("prediction_type".into(), "epsilon".into());
    decide(family, &mut marked, None, &[]).unwrap();
    assert_eq!(marked["unet"]["sample_size"], 64);
    decide(family, &mut marked, Some("v_prediction"), &[]).unwrap();
    assert_eq!(marked["scheduler"]["prediction_type"], "v_prediction");
    // A family that knows what its files predict takes the flag as a scheduler value.
    let mut marked = Marked::new();
    decide(&t.families["sd1"], &mut marked, Some("v_prediction"), &[]).unwrap();
    assert_eq!(marked["scheduler"]["prediction_type"], "v_prediction");
    assert!(!marked.contains_key("unet"));
}

#[test]
fn a_prediction_type_the_table_does_not_know_is_named() {
    let t = table();
    let metadata = [("modelspec.prediction_type".to_owned(), "eps".to_owned())];
    let err = decide(&t.families["sd2"], &mut Marked::new(), None, &metadata).unwrap_err();
    assert!(
        err.contains("modelspec.prediction_type \"eps\" is none the table knows"),
        "{err}"
    );
    assert!(
        err.contains("--prediction-type epsilon|v_prediction"),
        "{err}"
    );
}

#[test]
fn a_text_encoder_with_projection_needs_its_projection() {
    use crate::layout::convert::Renamed;
    let tensor = |key: &str, shape: &[u64]| Renamed {
        source: 0,
        key: key.to_owned(),
        shape: shape.to_vec(),
        rows: vec![],
        transposed: false,
    };
    let mut tensors = vec![
        tensor("text_model.embeddings.token_embedding.weight", &[100, 64]),
        tensor("text_model.embeddings.position_embedding.weight", &[77, 64]),
    ];
    let layer = "text_model.encoder.layers.0";
    for (name, shape) in [
        ("self_attn.q_proj", &[64, 64][..]),
        ("self_attn.k_proj", &[64, 64]),
        ("self_attn.v_proj", &[64, 64]),
        ("self_attn.out_proj", &[64, 64]),
        ("layer_norm1", &[64]),
        ("layer_norm2", &[64]),
        ("mlp.fc1", &[128, 64]),
        ("mlp.fc2", &[64, 128]),
    ] {
        tensors.push(tensor(&format!("{layer}.{name}.weight"), shape));
        tensors.push(tensor(&format!("{layer}.{name}.bias"), &shape[..1]));
    }
    tensors.push(tensor("text_model.final_layer_norm.weight", &[64]));
    tensors.push(tensor("text_model.final_layer_norm.bias", &[64]));
    // Transformers would make up a missing one.
    let lacking: Vec<_> = tensors[..tensors.len() - 1].to_vec();
    let err = configs::config(
        &("transformers".to_owned(), "CLIPTextModel".to_owned()),
        &table().families["sdxl"],
        &Default::default(),
        "text_encoder",
        &lacking,
        "F32",
    )
    .unwrap_err();
    assert!(
        err.contains("no tensor text_model.final_layer_norm.bias"),
        "{err}"
    );
    let family = &table().families["sdxl"];
    let class = (
        "transformers".to_owned(),
        "CLIPTextModelWithProjection".to_owned(),
    );
    let config = |tensors: &[Renamed]| {
        configs::config(
            &class,
            family,
            &Default::default(),
            "text_encoder_2",
            tensors,
            "F32",
        )
    };
    let err = config(&tensors).unwrap_err();
    assert!(err.contains("no text projection"), "{err}");
    tensors.push(tensor("text_projection.weight", &[32, 64]));
    assert_eq!(config(&tensors).unwrap()["projection_dim"], 32);
    // No layers left (an SD 2.x encoder of one layer, which is the unused last one).
    let plain = ("transformers".to_owned(), "CLIPTextModel".to_owned());
    let err = configs::config(
        &plain,
        family,
        &Default::default(),
        "text_encoder",
        &tensors[..2],
        "F32",
    )
    .unwrap_err();
    assert!(err.contains("no encoder layers"), "{err}");
}

/// A FLUX.1 transformer's tensors (Diffusers keys) of `heads` heads `head` wide, one double
/// and one single block, with guidance.
fn flux_tensors(heads: u64, head: u64) -> Vec<crate::layout::convert::Renamed> {
    let h = heads * head;
    let mut shapes: Vec<(String, Vec<u64>)> = Vec::new();
    let mut linear = |name: &str, rows: u64, cols: u64| {
        shapes.push((format!("{name}.weight"), vec![rows, cols]));
        shapes.push((format!("{name}.bias"), vec![rows]));
    };
    for e in ["timestep", "guidance"] {
        linear(&format!("time_text_embed.{e}_embedder.linear_1"), h, 256);
        linear(&format!("time_text_embed.{e}_embedder.linear_2"), h, h);
    }
    linear("time_text_embed.text_embedder.linear_1", h, 24);
    linear("time_text_embed.text_embedder.linear_2", h, h);
    linear("context_embedder", h, 32);
    linear("x_embedder", h, 16);
    linear("proj_out", 16, h);
    linear("norm_out.linear", 2 * h, h);
    let b = "transformer_blocks.0";
    linear(&format!("{b}.norm1.linear"), 6 * h, h);
    linear(&format!("{b}.norm1_context.linear"), 6 * h, h);
    for l in [
        "to_q",
        "to_k",
        "to_v",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "to_out.0",
    ] {
        linear(&format!("{b}.attn.{l}"), h, h);
    }
    linear(&format!("{b}.attn.to_add_out"), h, h);
    for ff in ["ff", "ff_context"] {
        linear(&format!("{b}.{ff}.net.0.proj"), 4 * h, h);
        linear(&format!("{b}.{ff}.net.2"), h, 4 * h);
    }
    let s = "single_transformer_blocks.0";
    linear(&format!("{s}.norm.linear"), 3 * h, h);
    for l in ["to_q", "to_k", "to_v"] {
        linear(&format!("{s}.attn.{l}"), h, h);
    }
    linear(&format!("{s}.proj_mlp"), 4 * h, h);
    linear(&format!("{s}.proj_out"), h, 5 * h);
    for n in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"] {
        shapes.push((format!("{b}.attn.{n}.weight"), vec![head]));
    }
    for n in ["norm_q", "norm_k"] {
        shapes.push((format!("{s}.attn.{n}.weight"), vec![head]));
    }
    shapes
        .into_iter()
        .map(|(key, shape)| crate::layout::convert::Renamed {
            source: 0,
            key,
            shape,
            rows: vec![],
            transposed: false,
        })
        .collect()
}

#[test]
fn a_flux_transformers_config_is_read_off_whole_weights() {
    let class = ("diffusers".to_owned(), "FluxTransformer2DModel".to_owned());
    let family = &table().families["flux"];
    let config = |tensors: &[crate::layout::convert::Renamed]| {
        configs::config(
            &class,
            family,
            &Default::default(),
            "transformer",
            tensors,
            "BF16",
        )
    };
    let tensors = flux_tensors(2, 128);
    let c = config(&tensors).unwrap();
    let got: Vec<serde_json::Value> = [
        "num_attention_heads",
        "attention_head_dim",
        "num_layers",
        "num_single_layers",
        "in_channels",
        "joint_attention_dim",
        "pooled_projection_dim",
        "guidance_embeds",
    ]
    .iter()
    .map(|k| c[*k].clone())
    .collect();
    assert_eq!(
        serde_json::Value::Array(got),
        serde_json::json!([2, 128, 1, 1, 16, 32, 24, true])
    );
    assert_eq!(c["axes_dims_rope"], serde_json::json!([16, 56, 56]));

    // Diffusers would make up a missing tensor and drop an extra one.
    let missing: Vec<_> = tensors
        .iter()
        .filter(|t| t.key != "single_transformer_blocks.0.attn.norm_k.weight")
        .cloned()
        .collect();
    let err = config(&missing).unwrap_err();
    assert!(
        err.contains("no tensor single_transformer_blocks.0.attn.norm_k.weight"),
        "{err}"
    );
    let mut extra = tensors.clone();
    extra.push(crate::layout::convert::Renamed {
        key: "transformer_blocks.0.attn.norm_q.bias".into(),
        ..tensors[0].clone()
    });
    let err = config(&extra).unwrap_err();
    assert!(
        err.contains("norm_q.bias has no place in FluxTransformer2DModel"),
        "{err}"
    );
    // A double block's MLP twice as wide, or a final adaLN given transposed, would not load.
    for (key, shape) in [
        ("transformer_blocks.0.ff.net.0.proj.weight", vec![512, 256]),
        ("norm_out.linear.weight", vec![256, 512]),
    ] {
        let mut other = tensors.clone();
        other.iter_mut().find(|t| t.key == key).unwrap().shape = shape;
        let err = config(&other).unwrap_err();
        assert!(
            err.contains(&format!("tensor {key} has shape"))
                && err.contains("where FluxTransformer2DModel has"),
            "{err}"
        );
    }
    // Heads 64 wide are no FLUX.1's: its rotary axes fill 128.
    let err = config(&flux_tensors(4, 64)).unwrap_err();
    assert!(
        err.contains("64 wide") && err.contains("[16, 56, 56]"),
        "{err}"
    );
}

#[test]
fn identity_matrices_are_ones_on_the_diagonal_in_the_files_dtype() {
    use crate::format::Dtype;
    let eye = identity(&Dtype::BF16, 3).unwrap();
    let one = [0x80, 0x3F];
    let want: Vec<u8> = (0..9)
        .flat_map(|i| if i % 4 == 0 { one } else { [0, 0] })
        .collect();
    assert_eq!(eye, want);
    assert_eq!(identity(&Dtype::F16, 1).unwrap(), [0, 0x3C]);
    assert_eq!(
        f32::from_le_bytes(identity(&Dtype::F32, 1).unwrap().try_into().unwrap()),
        1.0
    );
    assert_eq!(
        f64::from_le_bytes(identity(&Dtype::F64, 1).unwrap().try_into().unwrap()),
        1.0
    );
    assert!(identity(&Dtype::I8, 2).unwrap_err().contains("I8"));
}

#[test]
fn a_config_error_names_the_files_arrays_too() {
    use crate::layout::convert::{recognise, Outcome, SourceKey};
    let owned: Vec<(String, Vec<u64>)> = [
        ("img_in.weight", vec![8, 4]),
        ("double_blocks.0.img_attn.qkv.weight", vec![24, 8]),
        ("single_blocks.0.linear1.weight", vec![56, 8]),
        ("final_layer.adaLN_modulation.1.weight", vec![16, 8]),
    ]
    .into_iter()
    .map(|(k, s)| (k.to_owned(), s))
    .collect();
    let keys: Vec<SourceKey<'_>> = owned
        .iter()
        .map(|(key, shape)| SourceKey { key, shape })
        .collect();
    let Outcome::Converted(c) = recognise(table(), &keys, None, &|_| Ok(())).unwrap() else {
        panic!("not converted");
    };
    let arrays: Vec<super::super::scan::SourceTensor> = owned
        .iter()
        .map(|(key, shape)| super::super::scan::SourceTensor {
            key: key.clone(),
            dtype: crate::format::Dtype::BF16,
            shape: shape.clone(),
            file: 0,
            offset: 0,
            length: 0,
        })
        .collect();
    let converted = &c.components[0];
    // A key the file has, and one it lacks, which the reverse keymap names.
    let why = in_file_terms(
        "tensor x_embedder.weight has shape [8, 4], and it has no tensor \
         single_transformer_blocks.0.attn.norm_k.weight",
        converted,
        &arrays,
    );
    assert_eq!(
        why,
        "tensor x_embedder.weight (the file's img_in.weight) has shape [8, 4], and it has no \
         tensor single_transformer_blocks.0.attn.norm_k.weight (the file's \
         single_blocks.0.norm.key_norm.scale)"
    );
    let plain = in_file_terms("its 3 blocks", converted, &arrays);
    assert_eq!(plain, "its 3 blocks");
}
