"""Real TensorFS stores and mounts for the suite, through the `tensorfs` binary
($TENSORFS_BIN, else target/release/tensorfs), which needs /dev/fuse."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TENSORFS_BIN", ROOT / "target" / "release" / "tensorfs"))


def prerequisites():
    """Fails the test under CI=true when the binary or /dev/fuse is missing; skips it, by
    name, elsewhere."""
    missing = []
    if not BIN.is_file():
        missing.append(f"the tensorfs binary at {BIN} (cargo build --release)")
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse")
    if missing:
        why = "missing: " + ", ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def tensorfs(store, *args):
    """Runs `tensorfs --store STORE ARGS…`, asserting it succeeds; returns its stdout."""
    out = subprocess.run(
        [str(BIN), "--store", str(store), *map(str, args)], capture_output=True, text=True
    )
    assert out.returncode == 0, f"tensorfs {' '.join(map(str, args))}: {out.stderr}"
    return out.stdout


def unmount(mnt):
    """Unmounts `mnt`, lazily if a reader still holds it, so no test leaves a mount behind;
    fails, saying why, when it stays."""
    tries = [subprocess.run([str(BIN), "unmount", str(mnt)], capture_output=True, text=True)]
    if os.path.ismount(mnt):
        tries.append(subprocess.run([str(BIN), "unmount", "--lazy", str(mnt)], capture_output=True, text=True))
    assert not os.path.ismount(mnt), f"{mnt} is still mounted: " + "; ".join(t.stderr.strip() for t in tries)


def status(mnt):
    """The daemon's status of the mount at `mnt` (`user.tensorfs.status`, docs/xattrs.md)."""
    return json.loads(os.getxattr(mnt, "user.tensorfs.status"))


def blob_path(store, sha: str) -> Path:
    """The file of blob `sha` (SHA-256 hex) in `store`: `blobs/ab/cd/abcd…` (the store's
    layout, `tensorfs.store/3`)."""
    return Path(store) / "blobs" / sha[:2] / sha[2:4] / sha
