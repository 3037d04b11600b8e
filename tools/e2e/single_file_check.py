#!/usr/bin/env python3
"""Single-file checkpoints imported as Diffusers components, checked against diffusers itself.

    single_file_check.py --tensorfs BIN --work DIR

1. Builds a small Stable Diffusion 1.x pipeline offline (random weights; SD 1.x's conventions:
   32 norm groups, 8 heads, CLIP's 49 408-token vocabulary and quick-GELU text encoder, its
   PNDM scheduler) and saves it as a Diffusers folder. Writes the same weights as a CompVis
   single file (`model.diffusion_model.`, `first_stage_model.`, `cond_stage_model.transformer.`
   keys, the VAE's attention as 1×1 kernels, `alphas_cumprod` and `position_ids` beside them),
   by this script's own key map, and checks it with the outside oracle: diffusers'
   `from_single_file(<file>, config=<folder>)` gives back every tensor of the folder.
2. Imports the folder, then the single file, into one store: the file is recognised as
   `sd1.single_file` and adds at most 2 % of its size (the components are the folder's chunks).
   The reference's `tfs verify` accepts the converted lane. A second SDXL file, a fine-tune with
   its own UNet and the first's VAE and text encoders, adds its UNet's bytes and no more.
3. Mounts the store:
   - `<lane>/<file>` is the original file byte for byte;
   - `DiffusionPipeline.from_pretrained(<lane>@diffusers)` (offline) loads every tensor equal to
     the folder's, with configs whose derived values equal the folder's;
   - `from_single_file(<mounted file>, config=<lane>@diffusers)` loads the same tensors;
   - one inference step from `<lane>@diffusers` equals one from the folder.
   The same for a small SDXL (two text encoders, the second in OpenCLIP's layout: a fused
   q/k/v stored as its three row ranges, `text_projection` transposed), a small SDXL refiner
   (OpenCLIP-G alone, aesthetic-score time embeddings: StableDiffusionXLImg2ImgPipeline) and a
   small SD 2.x (OpenCLIP-H in the file's layout with one layer more than the model uses, as
   SD 2.x conditions on the penultimate layer; linear projections; v-prediction, which the
   import is told with --prediction-type after it refused the file without it), and a small
   SD3.5-like StableDiffusion3Pipeline without T5 (written as Stability's whole checkpoints are,
   a T5 beside the CLIPs: its CLIP-L gets Diffusers' identity projection, the file's own and the
   T5 stay in the file; loaded with text_encoder_3=None, tokenizer_3=None as diffusers loads SD3
   without T5). The SD3 folder's `<lane>@single` face is a file per component (transformer,
   VAE, text encoders in their model-alone layouts, as ComfyUI loads SD3), which diffusers'
   from_single_file reads as the folder's and `@comfyui` shows in diffusion_models, vae and
   text_encoders.
4. UNets alone (ComfyUI's diffusion_models): a small SD 1.x UNet (context 768) with bare CompVis
   keys and a small SDXL UNet (context 2048) under `model.diffusion_model.`, as ComfyUI saves a
   model alone: each is recognised by its context width, and its `<lane>@diffusers` folder
   loads with UNet2DConditionModel.from_pretrained equal to the UNet it was written from;
   diffusers' own from_single_file(<mounted file>, config=<@diffusers>) agrees. Text encoders
   alone (ComfyUI's text_encoders: a CLIP-L without projection, a CLIP-G with one, in
   Transformers' layout): recognised by width and projection, and `<lane>@diffusers` loads with
   Transformers' from_pretrained of the class, equal to the model written, quick-GELU or GELU.
5. Transformers alone (ComfyUI's diffusion_models): a small FLUX.1 transformer (BF16, guidance
   embedding, under `model.diffusion_model.`) and a small SD3.5-like MMDiT (q/k norms, a
   dual-attention block, bare keys), written in the original layout by tiny_dit.py, which
   diffusers' own conversion reads back as the model. Each imports as its converter, adding at
   most 2 % to a store holding its Diffusers folder; mounted, the file is re-created byte for
   byte (fused q/k/v and q/k/v/MLP projections through their row parts, the shift-first adaLN
   halves through the Diffusers tensor's halves in the other order) and shown in
   `@comfyui/diffusion_models`, diffusers' conversion of the mounted file gives the model, and
   `<lane>@diffusers` loads with the class's from_pretrained: every tensor, the derived config
   and one forward pass equal the model's. The transformer's Diffusers model folder has a
   `<lane>@single/model.safetensors` face holding the original file's arrays byte for byte,
   which diffusers' conversion reads as the model. The same FLUX.1 transformer as fp8
   checkpoints ship it (every matrix F8_E4M3, the vectors BF16) converts too; its
   `<lane>@diffusers` loads in BF16 equal to diffusers' conversion of the file, cast the same way.
6. A model alone joins a stored pipeline (`import --pipeline`): the small SDXL's UNet, tuned
   (every weight moved) and written as ComfyUI keeps a model alone, imported with `--pipeline
   local/sdxl` adds its own size (its tensors padded to 4 KiB: 5 % at most for a model this small)
   and nothing of the lane's other tensors; `<lane>@diffusers` loads as
   StableDiffusionXLPipeline with the tuned UNet and every other tensor the folder's, and one
   inference step equals the folder's pipeline with the tuned UNet put in. The reference's
   `tfs verify` accepts the lane.
7. cozytensors (the package tools/python-test.sh installs) reads every array of each mounted
   single file, the imported one and the `<lane>@single` face, from the store's blobs (a fused
   q/k/v array through its three tensors' bytes in turn), equal to safetensors' reading of the
   file; only the transposed `text_projection` comes through the file.

Prints PASS/FAIL lines and a closing `RESULT:` line; exits 0 only when every check passed.
"""

import argparse
import inspect
import json
import math
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import e2e_common as common  # noqa: E402
import tiny_dit  # noqa: E402
from tiny_sd import bytes_to_unicode  # noqa: E402

common.go_offline()
TOOL = "single_file_check"
# CLIP ViT-L/14's tokens of "a photo of a cat" (start, a, photo, of, a, cat, end).
CLIP_CAT = [49406, 320, 1125, 539, 320, 2368, 49407]
TEXT_HIDDEN = 256
MERGES = ROOT / "fs-layout" / "tokenizers" / "clip" / "merges.txt"


def clip_tokenizer_files(folder):
    """CLIP's vocab.json and merges.txt, derived as CLIP's SimpleTokenizer does."""
    merges = MERGES.read_text(encoding="utf-8").splitlines()[1:]
    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m.split(" ")) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False),
                                      encoding="utf-8")
    (folder / "merges.txt").write_bytes(MERGES.read_bytes())
    return {t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ")) for m in merges]


def perturb(*models):
    """Random init leaves norms and biases at exact 0/1: every tensor gets distinct bytes."""
    import torch

    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for model in models:
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.02)


def save(pipe, folder, scratch):
    pipe.save_pretrained(folder, safe_serialization=True)
    # The folder's tokenizer files are CLIP's own (the bundled ones), as a real repo's are.
    for tok in ("tokenizer", "tokenizer_2"):
        if (folder / tok).is_dir():
            for name in ("vocab.json", "merges.txt"):
                (folder / tok / name).write_bytes((scratch / "tok" / name).read_bytes())


def tiny_vae(**family):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=32, **family)


def build_sdxl(folder, scratch):
    """A small SDXL: CLIP-L-like and OpenCLIP-G-like text encoders, added time embeddings."""
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    vocab, merges = clip_tokenizer_files(scratch / "tok")
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77, pad_token="<|endoftext|>")
    tokenizer_2 = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77, pad_token="!")
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(64, 128), layers_per_block=2, sample_size=128, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=64 + 128, attention_head_dim=(1, 2), use_linear_projection=True,
        transformer_layers_per_block=(1, 2), addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=96 + 6 * 256, norm_num_groups=32)
    # SDXL's values where the weights do not tell them.
    vae = tiny_vae(sample_size=1024, scaling_factor=0.13025, force_upcast=True)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1, vocab_size=49408,
        max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768, bos_token_id=0, eos_token_id=2,
        pad_token_id=1))
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, vocab_size=49408,
        max_position_embeddings=77, hidden_act="gelu", projection_dim=96, bos_token_id=0, eos_token_id=2,
        pad_token_id=1))
    perturb(unet, vae, text_encoder, text_encoder_2)
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       steps_offset=1, timestep_spacing="leading")
    pipe = StableDiffusionXLPipeline(vae=vae.eval(), text_encoder=text_encoder.eval(),
                                     text_encoder_2=text_encoder_2.eval(), tokenizer=tokenizer,
                                     tokenizer_2=tokenizer_2, unet=unet.eval(), scheduler=scheduler)
    save(pipe, folder, scratch)
    return pipe


def build_refiner(folder, scratch):
    """A small SDXL refiner: one OpenCLIP-G-like text encoder (Diffusers' text_encoder_2), the
    aesthetic score among the time embeddings."""
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLImg2ImgPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer

    vocab, merges = clip_tokenizer_files(scratch / "tok")
    tokenizer_2 = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77, pad_token="!")
    torch.manual_seed(1)
    unet = UNet2DConditionModel(
        block_out_channels=(64, 128), layers_per_block=2, sample_size=128, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=128, attention_head_dim=(1, 2), use_linear_projection=True,
        transformer_layers_per_block=(1, 2), addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=96 + 5 * 256, norm_num_groups=32)
    vae = tiny_vae(sample_size=1024, scaling_factor=0.13025, force_upcast=True)
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, vocab_size=49408,
        max_position_embeddings=77, hidden_act="gelu", projection_dim=96, bos_token_id=0, eos_token_id=2,
        pad_token_id=1))
    perturb(unet, vae, text_encoder_2)
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       steps_offset=1, timestep_spacing="leading")
    pipe = StableDiffusionXLImg2ImgPipeline(
        vae=vae.eval(), text_encoder=None, text_encoder_2=text_encoder_2.eval(), tokenizer=None,
        tokenizer_2=tokenizer_2, unet=unet.eval(), scheduler=scheduler, requires_aesthetics_score=True,
        force_zeros_for_empty_prompt=False)
    save(pipe, folder, scratch)
    return pipe


def build_sd2(folder, scratch):
    """A small SD 2.x (768-v): an OpenCLIP-H-like text encoder, 64-wide heads, linear
    projections, DDIM predicting velocity."""
    import torch
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab, merges = clip_tokenizer_files(scratch / "tok")
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77, pad_token="!")
    torch.manual_seed(2)
    unet = UNet2DConditionModel(
        block_out_channels=(64, 128), layers_per_block=2, sample_size=96, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=128, attention_head_dim=(1, 2), use_linear_projection=True,
        upcast_attention=True, norm_num_groups=32)
    vae = tiny_vae(sample_size=768)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, vocab_size=49408,
        max_position_embeddings=77, hidden_act="gelu", projection_dim=512, bos_token_id=0, eos_token_id=2,
        pad_token_id=1))
    perturb(unet, vae, text_encoder)
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              clip_sample=False, set_alpha_to_one=False, steps_offset=1,
                              prediction_type="v_prediction")
    pipe = StableDiffusionPipeline(vae=vae.eval(), text_encoder=text_encoder.eval(), tokenizer=tokenizer,
                                   unet=unet.eval(), scheduler=scheduler, safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    save(pipe, folder, scratch)
    return pipe


def build_sd3(folder, scratch):
    """A small SD3.5-like pipeline without T5: tiny_dit's MMDiT on 16 latent channels, a
    16-channel VAE without quant convs (SD3's scaling and shift), CLIP-L- and OpenCLIP-G-like
    text encoders with projections, the flow-matching scheduler."""
    import torch
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel,
                           StableDiffusion3Pipeline)
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer

    vocab, merges = clip_tokenizer_files(scratch / "tok")
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77, pad_token="<|endoftext|>")
    tokenizer_2 = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77, pad_token="!")
    torch.manual_seed(0)
    # The text encoders' states (64 + 128 wide) padded to T5's width; their pooled outputs
    # (64, CLIP-L's unprojected, + 48) side by side.
    transformer = SD3Transformer2DModel(**dict(tiny_dit.SD3, in_channels=16, out_channels=16,
                                               joint_attention_dim=256, pooled_projection_dim=112))
    vae = AutoencoderKL(
        block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=16, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=32, sample_size=1024, scaling_factor=1.5305, shift_factor=0.0609, force_upcast=True,
        use_quant_conv=False, use_post_quant_conv=False)

    def clip(hidden, act, projection):
        return CLIPTextModelWithProjection(CLIPTextConfig(
            hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=hidden // 64,
            vocab_size=49408, max_position_embeddings=77, hidden_act=act, projection_dim=projection,
            bos_token_id=0, eos_token_id=2, pad_token_id=1))

    text_encoder, text_encoder_2 = clip(64, "quick_gelu", 64), clip(128, "gelu", 48)
    perturb(transformer, vae, text_encoder, text_encoder_2)
    # SD3 conditions on CLIP-L's pooled output unprojected: Diffusers' projection is the identity.
    with torch.no_grad():
        text_encoder.text_projection.weight.copy_(torch.eye(64))
    pipe = StableDiffusion3Pipeline(
        transformer=transformer.eval(), scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae.eval(),
        text_encoder=text_encoder.eval(), tokenizer=tokenizer, text_encoder_2=text_encoder_2.eval(),
        tokenizer_2=tokenizer_2, text_encoder_3=None, tokenizer_3=None)
    save(pipe, folder, scratch)
    return pipe


def build_sd1(folder, scratch):
    import torch
    from diffusers import PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab, merges = clip_tokenizer_files(scratch / "tok")
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77, pad_token="<|endoftext|>")
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=2, sample_size=16, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=TEXT_HIDDEN, attention_head_dim=8, norm_num_groups=32)
    vae = tiny_vae(sample_size=32)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        hidden_size=TEXT_HIDDEN, intermediate_size=512, num_hidden_layers=2, num_attention_heads=TEXT_HIDDEN // 64,
        vocab_size=49408, max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768,
        bos_token_id=0, eos_token_id=2, pad_token_id=1))
    perturb(unet, vae, text_encoder)
    scheduler = PNDMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              skip_prk_steps=True, steps_offset=1, set_alpha_to_one=False)
    pipe = StableDiffusionPipeline(vae=vae.eval(), text_encoder=text_encoder.eval(), tokenizer=tokenizer,
                                   unet=unet.eval(), scheduler=scheduler, safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    save(pipe, folder, scratch)
    return pipe


RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1",
          "norm2": "out_layers.0", "conv2": "out_layers.3", "conv_shortcut": "skip_connection"}


def ldm_unet(sd, config):
    """Diffusers UNet keys → CompVis keys (this script's own map, after the original layout)."""
    n = config["layers_per_block"] + 1
    out = {}
    attends_up = {int(k.split(".")[1]) for k in sd if k.startswith("up_blocks.") and ".attentions." in k}
    for key, t in sd.items():
        p = key.split(".")
        rest = ".".join(p[4:])

        def resnet(prefix):
            head, _, tail = rest.partition(".")
            return f"{prefix}.{RESNET[head]}.{tail}"

        if p[0] == "down_blocks" and p[2] == "resnets":
            new = resnet(f"input_blocks.{1 + int(p[1]) * n + int(p[3])}.0")
        elif p[0] == "down_blocks" and p[2] == "attentions":
            new = f"input_blocks.{1 + int(p[1]) * n + int(p[3])}.1.{rest}"
        elif p[0] == "down_blocks" and p[2] == "downsamplers":
            new = f"input_blocks.{(int(p[1]) + 1) * n}.0.op.{'.'.join(p[5:])}"
        elif p[0] == "up_blocks" and p[2] == "resnets":
            new = resnet(f"output_blocks.{int(p[1]) * n + int(p[3])}.0")
        elif p[0] == "up_blocks" and p[2] == "attentions":
            new = f"output_blocks.{int(p[1]) * n + int(p[3])}.1.{rest}"
        elif p[0] == "up_blocks" and p[2] == "upsamplers":
            slot = 2 if int(p[1]) in attends_up else 1
            new = f"output_blocks.{int(p[1]) * n + n - 1}.{slot}.conv.{'.'.join(p[5:])}"
        elif p[0] == "mid_block":
            rest = ".".join(p[3:])
            if p[1] == "attentions":
                new = f"middle_block.1.{rest}"
            else:
                head, _, tail = rest.partition(".")
                new = f"middle_block.{2 * int(p[2])}.{RESNET[head]}.{tail}"
        else:
            new = {"conv_in": "input_blocks.0.0", "time_embedding": None, "conv_norm_out": "out.0",
                   "conv_out": "out.2"}.get(p[0], "?")
            if p[0] == "time_embedding":
                new = {"linear_1": "time_embed.0", "linear_2": "time_embed.2"}[p[1]] + "." + p[2]
            elif p[0] == "add_embedding":
                new = {"linear_1": "label_emb.0.0", "linear_2": "label_emb.0.2"}[p[1]] + "." + p[2]
            else:
                new = f"{new}.{p[-1]}"
        out["model.diffusion_model." + new] = t
    return out


VAE_ATTN = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out": "proj_out"}


def ldm_vae(sd, levels):
    out = {}
    for key, t in sd.items():
        p = key.split(".")
        side = p[0]
        if p[1] in ("down_blocks", "up_blocks"):
            i = int(p[2]) if p[1] == "down_blocks" else levels - 1 - int(p[2])
            level = "down" if p[1] == "down_blocks" else "up"
            if p[3] == "resnets":
                name = "nin_shortcut" if p[5] == "conv_shortcut" else p[5]
                new = f"{side}.{level}.{i}.block.{p[4]}.{name}.{p[-1]}"
            else:
                new = f"{side}.{level}.{i}.{'downsample' if level == 'down' else 'upsample'}.conv.{p[-1]}"
        elif p[1] == "mid_block" and p[2] == "resnets":
            new = f"{side}.mid.block_{int(p[3]) + 1}.{'.'.join(p[4:])}"
        elif p[1] == "mid_block":
            new = f"{side}.mid.attn_1.{VAE_ATTN[p[4]]}.{p[-1]}"
            if t.dim() == 2:
                t = t.reshape(*t.shape, 1, 1)
        elif p[1] == "conv_norm_out":
            new = f"{side}.norm_out.{p[-1]}"
        else:
            new = key
        out["first_stage_model." + new] = t.contiguous()
    return out


def hf_clip(prefix, model):
    """A CLIPTextModel's tensors as files hold them: `<prefix>text_model.…` (Transformers 5
    names them without `text_model.`)."""
    return {prefix + (k if k.startswith(("text_model.", "text_projection.")) else "text_model." + k): t
            for k, t in model.state_dict().items()}


OPEN_CLIP = {"layer_norm1": "ln_1", "layer_norm2": "ln_2", "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj",
             "self_attn.out_proj": "attn.out_proj"}


def open_clip(prefix, model, unused_layer=False):
    """A CLIPTextModel(WithProjection)'s tensors in OpenCLIP's layout: fused in_proj, the
    projection as `x @ P`, `logit_scale`. `unused_layer`: as SD 2.x files hold OpenCLIP-H, one
    layer more than the model uses (a copy of its last, perturbed) and a projection it does not
    use."""
    import torch

    sd = {k.removeprefix("text_model."): t for k, t in model.state_dict().items()}
    hidden = model.config.hidden_size
    projection = sd.pop("text_projection.weight").T.contiguous() if "text_projection.weight" in sd \
        else torch.randn(hidden, hidden, generator=torch.Generator().manual_seed(5))
    out = {"token_embedding.weight": sd.pop("embeddings.token_embedding.weight"),
           "positional_embedding": sd.pop("embeddings.position_embedding.weight"),
           "text_projection": projection,
           "logit_scale": torch.tensor(4.6052)}
    for k in [k for k in sd if k.startswith("final_layer_norm.")]:
        out["ln_final." + k.split(".")[-1]] = sd.pop(k)
    for i in range(model.config.num_hidden_layers):
        layer = f"encoder.layers.{i}."
        for kind in ("weight", "bias"):
            qkv = [sd.pop(f"{layer}self_attn.{x}_proj.{kind}") for x in "qkv"]
            out[f"transformer.resblocks.{i}.attn.in_proj_{kind}"] = torch.cat(qkv)
        for k in [k for k in sd if k.startswith(layer)]:
            rest = k[len(layer):]
            name, _, kind = rest.rpartition(".")
            out[f"transformer.resblocks.{i}.{OPEN_CLIP[name]}.{kind}"] = sd.pop(k)
    assert not sd, f"unmapped: {list(sd)}"
    if unused_layer:
        last, extra = model.config.num_hidden_layers - 1, model.config.num_hidden_layers
        for k in [k for k in out if k.startswith(f"transformer.resblocks.{last}.")]:
            out[k.replace(f".{last}.", f".{extra}.", 1)] = out[k] + 0.01
    return {prefix + k: t for k, t in out.items()}


def single_file(pipe, path, family):
    import torch
    from safetensors.torch import save_file

    if family == "sd3":
        # As Stability's sd3_medium_incl_clips files are, with a T5 beside the CLIPs, which the
        # import leaves in the file.
        sd = {"model.diffusion_model." + k: t for k, t in tiny_dit.sd3_original(pipe.transformer).items()}
        sd.update(ldm_vae(pipe.vae.state_dict(), len(pipe.vae.config.block_out_channels)))
        sd.update(hf_clip("text_encoders.clip_l.transformer.", pipe.text_encoder))
        sd.update(hf_clip("text_encoders.clip_g.transformer.", pipe.text_encoder_2))
        t5 = {"shared.weight": torch.randn(300, 32), "encoder.final_layer_norm.weight": torch.randn(32)}
        sd.update({"text_encoders.t5xxl.transformer." + k: t for k, t in t5.items()})
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
        return
    sd = ldm_unet(pipe.unet.state_dict(), pipe.unet.config)
    sd.update(ldm_vae(pipe.vae.state_dict(), len(pipe.vae.config.block_out_channels)))
    if family == "sd1":
        sd.update(hf_clip("cond_stage_model.transformer.", pipe.text_encoder))
        sd["cond_stage_model.transformer.text_model.embeddings.position_ids"] = torch.arange(77).reshape(1, 77)
        sd["alphas_cumprod"] = pipe.scheduler.alphas_cumprod.to(torch.float32)
    elif family == "sd2":
        sd.update(open_clip("cond_stage_model.model.", pipe.text_encoder, unused_layer=True))
        sd["alphas_cumprod"] = pipe.scheduler.alphas_cumprod.to(torch.float32)
    elif family == "refiner":
        sd.update(open_clip("conditioner.embedders.0.model.", pipe.text_encoder_2))
    else:
        sd.update(hf_clip("conditioner.embedders.0.transformer.", pipe.text_encoder))
        sd.update(open_clip("conditioner.embedders.1.model.", pipe.text_encoder_2))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))


MODELS = ("unet", "transformer", "vae", "text_encoder", "text_encoder_2")
# What diffusers must be told a family's pipeline goes without (SD3's T5, as diffusers'
# documentation loads SD3 without it).
WITHOUT = {"sd1": {}, "sd2": {}, "sdxl": {}, "refiner": {}, "sd3": {"text_encoder_3": None, "tokenizer_3": None}}


def state_dicts(pipe):
    names = [n for n in MODELS if getattr(pipe, n, None) is not None]
    return {name: getattr(pipe, name).state_dict() for name in names}


def same_tensors(a, b):
    """Names that differ between two pipelines' state dicts (missing, or other bytes)."""
    import torch

    bad = []
    for name in a:
        for key, t in a[name].items():
            u = b[name].get(key)
            if u is None or u.shape != t.shape or u.dtype != t.dtype or not torch.equal(u, t):
                bad.append(f"{name}/{key}")
        bad += [f"{name}/{k} (extra)" for k in b[name] if k not in a[name]]
    return bad


def one_step(pipe):
    """One denoising step's latents (an image-to-image pipeline: two steps of four at strength
    0.5, from a fixed image)."""
    import torch

    args = dict(num_inference_steps=1, output_type="latent", generator=torch.Generator().manual_seed(0),
                guidance_scale=7.5)
    if "image" in inspect.signature(pipe.__call__).parameters:
        image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
        args.update(image=image, num_inference_steps=4, strength=0.5)
    else:
        args.update(height=32, width=32)
    return pipe("a photo of a cat", **args).images


def check_mounted(report, mnt, family, pipe, folder, file, cls, lane):
    import torch
    from diffusers import DiffusionPipeline

    want = state_dicts(pipe)
    base = mnt / "local" / f"{family}-single" / "latest"
    listed = sorted(p.name for p in base.iterdir())
    report.check(listed == [lane, f"{lane}@diffusers"], f"{family}: the lane and its Diffusers face", str(listed))
    mounted = base / lane / file.name
    report.check(common.sha256_file(mounted) == common.sha256_file(file),
                 f"{family}: the file is re-created byte for byte")
    face = base / f"{lane}@diffusers"
    comfy = mnt / "@comfyui"
    checkpoints = [p for p in (comfy / "checkpoints").rglob("*.safetensors") if f"{family}-single" in str(p)]
    report.check(len(checkpoints) == 1 and common.sha256_file(checkpoints[0]) == common.sha256_file(file),
                 f"{family}: @comfyui/checkpoints shows the file", str(checkpoints))
    pipelines = [p.parent for p in (comfy / "diffusers").rglob("model_index.json") if f"{family}-single" in str(p)]
    report.check(len(pipelines) == 1, f"{family}: @comfyui/diffusers shows the Diffusers face", str(pipelines))
    report.note(f"{family}: @diffusers holds "
                + ", ".join(sorted(str(p.relative_to(face)) for p in face.rglob("*") if p.is_file())))
    loaded = DiffusionPipeline.from_pretrained(str(face), local_files_only=True, **WITHOUT[family])
    report.check(type(loaded) is cls, f"{family}: the face loads as {cls.__name__}", type(loaded).__name__)
    bad = same_tensors(want, state_dicts(loaded))
    report.check(not bad, f"{family}: every tensor of @diffusers equals the folder's", ", ".join(bad[:5]))
    text = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
            "max_position_embeddings", "hidden_act"]
    derived = {
        "unet": ["in_channels", "out_channels", "block_out_channels", "layers_per_block", "down_block_types",
                 "up_block_types", "cross_attention_dim", "attention_head_dim", "use_linear_projection",
                 "transformer_layers_per_block", "norm_num_groups", "addition_embed_type",
                 "addition_time_embed_dim", "projection_class_embeddings_input_dim"],
        "vae": ["in_channels", "out_channels", "latent_channels", "block_out_channels", "layers_per_block",
                "norm_num_groups", "scaling_factor"],
        "text_encoder": text,
        "text_encoder_2": text + ["projection_dim"],
        "transformer": TRANSFORMERS_ALONE["sd3"][3],
    }
    for name in want:
        ours, theirs = getattr(loaded, name).config, getattr(pipe, name).config

        def get(config, key):
            value = config[key] if isinstance(config, dict) else getattr(config, key)
            return list(value) if isinstance(value, (list, tuple)) else value

        diff = {k: (get(ours, k), get(theirs, k)) for k in derived[name] if get(ours, k) != get(theirs, k)}
        report.check(not diff, f"{family}: {name}'s derived config equals the folder's", str(diff))
    check_cozytensors(report, family, mounted, "the imported file")
    again = cls.from_single_file(str(mounted), config=str(face), local_files_only=True, **WITHOUT[family])
    bad = same_tensors(want, state_dicts(again))
    report.check(not bad, f"{family}: from_single_file(mounted file, config=@diffusers) equals the folder",
                 ", ".join(bad[:5]))
    ids = (loaded.tokenizer or loaded.tokenizer_2)("a photo of a cat").input_ids
    report.check(ids == CLIP_CAT, f"{family}: the bundled CLIP tokenizer gives CLIP's ids", str(ids))
    # The folder as a loader loads it (a pipeline built in memory may attend another way).
    a, b = one_step(DiffusionPipeline.from_pretrained(str(folder), local_files_only=True, **WITHOUT[family])), one_step(loaded)
    report.check(torch.equal(a, b), f"{family}: one inference step from @diffusers equals the folder's",
                 f"max |Δ| {float((a - b).abs().max()):.3g}")


def check_single_face(report, mnt, family, pipe, folder, file, cls):
    """The Diffusers folder's lane shows the single file its components make (`<lane>@single`):
    every array equal to the original single file's of that key, diffusers' from_single_file
    of it gives the folder's tensors, and @comfyui/checkpoints lists it."""
    from safetensors import safe_open

    base = mnt / "local" / family / "latest"
    faces = sorted(p.name for p in base.iterdir())
    single = [f for f in faces if f.endswith("@single")]
    if family == "sd2":
        # The folder's text encoder lacks the last layer SD 2.x files carry: no such file.
        report.check(not single, f"{family}: a Diffusers SD 2.x folder has no single-file face", str(faces))
        return
    if family == "sd3":
        check_split_face(report, mnt, pipe, folder, base / single[0] if single else None)
        return
    report.check(len(single) == 1, f"{family}: the Diffusers folder's lane has a single-file face", str(faces))
    if not single:
        return
    made = base / single[0] / "model.safetensors"
    with safe_open(str(made), framework="pt") as ours, safe_open(str(file), framework="pt") as theirs:
        keys, original = set(ours.keys()), set(theirs.keys())
        extra = sorted(keys - original)
        differ = [k for k in sorted(keys & original)
                  if not torch_equal(ours.get_tensor(k), theirs.get_tensor(k))]
        report.check(not extra and not differ,
                     f"{family}: every array of @single equals the original file's ({len(keys)} of {len(original)})",
                     f"not in the original: {extra[:3]}; other bytes: {differ[:3]}; "
                     f"left out: {sorted(original - keys)[:5]}")
    check_cozytensors(report, family, made, "@single")
    again = cls.from_single_file(str(made), config=str(folder), local_files_only=True)
    bad = same_tensors(state_dicts(pipe), state_dicts(again))
    report.check(not bad, f"{family}: from_single_file(@single, config=the folder) equals the folder",
                 ", ".join(bad[:5]))
    checkpoints = [p for p in (mnt / "@comfyui" / "checkpoints").rglob("*.safetensors")
                   if p.name == f"{family}.safetensors"]
    report.check(len(checkpoints) == 1 and common.sha256_file(checkpoints[0]) == common.sha256_file(made),
                 f"{family}: @comfyui/checkpoints shows the folder's single file", str(checkpoints))


def check_split_face(report, mnt, pipe, folder, face):
    """An SD3 pipeline's single-file face (no converter writes the pipeline whole): a file per
    component in its model-alone layout, as ComfyUI loads SD3 from its diffusion_models, vae and
    text_encoders folders; diffusers' own conversions read the transformer and VAE files as the
    folder's, and the text encoders' files hold the folder's tensors."""
    import torch
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from safetensors.torch import load_file

    listed = sorted(p.name for p in face.iterdir()) if face else []
    want = ["text_encoder.safetensors", "text_encoder_2.safetensors", "transformer.safetensors", "vae.safetensors"]
    report.check(listed == want, "sd3: the Diffusers folder's single-file face is a file per component", str(listed))
    if listed != want:
        return
    transformer = SD3Transformer2DModel.from_single_file(str(face / "transformer.safetensors"), config=str(folder),
                                                         subfolder="transformer", local_files_only=True)
    vae = AutoencoderKL.from_single_file(str(face / "vae.safetensors"), config=str(folder), subfolder="vae",
                                         local_files_only=True)
    bad = same_tensors({"transformer": pipe.transformer.state_dict(), "vae": pipe.vae.state_dict()},
                       {"transformer": transformer.state_dict(), "vae": vae.state_dict()})
    report.check(not bad, "sd3: from_single_file of @single's transformer and VAE files equals the folder's",
                 ", ".join(bad[:5]))
    for name in ("text_encoder", "text_encoder_2"):
        ours = {k.removeprefix("text_model."): t for k, t in load_file(str(face / f"{name}.safetensors")).items()}
        theirs = {k.removeprefix("text_model."): t for k, t in getattr(pipe, name).state_dict().items()}
        differ = sorted(k for k in set(ours) | set(theirs)
                        if k not in ours or k not in theirs or not torch.equal(ours[k], theirs[k]))
        report.check(not differ, f"sd3: @single's {name} file holds the folder's {name}", str(differ[:5]))
    comfy = mnt / "@comfyui"
    shown = {folder_name: sorted(p.name for p in (comfy / folder_name).rglob("*.safetensors") if "/local/sd3/" in str(p))
             for folder_name in ("diffusion_models", "vae", "text_encoders")}
    report.check(shown == {"diffusion_models": ["transformer.safetensors"], "vae": ["vae.safetensors"],
                           "text_encoders": ["text_encoder.safetensors", "text_encoder_2.safetensors"]},
                 "sd3: @comfyui shows each file in its folder", str(shown))
    check_cozytensors(report, "sd3", face / "transformer.safetensors", "@single's transformer")


def check_cozytensors(report, family, path, what):
    """cozytensors reads every array of the mounted single file `path` from the blobs (the
    daemon's whole-file extents answer locates each; only arrays made when read, OpenCLIP's
    transposed projection, come through the file), equal to safetensors' reading."""
    from safetensors import safe_open

    try:
        import cozytensors
    except ImportError:
        # tools/test.sh installs the package (tools/python-test.sh) before this script runs.
        report.check(os.environ.get("CI") != "true", f"{family}: cozytensors reads {what}",
                     "skipped: cozytensors is not installed (tools/python-test.sh installs it)")
        return
    with cozytensors.safe_open(str(path), framework="pt") as ours, \
            safe_open(str(path), framework="pt") as theirs:
        differ = [k for k in theirs.keys() if not torch_equal(ours.get_tensor(k), theirs.get_tensor(k))]
        fast, through_file = ours._fast, sorted(ours._decoded)
    # SDXL's OpenCLIP-G projection is the text encoder's, stored transposed; SD 2.x's belongs to
    # no component (Diffusers' SD 2.x text encoder has none), so it is stored as the file has it.
    transposed = 1 if family in ("sdxl", "refiner") else 0
    report.check(fast and not differ and len(through_file) == transposed,
                 f"{family}: cozytensors reads every array of {what} from the blobs, equal to safetensors'",
                 f"from the blobs: {fast}; other bytes: {differ[:3]}; through the file: {len(through_file)}")


UNETS_ALONE = {
    # family: (converter, whether the file's keys carry model.diffusion_model., the UNet's config)
    "sd1": ("sd1_unet.single_file", False, dict(
        block_out_channels=(32, 64), layers_per_block=1, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32)),
    "sdxl": ("sdxl_unet.single_file", True, dict(
        block_out_channels=(64, 128), layers_per_block=1, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=2048, attention_head_dim=(1, 2), use_linear_projection=True,
        transformer_layers_per_block=(1, 2), addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=1280 + 6 * 256, norm_num_groups=32)),
}


def write_unet_alone(family, path):
    """A small UNet of `family` (UNETS_ALONE) written as ComfyUI keeps a model alone; returns
    the model."""
    import torch
    from diffusers import UNet2DConditionModel
    from safetensors.torch import save_file

    _, prefixed, config = UNETS_ALONE[family]
    torch.manual_seed(1)
    unet = UNet2DConditionModel(**config)
    perturb(unet)
    sd = ldm_unet(unet.state_dict(), unet.config)
    if not prefixed:
        sd = {k.removeprefix("model.diffusion_model."): t for k, t in sd.items()}
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return unet.eval()


def write_tuned_unet(pipe, path):
    """`pipe`'s UNet with every weight moved (a fine-tune), written as ComfyUI keeps a model
    alone (under `model.diffusion_model.`); returns the tuned UNet."""
    import copy

    from safetensors.torch import save_file

    unet = copy.deepcopy(pipe.unet)
    perturb(unet)
    sd = ldm_unet(unet.state_dict(), unet.config)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return unet.eval()


def check_fine_tune_shares(report, work, pipe, tensorfs):
    """A second SDXL single file, a fine-tune with its own UNet and the first's VAE and text
    encoders (as most SDXL fine-tunes ship), adds its UNet's bytes and no more."""
    import copy

    from safetensors import safe_open

    tuned = copy.deepcopy(pipe)
    perturb(tuned.unet)
    perturb(tuned.unet)  # other weights than write_tuned_unet's
    file = work / "sdxl_finetune.safetensors"
    single_file(tuned, file, "sdxl")
    width = {"F32": 4, "F16": 2, "BF16": 2}
    with safe_open(str(file), framework="pt") as f:
        unet_bytes = sum(math.prod(f.get_slice(k).get_shape()) * width[f.get_slice(k).get_dtype()]
                         for k in f.keys() if k.startswith("model.diffusion_model."))
    said = json.loads(tensorfs("import", file, "--name", "local/sdxl-finetune", "--json"))
    added = said["new_bytes"]
    report.check(added <= 1.05 * unet_bytes, "sdxl: a fine-tune's single file adds its UNet alone (VAE and text "
                 "encoders stored once)", f"{added} new bytes; its UNet {unet_bytes}, the file {file.stat().st_size}")


def check_lacking_a_model(report, work, sdxl_file, tensorfs):
    """An SDXL checkpoint saved without one of its text encoders imports as it is, the
    warning naming SDXL (whose converter takes the encoder that is there) and what it lacks;
    the file reads back byte for byte."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    for gone, model in (("conditioner.embedders.0.transformer.", "text_encoder"),
                        ("conditioner.embedders.1.model.", "text_encoder_2")):
        with safe_open(str(sdxl_file), framework="pt") as f:
            kept = {k: f.get_tensor(k) for k in f.keys() if not k.startswith(gone)}
        file = work / f"sdxl_without_{model}.safetensors"
        save_file(kept, str(file))
        said = json.loads(tensorfs("import", file, "--name", f"local/sdxl-without-{model}", "--json"))
        warnings = " ".join(said["warnings"])
        want = f"like a checkpoint of sdxl.single_file without its {model} (no key starts with"
        report.check(want in warnings and "sdxl_refiner" not in warnings and said["lanes"][0].get("single_file") is None,
                     f"sdxl without its {model}: imported as it is, the warning naming SDXL and the model",
                     warnings)
        out = work / f"sdxl-without-{model}-out"
        tensorfs("export", f"local/sdxl-without-{model}", out)
        report.check((out / file.name).read_bytes() == file.read_bytes(),
                     f"sdxl without its {model}: exported byte for byte", str(out / file.name))


def check_composed(report, mnt, pipe, folder, tuned, lane):
    import torch
    from diffusers import DiffusionPipeline, StableDiffusionXLPipeline

    face = mnt / "local" / "sdxl-tuned" / "latest" / f"{lane}@diffusers"
    loaded = DiffusionPipeline.from_pretrained(str(face), local_files_only=True)
    report.check(type(loaded) is StableDiffusionXLPipeline, "composed: @diffusers loads as the pipeline joined",
                 type(loaded).__name__)
    want = state_dicts(pipe)
    want["unet"] = tuned.state_dict()
    bad = same_tensors(want, state_dicts(loaded))
    report.check(not bad, "composed: the tuned UNet and every other tensor of the folder", ", ".join(bad[:5]))
    reference = DiffusionPipeline.from_pretrained(str(folder), local_files_only=True)
    reference.unet = tuned
    a, b = one_step(reference), one_step(loaded)
    report.check(torch.equal(a, b), "composed: one inference step equals the folder's with the tuned UNet",
                 f"max |Δ| {float((a - b).abs().max()):.3g}")


def config_diff(ours, theirs, keys):
    """The values of `keys` that differ between two Diffusers configs, as (ours, theirs)."""
    def get(config, key):
        value = config[key]
        return list(value) if isinstance(value, (list, tuple)) else value

    return {k: (get(ours, k), get(theirs, k)) for k in keys if get(ours, k) != get(theirs, k)}


def check_unet_alone(report, mnt, family, unet, file, lane):
    from diffusers import UNet2DConditionModel

    base = mnt / "local" / f"{family}-unet" / "latest"
    face = base / f"{lane}@diffusers"
    listed = sorted(p.name for p in face.iterdir()) if face.is_dir() else []
    report.check(listed == ["config.json", "diffusion_pytorch_model.safetensors"],
                 f"{family} UNet alone: its @diffusers face is a model folder", str(listed))
    want = {"unet": unet.state_dict()}
    loaded = UNet2DConditionModel.from_pretrained(str(face), local_files_only=True)
    bad = same_tensors(want, {"unet": loaded.state_dict()})
    report.check(not bad, f"{family} UNet alone: from_pretrained(@diffusers) equals the UNet written",
                 ", ".join(bad[:5]))
    keys = ["cross_attention_dim", "attention_head_dim", "block_out_channels", "layers_per_block",
            "down_block_types", "up_block_types", "use_linear_projection", "transformer_layers_per_block",
            "addition_embed_type", "projection_class_embeddings_input_dim"]
    diff = config_diff(loaded.config, unet.config, keys)
    report.check(not diff, f"{family} UNet alone: the derived config equals the UNet's", str(diff))
    mounted = base / lane / file.name
    if UNETS_ALONE[family][1]:
        # diffusers reads a UNet only under the checkpoint's prefix.
        again = UNet2DConditionModel.from_single_file(str(mounted), config=str(face), local_files_only=True)
        bad = same_tensors(want, {"unet": again.state_dict()})
        report.check(not bad, f"{family} UNet alone: from_single_file(mounted file, config=@diffusers) agrees",
                     ", ".join(bad[:5]))


TEXT_ENCODERS_ALONE = {
    # name: (converter, class, hidden width, activation)
    "clip_l": ("clip_l.single_file", "CLIPTextModel", 768, "quick_gelu"),
    "clip_g": ("clip_g.single_file", "CLIPTextModelWithProjection", 1280, "gelu"),
}


def write_text_encoder_alone(name, path):
    """A small CLIP text encoder of TEXT_ENCODERS_ALONE's `name`, one layer, saved as ComfyUI's
    text_encoders files are (Transformers' keys); returns the model."""
    import torch
    import transformers
    from safetensors.torch import save_file

    _, cls, hidden, act = TEXT_ENCODERS_ALONE[name]
    torch.manual_seed(2)
    model = getattr(transformers, cls)(transformers.CLIPTextConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1, num_attention_heads=hidden // 64,
        vocab_size=1000, max_position_embeddings=77, hidden_act=act, projection_dim=hidden,
        bos_token_id=0, eos_token_id=2, pad_token_id=1))
    perturb(model)
    # ComfyUI's files name the text model's tensors `text_model.*`, which some Transformers
    # versions' state dicts leave out.
    sd = {k if k.startswith(("text_model.", "text_projection.")) else f"text_model.{k}": v.contiguous()
          for k, v in model.state_dict().items()}
    save_file(sd, str(path))
    return model.eval()


def check_text_encoder_alone(report, mnt, name, model, lane):
    import transformers

    _, cls, hidden, act = TEXT_ENCODERS_ALONE[name]
    face = mnt / "local" / f"{name}-alone" / "latest" / f"{lane}@diffusers"
    loaded = getattr(transformers, cls).from_pretrained(str(face), local_files_only=True)
    bad = same_tensors({"m": model.state_dict()}, {"m": loaded.state_dict()})
    report.check(not bad, f"{name} alone: {cls}.from_pretrained(@diffusers) equals the model written",
                 ", ".join(bad[:5]))
    config = loaded.config
    got = (config.hidden_size, config.hidden_act, config.num_attention_heads, config.num_hidden_layers)
    report.check(got == (hidden, act, hidden // 64, 1), f"{name} alone: its derived config", str(got))


def write_t5_alone(path):
    """A small T5 v1.1 encoder (gated GELU), saved as ComfyUI's t5xxl files are (Transformers'
    keys, the embedding once as `shared.weight`); returns the model."""
    import torch
    import transformers
    from safetensors.torch import save_file

    torch.manual_seed(3)
    model = transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=300, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        feed_forward_proj="gated-gelu"))
    perturb(model)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "encoder.embed_tokens.weight"}
    save_file(sd, str(path))
    return model.eval()


def check_t5_alone(report, mnt, model, lane):
    import torch
    import transformers

    face = mnt / "local" / "t5-alone" / "latest" / f"{lane}@diffusers"
    loaded = transformers.T5EncoderModel.from_pretrained(str(face), local_files_only=True).eval()
    bad = same_tensors({"m": model.state_dict()}, {"m": loaded.state_dict()})
    report.check(not bad, "t5 alone: T5EncoderModel.from_pretrained(@diffusers) equals the model written",
                 ", ".join(bad[:5]))
    ids = torch.tensor([[5, 17, 42, 1]])
    with torch.no_grad():
        same = torch.equal(model(ids).last_hidden_state, loaded(ids).last_hidden_state)
    report.check(same, "t5 alone: the same encoding as the model written")


TRANSFORMERS_ALONE = {
    # kind: (converter, class, whether the file's keys carry model.diffusion_model., the config
    # values read off the weights)
    "flux": ("flux_transformer.single_file", "FluxTransformer2DModel", True,
             ["in_channels", "num_layers", "num_single_layers", "attention_head_dim", "num_attention_heads",
              "joint_attention_dim", "pooled_projection_dim", "guidance_embeds", "patch_size", "axes_dims_rope"]),
    "sd3": ("sd3_transformer.single_file", "SD3Transformer2DModel", False,
            ["patch_size", "in_channels", "out_channels", "num_layers", "attention_head_dim", "num_attention_heads",
             "joint_attention_dim", "caption_projection_dim", "pooled_projection_dim", "pos_embed_max_size",
             "dual_attention_layers", "qk_norm"]),
}


def write_transformer_alone(report, kind, folder, path):
    """A small transformer of `kind`, saved as a Diffusers folder and as its original single
    file, which diffusers' own conversion must read back as the model; returns the model."""
    from safetensors.torch import load_file, save_file

    _, _, prefixed, _ = TRANSFORMERS_ALONE[kind]
    model = tiny_dit.build(kind, seed=11)
    model.save_pretrained(str(folder))
    original = tiny_dit.flux_original(model) if kind == "flux" else tiny_dit.sd3_original(model)
    prefix = "model.diffusion_model." if prefixed else ""
    save_file({prefix + k: v.contiguous() for k, v in original.items()}, str(path))
    width = model.config.num_attention_heads * model.config.attention_head_dim
    read = tiny_dit.diffusers_reading(kind, load_file(str(path)), width)
    bad = same_tensors({"m": model.state_dict()}, {"m": read})
    report.check(not bad, f"{kind} alone: diffusers' conversion reads the written file as the model",
                 ", ".join(bad[:5]))
    return model


def check_transformer_alone(report, mnt, kind, model, file, lane):
    import diffusers
    import torch
    from safetensors.torch import load_file

    _, cls, _, derived = TRANSFORMERS_ALONE[kind]
    base = mnt / "local" / f"{kind}-alone" / "latest"
    mounted = base / lane / file.name
    report.check(common.sha256_file(mounted) == common.sha256_file(file),
                 f"{kind} alone: the file is re-created byte for byte")
    shown = [p for p in (mnt / "@comfyui" / "diffusion_models").rglob("*.safetensors") if f"{kind}-alone" in str(p)]
    report.check(len(shown) == 1, f"{kind} alone: @comfyui/diffusion_models shows the file", str(shown))
    width = model.config.num_attention_heads * model.config.attention_head_dim
    read = tiny_dit.diffusers_reading(kind, load_file(str(mounted)), width)
    bad = same_tensors({"m": model.state_dict()}, {"m": read})
    report.check(not bad, f"{kind} alone: diffusers' conversion of the mounted file gives the model",
                 ", ".join(bad[:5]))
    face = base / f"{lane}@diffusers"
    listed = sorted(p.name for p in face.iterdir()) if face.is_dir() else []
    report.check(listed == ["config.json", "diffusion_pytorch_model.safetensors"],
                 f"{kind} alone: its @diffusers face is a model folder", str(listed))
    # In the dtype it was written in, as FLUX.1's users load it (bfloat16), not float32.
    dtype = next(model.parameters()).dtype
    loaded = getattr(diffusers, cls).from_pretrained(str(face), local_files_only=True, torch_dtype=dtype).eval()
    bad = same_tensors({"m": model.state_dict()}, {"m": loaded.state_dict()})
    report.check(not bad, f"{kind} alone: {cls}.from_pretrained(@diffusers) equals the model written",
                 ", ".join(bad[:5]))
    diff = config_diff(loaded.config, model.config, derived)
    report.check(not diff, f"{kind} alone: the derived config equals the model's", str(diff))
    a, b = tiny_dit.forward(model), tiny_dit.forward(loaded)
    report.check(torch.equal(a, b), f"{kind} alone: one forward pass from @diffusers equals the model's",
                 f"max |Δ| {float((a.float() - b.float()).abs().max()):.3g}")
    check_cozytensors(report, f"{kind} alone", mounted, "the imported file")


def check_model_folder_single(report, mnt, kind, model, file, lane):
    """The single-file face of the transformer's Diffusers model folder: the original file's
    arrays byte for byte (under ComfyUI's names), which diffusers' conversion reads as the
    model."""
    from safetensors.torch import load_file

    made = mnt / "local" / f"{kind}-transformer" / "latest" / f"{lane}@single" / "model.safetensors"
    if not made.is_file():
        report.check(False, f"{kind} model folder: @single/model.safetensors exists", str(made))
        return

    def bare(tensors):
        return {k.removeprefix("model.diffusion_model."): v for k, v in tensors.items()}

    ours, original = bare(load_file(str(made))), bare(load_file(str(file)))
    bad = sorted(set(ours) ^ set(original)) + [k for k in ours if k in original and not torch_equal(ours[k], original[k])]
    report.check(not bad, f"{kind} model folder: @single holds the original file's arrays, byte for byte",
                 ", ".join(bad[:5]))
    # diffusers' from_single_file takes FLUX.1's real widths as given; its conversion, at the
    # model's widths, is tiny_dit's.
    width = model.config.num_attention_heads * model.config.attention_head_dim
    read = tiny_dit.diffusers_reading(kind, load_file(str(made)), width)
    bad = same_tensors({"m": model.state_dict()}, {"m": read})
    report.check(not bad, f"{kind} model folder: diffusers' conversion of @single gives the model",
                 ", ".join(bad[:5]))


def write_fp8_transformer(path):
    """A small FLUX.1 transformer as fp8 checkpoints ship (flux1-dev-fp8: every matrix
    F8_E4M3, the vectors BF16), under `model.diffusion_model.`; returns the original arrays."""
    import torch
    from safetensors.torch import save_file

    model = tiny_dit.build("flux", seed=13)
    original = {k: v.to(torch.float8_e4m3fn if v.dim() > 1 else torch.bfloat16).contiguous()
                for k, v in tiny_dit.flux_original(model).items()}
    save_file({"model.diffusion_model." + k: v for k, v in original.items()}, str(path))
    return original


def check_fp8_transformer(report, mnt, original, file, lane):
    """The fp8 file re-created byte for byte, and its `@diffusers` folder loaded in BF16 (as
    fp8 checkpoints are run) equal to diffusers' conversion of the file, cast the same way."""
    import diffusers
    import torch

    base = mnt / "local" / "flux-fp8" / "latest"
    report.check(common.sha256_file(base / lane / file.name) == common.sha256_file(file),
                 "flux fp8 alone: the file is re-created byte for byte")
    face = base / f"{lane}@diffusers"
    loaded = diffusers.FluxTransformer2DModel.from_pretrained(str(face), local_files_only=True,
                                                              torch_dtype=torch.bfloat16)
    width = loaded.config.num_attention_heads * loaded.config.attention_head_dim
    read = {k: v.to(torch.bfloat16) for k, v in tiny_dit.diffusers_reading("flux", original, width).items()}
    bad = same_tensors({"m": read}, {"m": loaded.state_dict()})
    report.check(not bad, "flux fp8 alone: @diffusers loads in BF16 equal to diffusers' conversion of the file",
                 ", ".join(bad[:5]))


def torch_equal(a, b):
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def import_recognised(report, tensorfs, file, repo, converter, what):
    """Imports `file` as `repo`, checking that `converter` converts it without a warning;
    returns the import's report."""
    said = json.loads(tensorfs("import", file, "--name", repo, "--json"))
    converted = said["lanes"][0].get("single_file") or {}
    report.check(converted.get("converter") == converter and not said.get("warnings"),
                 f"{what}: recognised as {converter}", f"{converted}; warnings: {said.get('warnings')}")
    return said


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensorfs", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--tfs", type=Path, default=Path(sys.executable).with_name("tfs"),
                    help="the reference CLI (PyPI tensorfs 0.17.2), beside this Python by default")
    args = ap.parse_args()
    common.exit_on_signals()
    common.quiet()
    from diffusers import (StableDiffusion3Pipeline, StableDiffusionPipeline, StableDiffusionXLImg2ImgPipeline,
                           StableDiffusionXLPipeline)

    report = common.Report(TOOL)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    store = work / "store"

    def tensorfs(*a):
        p = subprocess.run([str(args.tensorfs), "--store", str(store), *map(str, a)], capture_output=True,
                           text=True, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            common.die(TOOL, f"tensorfs {' '.join(map(str, a))}: exit {p.returncode}: {p.stderr[-2000:]}")
        return p.stdout

    families = {}
    for family, build, cls, declared in (("sd1", build_sd1, StableDiffusionPipeline, []),
                                         ("sdxl", build_sdxl, StableDiffusionXLPipeline, []),
                                         ("refiner", build_refiner, StableDiffusionXLImg2ImgPipeline, []),
                                         ("sd2", build_sd2, StableDiffusionPipeline,
                                          ["--prediction-type", "v_prediction"]),
                                         ("sd3", build_sd3, StableDiffusion3Pipeline, [])):
        folder, file = work / f"{family}-folder", work / f"{family}_tiny.safetensors"
        pipe = build(folder, work)
        single_file(pipe, file, family)
        oracle = cls.from_single_file(str(file), config=str(folder), local_files_only=True, **WITHOUT[family])
        bad = same_tensors(state_dicts(pipe), state_dicts(oracle))
        report.check(not bad, f"{family}: diffusers reads the written single file as the folder", ", ".join(bad[:5]))
        tensorfs("import", folder, "--name", f"local/{family}", "--json")
        if declared:
            # Nothing in the file says what it predicts: the import asks, and stores nothing.
            before = tensorfs("ls", "--json")
            p = subprocess.run([str(args.tensorfs), "--store", str(store), "import", str(file), "--name",
                                f"local/{family}-single"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
            report.check(p.returncode != 0 and declared[0] in p.stderr and tensorfs("ls", "--json") == before,
                         f"{family}: without {declared[0]} the import asks for it and stores nothing",
                         p.stderr.strip()[-300:])
        said = json.loads(tensorfs("import", file, "--name", f"local/{family}-single", "--json", *declared))
        converted = said["lanes"][0].get("single_file") or {}
        want = {"sd1": ("sd1.single_file", None), "sdxl": ("sdxl.single_file", "epsilon"),
                "refiner": ("sdxl_refiner.single_file", "epsilon"), "sd2": ("sd2.single_file", "v_prediction"),
                "sd3": ("sd3.single_file", None)}
        report.check((converted.get("converter"), converted.get("prediction_type")) == want[family]
                     and converted.get("pipeline") == cls.__name__,
                     f"{family}: the import says how it converted the file", str(converted))
        added = said["new_bytes"] / file.stat().st_size
        report.check(added <= 0.02, f"{family}: the single file adds at most 2 % to the folder's store",
                     f"{said['new_bytes']} new bytes, {added:.2%} of {file.stat().st_size}")
        for w in said.get("warnings", []):
            report.note(f"import warning: {w}")
        if args.tfs.is_file():
            p = subprocess.run([str(args.tfs), "--store", str(store), "verify", f"local/{family}-single"],
                               capture_output=True, text=True, stdin=subprocess.DEVNULL)
            report.check(p.returncode == 0, f"{family}: the reference's tfs verify accepts the converted lane",
                         (p.stdout + p.stderr).strip().splitlines()[-1] if p.returncode else "")
        elif os.environ.get("CI") == "true":
            report.check(False, "the reference's tfs verify accepts the converted lane", f"no {args.tfs}")
        else:
            report.note(f"SKIPPED: the reference's tfs verify (no {args.tfs})")
        families[family] = (pipe, folder, file, cls, said["lanes"][0]["lane"])

    unets = {}
    for family, (converter, _, _) in UNETS_ALONE.items():
        file = work / f"{family}_unet.safetensors"
        unet = write_unet_alone(family, file)
        said = import_recognised(report, tensorfs, file, f"local/{family}-unet", converter, f"{family} UNet alone")
        unets[family] = (unet, file, said["lanes"][0]["lane"])
    encoders = {}
    for name, (converter, _, _, _) in TEXT_ENCODERS_ALONE.items():
        file = work / f"{name}.safetensors"
        model = write_text_encoder_alone(name, file)
        said = import_recognised(report, tensorfs, file, f"local/{name}-alone", converter, f"{name} alone")
        encoders[name] = (model, said["lanes"][0]["lane"])
    t5_file = work / "t5xxl.safetensors"
    t5 = write_t5_alone(t5_file)
    said = import_recognised(report, tensorfs, t5_file, "local/t5-alone", "t5.single_file", "t5 alone")
    t5_lane = said["lanes"][0]["lane"]
    check_fine_tune_shares(report, work, families["sdxl"][0], tensorfs)
    check_lacking_a_model(report, work, work / "sdxl_tiny.safetensors", tensorfs)
    tuned_file = work / "sdxl_tuned_unet.safetensors"
    tuned = write_tuned_unet(families["sdxl"][0], tuned_file)
    said = json.loads(tensorfs("import", tuned_file, "--name", "local/sdxl-tuned", "--pipeline", "local/sdxl",
                               "--json"))
    converted = said["lanes"][0].get("single_file") or {}
    report.check((converted.get("converter"), converted.get("pipeline"))
                 == ("sdxl_unet.single_file", "StableDiffusionXLPipeline") and not said.get("warnings"),
                 "composed: a tuned UNet alone joins the SDXL folder's pipeline", str(said))
    # The UNet's own chunks (each tensor padded to 4 KiB, which is much for a tiny model) and
    # the documents; none of the lane's other tensors.
    size, lane_bytes = tuned_file.stat().st_size, said["lanes"][0]["tensor_bytes"]
    added = said["new_bytes"] / size
    report.check(added <= 1.05 and lane_bytes > 2 * size,
                 "composed: it adds its own size, the rest of the lane's tensors stored once",
                 f"{said['new_bytes']} new bytes, {added:.2%} of the file's {size}; the lane's tensors: {lane_bytes}")
    tuned_lane = said["lanes"][0]["lane"]
    if args.tfs.is_file():
        p = subprocess.run([str(args.tfs), "--store", str(store), "verify", "local/sdxl-tuned"],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
        report.check(p.returncode == 0, "composed: the reference's tfs verify accepts the lane",
                     (p.stdout + p.stderr).strip().splitlines()[-1] if p.returncode else "")
    transformers_alone = {}
    for kind, (converter, _, _, _) in TRANSFORMERS_ALONE.items():
        folder, file = work / f"{kind}-transformer", work / f"{kind}_alone.safetensors"
        model = write_transformer_alone(report, kind, folder, file)
        folder_lane = json.loads(tensorfs("import", folder, "--name", f"local/{kind}-transformer",
                                          "--json"))["lanes"][0]["lane"]
        said = import_recognised(report, tensorfs, file, f"local/{kind}-alone", converter, f"{kind} alone")
        added = said["new_bytes"] / file.stat().st_size
        report.check(added <= 0.02, f"{kind} alone: the file adds at most 2 % to its Diffusers folder's store",
                     f"{said['new_bytes']} new bytes, {added:.2%} of {file.stat().st_size}")
        transformers_alone[kind] = (model, file, said["lanes"][0]["lane"], folder_lane)
    fp8_file = work / "flux1-fp8.safetensors"
    fp8 = write_fp8_transformer(fp8_file)
    said = import_recognised(report, tensorfs, fp8_file, "local/flux-fp8", "flux_transformer.single_file",
                             "flux fp8 alone (F8_E4M3)")
    fp8_lane = said["lanes"][0]["lane"]
    # A transformer whose widths are not the pipeline's (4 latent channels against its VAE's 16)
    # joins no pipeline: the pipeline would fail at its first step.
    p = subprocess.run([str(args.tensorfs), "--store", str(store), "import", str(work / "sd3_alone.safetensors"),
                        "--name", "local/sd3-joined", "--pipeline", "local/sd3"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    report.check(p.returncode != 0 and "in_channels is 4, and the pipeline's transformer has 16" in p.stderr,
                 "sd3 alone: a transformer of other widths than the pipeline's does not join it",
                 p.stderr.strip()[-300:])

    mnt = work / "mnt"
    with common.Mount(args.tensorfs, store, mnt, work / "mount.log"):
        for family, (pipe, folder, file, cls, lane) in families.items():
            check_mounted(report, mnt, family, pipe, folder, file, cls, lane)
            check_single_face(report, mnt, family, pipe, folder, file, cls)
        for family, (unet, file, lane) in unets.items():
            check_unet_alone(report, mnt, family, unet, file, lane)
        for name, (model, lane) in encoders.items():
            check_text_encoder_alone(report, mnt, name, model, lane)
        check_t5_alone(report, mnt, t5, t5_lane)
        check_composed(report, mnt, families["sdxl"][0], families["sdxl"][1], tuned, tuned_lane)
        for kind, (model, file, lane, folder_lane) in transformers_alone.items():
            check_transformer_alone(report, mnt, kind, model, file, lane)
            check_model_folder_single(report, mnt, kind, model, file, folder_lane)
        check_fp8_transformer(report, mnt, fp8, fp8_file, fp8_lane)
    return report.finish("single files convert to Diffusers components that diffusers loads exactly")


if __name__ == "__main__":
    sys.exit(main())
