#!/usr/bin/env python3
"""Producer-quantized Transformers checkpoints through the mount, lane and decoded view.

    conventions_check.py --tensorfs BIN --work DIR [--cases DIR]

For every producer-made case that imports (tests/data/conventions: ComfyUI files, and Transformers
folders of bitsandbytes, GPTQ, AWQ, compressed-tensors, FP8 block scales, ModelOpt):
1. `tensorfs import` reads its quantized arrays by the producer's convention, the reference's
   `tfs verify` accepts the commit, and the mounted lane folder holds the source files byte for
   byte.
2. For Transformers folders, Transformers loads `<lane>@decoded` unmodified (no quantization library involved) and its
   logits are finite.
3. Where the producer's own library loads the source folder on this machine (bitsandbytes and
   compressed-tensors on CPU), the decoded view's logits match the producer's within cosine
   0.999 (the producer may compute in another dtype); elsewhere that check is reported as not
   run.

Prints PASS/FAIL lines and a closing `RESULT:` line; exits 0 only when every check passed.
"""

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import e2e_common as common  # noqa: E402

common.go_offline()
TOOL = "conventions_check"
ROOT = HERE.parent.parent
TOKENS = [[1, 5, 9, 17, 33, 2, 7, 11]]


def logits(folder, **kwargs):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, **kwargs).eval()
    ids = torch.tensor(TOKENS) % model.config.vocab_size
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def producer_logits(source, method):
    """The producer's own reading of `source`, or None when its library cannot run here."""
    import importlib.util

    import torch

    needs = {"bitsandbytes": "bitsandbytes", "compressed-tensors": "compressed_tensors"}
    if method not in needs or importlib.util.find_spec(needs[method]) is None:
        return None
    try:
        return logits(source, device_map="cpu", dtype=torch.float32)
    except Exception as e:  # the producer's loader failed here: say so, do not fail
        print(f"  note: {method} could not load {source.name}: {type(e).__name__}: {e}"[:300])
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensorfs", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--cases", type=Path, default=ROOT / "tests" / "data" / "conventions")
    ap.add_argument("--tfs", type=Path)
    args = ap.parse_args()
    common.exit_on_signals()
    common.quiet()
    report = common.Report(TOOL)
    work = args.work.resolve()
    if work.exists():
        common.force_unmount(work / "mnt")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    store, mnt = work / "store", work / "mnt"
    tensorfs = [str(args.tensorfs), "--store", str(store)]
    tfs = args.tfs or (Path(sys.executable).parent / "tfs")

    cases = {}
    for expect_path in sorted(args.cases.glob("*/expect.json")):
        expect = json.loads(expect_path.read_text())
        source = expect_path.parent / expect["source"]
        if expect.get("refuse"):
            continue
        name = expect_path.parent.name.replace("_", "-")
        cmd = tensorfs + ["import", str(source), "--name", f"local/{name}", "--json"]
        if expect.get("converter"):
            cmd += ["--converter", expect["converter"]]
        p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            report.check(False, f"{name}: tensorfs import", p.stderr.strip()[-300:])
            continue
        lane = json.loads(p.stdout)["lanes"][0]["lane"]
        report.check(True, f"{name}: tensorfs import", f"lane {lane}")
        v = subprocess.run([str(tfs), "--store", str(store), "verify", f"local/{name}"],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
        report.check(v.returncode == 0, f"{name}: tfs verify", (v.stdout + v.stderr).strip()[-200:])
        method = None
        if (source / "config.json").is_file():
            method = json.loads((source / "config.json").read_text())["quantization_config"]["quant_method"]
        cases[name] = (source, lane, method)

    import torch

    mnt.mkdir()
    with common.Mount(args.tensorfs, store, mnt, work / "mount.log"):
        for name, (source, lane, method) in cases.items():
            folder = mnt / "local" / name / "latest" / lane
            expected = common.source_files(source) if source.is_dir() else {source.name: source}
            report.files(common.compare_files(expected, folder), f"{name}: lane files")
            if method is None:
                continue
            decoded = folder.parent / f"{lane}@decoded"
            try:
                ours = logits(decoded, dtype=torch.float32)
            except Exception as e:
                report.check(False, f"{name}: transformers loads {decoded.name}", f"{type(e).__name__}: {e}"[:300])
                continue
            report.check(bool(torch.isfinite(ours).all()), f"{name}: transformers loads {decoded.name}",
                         f"logits {tuple(ours.shape)}")
            theirs = producer_logits(source, method)
            if theirs is None:
                report.note(f"{name}: the producer ({method}) does not load on this machine; not compared")
                continue
            cosine = torch.nn.functional.cosine_similarity(ours.flatten(1), theirs.flatten(1)).min().item()
            report.check(cosine >= 0.999, f"{name}: decoded view equals {method}'s own reading",
                         f"cosine {cosine:.6f}")
    return report.finish(f"{len(report.passes)} checks: producer checkpoints imported, lanes exact, decoded views loaded")


if __name__ == "__main__":
    sys.exit(main())
