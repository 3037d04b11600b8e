#!/usr/bin/env python3
"""The lazy mount against download-then-mount, over `tensorfs serve` on loopback.

Method (printed with the results):
  * Input: a generated model of two loose safetensors files (two components): `a` holds 3/4 of
    SIZE MiB in 4 MiB F32 tensors, `b` the rest in 1 MiB tensors (random bytes). Imported into
    an origin store and published as release 1.0 of `acme/bench`; `tensorfs serve` serves it on
    127.0.0.1 (its blobs warm in the page cache).
  * lazy: a fresh empty store, `tensorfs mount --endpoint` (background daemon), then
    - first byte: time from before the mount command to the first tensor byte of `a`
      (open, read the 8-byte length, seek past the header, read 1 byte);
    - full load: on another fresh store and mount, time from before the mount command until
      both files were read whole in 16 MiB reads.
  * download: a fresh store, `tensorfs download`, then `tensorfs mount` (no endpoint), the same
    first byte and full load, each timed from before the download.
  * one component: a fresh store and lazy mount, `b` read whole; the bytes fetched are the
    bytes of the store's blobs afterwards, against the model's (the origin's closure).
  * Median of N runs of each; fresh stores every run. Loopback: the network costs little, so
    the lazy mount's gain is in what it does not fetch and in not waiting for the rest.

Usage: tools/lazy_bench.py [--size-mib 48] [--runs 3] [--tensorfs BIN] [--work DIR] [--json OUT]
Never a test: machines are shared and noisy; compare the columns of one run.
"""

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20


def safetensors(path, sizes, seed):
    """A safetensors file of F32 tensors of `sizes` bytes each, random bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for i, size in enumerate(sizes):
        header[f"layers.{i}.weight"] = {
            "dtype": "F32",
            "shape": [size // 4],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        rng = __import__("random").Random(seed)
        for size in sizes:
            out.write(rng.randbytes(size))


def run(binary, store, *args, env=None):
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("TENSORFS_ENDPOINT", None)
    full_env.pop("TENSORFS_TOKEN", None)
    done = subprocess.run(
        [binary, "--store", store, *args],
        capture_output=True,
        text=True,
        env=full_env,
    )
    if done.returncode != 0:
        sys.exit(f"tensorfs {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def first_byte(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + length)
        assert len(f.read(1)) == 1


def read_whole(path):
    with open(path, "rb", buffering=0) as f:
        while f.read(16 * MIB):
            pass


def blob_bytes(store):
    total = 0
    for root, _, files in os.walk(os.path.join(store, "blobs")):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


class Mount:
    """A background mount, unmounted on exit whatever happens."""

    def __init__(self, binary, store, mnt, endpoint=None):
        self.binary, self.store, self.mnt = binary, store, mnt
        os.makedirs(mnt)
        args = ["mount", mnt, "--log-file", mnt + ".log"]
        if endpoint:
            args += ["--endpoint", endpoint]
        run(binary, store, *args)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        done = subprocess.run([self.binary, "unmount", self.mnt], capture_output=True)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", self.mnt], capture_output=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tensorfs", default=None)
    parser.add_argument("--work", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target"))
    binary = args.tensorfs or os.path.join(target, "debug", "tensorfs")
    work = tempfile.mkdtemp(prefix="lazy-bench-", dir=args.work)
    server = None
    try:
        a = [4 * MIB] * max(1, args.size_mib * 3 // 4 // 4)
        b = [MIB] * max(1, args.size_mib - sum(a) // MIB)
        source = os.path.join(work, "source")
        os.makedirs(source)
        safetensors(os.path.join(source, "a.safetensors"), a, 1)
        safetensors(os.path.join(source, "b.safetensors"), b, 2)
        origin = os.path.join(work, "origin")
        run(binary, origin, "import", os.path.join(source, "a.safetensors"),
            os.path.join(source, "b.safetensors"), "--name", "local/bench")
        local_ref = os.path.join(origin, "refs", "local", "bench.json")
        repo = json.load(open(local_ref))
        commit = repo["commits"][0]
        tree = os.path.join(origin, "blobs", commit["sha256"][:2], commit["sha256"][2:4],
                            commit["sha256"])
        lane = json.load(open(tree))["lane"]
        os.makedirs(os.path.join(origin, "refs", "acme"))
        with open(os.path.join(origin, "refs", "acme", "bench.json"), "w") as f:
            json.dump({"format": "cozytensors.repo/1", "name": "acme/bench",
                       "releases": [{"version": "1.0", "lanes": {lane: commit}}]}, f,
                      separators=(",", ":"), sort_keys=True)
        model_bytes = blob_bytes(origin)
        server = subprocess.Popen(
            [binary, "serve", origin, "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        endpoint = next(w for w in server.stdout.readline().split() if w.startswith("http://"))
        rel = os.path.join("acme", "bench", "1.0", lane)
        results = {k: [] for k in ["lazy_first_s", "lazy_full_s", "download_first_s",
                                   "download_full_s", "one_component_bytes"]}
        for n in range(args.runs):
            def fresh(name):
                # Absent: a lazy mount and a download make their store.
                return os.path.join(work, f"{name}-{n}")

            store = fresh("lazy-first")
            start = time.perf_counter()
            with Mount(binary, store, store + ".mnt", endpoint) as m:
                first_byte(os.path.join(m.mnt, rel, "a.safetensors"))
                results["lazy_first_s"].append(time.perf_counter() - start)
            store = fresh("lazy-full")
            start = time.perf_counter()
            with Mount(binary, store, store + ".mnt", endpoint) as m:
                for f in ["a.safetensors", "b.safetensors"]:
                    read_whole(os.path.join(m.mnt, rel, f))
                results["lazy_full_s"].append(time.perf_counter() - start)
            for kind in ["first", "full"]:
                store = fresh(f"download-{kind}")
                start = time.perf_counter()
                run(binary, store, "download", "acme/bench", "--endpoint", endpoint)
                with Mount(binary, store, store + ".mnt") as m:
                    if kind == "first":
                        first_byte(os.path.join(m.mnt, rel, "a.safetensors"))
                    else:
                        for f in ["a.safetensors", "b.safetensors"]:
                            read_whole(os.path.join(m.mnt, rel, f))
                    results[f"download_{kind}_s"].append(time.perf_counter() - start)
            store = fresh("one")
            with Mount(binary, store, store + ".mnt", endpoint) as m:
                read_whole(os.path.join(m.mnt, rel, "b.safetensors"))
            results["one_component_bytes"].append(blob_bytes(store))
            for leftover in os.listdir(work):
                if leftover.endswith(f"-{n}"):
                    shutil.rmtree(os.path.join(work, leftover), ignore_errors=True)
        med = {k: statistics.median(v) for k, v in results.items()}
        print(__doc__.split("Usage:")[0].strip())
        print(f"\nModel: {model_bytes / MIB:.1f} MiB ({len(a)} + {len(b)} tensors), "
              f"median of {args.runs} runs, binary {binary}\n")
        print("| | lazy mount | download, then mount |")
        print("|---|---|---|")
        print(f"| first tensor byte | {med['lazy_first_s']:.3f} s | "
              f"{med['download_first_s']:.3f} s |")
        print(f"| whole model read | {med['lazy_full_s']:.3f} s | "
              f"{med['download_full_s']:.3f} s |")
        one = med["one_component_bytes"]
        print(f"\nComponent b alone through the lazy mount: {one / MIB:.2f} MiB fetched of "
              f"{model_bytes / MIB:.2f} MiB ({100 * one / model_bytes:.1f} %)")
        report = {"model_bytes": model_bytes, "runs": args.runs, "median": med,
                  "all": results}
        print("\n" + json.dumps(report, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=2)
    finally:
        if server:
            server.terminate()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
