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
   Imports it with `--pipeline` of the folder: converted by `flux.single_file` or
   `sd3_t5.single_file`, adding the fine-tune's own weights and no more (the tokenizers and scheduler are the
   folder's, borrowed); the folder's own model as a checkpoint adds at most 2 % of its size
   (its components are the folder's chunks). The reference's `tfs verify` accepts the lane.
4. Mounts the store: the file is re-created byte for byte and `@comfyui` shows it in
   `checkpoints/`, its Diffusers face in `diffusers/`; `<lane>@diffusers` loads offline
   as the pipeline with every tensor the fine-tune's and the folder's tokenizers;
   `from_single_file(<mounted file>, config=<lane>@diffusers)` agrees; one inference step from
   `<lane>@diffusers` equals one from the folder's pipeline with the fine-tune's models put in.
5. Refuses, storing nothing, FLUX.1 checkpoints whose models do not fit each other (a T5
   narrower than the transformer's context) or the pipeline they join (a schnell transformer,
   without guidance, joining a dev pipeline), and joining a pipeline without a T5 tokenizer.
6. Composes a FluxPipeline from separately imported parts (`--pipeline local/flux --component
   vae=… --component text_encoder_2=…`): a tuned transformer alone, as ComfyUI's
   diffusion_models holds one, joined with a tuned VAE saved as a Diffusers model folder and a
   tuned T5 alone as ComfyUI's text_encoders hold one. `<lane>@diffusers` loads with those
   three models and the folder's CLIP, tokenizers and scheduler; one inference step equals the
   folder's pipeline with the three put in.

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
TOOL = "joined_checkpoint_check"


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


def build_sd3(folder, scratch):
    """single_file_check.py's small SD3.5-like pipeline with a T5 (as wide as the transformer's
    context) and a T5 tokenizer, saved to `folder`."""
    from diffusers import StableDiffusion3Pipeline
    from transformers import T5Config, T5EncoderModel

    pipe = sfc.build_sd3(scratch / "sd3-without-t5", scratch)
    t5 = T5EncoderModel(T5Config(vocab_size=300, d_model=pipe.transformer.config.joint_attention_dim, d_kv=8, d_ff=64,
                                 num_layers=1, num_heads=4, feed_forward_proj="gated-gelu"))
    sfc.perturb(t5)
    pipe = StableDiffusion3Pipeline(**{**pipe.components, "text_encoder_3": t5.eval(), "tokenizer_3": t5_tokenizer()})
    sfc.save(pipe, folder, scratch)
    return pipe


def t5_keys(prefix, model):
    """A T5 encoder's tensors as ComfyUI's files hold them: the embedding once, `shared.weight`."""
    return {prefix + k: t for k, t in model.state_dict().items() if k != "encoder.embed_tokens.weight"}


def flux_checkpoint(models):
    import torch

    sd = {"model.diffusion_model." + k: t for k, t in tiny_dit.flux_original(models["transformer"]).items()}
    vae = sfc.ldm_vae(models["vae"].state_dict(), len(models["vae"].config.block_out_channels))
    sd.update({"vae." + k.removeprefix("first_stage_model."): t for k, t in vae.items()})
    sd.update(sfc.hf_clip("text_encoders.clip_l.transformer.", models["text_encoder"]))
    width = models["text_encoder"].config.hidden_size
    sd["text_encoders.clip_l.transformer.text_projection.weight"] = torch.randn(
        width, width, generator=torch.Generator().manual_seed(7))
    sd.update(t5_keys("text_encoders.t5xxl.transformer.", models["text_encoder_2"]))
    return sd


def sd3_checkpoint(models):
    sd = {"model.diffusion_model." + k: t for k, t in tiny_dit.sd3_original(models["transformer"]).items()}
    sd.update(sfc.ldm_vae(models["vae"].state_dict(), len(models["vae"].config.block_out_channels)))
    sd.update(sfc.hf_clip("text_encoders.clip_l.transformer.", models["text_encoder"]))
    sd.update(sfc.hf_clip("text_encoders.clip_g.transformer.", models["text_encoder_2"]))
    sd.update(t5_keys("text_encoders.t5xxl.transformer.", models["text_encoder_3"]))
    return sd


class Kind:
    """One kind of whole checkpoint: how its pipeline is built and its file written, what
    converts it, and what loads it."""

    def __init__(self, name, pipeline, converter, models, build, checkpoint, step_args):
        self.name, self.pipeline, self.converter = name, pipeline, converter
        self.models, self.build, self.checkpoint, self.step_args = models, build, checkpoint, step_args
        # The T5's input embedding is its `shared.weight`, tied; diffusers' single-file loading
        # leaves the tied copy unloaded (a meta tensor), so comparisons of its loads go without.
        self.tied = (models[-1], "encoder.embed_tokens.weight")

    def pipeline_class(self):
        import diffusers

        return getattr(diffusers, self.pipeline)

    def write(self, pipe, path, tune):
        """`pipe`'s models, every weight moved if `tune` (a fine-tune), written as a whole
        checkpoint; returns the models written, by name."""
        import torch
        from safetensors.torch import save_file

        models = {name: copy.deepcopy(getattr(pipe, name)) for name in self.models}
        if tune:
            sfc.perturb(*models.values())
            if self.name == "sd3":
                # SD3's CLIP-L goes unprojected: Diffusers' identity, which the import makes.
                width = models["text_encoder"].config.hidden_size
                with torch.no_grad():
                    models["text_encoder"].text_projection.weight.copy_(torch.eye(width))
        save_file({k: v.contiguous() for k, v in self.checkpoint(models).items()}, str(path))
        return {name: m.eval() for name, m in models.items()}

    def of(self, pipe, untie=False):
        dicts = {name: getattr(pipe, name).state_dict() for name in self.models}
        if untie:
            dicts = {n: {k: t for k, t in sd.items() if (n, k) != self.tied} for n, sd in dicts.items()}
        return dicts

    def from_single_file(self, file, config, transformer):
        """diffusers' own reading of a whole checkpoint (FLUX.1's transformer given: its
        conversion fixes FLUX.1's real widths)."""
        given = {"transformer": transformer} if self.name == "flux" else {}
        return self.pipeline_class().from_single_file(str(file), config=str(config), local_files_only=True, **given)

    def step(self, pipe):
        import torch

        return pipe("a photo of a cat", num_inference_steps=1, output_type="latent", height=32, width=32,
                    generator=torch.Generator().manual_seed(0), **self.step_args).images


KINDS = (
    Kind("flux", "FluxPipeline", "flux.single_file", ("transformer", "vae", "text_encoder", "text_encoder_2"),
         build_flux, flux_checkpoint, {"max_sequence_length": 32}),
    Kind("sd3", "StableDiffusion3Pipeline", "sd3_t5.single_file",
         ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"),
         build_sd3, sd3_checkpoint, {"max_sequence_length": 32, "guidance_scale": 7.5}),
)


def check_written(report, kind, folder, file, tuned):
    """diffusers' own conversion reads the written file as the fine-tune."""
    from safetensors.torch import load_file

    bad = []
    if kind.name == "flux":
        inner = {k.removeprefix("model.diffusion_model."): t for k, t in load_file(str(file)).items()
                 if k.startswith("model.diffusion_model.")}
        config = tuned["transformer"].config
        read = tiny_dit.diffusers_reading("flux", inner, config.num_attention_heads * config.attention_head_dim)
        bad = sfc.same_tensors({"transformer": tuned["transformer"].state_dict()}, {"transformer": read})
    oracle = kind.from_single_file(file, folder, tuned["transformer"])
    want = {n: {k: t for k, t in m.state_dict().items() if (n, k) != kind.tied} for n, m in tuned.items()}
    bad += sfc.same_tensors(want, kind.of(oracle, untie=True))
    report.check(not bad, f"{kind.name}: diffusers reads the written checkpoint as the fine-tune", ", ".join(bad[:5]))


def import_kind(report, kind, work, store_cli, tfs):
    """Builds, writes and imports `kind`'s pipeline and checkpoints (steps 1–3); returns what the
    mounted checks need."""
    tensorfs, run = store_cli
    folder, file = work / f"{kind.name}-folder", work / f"{kind.name}-tuned.safetensors"
    pipe = kind.build(folder, work)
    tuned = kind.write(pipe, file, tune=True)
    check_written(report, kind, folder, file, tuned)
    tensorfs("import", folder, "--name", f"local/{kind.name}")
    # The folder's own model as a checkpoint: its components are the folder's chunks.
    same = work / f"{kind.name}-same.safetensors"
    kind.write(pipe, same, tune=False)
    said = json.loads(tensorfs("import", same, "--name", f"local/{kind.name}-same", "--pipeline",
                               f"local/{kind.name}", "--json"))
    added = said["new_bytes"] / same.stat().st_size
    report.check(added <= 0.02, f"{kind.name}: the folder's own model as a checkpoint adds at most 2 % to its store",
                 f"{said['new_bytes']} new bytes, {added:.2%} of {same.stat().st_size}")

    said = json.loads(tensorfs("import", file, "--name", f"local/{kind.name}-alone", "--json"))
    warnings = " ".join(said.get("warnings", []))
    alone = (said["lanes"][0].get("single_file") or {}).get("converter")
    report.check(alone == {"flux": None, "sd3": "sd3.single_file"}[kind.name] and "T5 tokenizer" in warnings
                 and f"{kind.converter}:" in warnings and "--pipeline" in warnings,
                 f"{kind.name}: without --pipeline it converts as {alone}, the warning naming --pipeline", warnings)
    before = tensorfs("ls", "--json")
    p = run("import", file, "--name", f"local/{kind.name}-sd1", "--pipeline", "local/sd1")
    report.check(p.returncode != 0 and f"it is a StableDiffusionPipeline, and {kind.converter} makes a {kind.pipeline}"
                 in p.stderr and tensorfs("ls", "--json") == before,
                 f"{kind.name}: joining another class of pipeline is refused and stores nothing",
                 p.stderr.strip()[-300:])

    p = run("import", file, "--name", f"local/{kind.name}-declared", "--pipeline", f"local/{kind.name}",
            "--prediction-type", "epsilon")
    report.check(p.returncode != 0 and "takes its scheduler" in p.stderr and tensorfs("ls", "--json") == before,
                 f"{kind.name}: --prediction-type is refused when the joined pipeline's scheduler says it",
                 p.stderr.strip()[-300:])
    if kind.name == "sd3":
        p = run("import", file, "--name", f"local/{kind.name}-declared", "--prediction-type", "epsilon")
        report.check(p.returncode != 0 and "flow matching" in p.stderr and tensorfs("ls", "--json") == before,
                     "sd3: --prediction-type is refused without a pipeline too: its scheduler has none",
                     p.stderr.strip()[-300:])
    name = f"local/{kind.name}-tuned"
    said = json.loads(tensorfs("import", file, "--name", name, "--pipeline", f"local/{kind.name}", "--json"))
    converted = said["lanes"][0].get("single_file") or {}
    report.check((converted.get("converter"), converted.get("pipeline")) == (kind.converter, kind.pipeline)
                 and not said.get("warnings"), f"{kind.name}: joining its folder it converts as {kind.converter}",
                 str(said))
    # Every weight is the fine-tune's own: its bytes, each tensor padded to 4 KiB, and the documents.
    added = said["new_bytes"] / file.stat().st_size
    report.check(added <= 1.05, f"{kind.name}: the checkpoint adds its own weights, the tokenizers and scheduler "
                 "borrowed", f"{said['new_bytes']} new bytes, {added:.2%} of the file's {file.stat().st_size}")
    if tfs.is_file():
        p = subprocess.run([str(tfs), "--store", str(work / "store"), "verify", name],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
        report.check(p.returncode == 0, f"{kind.name}: the reference's tfs verify accepts the joined lane",
                     (p.stdout + p.stderr).strip().splitlines()[-1] if p.returncode else "")
    elif os.environ.get("CI") == "true":
        report.check(False, "the reference's tfs verify accepts the joined lane", f"no {tfs}")
    else:
        report.note(f"SKIPPED: the reference's tfs verify (no {tfs})")
    return pipe, folder, file, tuned, said["lanes"][0]["lane"]


def check_mounted(report, kind, mnt, pipe, folder, file, tuned, lane):
    """Step 4 on the mount."""
    import torch
    from diffusers import DiffusionPipeline

    base = mnt / "local" / f"{kind.name}-tuned" / "latest"
    mounted = base / lane / file.name
    report.check(common.sha256_file(mounted) == common.sha256_file(file),
                 f"{kind.name}: the file is re-created byte for byte")
    comfy = mnt / "@comfyui"
    shown = [p for p in (comfy / "checkpoints").rglob("*.safetensors") if f"{kind.name}-tuned" in str(p)]
    report.check(len(shown) == 1 and common.sha256_file(shown[0]) == common.sha256_file(file),
                 f"{kind.name}: @comfyui/checkpoints shows the file", str(shown))
    shown = [p.parent for p in (comfy / "diffusers").rglob("model_index.json") if f"{kind.name}-tuned" in str(p)]
    report.check(len(shown) == 1, f"{kind.name}: @comfyui/diffusers shows the Diffusers face", str(shown))
    face = base / f"{lane}@diffusers"
    loaded = DiffusionPipeline.from_pretrained(str(face), local_files_only=True)
    report.check(type(loaded).__name__ == kind.pipeline, f"{kind.name}: @diffusers loads as {kind.pipeline}",
                 type(loaded).__name__)
    bad = sfc.same_tensors({n: m.state_dict() for n, m in tuned.items()}, kind.of(loaded))
    report.check(not bad, f"{kind.name}: every tensor of @diffusers is the fine-tune's", ", ".join(bad[:5]))
    prompt = "a photo of a cat"
    tokenizers = [t for t in ("tokenizer", "tokenizer_2", "tokenizer_3") if hasattr(pipe, t)]
    same = all(getattr(loaded, t)(prompt).input_ids == getattr(pipe, t)(prompt).input_ids for t in tokenizers)
    report.check(same, f"{kind.name}: its tokenizers are the folder's",
                 str(getattr(loaded, tokenizers[-1])(prompt).input_ids))
    again = kind.from_single_file(mounted, face, loaded.transformer)
    want = {n: {k: t for k, t in m.state_dict().items() if (n, k) != kind.tied} for n, m in tuned.items()}
    bad = sfc.same_tensors(want, kind.of(again, untie=True))
    report.check(not bad, f"{kind.name}: from_single_file(mounted file, config=@diffusers) is the fine-tune",
                 ", ".join(bad[:5]))
    reference = DiffusionPipeline.from_pretrained(str(folder), local_files_only=True)
    for name, model in tuned.items():
        setattr(reference, name, model)
    a, b = kind.step(reference), kind.step(loaded)
    report.check(torch.equal(a, b), f"{kind.name}: one inference step from @diffusers equals the folder's with the "
                 "fine-tune", f"max |Δ| {float((a - b).abs().max()):.3g}")
    sfc.check_cozytensors(report, kind.name, mounted, "the imported file")


def check_misfits(report, work, store_cli, pipe, folder):
    """FLUX.1 checkpoints whose models do not fit each other, or the pipeline they join, and a
    pipeline without the T5 tokenizer the file needs: each refused, storing nothing."""
    import torch
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from safetensors.torch import save_file
    from transformers import T5Config, T5EncoderModel

    tensorfs, run = store_cli
    models = {name: getattr(pipe, name) for name in KINDS[0].models}
    torch.manual_seed(5)
    narrow_t5 = T5EncoderModel(T5Config(vocab_size=300, d_model=48, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                        feed_forward_proj="gated-gelu"))
    schnell = FluxTransformer2DModel(**dict(pipe.transformer.config, guidance_embeds=False))
    untokenized = work / "flux-no-tokenizer-2"
    FluxPipeline(**{**pipe.components, "tokenizer_2": None}).save_pretrained(untokenized)
    tensorfs("import", untokenized, "--name", "local/flux-no-tokenizer-2")
    cases = [
        ({"text_encoder_2": narrow_t5}, "local/flux",
         "its models do not fit each other: transformer.joint_attention_dim is 32, and text_encoder_2.d_model is 48",
         "a T5 narrower than the transformer's context"),
        ({"transformer": schnell}, "local/flux", "transformer's guidance_embeds is false, and the pipeline's "
         "transformer has true", "a schnell checkpoint (no guidance) joining a dev pipeline"),
        ({}, "local/flux-no-tokenizer-2", "it has no tokenizer_2, which flux.single_file takes from it",
         "a pipeline without a T5 tokenizer"),
    ]
    for i, (swapped, base, why, what) in enumerate(cases):
        file = work / f"flux-misfit-{i}.safetensors"
        save_file({k: v.contiguous() for k, v in flux_checkpoint({**models, **swapped}).items()}, str(file))
        before = tensorfs("ls", "--json")
        p = run("import", file, "--name", f"local/flux-misfit-{i}", "--pipeline", base)
        report.check(p.returncode != 0 and why in p.stderr and tensorfs("ls", "--json") == before,
                     f"flux: {what} is refused, storing nothing", p.stderr.strip()[-300:])


def import_composed(report, work, tensorfs, pipe):
    """Step 5: a tuned FLUX.1 transformer alone (ComfyUI's diffusion_models file), a tuned VAE
    saved as a Diffusers model folder and a tuned T5 alone (ComfyUI's text_encoders file), each
    imported on its own, composed with the folder's pipeline; returns the tuned models."""
    from safetensors.torch import save_file

    tuned = {name: copy.deepcopy(getattr(pipe, name)) for name in ("transformer", "vae", "text_encoder_2")}
    sfc.perturb(*tuned.values())
    original = tiny_dit.flux_original(tuned["transformer"])
    transformer = work / "flux1-transformer.safetensors"
    save_file({"model.diffusion_model." + k: v.contiguous() for k, v in original.items()}, str(transformer))
    tuned["vae"].save_pretrained(str(work / "flux-vae"))
    t5 = work / "t5xxl.safetensors"
    save_file({k: v.contiguous() for k, v in t5_keys("", tuned["text_encoder_2"]).items()}, str(t5))
    tensorfs("import", work / "flux-vae", "--name", "local/flux-vae")
    tensorfs("import", t5, "--name", "local/t5xxl")
    said = json.loads(tensorfs("import", transformer, "--name", "local/flux-composed", "--pipeline", "local/flux",
                               "--component", "vae=local/flux-vae", "--component", "text_encoder_2=local/t5xxl",
                               "--json"))
    converted = said["lanes"][0].get("single_file") or {}
    report.check((converted.get("converter"), converted.get("pipeline"))
                 == ("flux_transformer.single_file", "FluxPipeline") and not said.get("warnings"),
                 "composed: a transformer alone joins the FluxPipeline with a VAE folder and a T5 file of its own",
                 str(said))
    return {name: m.eval() for name, m in tuned.items()}, said["lanes"][0]["lane"]


def check_composed(report, mnt, pipe, folder, tuned, lane):
    """Step 5 on the mount: the composed pipeline's models are the transformer file's, the VAE
    folder's and the T5 file's, the rest the folder's."""
    from diffusers import DiffusionPipeline

    kind = KINDS[0]
    face = mnt / "local" / "flux-composed" / "latest" / f"{lane}@diffusers"
    loaded = DiffusionPipeline.from_pretrained(str(face), local_files_only=True)
    want = {name: getattr(pipe, name).state_dict() for name in kind.models}
    want.update({name: m.state_dict() for name, m in tuned.items()})
    bad = sfc.same_tensors(want, kind.of(loaded))
    report.check(not bad, "composed: the transformer, VAE and T5 are the files', CLIP the folder's",
                 ", ".join(bad[:5]))
    reference = DiffusionPipeline.from_pretrained(str(folder), local_files_only=True)
    for name, model in tuned.items():
        setattr(reference, name, model)
    a, b = kind.step(reference), kind.step(loaded)
    report.check(a.equal(b), "composed: one inference step equals the folder's with the three models put in",
                 f"max |Δ| {float((a - b).abs().max()):.3g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensorfs", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--tfs", type=Path, default=Path(sys.executable).with_name("tfs"),
                    help="the reference CLI (PyPI tensorfs 0.17.2), beside this Python by default")
    args = ap.parse_args()
    common.exit_on_signals()
    common.quiet()
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

    # A pipeline of another class, which no whole checkpoint here may join.
    sfc.build_sd1(work / "sd1-folder", work)
    tensorfs("import", work / "sd1-folder", "--name", "local/sd1")
    imported = [(kind, import_kind(report, kind, work, (tensorfs, run), args.tfs)) for kind in KINDS]
    flux_pipe, flux_folder = imported[0][1][:2]
    check_misfits(report, work, (tensorfs, run), flux_pipe, flux_folder)
    composed, composed_lane = import_composed(report, work, tensorfs, flux_pipe)
    mnt = work / "mnt"
    with common.Mount(args.tensorfs, store, mnt, work / "mount.log"):
        for kind, made in imported:
            check_mounted(report, kind, mnt, *made)
        check_composed(report, mnt, flux_pipe, flux_folder, composed, composed_lane)
    return report.finish("whole checkpoints with a T5 join a stored pipeline and load exactly")


if __name__ == "__main__":
    sys.exit(main())
