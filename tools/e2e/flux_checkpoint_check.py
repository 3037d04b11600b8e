#!/usr/bin/env python3
"""Whole FLUX.1 checkpoints (as ComfyUI saves them) composed with a stored FluxPipeline.

    flux_checkpoint_check.py --tensorfs BIN --work DIR

A whole FLUX.1 checkpoint holds the transformer (`model.diffusion_model.`, original keys), the
16-channel VAE (`vae.`), CLIP-L (`text_encoders.clip_l.transformer.`) and the T5 encoder
(`text_encoders.t5xxl.transformer.`), but no tokenizer, and no T5 tokenizer ships offline. So
the file converts only joining a stored FluxPipeline (`import --pipeline`), which gives its
tokenizers and scheduler.

1. Builds a small FluxPipeline offline (random weights; FLUX.1-dev's guidance embedding, a
   16-channel VAE without quant convs and FLUX.1's scaling and shift, a CLIP-L-like quick-GELU
   text encoder, a small T5 v1.1 encoder, CLIP's tokenizer, a small Unigram T5 tokenizer, the
   flow-matching scheduler) and saves it as a Diffusers folder: `local/flux`.
2. Writes the folder's model, and a fine-tune, as whole checkpoints (every weight moved, a CLIP projection the pipeline
   does not use beside the encoder, as ComfyUI's files carry one) by this script's own key map,
   checked against diffusers' own conversion: `FluxPipeline.from_single_file(<file>,
   config=<folder>)` reads its VAE and text encoders, `tiny_dit.diffusers_reading` its
   transformer, as the fine-tune.
3. Imports the file without `--pipeline`: it stays as it is, the warning saying why and naming
   `--pipeline`. Imports it with `--pipeline` of a non-Flux pipeline: refused, nothing stored.
   Imports it with `--pipeline local/flux`: converted by `flux.single_file` as a FluxPipeline,
   adding the fine-tune's own weights and no more (the tokenizers and scheduler are the
   folder's, borrowed); the folder's own model as a checkpoint adds at most 2 % of its size
   (its components are the folder's chunks). The reference's `tfs verify` accepts the lane.
4. Mounts the store: the file is re-created byte for byte and `@comfyui` shows it in
   `checkpoints/`, its Diffusers face in `diffusers/`; `<lane>@diffusers` loads offline
   as FluxPipeline with every tensor the fine-tune's and the folder's tokenizers;
   `from_single_file(<mounted file>, config=<lane>@diffusers)` agrees; one inference step from
   `<lane>@diffusers` equals one from the folder's pipeline with the fine-tune's models put in.

Prints PASS/FAIL lines and a closing `RESULT:` line; exits 0 only when every check passed.
"""

import argparse
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import e2e_common as common  # noqa: E402
import single_file_check as sfc  # noqa: E402
import tiny_dit  # noqa: E402

common.go_offline()
TOOL = "flux_checkpoint_check"
MODELS = ("transformer", "vae", "text_encoder", "text_encoder_2")


def t5_tokenizer():
    """A small T5 tokenizer (SentencePiece Unigram, as T5's is) made offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [(chr(c), -3.0) for c in range(ord("a"), ord("z") + 1)]
    pieces += [(f"▁{w}", -1.0) for w in ("a", "photo", "of", "cat")]
    model = Tokenizer(models.Unigram(pieces, unk_id=2))
    model.pre_tokenizer = pre_tokenizers.Metaspace()
    return T5TokenizerFast(tokenizer_object=model, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                           extra_ids=0, model_max_length=32)


def build_flux(folder, scratch):
    """A small FluxPipeline, saved to `folder`."""
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel

    vocab, merges = sfc.clip_tokenizer_files(scratch / "tok")
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77, pad_token="<|endoftext|>")
    torch.manual_seed(0)
    # Latents packed 2 × 2: the transformer takes 4 × the VAE's 16 channels. Its context is the
    # T5's width, its pooled input CLIP's.
    transformer = FluxTransformer2DModel(**dict(tiny_dit.FLUX, in_channels=64, joint_attention_dim=32,
                                                pooled_projection_dim=64))
    vae = AutoencoderKL(
        block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=16, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=32, sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159, force_upcast=True,
        use_quant_conv=False, use_post_quant_conv=False)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1, vocab_size=49408,
        max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768, bos_token_id=0, eos_token_id=2,
        pad_token_id=1))
    text_encoder_2 = T5EncoderModel(T5Config(vocab_size=300, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                             feed_forward_proj="gated-gelu"))
    sfc.perturb(transformer, vae, text_encoder, text_encoder_2)
    pipe = FluxPipeline(transformer=transformer.eval(), scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                        vae=vae.eval(), text_encoder=text_encoder.eval(), tokenizer=tokenizer,
                        text_encoder_2=text_encoder_2.eval(), tokenizer_2=t5_tokenizer())
    sfc.save(pipe, folder, scratch)
    return pipe


def write_checkpoint(pipe, path, tune):
    """`pipe`'s models, with every weight moved if `tune` (a fine-tune), written as ComfyUI saves
    a whole FLUX.1 checkpoint; returns the models written, by name."""
    import torch
    from safetensors.torch import save_file

    tuned = {name: copy.deepcopy(getattr(pipe, name)) for name in MODELS}
    if tune:
        sfc.perturb(*tuned.values())
    sd = {"model.diffusion_model." + k: t for k, t in tiny_dit.flux_original(tuned["transformer"]).items()}
    vae = sfc.ldm_vae(tuned["vae"].state_dict(), len(tuned["vae"].config.block_out_channels))
    sd.update({"vae." + k.removeprefix("first_stage_model."): t for k, t in vae.items()})
    sd.update(sfc.hf_clip("text_encoders.clip_l.transformer.", tuned["text_encoder"]))
    width = tuned["text_encoder"].config.hidden_size
    sd["text_encoders.clip_l.transformer.text_projection.weight"] = torch.randn(
        width, width, generator=torch.Generator().manual_seed(7))
    t5 = tuned["text_encoder_2"].state_dict()
    sd.update({"text_encoders.t5xxl.transformer." + k: t for k, t in t5.items() if k != "encoder.embed_tokens.weight"})
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return {name: m.eval() for name, m in tuned.items()}


def tuned_dicts(tuned):
    return {name: m.state_dict() for name, m in tuned.items()}


def models_of(pipe):
    return {name: getattr(pipe, name).state_dict() for name in MODELS}


# The T5's input embedding is its `shared.weight`, tied; diffusers' single-file loading leaves
# the tied copy unloaded (a meta tensor), so the comparisons of its loads go without it.
TIED = ("text_encoder_2", "encoder.embed_tokens.weight")


def untied(dicts):
    return {name: {k: t for k, t in sd.items() if (name, k) != TIED} for name, sd in dicts.items()}


def check_written(report, folder, file, tuned):
    """diffusers' own conversion reads the written file as the fine-tune."""
    from diffusers import FluxPipeline
    from safetensors.torch import load_file

    checkpoint = load_file(str(file))
    inner = {k.removeprefix("model.diffusion_model."): t for k, t in checkpoint.items()
             if k.startswith("model.diffusion_model.")}
    config = tuned["transformer"].config
    read = tiny_dit.diffusers_reading("flux", inner, config.num_attention_heads * config.attention_head_dim)
    bad = sfc.same_tensors({"transformer": tuned["transformer"].state_dict()}, {"transformer": read})
    # Its transformer conversion fixes FLUX.1's real widths, so the tuned transformer is given.
    oracle = FluxPipeline.from_single_file(str(file), config=str(folder), local_files_only=True,
                                           transformer=tuned["transformer"])
    bad += sfc.same_tensors(untied(tuned_dicts(tuned)), untied(models_of(oracle)))
    report.check(not bad, "diffusers reads the written checkpoint as the fine-tune", ", ".join(bad[:5]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensorfs", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--tfs", type=Path, default=Path(sys.executable).with_name("tfs"),
                    help="the reference CLI (PyPI tensorfs 0.17.2), beside this Python by default")
    args = ap.parse_args()
    common.exit_on_signals()
    common.quiet()
    import torch
    from diffusers import DiffusionPipeline, FluxPipeline

    report = common.Report(TOOL)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    store = work / "store"

    def run(*a):
        return subprocess.run([str(args.tensorfs), "--store", str(store), *map(str, a)], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)

    def tensorfs(*a):
        p = run(*a)
        if p.returncode != 0:
            common.die(TOOL, f"tensorfs {' '.join(map(str, a))}: exit {p.returncode}: {p.stderr[-2000:]}")
        return p.stdout

    folder, file = work / "flux-folder", work / "flux1-tuned.safetensors"
    pipe = build_flux(folder, work)
    tuned = write_checkpoint(pipe, file, tune=True)
    check_written(report, folder, file, tuned)
    tensorfs("import", folder, "--name", "local/flux")
    # The folder's own model as a checkpoint: its components are the folder's chunks.
    same = work / "flux1.safetensors"
    write_checkpoint(pipe, same, tune=False)
    said = json.loads(tensorfs("import", same, "--name", "local/flux-same", "--pipeline", "local/flux", "--json"))
    added = said["new_bytes"] / same.stat().st_size
    report.check(added <= 0.02, "the folder's own model as a checkpoint adds at most 2 % to its store",
                 f"{said['new_bytes']} new bytes, {added:.2%} of {same.stat().st_size}")
    sfc.build_sd1(work / "sd1-folder", work)
    tensorfs("import", work / "sd1-folder", "--name", "local/sd1")

    said = json.loads(tensorfs("import", file, "--name", "local/flux-alone", "--json"))
    warnings = " ".join(said.get("warnings", []))
    report.check(said["lanes"][0].get("single_file") is None and "T5 tokenizer" in warnings
                 and "--pipeline" in warnings,
                 "without --pipeline the checkpoint stays as it is, the warning naming --pipeline", warnings)
    before = tensorfs("ls", "--json")
    p = run("import", file, "--name", "local/flux-sd1", "--pipeline", "local/sd1")
    report.check(p.returncode != 0 and "it is a StableDiffusionPipeline, and flux.single_file makes a FluxPipeline"
                 in p.stderr and tensorfs("ls", "--json") == before,
                 "joining another class of pipeline is refused and stores nothing", p.stderr.strip()[-300:])

    said = json.loads(tensorfs("import", file, "--name", "local/flux-tuned", "--pipeline", "local/flux", "--json"))
    converted = said["lanes"][0].get("single_file") or {}
    report.check((converted.get("converter"), converted.get("pipeline")) == ("flux.single_file", "FluxPipeline")
                 and not said.get("warnings"), "with --pipeline local/flux it converts as a FluxPipeline", str(said))
    # Every weight is the fine-tune's own: its bytes, each tensor padded to 4 KiB, and the documents.
    added = said["new_bytes"] / file.stat().st_size
    report.check(added <= 1.05, "the checkpoint adds its own weights, the tokenizers and scheduler borrowed",
                 f"{said['new_bytes']} new bytes, {added:.2%} of the file's {file.stat().st_size}")
    lane = said["lanes"][0]["lane"]
    if args.tfs.is_file():
        p = subprocess.run([str(args.tfs), "--store", str(store), "verify", "local/flux-tuned"],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
        report.check(p.returncode == 0, "the reference's tfs verify accepts the composed lane",
                     (p.stdout + p.stderr).strip().splitlines()[-1] if p.returncode else "")
    elif os.environ.get("CI") == "true":
        report.check(False, "the reference's tfs verify accepts the composed lane", f"no {args.tfs}")
    else:
        report.note(f"SKIPPED: the reference's tfs verify (no {args.tfs})")

    mnt = work / "mnt"
    with common.Mount(args.tensorfs, store, mnt, work / "mount.log"):
        base = mnt / "local" / "flux-tuned" / "latest"
        mounted = base / lane / file.name
        report.check(common.sha256_file(mounted) == common.sha256_file(file), "the file is re-created byte for byte")
        comfy = mnt / "@comfyui"
        shown = [p for p in (comfy / "checkpoints").rglob("*.safetensors") if "flux-tuned" in str(p)]
        report.check(len(shown) == 1 and common.sha256_file(shown[0]) == common.sha256_file(file),
                     "@comfyui/checkpoints shows the file", str(shown))
        shown = [p.parent for p in (comfy / "diffusers").rglob("model_index.json") if "flux-tuned" in str(p)]
        report.check(len(shown) == 1, "@comfyui/diffusers shows the Diffusers face", str(shown))
        face = base / f"{lane}@diffusers"
        loaded = DiffusionPipeline.from_pretrained(str(face), local_files_only=True)
        report.check(type(loaded) is FluxPipeline, "@diffusers loads as FluxPipeline", type(loaded).__name__)
        bad = sfc.same_tensors(tuned_dicts(tuned), models_of(loaded))
        report.check(not bad, "every tensor of @diffusers is the fine-tune's", ", ".join(bad[:5]))
        prompt = "a photo of a cat"
        same = all(getattr(loaded, t)(prompt).input_ids == getattr(pipe, t)(prompt).input_ids
                   for t in ("tokenizer", "tokenizer_2"))
        report.check(same, "its tokenizers are the folder's", str(loaded.tokenizer_2(prompt).input_ids))
        again = FluxPipeline.from_single_file(str(mounted), config=str(face), local_files_only=True,
                                              transformer=loaded.transformer)
        bad = sfc.same_tensors(untied(tuned_dicts(tuned)), untied(models_of(again)))
        report.check(not bad, "from_single_file(mounted file, config=@diffusers) is the fine-tune",
                     ", ".join(bad[:5]))
        reference = DiffusionPipeline.from_pretrained(str(folder), local_files_only=True)
        for name, model in tuned.items():
            setattr(reference, name, model)

        def step(p):
            return p(prompt, num_inference_steps=1, output_type="latent", height=32, width=32,
                     max_sequence_length=32, generator=torch.Generator().manual_seed(0)).images

        a, b = step(reference), step(loaded)
        report.check(torch.equal(a, b), "one inference step from @diffusers equals the folder's with the fine-tune",
                     f"max |Δ| {float((a - b).abs().max()):.3g}")
        sfc.check_cozytensors(report, "flux", mounted, "the imported file")
    return report.finish("a whole FLUX.1 checkpoint joins a stored FluxPipeline and loads exactly")


if __name__ == "__main__":
    sys.exit(main())
