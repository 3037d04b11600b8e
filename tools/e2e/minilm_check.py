#!/usr/bin/env python3
"""Check that a mounted Transformers folder is the source folder, as Transformers sees it.

    minilm_check.py --source DIR --mounted DIR

1. Loads AutoTokenizer + AutoModel from each folder (offline, CPU, float32), embeds a few
   sentences (mean pooling over the attention mask, as sentence-transformers' all-MiniLM-L6-v2
   does) and asserts the embeddings are exactly equal (torch.equal), and so is every parameter.
2. Asserts every source file is in the mounted folder with the same SHA-256, listing missing,
   different and extra files.

Prints one PASS/FAIL line per check and a closing `RESULT: PASS — …` or `RESULT: FAIL — …`
line; exits 0 only when every check passed.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_common as common  # noqa: E402

common.go_offline()

SENTENCES = [
    "This framework generates embeddings for each input sentence.",
    "Sentences are passed as a list of strings.",
    "The quick brown fox jumps over the lazy dog.",
    "TensorFS stores each tensor once and mounts checkpoints as ordinary folders.",
    "Ünïcödé, emoji 🙂 and numbers 12345 also tokenize.",
]
TOOL = "minilm_check"


def embed(folder):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModel.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    batch = tokenizer(SENTENCES, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(out.dtype)
    pooled = (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1), batch["input_ids"], model.state_dict()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, type=Path, help="the original model folder")
    ap.add_argument("--mounted", required=True, type=Path, help="the lane folder to check (in the mount)")
    args = ap.parse_args()
    for d in (args.source, args.mounted):
        if not d.is_dir():
            common.die(TOOL, f"{d} is not a folder")

    import torch

    common.quiet()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    report = common.Report(TOOL)
    try:
        src_emb, src_ids, src_sd = embed(args.source)
    except Exception as e:  # the source must load; anything else is a broken setup
        common.die(TOOL, f"the source folder does not load: {type(e).__name__}: {e}")
    try:
        mnt_emb, mnt_ids, mnt_sd = embed(args.mounted)
        loaded = True
    except Exception as e:
        report.check(False, "load from the mounted folder", f"{type(e).__name__}: {e}")
        loaded = False

    if loaded:
        report.check(torch.equal(src_ids, mnt_ids), "tokenizer", f"token ids of {len(SENTENCES)} sentences equal")
        problems = common.compare_tensors(src_sd, mnt_sd)
        report.check(not problems, "parameters", f"{len(src_sd)} tensors equal" if not problems else f"{len(problems)} differ")
        for p in problems[:20]:
            report.note(p)
        same = src_emb.shape == mnt_emb.shape and torch.equal(src_emb, mnt_emb)
        detail = f"{tuple(src_emb.shape)} exactly equal"
        if not same and src_emb.shape == mnt_emb.shape:
            detail = f"max abs difference {(src_emb - mnt_emb).abs().max().item():.3e}"
        report.check(same, "embeddings", detail)

    files = common.compare_files(common.lane_files(args.source), args.mounted)
    report.files(files)
    return report.finish(f"embeddings equal, {files['equal']}/{files['total']} files SHA-256 equal")


if __name__ == "__main__":
    sys.exit(main())
