#!/usr/bin/env python3
"""Load every tensor of a mounted TensorFS safetensors file to a device through the extents
side path, and compare with safetensors' own loading.

For each tensor, the extents ioctl (docs/extents.md, packaging/tensorfs_extents.h) tells its
logical dtype and shape, its encoding, and each stored part's extents in the store's chunk
blobs. Each extent is read with os.preadv straight from its blob into one of two pinned
(page-locked) staging buffers and copied to the device with non_blocking=True: the copy of one
buffer runs while the next is read, and a CUDA event per buffer gates its reuse. A plain
tensor's bytes are viewed as its dtype and shape; an encoded tensor's parts are moved raw and
reported as parts (no decoding on the device). Every array of the file, plain tensors and
encoded tensors' parts alike, is compared bit for bit with
safetensors.safe_open(FILE, framework="pt", device=DEVICE).get_tensor(name) (torch.equal on
their bytes, so NaNs compare equal to themselves).

Timing (printed with the results): after the comparison pass, each path loads every tensor of
the file to DEVICE and waits for the device; the best of --runs runs is reported. Both paths
read the same blobs (the mount serves the file from them), so after the first pass they are in
the page cache: these are warm-cache numbers unless you drop caches between runs.

Usage:
    tools/gpu_load.py MOUNTED_FILE.safetensors [--device cuda|cuda:N|cpu] [--buffer-mib 16]
                      [--runs 1] [--json] [-v]

Without CUDA (torch.cuda.is_available() false) a cuda device is refused with "CUDA not
available" and exit status 3; --device cpu runs the same path into CPU memory (unpinned
buffers, synchronous copies). Exit status 1: an array differs, or an error.
"""

import argparse
import errno
import fcntl
import json
import os
import struct
import sys
import time

import torch
from safetensors import safe_open

# The extents ioctl, ABI version 1 (docs/extents.md).
ABI = 1
TENSOR, PART, EXTENTS = 0xE8C8E701, 0xC4C8E702, 0xF820E703
TENSOR_BYTES, PART_BYTES, EXTENTS_BYTES = 10440, 1224, 14368
NAME_BYTES, EXTENTS_PER_PAGE, EXTENT_BYTES, PARAMS_PAGE = 1024, 128, 104, 4096
FLAG_ENCODED = 1

DTYPES = {
    name: getattr(torch, attr)
    for name, attr in {
        "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
        "F16": "float16", "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32",
        "F64": "float64", "I64": "int64", "U64": "uint64", "C64": "complex64",
        "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
    }.items()
    if hasattr(torch, attr)
}


class CudaNotAvailable(Exception):
    pass


def cstr(buf, at, n):
    return bytes(buf[at:at + n]).split(b"\0")[0].decode()


def query(fd, cmd, size, name, index=0):
    """Runs extents command `cmd` for `name` (and params page, part or extents page `index`)."""
    raw = name.encode()
    if len(raw) >= NAME_BYTES:
        raise ValueError(f"tensor name longer than {NAME_BYTES - 1} bytes: {name!r}")
    buf = bytearray(size)
    struct.pack_into("<II", buf, 0, ABI, index)
    buf[16:16 + len(raw)] = raw
    fcntl.ioctl(fd, cmd, buf, True)
    return buf


def locate(fd, name):
    """The tensor `name` of the open mounted file: its description, parts and extents."""
    t = query(fd, TENSOR, TENSOR_BYTES, name)
    rank, n_parts = struct.unpack_from("<II", t, 2080)
    n_extents, file_begin, file_end = struct.unpack_from("<QQQ", t, 2152)
    flags, params_len = struct.unpack_from("<II", t, 2176)
    params = bytes(t[6344:6344 + min(params_len, PARAMS_PAGE)])
    page = 1
    while len(params) < params_len:
        more = query(fd, TENSOR, TENSOR_BYTES, name, page)
        params += bytes(more[6344:6344 + min(params_len - len(params), PARAMS_PAGE)])
        page += 1
    tensor = {
        "key": cstr(t, 1040, NAME_BYTES),
        "dtype": cstr(t, 2064, 16),
        "shape": list(struct.unpack_from("<8Q", t, 2088)[:rank]),
        "encoded": bool(flags & FLAG_ENCODED),
        "scheme": cstr(t, 2184, 64),
        "params": params.decode() if params else "",
        "store": cstr(t, 2248, 4096),
        "parts": [],
    }
    extents = []
    for page in range((n_extents + EXTENTS_PER_PAGE - 1) // EXTENTS_PER_PAGE):
        e = query(fd, EXTENTS, EXTENTS_BYTES, name, page)
        for i in range(struct.unpack_from("<I", e, 1048)[0]):
            at = 1056 + EXTENT_BYTES * i
            blob = bytes(e[at + 8:at + 72]).decode()
            offset, length, file_offset = struct.unpack_from("<QQQ", e, at + 80)
            extents.append({
                "part": struct.unpack_from("<I", e, at)[0],
                "path": os.path.join(tensor["store"], "blobs", blob[:2], blob[2:4], blob),
                "offset": offset, "length": length, "file_offset": file_offset,
            })
    for i in range(n_parts):
        p = query(fd, PART, PART_BYTES, name, i)
        prank = struct.unpack_from("<I", p, 1120)[0]
        begin, end, first, count = struct.unpack_from("<QQQQ", p, 1192)
        tensor["parts"].append({
            "role": cstr(p, 1040, 64),
            "dtype": cstr(p, 1104, 16),
            "shape": list(struct.unpack_from("<8Q", p, 1128)[:prank]),
            "file_begin": begin, "file_end": end,
            "extents": extents[first:first + count],
        })
    if not tensor["encoded"]:
        assert tensor["parts"][0]["file_begin"] == file_begin and tensor["parts"][0]["file_end"] == file_end
    return tensor


def header_entries(path):
    """The file's safetensors entries: name → (dtype, shape, absolute begin, end), file order."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    entries = {
        name: (e["dtype"], e["shape"], 8 + n + e["data_offsets"][0], 8 + n + e["data_offsets"][1])
        for name, e in header.items()
    }
    return dict(sorted(entries.items(), key=lambda kv: kv[1][2]))


class Stager:
    """Two staging buffers, pinned on CUDA; each extent is read into one while the other's
    copy to the device runs."""

    def __init__(self, device, buffer_bytes, count=2):
        self.device = device
        self.cuda = device.type == "cuda"
        self.buffers = [torch.empty(buffer_bytes, dtype=torch.uint8, pin_memory=self.cuda)
                        for _ in range(count)]
        self.views = [memoryview(b.numpy()) for b in self.buffers]
        self.events = [None] * count
        self.next = 0
        self.fds = {}

    def close(self):
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def fd(self, path):
        if path not in self.fds:
            self.fds[path] = os.open(path, os.O_RDONLY)
        return self.fds[path]

    def take(self):
        """The next buffer, once its last copy is done."""
        slot = self.next
        self.next = (slot + 1) % len(self.buffers)
        if self.events[slot] is not None:
            self.events[slot].synchronize()
            self.events[slot] = None
        return slot

    def read(self, path, offset, view):
        """Reads len(view) bytes at `offset` of blob `path`; short reads go on, EOF is an error."""
        fd, done = self.fd(path), 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], offset + done)
            if n == 0:
                raise OSError(errno.EIO, f"blob {path} ends at byte {offset + done}, before "
                              f"{offset + len(view)}: truncated or damaged (tensorfs verify)")
            done += n

    def copy(self, slot, used, dst):
        if self.cuda:
            dst.copy_(self.buffers[slot][:used], non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.events[slot] = event
        else:
            dst.copy_(self.buffers[slot][:used])

    def load_part(self, part):
        """The part's stored bytes on the device (uint8)."""
        size = part["file_end"] - part["file_begin"]
        dst = torch.empty(size, dtype=torch.uint8, device=self.device)
        capacity = len(self.views[0])
        slot, used, pos = None, 0, 0
        for x in part["extents"]:
            done = 0
            while done < x["length"]:
                if slot is None:
                    slot, used = self.take(), 0
                n = min(capacity - used, x["length"] - done)
                self.read(x["path"], x["offset"] + done, self.views[slot][used:used + n])
                used, done = used + n, done + n
                if used == capacity:
                    self.copy(slot, used, dst[pos:pos + used])
                    pos, slot = pos + used, None
        if slot is not None and used:
            self.copy(slot, used, dst[pos:pos + used])
            pos += used
        if pos != size:
            raise RuntimeError(f"part {part['role']}: extents hold {pos} bytes, the part {size}")
        return dst

    def finish(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)


def as_dtype(raw, dtype, shape):
    """`raw` (uint8) viewed as `dtype` and `shape`, or None for a dtype torch lacks."""
    if dtype not in DTYPES:
        return None
    return raw.view(DTYPES[dtype]).reshape(shape)


def same_bytes(a, b):
    return a.dtype == b.dtype and list(a.shape) == list(b.shape) and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def tensors_of(fd, entries):
    """Locates every tensor of the file once (an encoded tensor's parts name it too)."""
    seen, tensors, decoded = set(), [], []
    by_begin = {v[2]: k for k, v in entries.items()}
    for name in entries:
        if name in seen:
            continue
        try:
            t = locate(fd, name)
        except OSError as e:
            if e.errno == errno.ENODATA:  # decoded in this view (<lane>@decoded)
                decoded.append(name)
                seen.add(name)
                continue
            raise
        for p in t["parts"]:
            p["entry"] = by_begin.get(p["file_begin"])
            seen.add(p["entry"])
        seen.add(t["key"])
        tensors.append(t)
    return tensors, decoded


def compare(path, device, stager, tensors, verbose):
    """Loads each tensor through the extents and compares each array with safetensors'."""
    mismatches, compared = [], 0
    with safe_open(path, framework="pt", device=str(device)) as f:
        for t in tensors:
            lines, differs = [], False
            for p in t["parts"]:
                raw = stager.load_part(p)
                dtype, shape = (p["dtype"], p["shape"]) if t["encoded"] else (t["dtype"], t["shape"])
                ours = as_dtype(raw, dtype, shape)
                ref = f.get_tensor(p["entry"])
                ok = same_bytes(ours, ref) if ours is not None else torch.equal(
                    raw.cpu(), ref.reshape(-1).view(torch.uint8).cpu())
                compared += 1
                if not ok:
                    differs = True
                    mismatches.append(f"{t['key']} part {p['role']} ({p['entry']})")
                lines.append(f"{p['role']} {p['dtype']} {p['shape']} {len(p['extents'])} extent(s) "
                             f"{'equal' if ok else 'DIFFERS'}")
            stager.finish()
            if verbose or t["encoded"] or differs:
                head = f"{t['key']}: {t['dtype']} {t['shape']}"
                if t["encoded"]:
                    head += f", encoded {t['scheme']} {t['params']}: parts (raw, not decoded)"
                print(f"  {head}: " + "; ".join(lines))
    return compared, mismatches


def time_ours(stager, tensors):
    start = time.perf_counter()
    for t in tensors:
        for p in t["parts"]:
            stager.load_part(p)
    stager.finish()
    return time.perf_counter() - start


def time_safetensors(path, device):
    start = time.perf_counter()
    with safe_open(path, framework="pt", device=str(device)) as f:
        for name in f.keys():
            f.get_tensor(name)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def run(args):
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CudaNotAvailable(
            f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False); "
            "run on a machine with an NVIDIA GPU and driver, or pass --device cpu to run the "
            "same path into CPU memory")
    if device.type not in ("cuda", "cpu"):
        raise SystemExit(f"gpu_load: --device {args.device}: only cuda[:N] and cpu")
    entries = header_entries(args.file)
    fd = os.open(args.file, os.O_RDONLY)
    try:
        try:
            tensors, decoded = tensors_of(fd, entries)
        except OSError as e:
            if e.errno == errno.ENOTTY:
                raise SystemExit(f"gpu_load: {args.file}: not a file of a TensorFS mount "
                                 "(the extents ioctl answers ENOTTY)")
            raise
    finally:
        os.close(fd)
    stager = Stager(device, args.buffer_mib << 20)
    try:
        print(f"gpu_load: {args.file} -> {device} (staging: 2 {'pinned ' if stager.cuda else ''}"
              f"buffers of {args.buffer_mib} MiB)")
        compared, mismatches = compare(args.file, device, stager, tensors, args.verbose)
        ours = min(time_ours(stager, tensors) for _ in range(args.runs))
        theirs = min(time_safetensors(args.file, device) for _ in range(args.runs))
    finally:
        stager.close()
    total = sum(p["file_end"] - p["file_begin"] for t in tensors for p in t["parts"])
    encoded = [t for t in tensors if t["encoded"]]
    print(f"method: each path loads every tensor of the file to {device} and waits for it; best of "
          f"{args.runs} run(s), caches warm (the comparison pass read everything first)")
    print("| path | MB | s | GB/s |\n|---|---|---|---|")
    for label, s in (("extents: preadv -> staging buffer -> device", ours),
                     (f"safetensors safe_open(device={str(device)!r})", theirs)):
        print(f"| {label} | {total / 1e6:.1f} | {s:.4f} | {total / 1e9 / max(s, 1e-9):.2f} |")
    print(f"{len(tensors)} tensors ({len(tensors) - len(encoded)} plain, {len(encoded)} encoded, "
          f"{sum(len(t['parts']) for t in encoded)} parts of them), {compared} arrays compared: "
          f"{compared - len(mismatches)} equal to safetensors', {len(mismatches)} differ"
          + (f"; {len(decoded)} decoded in this view, not located" if decoded else ""))
    for m in mismatches:
        print(f"  differs: {m}")
    if args.json:
        print(json.dumps({
            "file": args.file, "device": str(device), "tensors": len(tensors),
            "encoded": len(encoded), "arrays_compared": compared, "differ": mismatches,
            "decoded_not_located": decoded, "bytes": total,
            "extents_s": ours, "safetensors_s": theirs,
        }))
    return 1 if mismatches else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="a .safetensors file of a TensorFS mount")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--buffer-mib", type=int, default=16, help="each staging buffer (default 16)")
    ap.add_argument("--runs", type=int, default=1, help="timed runs of each path (best kept)")
    ap.add_argument("--json", action="store_true", help="also print a JSON summary line")
    ap.add_argument("-v", "--verbose", action="store_true", help="a line per tensor")
    args = ap.parse_args()
    try:
        return run(args)
    except CudaNotAvailable as e:
        print(f"gpu_load: CUDA not available: {e}", file=sys.stderr)
        return 3
    except OSError as e:
        print(f"gpu_load: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
