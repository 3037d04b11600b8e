//! Where a lane's weights go in ComfyUI's model folders (the mount's `@comfyui` view): each
//! weights file sorted by the tensors it holds, by the table `fs-layout/comfyui.json`
//! (documented in `fs-layout/README.md`), and a Diffusers pipeline as a folder under
//! `diffusers/`.
//!
//! Names: a lane with one weights file shows it as `ORG/NAME.<ext>` (another lane than the
//! repo's first as `ORG/NAME.LANE.<ext>`); a lane with several as `ORG/NAME[.LANE]/<path>`.
//! Shards (`…-00001-of-00003.safetensors`) are left out: ComfyUI loads whole files.

use std::sync::OnceLock;

use serde::Deserialize;

use super::{LaneView, Owner, PIPELINE_FILE};

const TABLE: &str = include_str!("../../fs-layout/comfyui.json");

/// The folder of Diffusers pipelines.
pub const DIFFUSERS: &str = "diffusers";

/// The classification table (`fs-layout/comfyui.json`).
#[derive(Debug, Deserialize)]
pub struct Table {
    /// ComfyUI's model folders, each with the older names ComfyUI still reads for it.
    pub folders: Vec<Folder>,
    /// File name endings of weights files the view shows.
    pub extensions: Vec<String>,
    /// Rules in order: the first whose every condition holds decides.
    pub rules: Vec<Rule>,
}

/// One model folder of ComfyUI.
#[derive(Debug, Deserialize)]
pub struct Folder {
    /// Its name (`diffusion_models`).
    pub name: String,
    /// Older names showing the same files (`unet`).
    pub aliases: Vec<String>,
}

/// A rule: the folder a file goes to when every condition holds.
#[derive(Debug, Deserialize)]
pub struct Rule {
    /// The folder's name.
    pub folder: String,
    /// What the rule recognises (documentation).
    pub why: String,
    /// The conditions.
    pub all: Vec<Condition>,
}

/// A condition on a file's tensor keys.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// Some key contains one of these.
    KeyContains(Vec<String>),
    /// Some key starts with one of these.
    KeyStartsWith(Vec<String>),
    /// Some key ends with one of these.
    KeyEndsWith(Vec<String>),
    /// No key starts with any of these.
    NoKeyStartsWith(Vec<String>),
    /// Every key starts with one of these.
    EveryKeyStartsWith(Vec<String>),
    /// Every key ends with one of these.
    EveryKeyEndsWith(Vec<String>),
    /// Every key is one of these.
    EveryKeyIn(Vec<String>),
}

impl Condition {
    fn holds(&self, keys: &[&str]) -> bool {
        let some = |f: &dyn Fn(&str) -> bool| keys.iter().any(|k| f(k));
        let every = |f: &dyn Fn(&str) -> bool| !keys.is_empty() && keys.iter().all(|k| f(k));
        match self {
            Condition::KeyContains(p) => some(&|k| p.iter().any(|p| k.contains(p.as_str()))),
            Condition::KeyStartsWith(p) => some(&|k| p.iter().any(|p| k.starts_with(p.as_str()))),
            Condition::KeyEndsWith(p) => some(&|k| p.iter().any(|p| k.ends_with(p.as_str()))),
            Condition::NoKeyStartsWith(p) => {
                !some(&|k| p.iter().any(|p| k.starts_with(p.as_str())))
            }
            Condition::EveryKeyStartsWith(p) => {
                every(&|k| p.iter().any(|p| k.starts_with(p.as_str())))
            }
            Condition::EveryKeyEndsWith(p) => every(&|k| p.iter().any(|p| k.ends_with(p.as_str()))),
            Condition::EveryKeyIn(p) => every(&|k| p.iter().any(|p| k == p)),
        }
    }
}

/// The table, parsed on first use (a unit test checks it parses and names its folders).
pub fn table() -> &'static Table {
    static PARSED: OnceLock<Table> = OnceLock::new();
    PARSED.get_or_init(|| {
        serde_json::from_str(TABLE).expect("fs-layout/comfyui.json is checked by a unit test")
    })
}

impl Table {
    /// The folder a weights file holding tensors `keys` goes to; `None` when no rule takes it.
    pub fn classify(&self, keys: &[&str]) -> Option<&str> {
        self.rules
            .iter()
            .find(|r| r.all.iter().all(|c| c.holds(keys)))
            .map(|r| r.folder.as_str())
    }

    /// The folder named `name`, or having `name` as an older name.
    pub fn folder(&self, name: &str) -> Option<&Folder> {
        self.folders
            .iter()
            .find(|f| f.name == name || f.aliases.iter().any(|a| a == name))
    }
}

/// One entry of the view for a lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The model folder (`loras`).
    pub folder: String,
    /// Its path in the folder (`acme/style.safetensors`, `acme/sd/model_index.json`'s folder
    /// `acme/sd`).
    pub path: String,
    /// What it shows.
    pub shows: Shows,
}

/// What an entry shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shows {
    /// The lane file at this path.
    File(String),
    /// The whole lane folder (a Diffusers pipeline).
    Lane,
}

/// A lane file no rule takes, for `tensorfs ls --comfyui`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftOut {
    /// The file's path in the lane.
    pub file: String,
    /// Why.
    pub why: String,
}

/// The faces of a commit that the ComfyUI view shows: the lane, a single file's Diffusers
/// folder (in `diffusers/`) beside the file itself (in `checkpoints/`), and a Diffusers
/// pipeline's single file (in `checkpoints/`) beside the folder (in `diffusers/`). A model
/// alone shows one file, the lane's own (a model folder's weights, not its single-file face;
/// a file alone, not its Diffusers face): ComfyUI loads either layout, and both would claim
/// one name.
pub fn faces(header: &crate::format::Header) -> &'static [super::Face] {
    use super::Face;
    let pipeline = header.pipeline.is_some();
    if LaneView::is_single_file(header) && pipeline {
        &[Face::AsImported, Face::Diffusers]
    } else if pipeline && LaneView::has_single_face(header) {
        &[Face::AsImported, Face::Single]
    } else {
        &[Face::AsImported]
    }
}

/// The names of a weights file's arrays as a loader sees them: its component's keys, or for a
/// single-file checkpoint (whose arrays are several components' tensors) its header's names.
fn array_names(view: &LaneView, file: &super::LaneFile) -> Vec<String> {
    match (&file.owner, &file.content) {
        (Owner::Component { index, tensors }, _) => {
            let component = &view.header.components[*index];
            tensors
                .iter()
                .filter_map(|&t| component.tensors.get(t as usize))
                .map(|t| t.key.clone())
                .collect()
        }
        (Owner::Checkpoint, super::Content::Safetensors(plan)) => plan
            .prefix()
            .get(8..)
            .and_then(|json| crate::format::safetensors::parse_header(json, plan.size()).ok())
            .map(|h| h.tensors.into_iter().map(|t| t.name).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The entries of `view` (lane `lane` of repo `repo`, `ORG/NAME`; `first` when it is the
/// repo's first lane, shown without its label), and the weights files no rule takes.
pub fn entries(view: &LaneView, repo: &str, lane: &str, first: bool) -> (Vec<Entry>, Vec<LeftOut>) {
    let base = match first {
        true => repo.to_owned(),
        false => format!("{repo}.{lane}"),
    };
    if view.file(PIPELINE_FILE).is_some() {
        let entry = Entry {
            folder: DIFFUSERS.to_owned(),
            path: base,
            shows: Shows::Lane,
        };
        return (vec![entry], Vec::new());
    }
    let table = table();
    let mut weights = Vec::new();
    let mut left_out = Vec::new();
    for file in &view.files {
        let held = match &file.owner {
            Owner::Component { tensors, .. } => !tensors.is_empty(),
            Owner::Checkpoint => true,
            Owner::Repo | Owner::Pipeline => false,
        };
        if !held || !table.extensions.iter().any(|e| file.path.ends_with(e)) {
            continue;
        }
        if is_shard(&file.path) {
            left_out.push(LeftOut {
                file: file.path.clone(),
                why: "a shard: ComfyUI loads whole files".into(),
            });
            continue;
        }
        let names = array_names(view, file);
        let keys: Vec<&str> = names.iter().map(String::as_str).collect();
        match table.classify(&keys) {
            Some(folder) => weights.push((folder.to_owned(), file.path.clone())),
            None => left_out.push(LeftOut {
                file: file.path.clone(),
                why: format!(
                    "no rule of fs-layout/comfyui.json takes its tensors ({}, …)",
                    keys.iter().take(3).copied().collect::<Vec<_>>().join(", ")
                ),
            }),
        }
    }
    let one = weights.len() == 1;
    let entries = weights
        .into_iter()
        .map(|(folder, path)| {
            let shown = match one {
                true => {
                    let ext = table
                        .extensions
                        .iter()
                        .find(|e| path.ends_with(e.as_str()))
                        .expect("weights files have one");
                    format!("{base}{ext}")
                }
                false => format!("{base}/{path}"),
            };
            Entry {
                folder,
                path: shown,
                shows: Shows::File(path),
            }
        })
        .collect();
    (entries, left_out)
}

/// Orders a repo's `latest` lanes as the view names them: first the lane whose label the repo
/// had first (shown without its label; an import publishes its default lane first, and a
/// re-import of it keeps it first), then by when each label first appeared, then by label.
/// `lane_of` gives a commit's lane label (reading its tree); a commit it cannot read counts
/// as having none.
pub fn order_lanes<E>(
    repo: &crate::format::Repo,
    lanes: &mut [(String, crate::format::ObjectRef)],
    mut lane_of: impl FnMut(&crate::format::ObjectRef) -> Result<Option<String>, E>,
) {
    let mut first_seen: std::collections::HashMap<String, usize> = Default::default();
    for (i, commit) in repo.roots().enumerate() {
        let label = lane_of(commit).ok().flatten();
        let label = label.unwrap_or_else(|| crate::revisions::NO_LANE.to_owned());
        first_seen.entry(label).or_insert(i);
    }
    let age = |label: &String| first_seen.get(label).copied().unwrap_or(usize::MAX);
    lanes.sort_by(|(a, _), (b, _)| age(a).cmp(&age(b)).then(a.cmp(b)));
}

/// The entries of `paths` (in the order given: the first claim wins) that lose their name: a
/// path another entry took already, or one that is a file where another is a folder (or the
/// reverse). The view leaves them out and `ls --comfyui` says which entry took the name.
pub fn collisions(paths: &[&str]) -> Vec<(usize, usize)> {
    let mut taken: std::collections::HashMap<&str, usize> = Default::default();
    let mut folders: std::collections::HashMap<String, usize> = Default::default();
    let mut lost = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let prefixes: Vec<String> = path
            .match_indices('/')
            .map(|(at, _)| path[..at].to_owned())
            .collect();
        let by = taken
            .get(path)
            .or_else(|| folders.get(*path))
            .or_else(|| prefixes.iter().find_map(|p| taken.get(p.as_str())));
        if let Some(&by) = by {
            lost.push((i, by));
            continue;
        }
        taken.insert(path, i);
        for p in prefixes {
            folders.entry(p).or_insert(i);
        }
    }
    lost
}

/// `…-00001-of-00003.<ext>`: one shard of a sharded checkpoint.
fn is_shard(path: &str) -> bool {
    let stem = path.rsplit_once('.').map_or(path, |(s, _)| s);
    let Some((head, total)) = stem.rsplit_once("-of-") else {
        return false;
    };
    let index = head.rsplit_once('-').map_or("", |(_, i)| i);
    [index, total]
        .iter()
        .all(|n| n.len() == 5 && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(keys: &[&str]) -> Option<&'static str> {
        table().classify(keys)
    }

    #[test]
    fn the_table_parses_and_every_rule_names_a_folder() {
        let t = table();
        for rule in &t.rules {
            assert!(t.folder(&rule.folder).is_some(), "{}", rule.folder);
            assert!(!rule.all.is_empty(), "{}", rule.why);
        }
        assert_eq!(t.folder("unet").unwrap().name, "diffusion_models");
        assert_eq!(t.folder("clip").unwrap().name, "text_encoders");
    }

    /// Key names as the producers write them: kohya-ss and PEFT LoRAs, LyCORIS, A1111/LDM
    /// single files, Diffusers components, BFL Flux, Transformers CLIP/T5, llama.cpp GGUF.
    #[test]
    fn files_are_sorted_by_the_tensors_they_hold() {
        let cases: &[(&[&str], Option<&str>)] = &[
            (
                &[
                    "lora_unet_down_blocks_0_attentions_0_proj_in.alpha",
                    "lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight",
                    "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight",
                ],
                Some("loras"),
            ),
            (
                &[
                    "transformer.single_transformer_blocks.0.attn.to_k.lora_A.weight",
                    "transformer.single_transformer_blocks.0.attn.to_k.lora_B.weight",
                ],
                Some("loras"),
            ),
            (
                &["lora_unet_x.hada_w1_a", "lora_unet_x.hada_w1_b"],
                Some("loras"),
            ),
            (
                &["lora_unet_x.lokr_w1", "lora_unet_x.lokr_w2"],
                Some("loras"),
            ),
            (
                &["diffusion_model.x.diff", "diffusion_model.x.diff_b"],
                Some("loras"),
            ),
            (
                &[
                    "model.diffusion_model.input_blocks.0.0.weight",
                    "first_stage_model.decoder.conv_in.weight",
                    "cond_stage_model.transformer.text_model.embeddings.position_ids",
                ],
                Some("checkpoints"),
            ),
            (
                &["model.diffusion_model.input_blocks.0.0.weight"],
                Some("diffusion_models"),
            ),
            (
                &[
                    "double_blocks.0.img_attn.norm.key_norm.scale",
                    "img_in.weight",
                ],
                Some("diffusion_models"),
            ),
            (
                &[
                    "down_blocks.0.resnets.0.conv1.weight",
                    "time_embedding.linear_1.weight",
                ],
                Some("diffusion_models"),
            ),
            (
                &[
                    "decoder.conv_in.weight",
                    "encoder.conv_in.weight",
                    "quant_conv.weight",
                ],
                Some("vae"),
            ),
            (
                &[
                    "decoder.up_blocks.0.resnets.0.conv1.weight",
                    "encoder.down_blocks.0.resnets.0.conv1.weight",
                ],
                Some("vae"),
            ),
            // An LDM VAE file with the loss its training left (SD 1.x releases keep it).
            (
                &[
                    "decoder.conv_in.weight",
                    "encoder.conv_in.weight",
                    "loss.logvar",
                ],
                Some("vae"),
            ),
            (
                &[
                    "text_model.embeddings.token_embedding.weight",
                    "text_projection.weight",
                ],
                Some("text_encoders"),
            ),
            (
                &[
                    "encoder.block.0.layer.0.SelfAttention.k.weight",
                    "shared.weight",
                ],
                Some("text_encoders"),
            ),
            (
                &[
                    "encoder.block.0.layer.0.SelfAttention.k.weight",
                    "encoder.final_layer_norm.weight",
                ],
                Some("text_encoders"),
            ),
            (
                &["token_embd.weight", "blk.0.attn_q.weight"],
                Some("text_encoders"),
            ),
            (
                &[
                    "vision_model.embeddings.patch_embedding.weight",
                    "visual_projection.weight",
                ],
                Some("clip_vision"),
            ),
            (
                &[
                    "control_model.input_blocks.0.0.weight",
                    "control_model.input_hint_block.0.weight",
                ],
                Some("controlnet"),
            ),
            (
                &["controlnet_cond_embedding.conv_in.weight"],
                Some("controlnet"),
            ),
            (&["emb_params"], Some("embeddings")),
            (&["clip_g", "clip_l"], Some("embeddings")),
            (
                &["clip_l.transformer.text_model.embeddings.token_embedding.weight"],
                Some("text_encoders"),
            ),
            (
                &[
                    "cap_embedder.1.weight",
                    "layers.0.attention.qkv.weight",
                    "x_embedder.weight",
                ],
                Some("diffusion_models"),
            ),
            (
                &["double_layers.0.attn.w1q.weight"],
                Some("diffusion_models"),
            ),
            (
                &[
                    "conv1.weight",
                    "decoder.conv1.weight",
                    "encoder.conv1.weight",
                ],
                Some("vae"),
            ),
            (
                &["visual.transformer.resblocks.0.attn.in_proj_weight"],
                Some("clip_vision"),
            ),
            (
                &["conv_first.weight", "RRDB_trunk.0.RDB1.conv1.weight"],
                Some("upscale_models"),
            ),
            // Upscalers by spandrel's detection keys (chaiNNer-org/spandrel architectures).
            (
                &[
                    "body.0.bias",
                    "body.0.weight",
                    "body.1.weight",
                    "body.2.weight",
                ],
                Some("upscale_models"),
            ),
            (
                &["module.body.0.weight", "module.body.1.weight"],
                Some("upscale_models"),
            ),
            (&["body.0.weight", "body.1.weight", "head.weight"], None),
            (
                &[
                    "block_1.c1_r.eval_conv.weight",
                    "block_1.c1_r.sk.weight",
                    "conv_1.sk.weight",
                    "conv_cat.weight",
                    "upsampler.0.weight",
                ],
                Some("upscale_models"),
            ),
            // SwinIR's `layers.` blocks are not a text encoder's.
            (
                &[
                    "conv_first.weight",
                    "layers.0.residual_group.blocks.0.attn.relative_position_index",
                    "layers.0.residual_group.blocks.0.norm1.weight",
                ],
                Some("upscale_models"),
            ),
            (
                &["netG.conv_first.weight", "netG.body.0.rdb1.conv1.weight"],
                Some("upscale_models"),
            ),
            (
                &["unet1.conv1.conv.0.weight", "unet2.conv_bottom.weight"],
                Some("upscale_models"),
            ),
            (
                &["feats.1.lk.conv.weight", "feats.1.refine.weight"],
                Some("upscale_models"),
            ),
            // Transformers 5 saves bare CLIP and SigLIP towers without their prefix.
            (
                &[
                    "embeddings.token_embedding.weight",
                    "encoder.layers.0.self_attn.q_proj.weight",
                    "final_layer_norm.weight",
                ],
                Some("text_encoders"),
            ),
            (
                &[
                    "embeddings.patch_embedding.weight",
                    "encoder.layers.0.self_attn.q_proj.weight",
                    "post_layernorm.weight",
                ],
                Some("clip_vision"),
            ),
            // A GGUF diffusion model whose file also holds llama.cpp-named tensors.
            (
                &[
                    "blk.0.ffn_up.weight",
                    "double_blocks.0.img_mod.lin.weight",
                    "img_in.weight",
                ],
                Some("diffusion_models"),
            ),
            (&["classifier.weight", "bert.pooler.dense.bias"], None),
            (&[], None),
        ];
        for (keys, want) in cases {
            assert_eq!(kind(keys), *want, "{keys:?}");
        }
    }

    #[test]
    fn a_name_claimed_twice_or_as_file_and_folder_goes_to_the_first() {
        let paths = [
            "local/sd15.f16.safetensors",
            "local/sd15.f16.safetensors",
            "local/lokr.safetensors",
            "local/lokr.safetensors/a.safetensors",
            "local/pack/a.safetensors",
            "local/pack",
        ];
        assert_eq!(collisions(&paths), [(1, 0), (3, 2), (5, 4)]);
    }

    #[test]
    fn shards_are_told_by_their_names() {
        assert!(is_shard(
            "diffusion_pytorch_model-00001-of-00003.safetensors"
        ));
        assert!(is_shard("unet/model.fp16-00002-of-00002.safetensors"));
        assert!(!is_shard("model.safetensors"));
        assert!(!is_shard("lora-v1-of-2.safetensors"));
    }
}
