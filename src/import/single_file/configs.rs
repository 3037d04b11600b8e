//! The configs a single-file checkpoint does not carry, derived from its weights.
//!
//! Each component's Diffusers or Transformers config is read off tensor shapes and key
//! structure (channels, levels, layers per level, which levels attend, context width), the way
//! ComfyUI's `model_detection.py` sizes a model, so reduced and unusual variants load. What
//! weights cannot tell (the head split, sample size, the VAE's scaling factor, the tokenizer's
//! special tokens) comes from the converter's family in `fs-layout/single_file.json`: every
//! key of a family's component entry is a config value, except the directives `heads` (the
//! UNet's heads per attention, SD 1.x's `attention_head_dim: 8`) and `head_width` (channels
//! per head: the UNet's heads per level, a text encoder's `num_attention_heads`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{json, Map, Value};

use crate::layout::convert::Renamed;

/// A family's directives, which are not config keys.
const DIRECTIVES: [&str; 2] = ["heads", "head_width"];

/// The bundled CLIP BPE merges (`fs-layout/tokenizers/clip/SOURCE.md`).
const CLIP_MERGES: &str = include_str!("../../../fs-layout/tokenizers/clip/merges.txt");

/// A component's tensors by key.
struct Shapes<'a> {
    by_key: HashMap<&'a str, &'a [u64]>,
}

impl<'a> Shapes<'a> {
    fn new(tensors: &'a [Renamed]) -> Shapes<'a> {
        Shapes {
            by_key: tensors
                .iter()
                .map(|t| (t.key.as_str(), t.shape.as_slice()))
                .collect(),
        }
    }

    fn has(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    /// Extent `dim` of tensor `key`, which must have `rank` dimensions, none of them 0 (a
    /// convolution's kernel 4, a linear or embedding weight 2).
    fn dim(&self, key: &str, rank: usize, dim: usize) -> Result<u64, String> {
        let shape = self
            .by_key
            .get(key)
            .ok_or_else(|| format!("it has no tensor {key}"))?;
        if shape.len() != rank || shape.contains(&0) {
            return Err(format!(
                "tensor {key} has shape {shape:?}, not {rank} nonzero dimensions"
            ));
        }
        Ok(shape[dim])
    }

    /// The indices that follow `prefix` in the keys (`encoder.block.` → each block's).
    fn indices(&self, prefix: &str) -> BTreeSet<u64> {
        self.by_key
            .keys()
            .filter_map(|k| k.strip_prefix(prefix))
            .filter_map(|rest| rest.split('.').next()?.parse().ok())
            .collect()
    }

    /// How many consecutive indices from 0 follow `prefix` (`down_blocks.` → the levels).
    fn count(&self, prefix: &str) -> u64 {
        let found = self.indices(prefix);
        (0..).take_while(|i| found.contains(i)).count() as u64
    }

    fn first_ending(&self, suffix: &str) -> Option<&'a str> {
        let mut keys: Vec<&str> = self
            .by_key
            .keys()
            .copied()
            .filter(|k| k.ends_with(suffix))
            .collect();
        keys.sort_unstable();
        keys.first().copied()
    }
}

/// The config of component `name` (class `class`) made of `tensors` (Diffusers keys), whose
/// weights are mostly `dtype` (a safetensors dtype name): what the weights tell, then what the
/// file's markers set (`marked`), then `family`'s values.
///
/// # Errors
/// A tensor the class's config is read from is missing or has another rank; a family value
/// does not fit (a width that the head width does not divide).
pub(crate) fn config(
    class: &(String, String),
    family: &Value,
    marked: &Map<String, Value>,
    name: &str,
    tensors: &[Renamed],
    dtype: &str,
) -> Result<Map<String, Value>, String> {
    let shapes = Shapes::new(tensors);
    let defaults = family.get(name).cloned().unwrap_or_else(|| json!({}));
    let directive = |key: &str| defaults.get(key).and_then(Value::as_u64);
    let mut config = match class.1.as_str() {
        "UNet2DConditionModel" => unet(&shapes, directive("heads"), directive("head_width"))?,
        "AutoencoderKL" => vae(&shapes)?,
        "CLIPTextModel" => clip_text(&shapes, directive("head_width"), dtype)?,
        "CLIPTextModelWithProjection" => {
            // Without its projection Transformers would make one up: random pooled embeddings.
            if !shapes.has("text_projection.weight") {
                return Err(
                    "it has no text projection, which CLIPTextModelWithProjection needs".into(),
                );
            }
            clip_text(&shapes, directive("head_width"), dtype)?
        }
        "T5EncoderModel" => t5_encoder(&shapes, dtype)?,
        "FluxTransformer2DModel" => flux_transformer(&shapes, &defaults)?,
        "SD3Transformer2DModel" => sd3_transformer(&shapes, directive("head_width"))?,
        other => return Err(format!("no config is derived for class {other}")),
    };
    for (k, v) in marked {
        config.entry(k.clone()).or_insert_with(|| v.clone());
    }
    if let Value::Object(values) = &defaults {
        for (k, v) in values {
            if !DIRECTIVES.contains(&k.as_str()) {
                config.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    let version = |library: &str| {
        family
            .pointer(&format!("/versions/{library}"))
            .cloned()
            .unwrap_or(Value::Null)
    };
    match class.0.as_str() {
        "diffusers" => {
            config.insert("_class_name".into(), json!(class.1));
            config.insert("_diffusers_version".into(), version("diffusers"));
        }
        "transformers" => {
            config.insert("architectures".into(), json!([class.1]));
            config.insert("transformers_version".into(), version("transformers"));
        }
        _ => {}
    }
    Ok(config)
}

fn unet(
    s: &Shapes<'_>,
    heads: Option<u64>,
    head_width: Option<u64>,
) -> Result<Map<String, Value>, String> {
    let levels = s.count("down_blocks.");
    if levels == 0 {
        return Err("it has no down_blocks".into());
    }
    let mut channels = Vec::new();
    let mut down = Vec::new();
    let mut layers = Vec::new();
    for b in 0..levels {
        channels.push(s.dim(&format!("down_blocks.{b}.resnets.0.conv1.weight"), 4, 0)?);
        let attends = s.has(&format!("down_blocks.{b}.attentions.0.proj_in.weight"));
        down.push(match attends {
            true => "CrossAttnDownBlock2D",
            false => "DownBlock2D",
        });
        layers.push(match attends {
            true => Some(s.count(&format!("down_blocks.{b}.attentions.0.transformer_blocks."))),
            false => None,
        });
    }
    // Diffusers gives the mid block the last level's depth: a last level without attention
    // takes the mid block's (other levels without it take 1, as Diffusers' configs write),
    // and a last level with attention must agree with it.
    let mid_depth = match s.has("mid_block.attentions.0.proj_in.weight") {
        true => Some(s.count("mid_block.attentions.0.transformer_blocks.")),
        false => None,
    };
    if let (Some(Some(last)), Some(mid)) = (layers.last(), mid_depth) {
        if *last != mid {
            return Err(format!(
                "the mid block's attention is {mid} blocks deep, the last level's {last}: \
                 Diffusers builds both from one number"
            ));
        }
    }
    let last = layers.len() - 1;
    let layers: Vec<u64> = layers
        .into_iter()
        .enumerate()
        .map(|(b, depth)| match (depth, b == last) {
            (Some(d), _) => d,
            (None, true) => mid_depth.unwrap_or(1),
            (None, false) => 1,
        })
        .collect();
    let up: Vec<&str> = (0..s.count("up_blocks."))
        .map(
            |b| match s.has(&format!("up_blocks.{b}.attentions.0.proj_in.weight")) {
                true => "CrossAttnUpBlock2D",
                false => "UpBlock2D",
            },
        )
        .collect();
    let mid = match (
        s.has("mid_block.attentions.0.proj_in.weight"),
        s.has("mid_block.resnets.0.conv1.weight"),
    ) {
        (true, _) => json!("UNetMidBlock2DCrossAttn"),
        (false, true) => json!("UNetMidBlock2D"),
        (false, false) => Value::Null,
    };
    let context = s
        .first_ending("attn2.to_k.weight")
        .map(|k| s.dim(k, 2, 1))
        .transpose()?;
    let linear = s
        .first_ending("proj_in.weight")
        .and_then(|k| s.by_key.get(k))
        .is_some_and(|shape| shape.len() == 2);
    let head_dim = match (heads, head_width) {
        (Some(h), _) => json!(h),
        (None, Some(w)) => {
            let mut per_level = Vec::new();
            for c in &channels {
                if c % w != 0 {
                    return Err(format!("{c} channels are not heads {w} wide"));
                }
                per_level.push(c / w);
            }
            json!(per_level)
        }
        (None, None) => return Err("the family gives neither heads nor head_width".into()),
    };
    let layers_per_block = s.count("down_blocks.0.resnets.");
    levels_hold(s, "down_blocks", levels, layers_per_block)?;
    levels_hold(s, "up_blocks", up.len() as u64, layers_per_block + 1)?;
    let mut config = Map::new();
    config.insert("in_channels".into(), json!(s.dim("conv_in.weight", 4, 1)?));
    config.insert(
        "out_channels".into(),
        json!(s.dim("conv_out.weight", 4, 0)?),
    );
    config.insert("block_out_channels".into(), json!(channels));
    config.insert("layers_per_block".into(), json!(layers_per_block));
    config.insert("down_block_types".into(), json!(down));
    config.insert("up_block_types".into(), json!(up));
    config.insert("mid_block_type".into(), mid);
    config.insert("attention_head_dim".into(), head_dim);
    config.insert("use_linear_projection".into(), json!(linear));
    if let Some(context) = context {
        config.insert("cross_attention_dim".into(), json!(context));
    }
    let transformer_layers = match layers.iter().all(|&n| n == 1) {
        true => json!(1),
        false => json!(layers),
    };
    config.insert("transformer_layers_per_block".into(), transformer_layers);
    if s.has("add_embedding.linear_1.weight") {
        config.insert("addition_embed_type".into(), json!("text_time"));
        config.insert(
            "projection_class_embeddings_input_dim".into(),
            json!(s.dim("add_embedding.linear_1.weight", 2, 1)?),
        );
    }
    Ok(config)
}

/// Checks that each of `list`'s `levels` holds `resnets` resnets (Diffusers gives every level
/// the same number, the UNet's up levels one more).
fn levels_hold(s: &Shapes<'_>, list: &str, levels: u64, resnets: u64) -> Result<(), String> {
    for b in 0..levels {
        let n = s.count(&format!("{list}.{b}.resnets."));
        if n != resnets {
            return Err(format!(
                "{list}.{b} has {n} resnets where Diffusers builds {resnets}"
            ));
        }
    }
    Ok(())
}

fn vae(s: &Shapes<'_>) -> Result<Map<String, Value>, String> {
    let levels = s.count("encoder.down_blocks.");
    if levels == 0 {
        return Err("it has no encoder.down_blocks".into());
    }
    let channels = (0..levels)
        .map(|b| {
            s.dim(
                &format!("encoder.down_blocks.{b}.resnets.0.conv1.weight"),
                4,
                0,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut config = Map::new();
    config.insert(
        "in_channels".into(),
        json!(s.dim("encoder.conv_in.weight", 4, 1)?),
    );
    config.insert(
        "out_channels".into(),
        json!(s.dim("decoder.conv_out.weight", 4, 0)?),
    );
    config.insert(
        "latent_channels".into(),
        json!(s.dim("decoder.conv_in.weight", 4, 1)?),
    );
    config.insert("block_out_channels".into(), json!(channels));
    let layers_per_block = s.count("encoder.down_blocks.0.resnets.");
    levels_hold(s, "encoder.down_blocks", levels, layers_per_block)?;
    let up_levels = s.count("decoder.up_blocks.");
    levels_hold(s, "decoder.up_blocks", up_levels, layers_per_block + 1)?;
    config.insert("layers_per_block".into(), json!(layers_per_block));
    config.insert(
        "down_block_types".into(),
        json!(vec!["DownEncoderBlock2D"; levels as usize]),
    );
    config.insert(
        "up_block_types".into(),
        json!(vec![
            "UpDecoderBlock2D";
            s.count("decoder.up_blocks.") as usize
        ]),
    );
    config.insert(
        "mid_block_add_attention".into(),
        json!(s.has("encoder.mid_block.attentions.0.to_q.weight")),
    );
    let quant = s.has("quant_conv.weight");
    let post_quant = s.has("post_quant_conv.weight");
    config.insert("use_quant_conv".into(), json!(quant));
    config.insert("use_post_quant_conv".into(), json!(post_quant));
    let mut want = Want::default();
    let latent = s.dim("decoder.conv_in.weight", 4, 1)?;
    let (first, last) = (channels[0], channels[channels.len() - 1]);
    let attention = s.has("encoder.mid_block.attentions.0.to_q.weight");
    // Encoder: conv_in, the levels (each but the last halves the size), the middle, and a
    // conv_out to the latent's mean and log-variance.
    want.conv(
        "encoder.conv_in",
        first,
        s.dim("encoder.conv_in.weight", 4, 1)?,
        3,
    );
    let mut width = first;
    for (b, &c) in channels.iter().enumerate() {
        for r in 0..layers_per_block {
            want.resnet(&format!("encoder.down_blocks.{b}.resnets.{r}"), width, c);
            width = c;
        }
        if b + 1 < channels.len() {
            want.conv(
                &format!("encoder.down_blocks.{b}.downsamplers.0.conv"),
                c,
                c,
                3,
            );
        }
    }
    want.mid_block("encoder.mid_block", last, attention);
    want.norm("encoder.conv_norm_out", last);
    want.conv("encoder.conv_out", 2 * latent, last, 3);
    if quant {
        want.conv("quant_conv", 2 * latent, 2 * latent, 1);
    }
    if post_quant {
        want.conv("post_quant_conv", latent, latent, 1);
    }
    // Decoder: the same levels the other way, one resnet more each, each but the last
    // doubling the size.
    want.conv("decoder.conv_in", last, latent, 3);
    want.mid_block("decoder.mid_block", last, attention);
    let mut width = last;
    for (b, &c) in channels.iter().rev().enumerate() {
        for r in 0..=layers_per_block {
            want.resnet(&format!("decoder.up_blocks.{b}.resnets.{r}"), width, c);
            width = c;
        }
        if b + 1 < channels.len() {
            want.conv(&format!("decoder.up_blocks.{b}.upsamplers.0.conv"), c, c, 3);
        }
    }
    want.norm("decoder.conv_norm_out", first);
    want.conv(
        "decoder.conv_out",
        s.dim("decoder.conv_out.weight", 4, 0)?,
        first,
        3,
    );
    want.exactly(s, "AutoencoderKL")?;
    Ok(config)
}

fn clip_text(
    s: &Shapes<'_>,
    head_width: Option<u64>,
    dtype: &str,
) -> Result<Map<String, Value>, String> {
    let embedding = "text_model.embeddings.token_embedding.weight";
    let hidden = s.dim(embedding, 2, 1)?;
    let width = head_width.ok_or("the family gives no head_width")?;
    if hidden % width != 0 {
        return Err(format!("{hidden} channels are not heads {width} wide"));
    }
    let layers = s.count("text_model.encoder.layers.");
    if layers == 0 {
        return Err("it has no encoder layers left to convert".into());
    }
    // Transformers makes up a tensor a file lacks: every layer must be whole.
    let mut linears = vec!["text_model.final_layer_norm".to_owned()];
    for l in 0..layers {
        let layer = format!("text_model.encoder.layers.{l}");
        for part in [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.out_proj",
            "layer_norm1",
            "layer_norm2",
            "mlp.fc1",
            "mlp.fc2",
        ] {
            linears.push(format!("{layer}.{part}"));
        }
    }
    let mut others = vec![
        embedding.to_owned(),
        "text_model.embeddings.position_embedding.weight".to_owned(),
    ];
    if s.has("text_projection.weight") {
        others.push("text_projection.weight".into());
    }
    let mut want = Want::default();
    for l in &linears {
        want.0.insert(format!("{l}.weight"), None);
        want.0.insert(format!("{l}.bias"), None);
    }
    want.0.extend(others.into_iter().map(|k| (k, None)));
    want.exactly(s, "a CLIP text model")?;
    let mut config = Map::new();
    config.insert("model_type".into(), json!("clip_text_model"));
    config.insert("vocab_size".into(), json!(s.dim(embedding, 2, 0)?));
    config.insert("hidden_size".into(), json!(hidden));
    config.insert(
        "intermediate_size".into(),
        json!(s.dim("text_model.encoder.layers.0.mlp.fc1.weight", 2, 0)?),
    );
    config.insert(
        "num_hidden_layers".into(),
        json!(s.count("text_model.encoder.layers.")),
    );
    config.insert("num_attention_heads".into(), json!(hidden / width));
    config.insert(
        "max_position_embeddings".into(),
        json!(s.dim("text_model.embeddings.position_embedding.weight", 2, 0)?),
    );
    if s.has("text_projection.weight") {
        config.insert(
            "projection_dim".into(),
            json!(s.dim("text_projection.weight", 2, 0)?),
        );
    }
    if let Some(torch) = torch_dtype(dtype) {
        config.insert("torch_dtype".into(), json!(torch));
    }
    Ok(config)
}

/// A T5 encoder's config (Transformers' `T5Config`): widths from the shared embedding
/// (`[vocab, d_model]`), the first block's attention (`q`: `[heads × d_kv, d_model]`; the
/// relative attention bias, which only the first block has: `[buckets, heads]`) and
/// feed-forward (`wi_0` and `wi_1`: T5 v1.1's gated GELU; `wi` alone: v1.0's ReLU), and the
/// number of blocks.
fn t5_encoder(s: &Shapes<'_>, dtype: &str) -> Result<Map<String, Value>, String> {
    let attention = "encoder.block.0.layer.0.SelfAttention";
    let feed_forward = "encoder.block.0.layer.1.DenseReluDense";
    let d_model = s.dim("shared.weight", 2, 1)?;
    let heads = s.dim(&format!("{attention}.relative_attention_bias.weight"), 2, 1)?;
    let inner = s.dim(&format!("{attention}.q.weight"), 2, 0)?;
    if inner % heads != 0 {
        return Err(format!(
            "{inner} attention channels are not {heads} equal heads"
        ));
    }
    let (d_ff, feed_forward_proj) = if s.has(&format!("{feed_forward}.wi_0.weight")) {
        (
            s.dim(&format!("{feed_forward}.wi_0.weight"), 2, 0)?,
            "gated-gelu",
        )
    } else {
        (s.dim(&format!("{feed_forward}.wi.weight"), 2, 0)?, "relu")
    };
    let layers = s.count("encoder.block.");
    // Transformers makes up what a file lacks, and drops blocks past a gap: every block must
    // be whole, numbered from 0 without one.
    let mut whole = vec!["encoder.final_layer_norm.weight".to_owned()];
    for b in 0..layers {
        let block = format!("encoder.block.{b}.layer");
        for w in ["q", "k", "v", "o"] {
            whole.push(format!("{block}.0.SelfAttention.{w}.weight"));
        }
        let inner: &[&str] = match feed_forward_proj {
            "gated-gelu" => &["wi_0", "wi_1", "wo"],
            _ => &["wi", "wo"],
        };
        whole.extend(
            inner
                .iter()
                .map(|w| format!("{block}.1.DenseReluDense.{w}.weight")),
        );
        whole.push(format!("{block}.0.layer_norm.weight"));
        whole.push(format!("{block}.1.layer_norm.weight"));
    }
    if let Some(missing) = whole.iter().find(|k| !s.has(k)) {
        return Err(format!("it has no tensor {missing}"));
    }
    if s.indices("encoder.block.").len() as u64 > layers {
        return Err(format!(
            "its blocks are not numbered from 0 without a gap: block {layers} is missing"
        ));
    }
    let mut config = Map::new();
    config.insert("model_type".into(), json!("t5"));
    config.insert("vocab_size".into(), json!(s.dim("shared.weight", 2, 0)?));
    config.insert("d_model".into(), json!(d_model));
    config.insert("d_kv".into(), json!(inner / heads));
    config.insert("d_ff".into(), json!(d_ff));
    config.insert("num_layers".into(), json!(layers));
    config.insert("num_decoder_layers".into(), json!(layers));
    config.insert("num_heads".into(), json!(heads));
    config.insert(
        "relative_attention_num_buckets".into(),
        json!(s.dim(&format!("{attention}.relative_attention_bias.weight"), 2, 0)?),
    );
    config.insert("feed_forward_proj".into(), json!(feed_forward_proj));
    config.insert("is_encoder_decoder".into(), json!(true));
    if let Some(torch) = torch_dtype(dtype) {
        config.insert("torch_dtype".into(), json!(torch));
    }
    Ok(config)
}

/// A joint block's q/k norms (FLUX.1's always, SD3.5's).
const JOINT_NORMS: [&str; 4] = [
    "attn.norm_q",
    "attn.norm_k",
    "attn.norm_added_q",
    "attn.norm_added_k",
];

/// A FLUX.1 transformer's config (`FluxTransformer2DModel`): widths, depths and whether it
/// embeds guidance (dev) or not (schnell), read off the weights, which must be exactly the
/// class's. The head width is the q/k norms'; the rotary axes, which weights cannot tell, are
/// the family's and must add up to it.
fn flux_transformer(s: &Shapes<'_>, family: &Value) -> Result<Map<String, Value>, String> {
    let h = s.dim("x_embedder.weight", 2, 0)?;
    let head = s.dim("transformer_blocks.0.attn.norm_q.weight", 1, 0)?;
    if h % head != 0 {
        return Err(format!("{h} channels are not heads {head} wide"));
    }
    let axes: Vec<u64> = family
        .get("axes_dims_rope")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    if axes.iter().sum::<u64>() != head {
        return Err(format!(
            "its heads are {head} wide, which the family's rotary axes {axes:?} do not fill"
        ));
    }
    let (double, single) = (
        s.count("transformer_blocks."),
        s.count("single_transformer_blocks."),
    );
    let guidance = s.has("time_text_embed.guidance_embedder.linear_1.weight");
    let (joint, pooled) = (
        s.dim("context_embedder.weight", 2, 1)?,
        s.dim("time_text_embed.text_embedder.linear_1.weight", 2, 1)?,
    );
    let (latent, out) = (
        s.dim("x_embedder.weight", 2, 1)?,
        s.dim("proj_out.weight", 2, 0)?,
    );
    let mut want = Want::default();
    want.linear("x_embedder", h, latent);
    want.linear("context_embedder", h, joint);
    let mut embedders = vec![("timestep", TIMESTEP_CHANNELS), ("text", pooled)];
    if guidance {
        embedders.push(("guidance", TIMESTEP_CHANNELS));
    }
    for (embedder, width) in embedders {
        want.linear(
            &format!("time_text_embed.{embedder}_embedder.linear_1"),
            h,
            width,
        );
        want.linear(
            &format!("time_text_embed.{embedder}_embedder.linear_2"),
            h,
            h,
        );
    }
    want.linear("proj_out", out, h);
    want.linear("norm_out.linear", 2 * h, h);
    for b in 0..double {
        let block = format!("transformer_blocks.{b}");
        want.joint_block(&block, h, head, 6, 6, true, true);
    }
    for b in 0..single {
        // The fused projection splits 1:1:1:4: a square query and an MLP four times as wide.
        let block = format!("single_transformer_blocks.{b}");
        want.linear(&format!("{block}.norm.linear"), 3 * h, h);
        for l in ["to_q", "to_k", "to_v"] {
            want.linear(&format!("{block}.attn.{l}"), h, h);
        }
        want.linear(&format!("{block}.proj_mlp"), 4 * h, h);
        want.linear(&format!("{block}.proj_out"), h, 5 * h);
        for n in ["norm_q", "norm_k"] {
            want.tensor(&format!("{block}.attn.{n}.weight"), &[head]);
        }
    }
    want.exactly(s, "FluxTransformer2DModel")?;
    Ok(object(json!({
        "in_channels": latent,
        "out_channels": out,
        "num_layers": double,
        "num_single_layers": single,
        "attention_head_dim": head,
        "num_attention_heads": h / head,
        "joint_attention_dim": joint,
        "pooled_projection_dim": pooled,
        "guidance_embeds": guidance,
    })))
}

/// An SD3 or SD3.5 MMDiT's config (`SD3Transformer2DModel`): patch, widths, depth, position
/// grid, which blocks have a second attention (SD3.5 medium) and whether attention
/// normalises q and k (SD3.5), read off the weights, which must be exactly the class's. The
/// head width is the q/k norms' when there are some, else the family's `head_width`.
fn sd3_transformer(s: &Shapes<'_>, head_width: Option<u64>) -> Result<Map<String, Value>, String> {
    let h = s.dim("pos_embed.proj.weight", 4, 0)?;
    let (latent, patch) = (
        s.dim("pos_embed.proj.weight", 4, 1)?,
        s.dim("pos_embed.proj.weight", 4, 2)?,
    );
    let layers = s.count("transformer_blocks.");
    let qk_norm = s.has("transformer_blocks.0.attn.norm_q.weight");
    let head = match (qk_norm, head_width) {
        (true, _) => s.dim("transformer_blocks.0.attn.norm_q.weight", 1, 0)?,
        (false, Some(w)) => w,
        (false, None) => return Err("the family gives no head_width".into()),
    };
    if h % head != 0 {
        return Err(format!("{h} channels are not heads {head} wide"));
    }
    let positions = s.dim("pos_embed.pos_embed", 3, 1)?;
    let grid = (positions as f64).sqrt().round() as u64;
    if grid * grid != positions {
        return Err(format!("its {positions} positions are no square grid"));
    }
    let out = s.dim("proj_out.weight", 2, 0)?;
    if out % (patch * patch) != 0 {
        return Err(format!("its {out} outputs are no {patch}×{patch} patches"));
    }
    let (joint, pooled) = (
        s.dim("context_embedder.weight", 2, 1)?,
        s.dim("time_text_embed.text_embedder.linear_1.weight", 2, 1)?,
    );
    let dual: Vec<u64> = (0..layers)
        .filter(|b| s.has(&format!("transformer_blocks.{b}.attn2.to_q.weight")))
        .collect();
    let mut want = Want::default();
    want.tensor("pos_embed.pos_embed", &[1, positions, h]);
    want.tensor("pos_embed.proj.weight", &[h, latent, patch, patch]);
    want.tensor("pos_embed.proj.bias", &[h]);
    want.linear(
        "time_text_embed.timestep_embedder.linear_1",
        h,
        TIMESTEP_CHANNELS,
    );
    want.linear("time_text_embed.timestep_embedder.linear_2", h, h);
    want.linear("time_text_embed.text_embedder.linear_1", h, pooled);
    want.linear("time_text_embed.text_embedder.linear_2", h, h);
    want.linear("context_embedder", h, joint);
    want.linear("proj_out", out, h);
    want.linear("norm_out.linear", 2 * h, h);
    for b in 0..layers {
        let block = format!("transformer_blocks.{b}");
        // SD3.5's dual-attention blocks modulate nine ways; the last block's context stream
        // ends in it (a scale and shift, no output projection, no MLP).
        let last = b + 1 == layers;
        let image = if dual.contains(&b) { 9 } else { 6 };
        want.joint_block(
            &block,
            h,
            head,
            image,
            if last { 2 } else { 6 },
            !last,
            qk_norm,
        );
        if dual.contains(&b) {
            for l in ["to_q", "to_k", "to_v", "to_out.0"] {
                want.linear(&format!("{block}.attn2.{l}"), h, h);
            }
            if qk_norm {
                for n in ["norm_q", "norm_k"] {
                    want.tensor(&format!("{block}.attn2.{n}.weight"), &[head]);
                }
            }
        }
    }
    want.exactly(s, "SD3Transformer2DModel")?;
    Ok(object(json!({
        "patch_size": patch,
        "in_channels": latent,
        "out_channels": out / (patch * patch),
        "num_layers": layers,
        "attention_head_dim": head,
        "num_attention_heads": h / head,
        "joint_attention_dim": joint,
        "caption_projection_dim": h,
        "pooled_projection_dim": pooled,
        "pos_embed_max_size": grid,
        "dual_attention_layers": dual,
        "qk_norm": if qk_norm { Some("rms_norm") } else { None },
    })))
}

/// The width of the sinusoidal timestep embedding FLUX.1's and SD3's time embedders take.
const TIMESTEP_CHANNELS: u64 = 256;

/// The tensors a class has, by key, each with its shape (`None`: any).
#[derive(Default)]
struct Want(BTreeMap<String, Option<Vec<u64>>>);

impl Want {
    fn tensor(&mut self, key: &str, shape: &[u64]) {
        self.0.insert(key.to_owned(), Some(shape.to_vec()));
    }

    /// A linear layer `name` from `inputs` to `outputs` features: `.weight` `[outputs,
    /// inputs]`, `.bias` `[outputs]`.
    fn linear(&mut self, name: &str, outputs: u64, inputs: u64) {
        self.tensor(&format!("{name}.weight"), &[outputs, inputs]);
        self.tensor(&format!("{name}.bias"), &[outputs]);
    }

    /// A convolution `name` from `inputs` to `outputs` channels with a `k`×`k` kernel:
    /// `.weight` `[outputs, inputs, k, k]`, `.bias` `[outputs]`.
    fn conv(&mut self, name: &str, outputs: u64, inputs: u64, k: u64) {
        self.tensor(&format!("{name}.weight"), &[outputs, inputs, k, k]);
        self.tensor(&format!("{name}.bias"), &[outputs]);
    }

    /// A group or layer norm `name` over `c` channels: `.weight` and `.bias` `[c]`.
    fn norm(&mut self, name: &str, c: u64) {
        self.tensor(&format!("{name}.weight"), &[c]);
        self.tensor(&format!("{name}.bias"), &[c]);
    }

    /// A Diffusers `ResnetBlock2D` `name` from `inputs` to `outputs` channels (no time
    /// embedding): two norms and 3×3 convolutions, and a 1×1 shortcut where the widths differ.
    fn resnet(&mut self, name: &str, inputs: u64, outputs: u64) {
        self.norm(&format!("{name}.norm1"), inputs);
        self.conv(&format!("{name}.conv1"), outputs, inputs, 3);
        self.norm(&format!("{name}.norm2"), outputs);
        self.conv(&format!("{name}.conv2"), outputs, outputs, 3);
        if inputs != outputs {
            self.conv(&format!("{name}.conv_shortcut"), outputs, inputs, 1);
        }
    }

    /// A VAE's `UNetMidBlock2D` `name`, `c` channels wide: two resnets, and between them,
    /// with `attention`, one attention over the channels (a group norm and four linears).
    fn mid_block(&mut self, name: &str, c: u64, attention: bool) {
        self.resnet(&format!("{name}.resnets.0"), c, c);
        self.resnet(&format!("{name}.resnets.1"), c, c);
        if attention {
            let attn = format!("{name}.attentions.0");
            self.norm(&format!("{attn}.group_norm"), c);
            for l in ["to_q", "to_k", "to_v", "to_out.0"] {
                self.linear(&format!("{attn}.{l}"), c, c);
            }
        }
    }

    /// A joint-attention block `block` of width `h` (FLUX.1's double blocks, SD3's joint
    /// blocks): the image stream modulated `image` ways, the context stream `context` ways,
    /// both streams' q/k/v, the image stream's output projection and MLP (four times as
    /// wide), the context stream's when it `goes_on`, and q/k norms `head` wide when `normed`.
    #[allow(clippy::too_many_arguments)] // the block's shape, named one by one
    fn joint_block(
        &mut self,
        block: &str,
        h: u64,
        head: u64,
        image: u64,
        context: u64,
        goes_on: bool,
        normed: bool,
    ) {
        self.linear(&format!("{block}.norm1.linear"), image * h, h);
        self.linear(&format!("{block}.norm1_context.linear"), context * h, h);
        for l in [
            "to_q",
            "to_k",
            "to_v",
            "add_q_proj",
            "add_k_proj",
            "add_v_proj",
            "to_out.0",
        ] {
            self.linear(&format!("{block}.attn.{l}"), h, h);
        }
        let mut streams = vec!["ff"];
        if goes_on {
            self.linear(&format!("{block}.attn.to_add_out"), h, h);
            streams.push("ff_context");
        }
        for ff in streams {
            self.linear(&format!("{block}.{ff}.net.0.proj"), 4 * h, h);
            self.linear(&format!("{block}.{ff}.net.2"), h, 4 * h);
        }
        if normed {
            for n in JOINT_NORMS {
                self.tensor(&format!("{block}.{n}.weight"), &[head]);
            }
        }
    }

    /// That the tensors are exactly these, of these shapes: Diffusers makes up a tensor a
    /// file lacks and drops one the class has no place for, so either would load another
    /// model than the file's, and one of another shape would not load.
    ///
    /// # Errors
    /// The first tensor missing, of another shape, or with no place in `class`.
    fn exactly(&self, s: &Shapes<'_>, class: &str) -> Result<(), String> {
        for (key, shape) in &self.0 {
            match (s.by_key.get(key.as_str()), shape) {
                (None, _) => return Err(format!("it has no tensor {key}")),
                (Some(found), Some(want)) if *found != want.as_slice() => {
                    return Err(format!(
                        "tensor {key} has shape {found:?}, where {class} has {want:?}"
                    ))
                }
                _ => {}
            }
        }
        let mut extra: Vec<&str> = s
            .by_key
            .keys()
            .copied()
            .filter(|k| !self.0.contains_key(*k))
            .collect();
        extra.sort_unstable();
        match extra.first() {
            None => Ok(()),
            Some(k) => Err(format!("its tensor {k} has no place in {class}")),
        }
    }
}

/// The fields of a JSON object (`json!({…})`).
fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(fields) => fields,
        _ => Map::new(),
    }
}

/// PyTorch's name of a safetensors dtype, as configs record it.
fn torch_dtype(dtype: &str) -> Option<&'static str> {
    Some(match dtype {
        "F32" => "float32",
        "F16" => "float16",
        "BF16" => "bfloat16",
        _ => return None,
    })
}

/// A component the file does not hold but its pipeline needs (a tokenizer, a scheduler).
#[derive(Debug)]
pub(crate) struct Extra {
    /// Its component name.
    pub name: String,
    /// `[library, class]`.
    pub class: (String, String),
    /// Its config.
    pub config: Map<String, Value>,
    /// The config's file name.
    pub config_file: String,
    /// Its assets by name.
    pub assets: BTreeMap<String, Vec<u8>>,
}

/// The tokenizers and scheduler of `family`'s pipelines.
///
/// # Errors
/// The family's entry names a vocabulary that is not bundled, or is malformed.
pub(crate) fn extras(family: &Value) -> Result<Vec<Extra>, String> {
    let mut out = Vec::new();
    for (name, config_file) in [
        ("tokenizer", "tokenizer_config.json"),
        ("tokenizer_2", "tokenizer_config.json"),
        ("scheduler", "scheduler_config.json"),
    ] {
        let Some(entry) = family.get(name) else {
            continue;
        };
        let class = entry
            .get("class")
            .and_then(|c| serde_json::from_value::<(String, String)>(c.clone()).ok())
            .ok_or_else(|| format!("family {name}: no [library, class]"))?;
        let config = match entry.get("config") {
            Some(Value::Object(m)) => m.clone(),
            _ => return Err(format!("family {name}: no config")),
        };
        let mut assets = BTreeMap::new();
        match entry.get("vocabulary").and_then(Value::as_str) {
            None => {}
            Some("clip") => {
                assets.insert("merges.txt".to_owned(), CLIP_MERGES.as_bytes().to_vec());
                assets.insert(
                    "vocab.json".to_owned(),
                    clip_vocab(CLIP_MERGES).into_bytes(),
                );
            }
            Some(other) => return Err(format!("family {name}: no vocabulary {other:?}")),
        }
        out.push(Extra {
            name: name.to_owned(),
            class,
            config,
            config_file: config_file.to_owned(),
            assets,
        });
    }
    Ok(out)
}

/// CLIP's vocabulary from its merges, as `vocab.json` (token → id, in id order): the 256 byte
/// symbols of GPT-2's byte-to-unicode map, each again with `</w>`, one token per merge, then
/// `<|startoftext|>` and `<|endoftext|>` (CLIP's `SimpleTokenizer`).
pub(crate) fn clip_vocab(merges: &str) -> String {
    let symbols = byte_symbols();
    let mut tokens: Vec<String> = symbols.iter().map(|c| c.to_string()).collect();
    tokens.extend(symbols.iter().map(|c| format!("{c}</w>")));
    tokens.extend(
        merges
            .lines()
            .skip(1)
            .filter(|l| !l.is_empty())
            .map(|l| l.replacen(' ', "", 1)),
    );
    tokens.push("<|startoftext|>".into());
    tokens.push("<|endoftext|>".into());
    let mut text = String::with_capacity(tokens.len() * 16);
    text.push('{');
    for (i, t) in tokens.iter().enumerate() {
        if i > 0 {
            text.push_str(", ");
        }
        text.push_str(&serde_json::to_string(t).expect("a string serializes"));
        text.push_str(": ");
        text.push_str(&i.to_string());
    }
    text.push('}');
    text
}

/// GPT-2's reversible map from bytes to printable characters, in CLIP's order: the printable
/// bytes `!`..`~`, `¡`..`¬`, `®`..`ÿ` as themselves, then every other byte as 256 + n.
fn byte_symbols() -> Vec<char> {
    let printable: Vec<u32> = (u32::from(b'!')..=u32::from(b'~'))
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut out: Vec<char> = printable
        .iter()
        .map(|&b| char::from_u32(b).expect("a Latin-1 code point"))
        .collect();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            out.push(char::from_u32(256 + n).expect("a code point below 512"));
            n += 1;
        }
    }
    out
}

/// `model_index.json` of a converted pipeline: `_class_name`, the family's pipeline values,
/// and each component's `[library, class]`.
pub(crate) fn pipeline(
    class: &str,
    family: &Value,
    components: &[(String, (String, String))],
) -> Map<String, Value> {
    let mut config = Map::new();
    config.insert("_class_name".into(), json!(class));
    if let Some(version) = family.pointer("/versions/diffusers") {
        config.insert("_diffusers_version".into(), version.clone());
    }
    if let Some(Value::Object(values)) = family.get("pipeline") {
        config.extend(values.clone());
    }
    for (name, (library, class)) in components {
        config.insert(name.clone(), json!([library, class]));
    }
    config
}
