#!/usr/bin/env python3
"""Build a tiny, deterministic Stable Diffusion pipeline folder, offline.

    tiny_sd.py OUT_DIR [--seed N] [--no-fp16] [--fp16-skip COMPONENT ...]

Writes a Diffusers folder (model_index.json, scheduler/, tokenizer/, text_encoder/, unet/,
vae/) with random weights drawn from a seeded generator, so two runs give byte-identical files.
It exercises what a real Stable Diffusion 1.x repo has:

- a byte-level BPE CLIP tokenizer (vocab.json + merges.txt generated here, no hub);
- a sharded component: the UNet is saved with a small max_shard_size, so it is written as
  diffusion_pytorch_model-0000k-of-0000n.safetensors plus diffusion_pytorch_model.safetensors.index.json;
- an fp16 variant in the same folder (*.fp16.safetensors, and the sharded UNet's
  *.fp16.safetensors shards plus diffusion_pytorch_model.safetensors.index.fp16.json), like the
  `variant="fp16"` files of real repos. --fp16-skip leaves a component without fp16 files (an
  fp16 lane then falls back to that component's default files).

The fp16 files are written first and the float32 ones last, so the configs on disk describe the
float32 weights, as in real repos. Everything runs on CPU in a few seconds; nothing is
downloaded (HF_HUB_OFFLINE=1 is set before diffusers is imported).
"""

import argparse
import copy
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_common as common  # noqa: E402

common.go_offline()
import torch  # noqa: E402

# The UNet is about 118 KB in float32 and 59 KB in fp16; this splits it into several shards in both.
UNET_SHARD_SIZE = "30KB"
TEXT_HIDDEN = 32
COMPONENTS = ("text_encoder", "unet", "vae")


def bytes_to_unicode():
    """GPT-2 / CLIP's reversible map from bytes to printable unicode characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def tiny_vocab():
    """A small byte-level BPE vocabulary with CLIP's conventions (`</w>` ends a word).

    Every byte is a token alone and as a word end, so any text tokenizes; a few merges make
    common words single tokens, so the merges file is exercised too.
    """
    chars = list(bytes_to_unicode().values())
    tokens = chars + [c + "</w>" for c in chars]
    merges = []
    for word in ("a", "photo", "of", "cat", "dog", "the", "astronaut", "riding", "horse"):
        parts = list(word[:-1]) + [word[-1] + "</w>"]
        while len(parts) > 1:
            merges.append((parts[0], parts[1]))
            parts = [parts[0] + parts[1]] + parts[2:]
            if parts[0] not in tokens:
                tokens.append(parts[0])
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    # Deduplicate merges, keeping the first (highest-priority) occurrence.
    merges = list(dict.fromkeys(merges))
    return vocab, merges


def build(seed: int):
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab, merges = tiny_vocab()
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        block_out_channels=(4, 8),
        layers_per_block=1,
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=TEXT_HIDDEN,
        attention_head_dim=(2, 4),
        norm_num_groups=2,
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKL(
        block_out_channels=(4, 8),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        norm_num_groups=2,
        sample_size=32,
    )
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=vocab["<|startoftext|>"],
            eos_token_id=vocab["<|endoftext|>"],
            pad_token_id=vocab["<|endoftext|>"],
            hidden_size=TEXT_HIDDEN,
            intermediate_size=37,
            layer_norm_eps=1e-05,
            num_attention_heads=4,
            num_hidden_layers=2,
            projection_dim=TEXT_HIDDEN,
            vocab_size=len(vocab),
            max_position_embeddings=77,
        )
    )
    # Random init leaves some tensors at exact 0/1 (norms, biases); perturb everything so every
    # tensor has distinct bytes and a wrong mapping of tensors cannot go unnoticed.
    g = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for model in (unet, vae, text_encoder):
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    return StableDiffusionPipeline(
        vae=vae.eval(),
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        unet=unet.eval(),
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def save(pipe, out: Path, variant, skip=()):
    """Saves the pipeline's `variant` files into `out` (merging with what is there; configs are
    overwritten), the UNet sharded; `skip` components get no files for this variant.

    Each variant is saved into a fresh folder first and then copied over: saving a sharded model
    deletes other shard files with the same stem, which would remove the other variant's shards.
    """
    suffix = f".{variant}" if variant else ""
    with tempfile.TemporaryDirectory(prefix="tiny_sd.") as tmp:
        tmp = Path(tmp)
        pipe.save_pretrained(tmp, safe_serialization=True, variant=variant)
        unet_dir = tmp / "unet"
        (unet_dir / f"diffusion_pytorch_model{suffix}.safetensors").unlink()
        pipe.unet.save_pretrained(unet_dir, safe_serialization=True, variant=variant, max_shard_size=UNET_SHARD_SIZE)
        # Diffusers names variant shards diffusion_pytorch_model.fp16-00001-of-00002.safetensors.
        pattern = re.compile(rf"diffusion_pytorch_model{re.escape(suffix)}-\d{{5}}-of-\d{{5}}\.safetensors")
        shards = sorted(p.name for p in unet_dir.iterdir() if pattern.fullmatch(p.name))
        if len(shards) < 2:
            sys.exit(f"tiny_sd: expected a sharded unet for variant {variant}, got {shards}")
        for name in skip:
            for f in (tmp / name).iterdir():
                if f.name.endswith(".safetensors") or (f.name.endswith(".json") and ".index" in f.name):
                    f.unlink()
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                dest = out / f.relative_to(tmp)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dest)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the folder to write (created; must be empty or absent)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-fp16", action="store_true", help="write no fp16 variant files")
    ap.add_argument(
        "--fp16-skip",
        action="append",
        default=[],
        choices=COMPONENTS,
        help="leave this component without fp16 files (repeatable)",
    )
    ap.add_argument(
        "--fp16-distinct",
        action="store_true",
        help="halve the fp16 VAE's parameters, so a load shows which variant's files it read",
    )
    args = ap.parse_args()

    out = args.out
    if out.exists() and any(out.iterdir()):
        sys.exit(f"tiny_sd: {out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    common.quiet()

    pipe = build(args.seed)
    if not args.no_fp16:
        half = copy.deepcopy(pipe)
        half.to(torch.float16)
        if args.fp16_distinct:
            with torch.no_grad():
                for p in half.vae.parameters():
                    p.mul_(0.5)
        save(half, out, "fp16", skip=args.fp16_skip)
        del half
    # The float32 files last: their configs are the ones left on disk.
    save(pipe, out, None)
    # Real SD 1.x repos also carry the slow tokenizer's files; transformers 5 writes only
    # tokenizer.json, so write them too (same vocabulary), as extra assets to carry.
    vocab, merges = tiny_vocab()
    tok = out / "tokenizer"
    (tok / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (tok / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")

    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    total = sum((out / f).stat().st_size for f in files)
    print(json.dumps({"out": str(out), "files": len(files), "bytes": total}))
    for f in files:
        print(f"  {f}")


if __name__ == "__main__":
    main()
