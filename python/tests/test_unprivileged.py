"""An unprivileged user on a standard system (/dev/fuse mode 0666, fusermount3 setuid) imports
a model into a store of their own, mounts it, and loads it with cozytensors from the blobs
(and opens it with the format API), as root does.

Runs as root: it makes /dev/fuse 0666 for the test's length (the mode a standard system gives
it) and forks a child that drops to `nobody` after every module it needs is imported (the
venv may lie under a folder `nobody` cannot read).
"""

import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import cozytensors
import cozytensors._api  # noqa: F401 - imported before the child drops privileges
import cozytensors._loader  # noqa: F401
from mounts import BIN, prerequisites


def _child(work: Path, tensorfs: Path, expected: dict) -> dict:
    """What `nobody` sees: run in the forked child after setuid."""
    store, mnt, source = work / "store", work / "mnt", work / "model.safetensors"

    def run(*args):
        out = subprocess.run([str(tensorfs), "--store", str(store), *map(str, args)],
                             capture_output=True, text=True)
        assert out.returncode == 0, f"tensorfs {' '.join(map(str, args))}: {out.stderr}"

    said = {"uid": os.getuid()}
    run("import", source, "--name", "local/m")
    mnt.mkdir()
    run("mount", mnt, "--view-cache", "0", "--log-file", work / "mount.log")
    try:
        file = mnt / "local/m/latest/f32/model.safetensors"
        with cozytensors.safe_open(file, framework="pt") as f:
            said["fast"] = f._fast
            said["equal"] = all(
                f.get_tensor(k).numpy().tobytes() == bytes.fromhex(v) for k, v in expected.items()
            )
    finally:
        subprocess.run([str(tensorfs), "unmount", str(mnt)], capture_output=True)
    said["unmounted"] = not os.path.ismount(mnt)
    with cozytensors.open("local/m", store=store) as ckpt:
        (component,) = ckpt.components.values()
        said["api_equal"] = all(
            component.tensors.read(k).tobytes() == bytes.fromhex(v) for k, v in expected.items()
        )
    return said


def test_an_unprivileged_user_mounts_and_loads_from_the_blobs():
    prerequisites()
    if os.geteuid() != 0:
        why = "needs root (it lends /dev/fuse to an unprivileged user)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    nobody = pwd.getpwnam("nobody")
    work = Path(tempfile.mkdtemp(prefix="cozytensors-nobody-"))
    fuse_mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    try:
        os.chmod(work, 0o755)
        # The binary where `nobody` may run it (a build folder may lie under /root).
        tensorfs = work / "tensorfs"
        shutil.copy2(BIN, tensorfs)
        g = torch.Generator().manual_seed(5)
        tensors = {"a.weight": torch.randn(256, 512, generator=g), "b.bias": torch.randn(7, generator=g)}
        save_file(tensors, str(work / "model.safetensors"))
        expected = {k: v.numpy().tobytes().hex() for k, v in tensors.items()}
        os.chown(work, nobody.pw_uid, nobody.pw_gid)
        os.chown(work / "model.safetensors", nobody.pw_uid, nobody.pw_gid)
        os.chmod("/dev/fuse", 0o666)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            status = 1
            try:
                os.close(read)
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                os.environ["HOME"] = str(work)
                said = _child(work, tensorfs, expected)
                os.write(write, json.dumps(said).encode())
                status = 0
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                os.write(write, json.dumps({"error": repr(e)}).encode())
            finally:
                os._exit(status)
        os.close(write)
        with os.fdopen(read) as f:
            said = json.loads(f.read() or "{}")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, said
        assert said["uid"] == nobody.pw_uid
        assert said["fast"], "the user's own store is read from its blobs"
        assert said["equal"] and said["api_equal"], said
        assert said["unmounted"], said
    finally:
        os.chmod("/dev/fuse", fuse_mode)
        mnt = work / "mnt"
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
