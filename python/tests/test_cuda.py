"""Loading to CUDA devices: `safe_open(device="cuda")` on a mounted file and
`tensors.read(device="cuda")` read the store's blobs straight into device memory (the wheel's
`cuda` feature, `tensorfs::gpu`), equal to safetensors' own reading; without a device, the
errors safetensors and the format's API give.

The device tests need a CUDA device: on a machine without one they are skipped by name (CI has
none; `tools/gpu-test.sh` runs them on a GPU machine, where TENSORFS_REQUIRE_GPU=1 makes a
missing device a failure). The others run everywhere.
"""

import errno
import os
import re
import stat

import pytest
import safetensors
import safetensors.torch
import torch
from safetensors.torch import save_file

import cozytensors
import cozytensors.torch
from cozytensors import _native

from mounts import blob_path, prerequisites, status, tensorfs, unmount
from test_safe_open import _locate, _tensors, same

CUDA = torch.cuda.is_available()


def needs_cuda():
    if CUDA:
        return
    why = "no CUDA device (torch.cuda.is_available() is False): run tools/gpu-test.sh on a GPU machine"
    if os.environ.get("TENSORFS_REQUIRE_GPU") == "1":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def mounted(tmp_path_factory):
    """The model of test_safe_open (every dtype, a tensor spanning chunks, a scalar, an empty
    tensor) and an int8 rowwise lane of a small one, imported and mounted."""
    prerequisites()
    work = tmp_path_factory.mktemp("cuda")
    source = work / "model.safetensors"
    save_file(_tensors(), str(source), metadata={"format": "pt"})
    dense = work / "dense.safetensors"
    g = torch.Generator().manual_seed(3)
    save_file({"proj.weight": torch.randn(96, 256, generator=g), "proj.bias": torch.randn(96, generator=g)}, str(dense))
    store, mnt = work / "store", work / "mnt"
    tensorfs(store, "import", source, "--name", "local/model")
    tensorfs(store, "import", dense, "--name", "local/dense")
    tensorfs(store, "quantize", "local/dense", "--scheme", "int8.rowwise", "--name", "local/q8")
    mnt.mkdir()
    tensorfs(store, "mount", mnt, "--log-file", work / "mount.log")
    try:
        yield {
            "file": mnt / "local/model/latest/f32/model.safetensors",
            "source": source,
            "store": store,
            "mnt": mnt,
        }
    finally:
        unmount(mnt)


def test_the_wheel_loads_to_devices():
    assert hasattr(_native, "to_device"), "the wheel is built with the cuda feature"


def test_a_device_that_does_not_exist_fails_as_safetensors_fails(mounted):
    """On any machine: cuda:97 is no device here. Our error is of the class safetensors'
    own reading of the local file raises."""
    with safetensors.safe_open(mounted["source"], framework="pt", device="cuda:97") as theirs:
        with pytest.raises(Exception) as expected:
            theirs.get_tensor("big")
    with cozytensors.safe_open(mounted["file"], framework="pt", device="cuda:97") as ours:
        assert ours._fast
        with pytest.raises(type(expected.value)):
            ours.get_tensor("big")


def test_safe_open_on_a_device_equals_safetensors_and_bypasses_the_mount(mounted):
    needs_cuda()
    file = mounted["file"]
    served = status(mounted["mnt"])["bytes_served"]
    with cozytensors.safe_open(file, framework="pt", device="cuda:0") as ours:
        assert ours._fast
        tensors = {name: ours.get_tensor(name) for name in ours.keys()}
    assert status(mounted["mnt"])["bytes_served"] - served < 1 << 20, "only the header crossed FUSE"
    with safetensors.safe_open(mounted["source"], framework="pt", device="cuda:0") as theirs:
        for name in theirs.keys():
            expected = theirs.get_tensor(name)
            assert tensors[name].device == expected.device, name
            assert same(tensors[name], expected), name
    # The tensors are torch's own memory (its allocator), writable, and the store is untouched.
    tensors["big"][0] = 1234.0
    loaded = cozytensors.torch.load_file(file, device="cuda")
    assert loaded["big"][0] != 1234.0 and loaded["big"].device.type == "cuda"
    expected = safetensors.torch.load_file(mounted["source"], device="cuda")
    assert list(loaded) == list(expected)
    assert all(same(loaded[k], expected[k]) for k in expected)


def test_a_device_load_on_a_busy_side_stream_gives_the_tensor(mounted):
    """Loads while a side stream with queued work is current: the copies are ordered after
    that stream's work (the memory is allocated on it), and the tensor is complete when
    get_tensor returns."""
    needs_cuda()
    side = torch.cuda.Stream()
    expected = safetensors.torch.load_file(mounted["source"])["big"]
    with torch.cuda.stream(side):
        busy = torch.randn(4096, 4096, device="cuda")
        for _ in range(20):  # queue work on the side stream before the load
            busy = busy @ busy / 4096
        with cozytensors.safe_open(mounted["file"], framework="pt", device="cuda") as ours:
            got = ours.get_tensor("big")
        assert torch.equal(got.cpu(), expected)
    torch.cuda.synchronize()


def test_read_to_a_device_equals_the_host_read(mounted):
    """On a machine with CUDA: every tensor, encoded parts and decoded tensors on the device
    equal the host read, shared with torch through DLPack as CUDA memory. Without: the API's
    UnsupportedError, saying CUDA is not available."""
    root = mounted["store"]
    with cozytensors.open("local/model", store=root) as ckpt:
        (component,) = ckpt.components.values()
        if not CUDA:
            with pytest.raises(cozytensors.UnsupportedError, match="CUDA not available") as raised:
                component.tensors.read("big", device="cuda")
            assert raised.value.code == "unsupported" and "big" in raised.value.detail
            return
        host = component.tensors.read()
        device = component.tensors.read(device="cuda:0")
        assert list(device) == list(host)
        for key, array in device.items():
            assert array.device == "cuda:0" and array.__dlpack_device__() == (2, 0), key
            assert (array.dtype, array.shape, array.nbytes) == (host[key].dtype, host[key].shape, host[key].nbytes)
            if array.nbytes == 0:
                assert array.tobytes() == host[key].tobytes(), key
                continue
            on_device = torch.from_dlpack(array)
            assert on_device.device == torch.device("cuda", 0), key
            assert same(on_device.cpu(), torch.from_dlpack(host[key])), key
    with cozytensors.open("local/q8", store=root) as ckpt:
        (component,) = ckpt.components.values()
        encoded = [k for k, m in component.tensors.items() if m.encoding is not None]
        assert encoded
        for key in encoded:
            stored, on_device = component.tensors.read(key), component.tensors.read(key, device="cuda")
            for role, part in stored.parts.items():
                assert on_device.parts[role].device == "cuda:0"
                assert on_device.parts[role].tobytes() == part.tobytes(), (key, role)
            decoded = component.tensors.read(key, decode=True, device=0)
            assert decoded.device == "cuda:0"
            assert decoded.tobytes() == component.tensors.read(key, decode=True).tobytes(), key


def test_device_arrays_free_their_memory_after_their_last_consumer(mounted):
    needs_cuda()
    with cozytensors.open("local/model", store=mounted["store"]) as ckpt:
        (component,) = ckpt.components.values()
        torch.cuda.synchronize()
        free_before, _ = torch.cuda.mem_get_info()
        arrays = [component.tensors.read("big", device="cuda") for _ in range(8)]  # 8 × 80 MB
        shared = torch.from_dlpack(arrays[0])
        free_loaded, _ = torch.cuda.mem_get_info()
        assert free_before - free_loaded >= 8 * 80_000_000 * 0.95
        del arrays
        expected = torch.from_dlpack(component.tensors.read("big"))
        assert torch.equal(shared.cpu(), expected), "torch's tensor keeps its array alive"
        del shared
        torch.cuda.synchronize()
        free_after, _ = torch.cuda.mem_get_info()
        assert free_before - free_after < 64 << 20, "the memory went back"


def test_a_damaged_blob_on_the_device_path_is_an_error(tmp_path):
    needs_cuda()
    prerequisites()
    source = tmp_path / "model.safetensors"
    tensors = {"a": torch.arange(256, dtype=torch.float32), "z": torch.arange(20_000_000, dtype=torch.float32)}
    save_file(tensors, str(source))
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    tensorfs(store, "import", source, "--name", "local/d")
    mnt.mkdir()
    tensorfs(store, "mount", mnt, "--log-file", tmp_path / "mount.log")
    try:
        file = mnt / "local/d/latest/f32/model.safetensors"
        sha, _, offset, _, _ = _locate(file, "z")["parts"][0]["extents"][-1]
        assert sha != _locate(file, "a")["parts"][0]["extents"][0][0], "z ends in a chunk of its own"
        blob = blob_path(store, sha)
        mode = blob.stat().st_mode
        blob.chmod(mode | stat.S_IWUSR)
        with open(blob, "r+b") as f:
            f.seek(offset + 8)
            byte = f.read(1)
            f.seek(offset + 8)
            f.write(bytes([byte[0] ^ 0xFF]))
        blob.chmod(mode)
        with cozytensors.safe_open(file, framework="pt", device="cuda") as ours:
            assert torch.equal(ours.get_tensor("a").cpu(), tensors["a"])
            with pytest.raises(OSError, match="damaged blob") as raised:
                ours.get_tensor("z")
            assert raised.value.errno == errno.EIO and re.search("tensor ['\"]z['\"]", str(raised.value))
        with cozytensors.open("local/d", store=store) as ckpt:
            (component,) = ckpt.components.values()
            with pytest.raises(cozytensors.IntegrityError):
                component.tensors.read("z", device="cuda")
    finally:
        unmount(mnt)
