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
    """Unmounts `mnt`, lazily if a reader still holds it, so no test leaves a mount behind."""
    subprocess.run([str(BIN), "unmount", str(mnt)], capture_output=True)
    if os.path.ismount(mnt):
        subprocess.run([str(BIN), "unmount", "--lazy", str(mnt)], capture_output=True)


def status(mnt):
    """The daemon's status of the mount at `mnt` (`user.tensorfs.status`, docs/xattrs.md)."""
    out = subprocess.run(
        ["getfattr", "--only-values", "-n", "user.tensorfs.status", str(mnt)],
        capture_output=True,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
