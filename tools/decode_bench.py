#!/usr/bin/env python3
"""Decode speed of every scheme: ours against the reference implementation, in one run.

Method (printed with the results): each scheme decodes one tensor of ROWS × COLS elements
(default 1024 × 4096, BF16 output), built by the golden-fixture generator's builders
(tools/fixtures/fx; gguf.* from random structs). The reference (PyPI tensorfs 0.17.2,
`raw.decode_into` into a torch bfloat16 tensor) and ours (examples/decode_bench.rs, release
build) decode the same bytes; each reports the best of RUNS runs, ours on one thread and on
every core. Ratios are ours ÷ the reference's MB/s of output. The machine is shared and
noisy: read the ratios, not the absolute numbers. Never a test.

Usage (the dev venv's python, which has the reference, numpy and torch):
    tools/decode_bench.py [--rows 1024] [--cols 4096] [--runs 3] [--only PREFIX] [--json OUT]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
sys.path.insert(0, os.path.join(HERE, "e2e"))

from e2e_common import release_build  # noqa: E402
from fx import bnb, convrot, grouped, micro, scaled  # noqa: E402

# ggml block types: (elements per struct, struct bytes).
GGUF = {"q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34),
        "q2_k": (256, 84), "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176),
        "q6_k": (256, 210), "mxfp4": (32, 17), "nvfp4": (64, 36), "q1_0": (128, 18), "q2_0": (64, 18)}


class Raw:
    """A case made here (gguf): scheme, params, logical shape and parts."""

    def __init__(self, scheme, params, shape, parts):
        self.scheme, self.params, self.shape, self.parts = scheme, params, shape, parts


def gguf_case(kind, shape):
    n, size = GGUF[kind]
    rng = np.random.default_rng(0)
    structs = shape[0] * shape[1] // n
    blocks = rng.integers(0, 256, size=(structs, size), dtype=np.uint8)
    # Finite f16 scales keep the arithmetic on its usual path.
    d = np.array([0.01], dtype=np.float16).view(np.uint8)
    if kind not in ("mxfp4", "nvfp4"):
        blocks[:, :2] = d
    stored = [shape[0], shape[1] // n, size]
    return Raw(f"gguf.{kind}", {"block_size": n}, shape, [("blocks", "U8", stored, blocks.tobytes())])


def cases(rows, cols):
    s = [rows, cols]
    yield lambda: scaled.scaled("fp8.tensorwise", "b", s, "F8_E4M3", "F32", "tensor")
    yield lambda: scaled.scaled("fp8.rowwise", "b", s, "F8_E4M3", "F32", "row")
    yield lambda: scaled.scaled("fp8.columnwise", "b", s, "F8_E4M3", "F32", "col")
    yield lambda: scaled.scaled("int8.tensorwise", "b", s, "I8", "F32", "tensor")
    yield lambda: scaled.scaled("int8.rowwise", "b", s, "I8", "F32", "row")
    yield lambda: scaled.scaled("int8.columnwise", "b", s, "I8", "F32", "col")
    yield lambda: convrot.int8_convrot("b", s, 256)
    yield lambda: convrot.int4_convrot("b", s, 256)
    yield lambda: micro.mxfp8("b", s, "F8_E4M3", "row_major")
    yield lambda: micro.nvfp4("b", s, "multiply", "low_first", "row_major")
    yield lambda: micro.svdq("b", s, "multiply", "low_first", "row_major", rank=32)
    yield lambda: micro.blockwise("b", s, 128, 128, "F32")
    yield lambda: micro.mxfp4("b", s, False)
    for kind in GGUF:
        yield lambda kind=kind: gguf_case(kind, s)
    for bits in (2, 3, 4, 8):
        yield lambda bits=bits: grouped.gptq(bits, "b", rows, cols, 128)
    yield lambda: grouped.awq("b", rows, cols, 128)
    for bits in range(1, 9):
        yield lambda bits=bits: grouped.ct(bits, "b", s, 128)
    yield lambda: bnb.four_bit("bnb.nf4", "b", s, 64, True)
    yield lambda: bnb.four_bit("bnb.fp4", "b", s, 64, True)
    yield lambda: bnb.int8("b", s)
    yield lambda: convrot.grouped("comfy.asym_w4a8_int8", "b", s, 128, 256, 4)
    yield lambda: convrot.grouped("comfy.w6a8_int8", "b", s, 128, 256, 6)
    yield lambda: convrot.grouped("w4a8.convrot", "b", s, 16, 256, 4)


def reference_seconds(case, runs):
    import torch
    from tensorfs import raw

    out = torch.empty(tuple(case.shape), dtype=torch.bfloat16)
    parts = {role: (dt, [int(e) for e in sh], bytes(b)) for role, dt, sh, b in case.parts}
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        raw.decode_into(case.scheme, parts, out, dtype="BF16", shape=list(case.shape), params=case.params)
        best = min(best, time.perf_counter() - start)
    return best


def measure(binary, rows, cols, runs, only=""):
    """Decodes each scheme whose name starts with `only` with the reference and with `binary`
    (examples/decode_bench.rs, release build); returns one dict per scheme: MB/s of output of
    the reference, ours on one thread and on every core, and ours ÷ the reference's."""
    manifests, reference = [], {}
    with tempfile.TemporaryDirectory(prefix="tensorfs-decode-bench-") as work:
        for make in cases(rows, cols):
            case = make()
            if not case.scheme.startswith(only):
                continue
            folder = os.path.join(work, case.scheme)
            os.makedirs(folder, exist_ok=True)
            parts = []
            for i, (role, dt, sh, b) in enumerate(case.parts):
                name = f"{i}-{role}.bin"
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(bytes(b))
                parts.append({"role": role, "dtype": dt, "shape": [int(e) for e in sh], "file": name})
            manifest = os.path.join(folder, "manifest.json")
            with open(manifest, "w") as f:
                json.dump({"scheme": case.scheme, "params": case.params, "shape": [int(e) for e in case.shape],
                           "dtype": "BF16", "parts": parts}, f)
            manifests.append(manifest)
            reference[case.scheme] = reference_seconds(case, runs)
        out = subprocess.run([str(binary), str(runs)] + manifests, check=True, capture_output=True,
                             text=True).stdout
    results = []
    for line in out.splitlines():
        r = json.loads(line)
        mb = r["bytes"] / 1e6
        ref = mb / reference[r["scheme"]]
        one, all_ = mb / r["one_core_s"], mb / r["all_cores_s"]
        results.append({"scheme": r["scheme"], "reference_mb_s": ref, "ours_one_core_mb_s": one,
                        "ours_all_cores_mb_s": all_, "ratio_one_core": one / ref, "ratio_all_cores": all_ / ref})
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    binary = release_build(REPO, examples=["decode_bench"]) / "examples" / "decode_bench"
    rows = measure(binary, args.rows, args.cols, args.runs, args.only)
    print(f"# decode to BF16, {args.rows} x {args.cols} elements ({args.rows * args.cols * 2 / 1e6:.1f} MB out), "
          f"best of {args.runs}; {os.cpu_count()} cores")
    print(f"{'scheme':24} {'reference':>10} {'ours 1 core':>12} {'ours all':>10} {'x 1 core':>9} {'x all':>7}  (MB/s)")
    for r in rows:
        print(f"{r['scheme']:24} {r['reference_mb_s']:10.0f} {r['ours_one_core_mb_s']:12.0f} "
              f"{r['ours_all_cores_mb_s']:10.0f} {r['ratio_one_core']:9.1f} {r['ratio_all_cores']:7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": args.rows, "cols": args.cols, "runs": args.runs, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
