#!/usr/bin/env python3
"""Check that a mounted Diffusers folder is the source folder, as Diffusers sees it.

    sd_check.py --source DIR --mounted DIR [--variant fp16] [--dtype float32|float16]

1. Loads StableDiffusionPipeline.from_pretrained (unmodified, offline, CPU) from each folder,
   with `variant` when given; asserts every parameter of every model component is equal, then
   runs one denoising step from a fixed generator at 32×32 and asserts the decoded images are
   equal (np.array_equal).
2. Asserts every file the lane should show (the source's files, without other variants'
   weights; see e2e_common.lane_files) is in the mounted folder with the same SHA-256, and
   lists missing, different and extra files.

The pipeline runs in --dtype (default float32; fp16 weights are upcast on load, which CPUs
run everywhere). Prints one PASS/FAIL line per check and a closing `RESULT: …` line; exits 0
only when every check passed.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_common as common  # noqa: E402

common.go_offline()

TOOL = "sd_check"
PROMPT = "a photo of an astronaut riding a horse"
MODEL_COMPONENTS = ("unet", "vae", "text_encoder")


def load(folder, variant, dtype):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(
        folder, variant=variant, dtype=dtype, local_files_only=True, safety_checker=None
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe.to("cpu")


def run(pipe, size, steps):
    import torch

    generator = torch.Generator("cpu").manual_seed(1234)
    with torch.no_grad():
        return pipe(
            PROMPT,
            negative_prompt="blurry",
            num_inference_steps=steps,
            guidance_scale=7.5,
            height=size,
            width=size,
            generator=generator,
            output_type="np",
        ).images


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, type=Path, help="the original Diffusers folder")
    ap.add_argument("--mounted", required=True, type=Path, help="the lane folder to check (in the mount)")
    ap.add_argument("--variant", default=None, help="the weights variant the lane holds (fp16)")
    ap.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="the pipeline's dtype")
    ap.add_argument("--size", type=int, default=32, help="image height and width in pixels")
    ap.add_argument("--steps", type=int, default=1, help="denoising steps")
    args = ap.parse_args()
    for d in (args.source, args.mounted):
        if not d.is_dir():
            common.die(TOOL, f"{d} is not a folder")

    import numpy as np
    import torch

    common.quiet()
    torch.use_deterministic_algorithms(True)
    dtype = getattr(torch, args.dtype)
    report = common.Report(TOOL)
    what = f"variant {args.variant}" if args.variant else "default weights"
    try:
        src = load(args.source, args.variant, dtype)
        src_img = run(src, args.size, args.steps)
    except Exception as e:
        common.die(TOOL, f"the source folder does not load or run ({what}): {type(e).__name__}: {e}")
    try:
        mnt = load(args.mounted, args.variant, dtype)
        loaded = True
    except Exception as e:
        report.check(False, "load from the mounted folder", f"{what}: {type(e).__name__}: {e}")
        loaded = False

    if loaded:
        count = 0
        problems = []
        for name in MODEL_COMPONENTS:
            a, b = getattr(src, name).state_dict(), getattr(mnt, name).state_dict()
            count += len(a)
            problems += [f"{name}.{p}" for p in common.compare_tensors(a, b)]
        report.check(not problems, "parameters", f"{count} tensors of {', '.join(MODEL_COMPONENTS)} equal"
                     if not problems else f"{len(problems)} differ")
        for p in problems[:20]:
            report.note(p)
        same_ids = torch.equal(src.tokenizer(PROMPT, return_tensors="pt").input_ids,
                               mnt.tokenizer(PROMPT, return_tensors="pt").input_ids)
        report.check(same_ids, "tokenizer", "token ids equal")
        try:
            mnt_img = run(mnt, args.size, args.steps)
            same = src_img.shape == mnt_img.shape and np.array_equal(src_img, mnt_img)
            detail = f"{args.steps} step(s), images {src_img.shape} {src_img.dtype} exactly equal"
            if not same and src_img.shape == mnt_img.shape:
                detail = f"max abs difference {np.abs(src_img - mnt_img).max():.3e}"
            report.check(same, "inference", detail)
        except Exception as e:
            report.check(False, "inference", f"{type(e).__name__}: {e}")

    files = common.compare_files(common.lane_files(args.source, args.variant), args.mounted)
    report.files(files)
    return report.finish(f"{what}: parameters and images equal, {files['equal']}/{files['total']} files SHA-256 equal")


if __name__ == "__main__":
    sys.exit(main())
