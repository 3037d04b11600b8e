#!/usr/bin/env python3
"""TensorFS benchmarks: ratios against a baseline measured in the same run.

Method (printed with the results):
  * Input: a generated safetensors file of SIZE GiB (64 BF16 tensors of random bytes,
    seeded), on the local disk (ext4 here), read once before timing so the page cache is warm.
  * import: `tensorfs import` vs the reference `tfs import` of that file into fresh stores,
    median of N runs each (wall time of the command; `sync` before each, since both flush what
    they write and would otherwise wait on the other's writes).
  * sequential read: the file read in 16 MiB blocks from the source (warm, median of N) vs
    the mounted file: first read after a fresh mount (the store's blobs warm), then a second
    read on the same mount; N fresh mounts, medians.
  * safe_open: every tensor of the folder loaded with safetensors' safe_open(framework="pt")
    from the mount (second pass, page cache warm) vs the source folder (warm), median of N.
  * daemon peak RSS: VmHWM of the mount daemon after a first full read (a fresh daemon; the
    largest of N).

Usage: tools/bench.py [--size-gib 1] [--runs 3] [--work DIR] [--tensorfs BIN] [--tfs BIN]
                      [--json OUT]
Run with the dev venv's python (tools/venv.sh prints it): it needs numpy, torch and safetensors.
Never a test: machines are shared and noisy; read the ratios, not the absolute numbers.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def make_input(path, size_gib):
    import torch
    from safetensors.torch import save_file

    rng = np.random.default_rng(0)
    total = int(size_gib * (1 << 30))
    n = 64
    cols = 4096
    rows = max(1, total // n // 2 // cols)
    tensors = {}
    for i in range(n):
        raw = rng.integers(0, 1 << 16, size=(rows, cols), dtype=np.uint16)
        tensors[f"layers.{i}.weight"] = torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16)
    save_file(tensors, path, metadata={"format": "pt"})


def read_all(path, block=16 << 20):
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(block)
        view = memoryview(buf)
        while f.readinto(view):
            pass
    return time.perf_counter() - start


def run(cmd, **kw):
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return time.perf_counter() - start


def median(xs):
    return statistics.median(xs)


def safe_open_all(folder):
    from safetensors import safe_open

    start = time.perf_counter()
    total = 0
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(folder, name), framework="pt") as f:
            for key in f.keys():
                # safetensors maps the file: clone() reads every byte, as a load to a device would.
                total += f.get_tensor(key).clone().nbytes
    return time.perf_counter() - start


class Mount:
    """A foreground mount daemon this process started and always stops."""

    def __init__(self, tensorfs, store, mountpoint):
        self.mountpoint = mountpoint
        os.makedirs(mountpoint, exist_ok=True)
        self.proc = subprocess.Popen(
            [tensorfs, "--store", store, "mount", mountpoint, "--foreground"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.time() + 20
        while not os.path.ismount(mountpoint):
            if self.proc.poll() is not None or time.time() > deadline:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
                self.close()
                raise SystemExit(f"mount did not appear: {err}")
            time.sleep(0.05)

    def peak_rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if os.path.ismount(self.mountpoint):
            subprocess.run(["umount", "-l", self.mountpoint], check=False)


def lane_folder(mountpoint, repo):
    latest = os.path.join(mountpoint, repo, "latest")
    lanes = sorted(os.listdir(latest))
    return os.path.join(latest, lanes[0])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gib", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work", default=None)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--tensorfs", default=os.path.join(here, "target", "release", "tensorfs"))
    p.add_argument("--tfs", default=shutil.which("tfs") or os.path.join(os.path.dirname(sys.executable), "tfs"))
    p.add_argument("--json", default=None)
    args = p.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="tensorfs-bench-")
    src_dir = os.path.join(work, "src")
    os.makedirs(src_dir, exist_ok=True)
    src = os.path.join(src_dir, "model.safetensors")
    if not os.path.exists(src) or os.path.getsize(src) < args.size_gib * (1 << 30) * 0.99:
        make_input(src, args.size_gib)
    size = os.path.getsize(src)
    read_all(src)  # warm the page cache
    rows = []

    def row(name, ours, base, unit="s", note=""):
        ratio = base / ours if unit == "s" else ours / base
        rows.append({"bench": name, "ours": ours, "baseline": base, "unit": unit, "ratio": ratio, "note": note})

    # import
    ours, theirs = [], []
    for i in range(args.runs):
        for store, cmd, out in (
            (os.path.join(work, f"store-ours-{i}"), [args.tensorfs], ours),
            (os.path.join(work, f"store-tfs-{i}"), [args.tfs], theirs),
        ):
            shutil.rmtree(store, ignore_errors=True)
            # Imports flush what they write: start each with no other run's writes pending.
            os.sync()
            out.append(run(cmd + ["--store", store, "import", src, "--name", "local/bench"]))
    row("import (tensorfs vs tfs), x faster", median(ours), median(theirs), note="goal >= 1.5")
    store = os.path.join(work, "store-ours-0")
    for i in range(1, args.runs):
        shutil.rmtree(os.path.join(work, f"store-ours-{i}"), ignore_errors=True)
        shutil.rmtree(os.path.join(work, f"store-tfs-{i}"), ignore_errors=True)

    os.sync()
    native = median([read_all(src) for _ in range(args.runs)])
    mnt = os.path.join(work, "mnt")
    firsts, seconds, rss = [], [], []
    for _ in range(args.runs):
        # A fresh mount each time: its page cache starts empty, the store's blobs stay warm.
        m = Mount(args.tensorfs, store, mnt)
        try:
            lane = lane_folder(mnt, "local/bench")
            mounted = os.path.join(lane, "model.safetensors")
            firsts.append(read_all(mounted))
            rss.append(m.peak_rss_kib())
            seconds.append(read_all(mounted))
        finally:
            m.close()
    row("sequential read, first (mount vs ext4 warm)", median(firsts), native, note="goal >= 0.5")
    row("sequential read, second (mount vs ext4 warm)", median(seconds), native, note="goal >= 0.8")
    m = Mount(args.tensorfs, store, mnt)
    try:
        lane = lane_folder(mnt, "local/bench")
        base = median([safe_open_all(src_dir) for _ in range(args.runs)])
        ours_load = median([safe_open_all(lane) for _ in range(args.runs)])
        row("safe_open all tensors (mount vs ext4 warm)", ours_load, base)
    finally:
        m.close()
    rows.append({"bench": "daemon peak RSS during a first read", "ours": max(rss) / 1024, "baseline": None,
                 "unit": "MiB", "ratio": None, "note": f"goal < 100 MiB; file {size / (1 << 30):.2f} GiB"})

    print(f"# TensorFS benchmarks: {size / (1 << 30):.2f} GiB safetensors, median of {args.runs}, warm page cache")
    print(f"{'bench':50} {'ours':>10} {'baseline':>10} {'ratio':>7}  note")
    for r in rows:
        base = "-" if r["baseline"] is None else f"{r['baseline']:.3f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(f"{r['bench']:50} {r['ours']:>10.3f} {base:>10} {ratio:>7}  {r['unit']}; {r['note']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size_bytes": size, "runs": args.runs, "rows": rows}, f, indent=2)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
