"""cozytensors.safe_open on real TensorFS mounts: every tensor equal to safetensors' own
reading, from the blobs and not through FUSE; files elsewhere are safetensors' own; a damaged
blob is an error, never wrong values.

Needs the `tensorfs` binary and /dev/fuse (`mounts.py`).
"""

import ctypes
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time

import pytest
import safetensors
import torch
from safetensors.torch import save_file

import cozytensors
import cozytensors.torch
import safetensors.torch
from cozytensors import _native

from mounts import blob_path, prerequisites, status, tensorfs, unmount


def _tensors():
    """Tensors of every dtype torch and safetensors share, sized so that some span the
    store's 64 MiB chunks; with scalars and an empty tensor."""
    g = torch.Generator().manual_seed(7)
    out = {}
    for i, dtype in enumerate(
        [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.int64, torch.uint8]
    ):
        base = torch.randn(5_000_000 + 97 * i, generator=g)
        if dtype.is_floating_point:
            out[f"layer.{i}.weight"] = base.to(dtype)
        else:
            out[f"layer.{i}.weight"] = (base * 50).to(dtype)
    out["big"] = torch.randn(20_000_000, generator=g)  # 80 MB: spans two chunks
    out["mask"] = torch.randn(333, generator=g) > 0
    out["scalar"] = torch.tensor(3.5)
    out["empty"] = torch.zeros(0, 4)
    # Zero-size and first in the data (F64 before the rest) where another tensor starts:
    # offset_keys puts it first, as safetensors does, though its name sorts last.
    out["zz_empty"] = torch.zeros(0, dtype=torch.float64)
    out["fp8"] = torch.randn(1000, generator=g).to(torch.float8_e4m3fn)
    return out


@pytest.fixture(scope="module")
def mounted(tmp_path_factory):
    prerequisites()
    work = tmp_path_factory.mktemp("mounted")
    source = work / "model.safetensors"
    save_file(_tensors(), str(source), metadata={"format": "pt", "note": "cozytensors"})
    store, mnt = work / "store", work / "mnt"
    tensorfs(store, "import", source, "--name", "local/model")
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


def _locate(file, name):
    fd = os.open(file, os.O_RDONLY)
    try:
        return _native.locate(fd, str(file), name)
    finally:
        os.close(fd)


def same(a, b):
    """Equal dtype, shape and bytes (NaNs equal to themselves)."""
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.numel() == 0:
            return True
        a, b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert a.dtype == b.dtype and a.shape == b.shape
    return a.tobytes() == b.tobytes()


def _cached(path, offset: int) -> bool:
    """Whether the page of byte `offset` of file `path` is in the page cache: `mincore` of a
    mapping of it, which reads nothing (a probe by `RWF_NOWAIT` read starts read-ahead of
    what it finds absent, so it answers "cached" the second time whatever the loader did)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, page, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset // page * page)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            resident = ctypes.c_ubyte()
            assert libc.mincore(address, page, ctypes.byref(resident)) == 0, os.strerror(ctypes.get_errno())
            return bool(resident.value & 1)
        finally:
            libc.munmap(address, page)
    finally:
        os.close(fd)


def _evict(path):
    """Drops file `path`'s pages from the page cache (those no mapping holds)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_every_tensor_equals_safetensors_and_comes_from_the_blobs(mounted, backend):
    file = mounted["file"]
    served = status(mounted["mnt"])["bytes_served"]
    with cozytensors.safe_open(file, framework="pt", backend=backend) as ours:
        assert ours._fast, "the mounted file is read from the blobs"
        tensors = {name: ours.get_tensor(name) for name in ours.keys()}
        keys, offset_keys, metadata = ours.keys(), ours.offset_keys(), ours.metadata()
    # Only the header crossed FUSE.
    assert status(mounted["mnt"])["bytes_served"] - served < 1 << 20
    with safetensors.safe_open(mounted["source"], framework="pt") as theirs:
        assert keys == theirs.keys()
        assert offset_keys == theirs.offset_keys()
        assert metadata == theirs.metadata()
        for name in keys:
            assert same(tensors[name], theirs.get_tensor(name)), name
    # At least one tensor spans chunk blobs, and it reads right (above).
    spans = [
        name
        for name in keys
        if any(len(p["extents"]) > 1 for p in _locate(file, name)["parts"])
    ]
    assert spans, "the test model has a tensor spanning chunks"
    # Writable, copy-on-write: the store is untouched.
    tensors["big"][0] = 1234.0
    with cozytensors.safe_open(file, framework="pt") as again:
        assert again.get_tensor("big")[0] != 1234.0


def test_numpy_and_load_file_agree_with_safetensors(mounted):
    file = mounted["file"]
    with cozytensors.safe_open(file, framework="np") as ours, safetensors.safe_open(
        mounted["source"], framework="np"
    ) as theirs:
        for name in theirs.keys():
            try:
                expected = theirs.get_tensor(name)
            except Exception as e:  # a dtype numpy lacks: the same error
                with pytest.raises(type(e)):
                    ours.get_tensor(name)
                continue
            assert same(ours.get_tensor(name), expected), name
    loaded = cozytensors.torch.load_file(file)
    expected = safetensors.torch.load_file(mounted["source"])
    assert list(loaded) == list(expected)
    for name in expected:
        assert same(loaded[name], expected[name]), name


def test_an_absent_tensor_is_safetensors_error(mounted):
    with cozytensors.safe_open(mounted["file"], framework="pt") as ours:
        with pytest.raises(safetensors.SafetensorError, match="does not contain tensor nope"):
            ours.get_tensor("nope")
    # Used after its context: safetensors' error; tensors built before stay valid.
    with cozytensors.safe_open(mounted["file"], framework="pt") as ours:
        kept = ours.get_tensor("layer.0.weight")
    with pytest.raises(safetensors.SafetensorError, match="File is closed"):
        ours.get_tensor("layer.0.weight")
    assert same(kept, _tensors()["layer.0.weight"])


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_slices_equal_safetensors_and_come_from_the_blobs(mounted, backend):
    """Transformers' from_pretrained takes every tensor as a slice (`get_slice(k)[...]`),
    closing the file only after; tensor-parallel loads index rows and columns. safetensors'
    pread backend slices by its own rules, not torch's: with it, slices are safetensors' own,
    read through the mount."""
    indices = [..., 0, -1, slice(None, 10), slice(3, 1000, 7), slice(0, 10**9), (slice(None), None)]
    served = status(mounted["mnt"])["bytes_served"]
    with cozytensors.safe_open(mounted["file"], framework="pt", backend=backend) as ours:
        slices = {name: ours.get_slice(name) for name in ours.keys()}
    with safetensors.safe_open(mounted["source"], framework="pt", backend=backend) as theirs:
        for name, ours_slice in slices.items():
            theirs_slice = theirs.get_slice(name)
            assert ours_slice.get_shape() == theirs_slice.get_shape(), name
            assert ours_slice.get_dtype() == theirs_slice.get_dtype(), name
            for index in indices if ours_slice.get_shape() else [...]:
                try:
                    expected = theirs_slice[index]
                except Exception as e:  # the same error, from the same indexing rules
                    with pytest.raises(type(e)):
                        ours_slice[index]
                    continue
                # Taken before the file closed, indexed after: as safetensors' slices.
                assert same(ours_slice[index], expected), (name, index)
        layer = theirs.get_slice("layer.1.weight")
        for bad in [slice(None, None, -1), 10**9]:
            with pytest.raises(Exception) as theirs_error:
                layer[bad]
            with pytest.raises(theirs_error.type):
                slices["layer.1.weight"][bad]
    if backend == "mmap":
        assert status(mounted["mnt"])["bytes_served"] - served < 1 << 20, "only the header"
    with cozytensors.safe_open(mounted["file"], framework="pt") as ours:
        with pytest.raises(safetensors.SafetensorError, match="does not contain tensor nope"):
            ours.get_slice("nope")
    with pytest.raises(safetensors.SafetensorError, match="File is closed"):
        ours.get_slice("big")
    # NumPy slices are safetensors' own (its rules, not NumPy's), through the mount.
    with cozytensors.safe_open(mounted["file"], framework="np") as ours:
        assert same(ours.get_slice("big")[:10], ours.get_tensor("big")[:10])


def test_a_file_elsewhere_is_read_by_safetensors(mounted, tmp_path):
    copy = tmp_path / "copy.safetensors"
    shutil.copyfile(mounted["source"], copy)
    with cozytensors.safe_open(copy, framework="pt") as ours:
        assert not ours._fast
        assert same(ours.get_tensor("big"), safetensors.torch.load_file(copy)["big"])
    # A file that is not safetensors: safetensors' own error.
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\xff" * 100)
    with pytest.raises(safetensors.SafetensorError):
        cozytensors.safe_open(junk, framework="pt")


def test_a_store_the_caller_cannot_read_falls_back(mounted, monkeypatch):
    # As in a container that binds only the mount: the store's folder is not there.
    real = os.access
    blobs = str(mounted["store"] / "blobs")
    monkeypatch.setattr(os, "access", lambda p, m: False if str(p) == blobs else real(p, m))
    with cozytensors.safe_open(mounted["file"], framework="pt") as ours:
        assert not ours._fast
        assert same(ours.get_tensor("layer.1.weight"), _tensors()["layer.1.weight"])


def test_a_damaged_blob_is_an_error_never_wrong_values(tmp_path):
    prerequisites()
    source = tmp_path / "model.safetensors"
    # `a` and the header lie in one chunk; `w` (80 MB) and `z` (16 MiB), standalone, in others.
    tensors = {
        "a": torch.arange(256, dtype=torch.float32),
        "w": torch.zeros(20_000_000),
        "z": torch.arange(1 << 22, dtype=torch.float32),
    }
    save_file(tensors, str(source))
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    tensorfs(store, "import", source, "--name", "local/d")
    mnt.mkdir()
    tensorfs(store, "mount", mnt, "--log-file", tmp_path / "mount.log")
    try:
        file = mnt / "local/d/latest/f32/model.safetensors"
        located = _locate(file, "z")
        sha, _, offset, _, _ = located["parts"][0]["extents"][-1]
        first = _locate(file, "a")["parts"][0]["extents"][0][0]
        assert sha != first, "z lies in another chunk than the header"
        def flip(sha, at):
            blob = blob_path(store, sha)
            mode = blob.stat().st_mode
            blob.chmod(mode | stat.S_IWUSR)
            with open(blob, "r+b") as f:
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([byte[0] ^ 0xFF]))
            blob.chmod(mode)

        # Another chunk than the header's: the file opens, `a` reads, `z` (mapped or read) and
        # `w` (read across both chunks) are refused.
        flip(sha, offset + 8)
        w_sha, _, w_offset, _, _ = _locate(file, "w")["parts"][0]["extents"][-1]
        flip(w_sha, w_offset + 8)
        for backend in ["mmap", "pread"]:
            with cozytensors.safe_open(file, framework="pt", backend=backend) as ours:
                assert torch.equal(ours.get_tensor("a"), tensors["a"])
                for name in ["z", "w"]:
                    with pytest.raises(OSError, match="damaged blob") as raised:
                        ours.get_tensor(name)
                    assert raised.value.errno == errno.EIO
                    assert f"tensor {name!r}" in str(raised.value)
        # `w`'s first chunk, mapped before its second was refused, was unmapped with it.
        assert _blob_mappings(store) == 0
        # What safetensors reads for us (a NumPy slice) is read through the mount first: an
        # error, where a fault on safetensors' mapping of the file would kill the process.
        for backend in ["mmap", "pread"]:
            probe = f"""
import cozytensors
with cozytensors.safe_open({str(file)!r}, framework="numpy", backend={backend!r}) as f:
    try:
        f.get_slice("z")[0:4]
    except OSError as e:
        print("errno", e.errno, e)
"""
            run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, f"{backend}: exit {run.returncode}: {run.stderr[-2000:]}"
            assert f"errno {errno.EIO}" in run.stdout and "tensor 'z'" in run.stdout, (backend, run.stdout)
        # The header's chunk: the mount proves it before it serves the header, and refuses
        # it; so do we, where safetensors' own mapping of the file would die of SIGBUS.
        flip(first, 0)
        fd = os.open(file, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the header's page, read again
        os.close(fd)
        with pytest.raises(OSError, match="reading its safetensors header") as raised:
            cozytensors.safe_open(file, framework="pt")
        assert raised.value.errno == errno.EIO
    finally:
        unmount(mnt)


def test_a_cold_tensor_is_read_ahead_and_the_hint_never_fails(mounted):
    """A tensor whose blob pages are not cached is asked of the disk at once (will_need): its
    last page comes into the page cache before anything touches the tensor, and the values
    are safetensors'. A hint at an address that is not mapped is no error."""
    file = mounted["file"]
    (sha, length, offset, size, _), = _locate(file, "layer.0.weight")["parts"][0]["extents"]
    blob = blob_path(mounted["store"], sha)
    last = offset + size - 1

    def cached() -> bool:
        return _cached(blob, last)

    _evict(blob)
    assert not cached()
    with cozytensors.safe_open(file, framework="pt") as ours, safetensors.safe_open(
        mounted["source"], framework="pt"
    ) as theirs:
        tensor = ours.get_tensor("layer.0.weight")  # a view of the mapping, not read yet
        deadline = time.monotonic() + 10
        while not cached() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cached(), "the tensor's range was not asked of the disk"
        assert same(tensor, theirs.get_tensor("layer.0.weight"))
    _native.will_need(0, 1)
    _native.will_need(1 << 46, 1 << 40)
    _native.will_need((1 << 64) - 1, 1)


def _resident_kib(address: int) -> int:
    """The resident KiB (`Rss` in /proc/self/smaps) of this process's mapping holding `address`:
    the pages its page tables map, cached pages a read has not touched not counted."""
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                begin, end = (int(x, 16) for x in head.split("-"))
                inside = begin <= address < end
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_cached_tensor_is_mapped_at_once(mounted):
    """A tensor whose blob pages are cached has its range mapped before anything touches it
    (will_need: MADV_POPULATE_READ), so reading it takes no page faults; its values are
    safetensors'."""
    file = mounted["file"]
    name = "layer.0.weight"
    (sha, _, offset, size, _), = _locate(file, name)["parts"][0]["extents"]
    with open(blob_path(mounted["store"], sha), "rb") as blob:
        blob.seek(offset)
        assert len(blob.read(size)) == size  # cached now
    with cozytensors.safe_open(file, framework="pt") as ours, safetensors.safe_open(
        mounted["source"], framework="pt"
    ) as theirs:
        tensor = ours.get_tensor(name)  # a view of the mapping, not read yet
        assert _resident_kib(tensor.data_ptr()) >= size // 1024 - 4
        assert same(tensor, theirs.get_tensor(name))


def test_one_whole_file_query_serves_every_tensor(mounted, monkeypatch):
    """ABI 2: the daemon's one answer at open locates every tensor; no query per tensor."""
    fd = os.open(mounted["file"], os.O_RDONLY)
    try:
        doc = json.loads(_native.describe(fd, str(mounted["file"])))
    finally:
        os.close(fd)
    assert doc["abi"] == 2
    assert {t["key"] for t in doc["tensors"]} == set(_tensors())
    def no_query(*_):
        raise AssertionError("a query per tensor")
    monkeypatch.setattr(_native, "locate", no_query)
    with cozytensors.safe_open(mounted["file"], framework="pt") as ours:
        assert ours._fast
        for name, expected in _tensors().items():
            assert same(ours.get_tensor(name), expected), name


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_a_daemon_that_speaks_only_abi_1_is_asked_per_tensor(mounted, monkeypatch, backend):
    """A daemon without the whole-file query (ABI 1 answers its command ENOTTY, which
    `_native.index` gives as None) is asked where each tensor lies: every tensor, and every
    slice, taken before close and indexed after it, equals safetensors' and comes from the
    blobs."""
    monkeypatch.setattr(_native, "index", lambda *_: None)
    asked = []
    real = _native.locate

    def locate(fd, path, name):
        asked.append(name)
        return real(fd, path, name)

    monkeypatch.setattr(_native, "locate", locate)
    served = status(mounted["mnt"])["bytes_served"]
    with safetensors.safe_open(mounted["source"], framework="pt") as theirs:
        with cozytensors.safe_open(mounted["file"], framework="pt", backend=backend) as ours:
            assert ours._fast
            for name in theirs.keys():
                assert same(ours.get_tensor(name), theirs.get_tensor(name)), name
            # Only the header crossed FUSE.
            assert status(mounted["mnt"])["bytes_served"] - served < 1 << 20
            slices = {name: ours.get_slice(name) for name in ("big", "layer.1.weight")}
        # (With pread, slices are safetensors' own, read through the mount.)
        for name, piece in slices.items():
            assert same(piece[7:1_000_003], theirs.get_slice(name)[7:1_000_003]), name
    assert set(asked) >= set(_tensors()) - {"empty", "zz_empty"}


def test_a_decoded_views_tensors_equal_the_files_own(tmp_path):
    """In <lane>@decoded an encoded tensor has no blob bytes: it comes from the file, as
    safetensors reads it; plain tensors still come from the blobs."""
    prerequisites()
    source = tmp_path / "model.safetensors"
    g = torch.Generator().manual_seed(3)
    save_file(
        {"dense.weight": torch.randn(64, 256, generator=g), "dense.bias": torch.randn(64, generator=g)},
        str(source),
    )
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    tensorfs(store, "import", source, "--name", "local/q")
    tensorfs(store, "quantize", "local/q", "--scheme", "int8.rowwise", "--name", "local/q")
    mnt.mkdir()
    tensorfs(store, "mount", mnt, "--log-file", tmp_path / "mount.log")
    try:
        lanes = os.listdir(mnt / "local/q/latest")
        assert "int8.rowwise@decoded" in lanes or any(l.endswith("@decoded") for l in lanes), lanes
        decoded = next(l for l in lanes if l.endswith("@decoded"))
        file = mnt / "local/q/latest" / decoded / "model.safetensors"
        with cozytensors.safe_open(file, framework="pt") as ours, safetensors.safe_open(
            file, framework="pt"
        ) as theirs:
            assert ours._fast
            assert ours.keys() == theirs.keys()
            for name in theirs.keys():
                assert same(ours.get_tensor(name), theirs.get_tensor(name)), name
        # The lane itself: its parts, as the file shows them.
        plain = mnt / "local/q/latest" / decoded.removesuffix("@decoded") / "model.safetensors"
        with cozytensors.safe_open(plain, framework="pt") as ours, safetensors.safe_open(
            plain, framework="pt"
        ) as theirs:
            assert ours._fast
            for name in theirs.keys():
                assert same(ours.get_tensor(name), theirs.get_tensor(name)), name
    finally:
        unmount(mnt)


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _blob_mappings(store) -> int:
    """How many mappings of the store's blobs this process has."""
    blobs = str(store / "blobs") + "/"
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if blobs in line)


def test_tensors_share_one_mapping_per_blob_as_safetensors_shares_its_file(mounted):
    """One mapping per blob, shared by the handle's tensors, as safetensors maps its file once
    (two reads of one name share their bytes; another handle's do not), and no descriptor per
    mapping: a descriptor per blob ran a 60 GiB model out of a 1024-descriptor limit."""
    before = _fds()
    with cozytensors.safe_open(mounted["file"], framework="pt") as ours:
        kept = {name: ours.get_tensor(name) for name in ours.keys()}
        # A tensor spanning blobs maps its ranges of them, stitched: one mapping each.
        blobs = {e[0] for p in ours._parts.values() for e in p}
        assert len(kept) > len(blobs) + 2, "the file has more tensors than blobs"
        assert _blob_mappings(mounted["store"]) <= len(blobs), "a mapping per blob, not per tensor"
        assert _fds() - before == 1, "the file's descriptor only: mappings keep none"
        kept["layer.0.weight"][0] = 1234.0
        assert ours.get_tensor("layer.0.weight")[0] == 1234.0, "shared within the handle"
    with cozytensors.safe_open(mounted["file"], framework="pt") as again:
        assert again.get_tensor("layer.0.weight")[0] != 1234.0, "not across handles"
    with safetensors.safe_open(mounted["source"], framework="pt") as theirs:
        for name, tensor in kept.items():
            if name != "layer.0.weight":
                assert same(tensor, theirs.get_tensor(name)), name
    del kept
    assert _fds() - before == 0, "the descriptors go with the file"


def _mapped_file(address: int) -> str:
    """The file this process maps at `address` ("" for anonymous memory)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            begin, end = (int(x, 16) for x in fields[0].split("-"))
            if begin <= address < end:
                return fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"nothing is mapped at {address:#x}")


def test_a_tensor_spanning_chunks_is_one_mapping_of_its_blobs(mounted):
    """A tensor spanning chunks is a view of its blobs' ranges mapped end to end, as the file
    lays them: no copy in new memory, values equal safetensors', writes the process's own."""
    (part,) = _locate(mounted["file"], "big")["parts"]
    extents = part["extents"]
    assert len(extents) > 1, "the test model's 'big' spans chunks"
    with cozytensors.safe_open(mounted["file"], framework="pt") as ours, safetensors.safe_open(
        mounted["source"], framework="pt"
    ) as theirs:
        big = ours.get_tensor("big")
        at = big.data_ptr()
        for sha, _, _, length, _ in extents:
            assert _mapped_file(at).endswith(f"/blobs/{sha[:2]}/{sha[2:4]}/{sha}")
            at += length
        assert same(big, theirs.get_tensor("big"))
        big[-1] = 1234.0
    with cozytensors.safe_open(mounted["file"], framework="pt") as again:
        assert again.get_tensor("big")[-1] != 1234.0


def test_a_slice_reads_only_the_pages_it_selects(mounted):
    """A slice of a tensor spanning chunks, its blobs not cached, reads the pages its index
    selects: the other blob is not read (nor asked of the disk ahead); `[...]` reads it all."""
    (part,) = _locate(mounted["file"], "big")["parts"]
    blobs = [
        (blob_path(mounted["store"], sha), offset, length)
        for sha, _, offset, length, _ in part["extents"]
    ]

    cached = _cached
    for blob, _, _ in blobs:
        _evict(blob)
    (first, first_offset, _), (last, last_offset, last_length) = blobs[0], blobs[-1]
    assert not cached(first, first_offset) and not cached(last, last_offset + last_length - 1)
    with cozytensors.safe_open(mounted["file"], framework="pt") as ours, safetensors.safe_open(
        mounted["source"], framework="pt"
    ) as theirs:
        piece = ours.get_slice("big")[-1000:]
        assert same(piece, theirs.get_slice("big")[-1000:])
        assert cached(last, last_offset + last_length - 1)
        time.sleep(0.2)  # what read-ahead would have asked for has had time to arrive
        assert not cached(first, first_offset), "a slice of the last chunk read the first"
        assert same(ours.get_slice("big")[...], theirs.get_tensor("big"))


def test_a_closed_file_says_so_as_safetensors_does(mounted, tmp_path):
    copy = tmp_path / "copy.safetensors"
    shutil.copyfile(mounted["source"], copy)
    for path in (mounted["file"], copy):
        with cozytensors.safe_open(path, framework="pt") as f:
            pass
        for call in (f.keys, f.metadata, f.offset_keys, lambda: f.get_tensor("big")):
            with pytest.raises(safetensors.SafetensorError, match="File is closed"):
                call()
        with f as again:  # re-entering gives the closed handle back, as safetensors does
            assert again is f


def test_a_blob_this_process_may_not_read_is_read_through_the_mount(mounted, monkeypatch):
    def refused(store, extents, *_):
        raise PermissionError(errno.EACCES, f"blob {extents[0][0]}: Permission denied")

    monkeypatch.setattr(_native, "map_extents", refused)
    monkeypatch.setattr(_native, "read", refused)
    with cozytensors.safe_open(mounted["file"], framework="pt") as ours, safetensors.safe_open(
        mounted["source"], framework="pt"
    ) as theirs:
        assert ours._fast
        for name in ["layer.0.weight", "big"]:
            assert same(ours.get_tensor(name), theirs.get_tensor(name)), name


@pytest.mark.parametrize("device", ["meta", "cpu:0", "bogus", -1, "cuda:x", "CUDA", "cpu ", "npu:0:0",
                                    "cuda:", "cuda:99999999999999999999", 2**70])
def test_a_device_safetensors_refuses_is_refused_alike(mounted, device):
    with pytest.raises(Exception) as theirs:
        safetensors.safe_open(mounted["source"], framework="pt", device=device)
    with pytest.raises(theirs.type) as ours:
        cozytensors.safe_open(mounted["file"], framework="pt", device=device)
    assert str(ours.value) == str(theirs.value)


def test_slices_indexed_after_close_share_the_blobs_mappings(mounted):
    """Slices taken while open and indexed after close (the documented use) map each blob
    once, not once per tensor (a tensor spanning chunks maps its own), and keep no
    descriptor."""
    with cozytensors.safe_open(mounted["file"], framework="pt") as ours:
        slices = {name: ours.get_slice(name) for name in ours.keys()}
        blobs = {e[0] for p in ours._parts.values() for e in p}
    before = _fds()
    kept = [s[...] for s in slices.values()]
    assert len(kept) > len(blobs) + 2
    assert _blob_mappings(mounted["store"]) <= len(blobs), "a mapping per blob, not per tensor"
    assert _fds() - before == 0, "mappings keep no descriptor"


def _store_fds(store):
    """This process's descriptors of files under `store`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(store) + "/"):
            found.append(target)
    return found


def _victim(tmp_path):
    """A store holding one model of one 64 MiB chunk and a tensor spanning two chunks,
    mounted; its source file."""
    prerequisites()
    g = torch.Generator().manual_seed(3)
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "model.safetensors"
    save_file({"a.weight": torch.randn(1000, generator=g), "b.weight": torch.randn(20_000_000, generator=g)},
              str(source))
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    tensorfs(store, "import", source, "--name", "local/victim")
    mnt.mkdir()
    # No views: a view built in the background reads the blobs, and keeps them from `gc`
    # until it is done.
    tensorfs(store, "mount", mnt, "--log-file", tmp_path / "mount.log", "--view-cache", "0")
    return source, store, mnt, mnt / "local/victim/latest/f32/model.safetensors"


def test_a_fifo_in_a_blobs_place_is_an_error_not_a_hang(tmp_path):
    """A blob replaced by a FIFO after the daemon answered (its stamp no longer matches) is
    refused by the reader, naming it; opening it to compare the stamp blocked, GIL held, for
    as long as no one wrote to the FIFO."""
    source, store, mnt, file = _victim(tmp_path)
    try:
        (sha, *_), = _locate(file, "a.weight")["parts"][0]["extents"]
        blob = blob_path(store, sha)
        probe = f"""
import os, cozytensors
with cozytensors.safe_open({str(file)!r}, framework="pt") as f:
    os.unlink({str(blob)!r})
    os.mkfifo({str(blob)!r})
    try:
        f.get_tensor("a.weight")
    except OSError as e:
        print("errno", e.errno, e)
"""
        run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr[-2000:]
        assert "errno" in run.stdout and "a.weight" in run.stdout, run.stdout
    finally:
        unmount(mnt)


def test_a_header_the_store_does_not_describe_is_refused(mounted, monkeypatch):
    """The header is read through the mount, the bytes from the blobs: a header that differs
    from the store's description of the file (a damaged view, a name or dtype changed) is an
    EIO naming the tensor, never the blobs' bytes under another dtype or name."""
    real = _native.header

    def tampered(change):
        def header(fd, path):
            tensors, metadata = real(fd, path)
            return change(dict(tensors)), metadata
        return header

    def dtype(tensors):
        _, shape, begin, end = tensors["layer.0.weight"]
        tensors["layer.0.weight"] = ("I32", shape, begin, end)
        return tensors

    def name(tensors):
        tensors["renamed"] = tensors.pop("scalar")  # its dtype, shape and bytes
        return tensors

    for change, tensor in ((dtype, "'layer.0.weight'"), (name, "'renamed'")):
        monkeypatch.setattr(_native, "header", tampered(change))
        with pytest.raises(OSError, match="the file the mount serves is not the store's") as raised:
            cozytensors.safe_open(mounted["file"], framework="pt")
        assert raised.value.errno == errno.EIO and tensor in str(raised.value)
    monkeypatch.setattr(_native, "header", real)
    with cozytensors.safe_open(mounted["file"], framework="pt") as ours:
        assert ours._fast


def test_a_descriptor_closed_while_safetensors_opens_it_reads_the_same_file(mounted, tmp_path, monkeypatch):
    """What safetensors reads for a handle it opens through a copy of the handle's
    descriptor: a close racing it (the handle's number free, and taken by another file) still
    reads the handle's file, never the other one."""
    other = tmp_path / "other.safetensors"
    save_file({name: torch.zeros(1) for name in _tensors()}, str(other))
    real = cozytensors._loader._safetensors_open()
    taken = []

    def racing():
        def open_(path, **kwargs):
            number = ours._fd
            ours._close()  # the race: the handle closes, its number is free...
            fd = os.open(other, os.O_RDONLY)  # ...and another file takes it
            taken.append(fd)
            assert fd == number
            return real(path, **kwargs)
        return open_

    ours = cozytensors.safe_open(mounted["file"], framework="numpy")
    monkeypatch.setattr(cozytensors._loader, "_safetensors_open", racing)
    try:
        piece = ours.get_slice("layer.0.weight")[0:4]
    finally:
        for fd in taken:
            os.close(fd)
    with safetensors.safe_open(mounted["source"], framework="numpy") as theirs:
        assert same(piece, theirs.get_slice("layer.0.weight")[0:4])


def _swept(store) -> str:
    """Collects `store` until no blob is left, for at most 30 s (the kernel tells the daemon
    of a file's last close after close(2) returns, and its hold lasts until then); "" when
    none is left, else what is left and the last collection's report."""
    for _ in range(300):
        report = json.loads(tensorfs(store, "gc", "--grace", "0", "--json"))
        assert report["busy"] == 0, report
        left = [p.name for p in (store / "blobs").rglob("*") if p.is_file()]
        if not left:
            return ""
        time.sleep(0.1)
    holds = sorted(p.name for p in (store / "holds").iterdir()) if (store / "holds").is_dir() else []
    return f"left {left}; holds {holds}; {report}"


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_a_closed_file_leaves_nothing_that_keeps_gc_from_its_blobs(tmp_path, backend):
    """Blobs the native reader opened (pread, a tensor spanning chunks) are let go at close:
    their descriptors' locks kept `tensorfs gc` from sweeping a removed model for as long as
    the process lived, and ran a long-lived loader out of descriptors."""
    source, store, mnt, file = _victim(tmp_path)
    try:
        with cozytensors.safe_open(file, framework="pt", backend=backend) as f:
            for name in f.keys():
                f.get_tensor(name).clone()
        del f
        assert _store_fds(store) == []
        tensorfs(store, "rm", "local/victim")
        assert _swept(store) == "", "every blob is swept"
    finally:
        unmount(mnt)


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_a_slice_taken_before_close_reads_after_rm_and_gc(tmp_path, backend):
    """A slice taken while the file is open and indexed after close (as Transformers does)
    keeps the file open, as a slice of safetensors' own mapping does: `rm` and `gc` meanwhile
    leave its blobs, and it reads its values; once the slice goes, they are swept."""
    source, store, mnt, file = _victim(tmp_path)
    try:
        with cozytensors.safe_open(file, framework="pt", backend=backend) as f:
            slices = {name: f.get_slice(name) for name in f.keys()}
        tensorfs(store, "rm", "local/victim")
        tensorfs(store, "gc", "--grace", "0")
        with safetensors.safe_open(source, framework="pt") as theirs:
            for name, s in slices.items():
                assert same(s[...], theirs.get_tensor(name)), name
                assert same(s[1:7], theirs.get_slice(name)[1:7]), name
        assert _store_fds(store) == [], "reads after close let go of their blobs at once"
        del slices, s
        assert _swept(store) == "", "swept once the slices go"
    finally:
        unmount(mnt)


def test_what_safetensors_itself_reads_comes_from_the_file_opened(mounted, tmp_path, monkeypatch):
    """Readings left to safetensors (NumPy slices) open the file this handle opened, through
    its descriptor: a relative path after `chdir` named a decoy file instead."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    save_file({name: torch.full_like(t, 7) if t.dtype.is_floating_point else t
               for name, t in _tensors().items()}, str(decoy / "model.safetensors"))
    monkeypatch.chdir(mounted["file"].parent)
    with cozytensors.safe_open("model.safetensors", framework="np") as ours:
        assert ours._fast
        monkeypatch.chdir(decoy)
        got = ours.get_slice("big")[:10]
    with safetensors.safe_open(mounted["source"], framework="np") as theirs:
        assert same(got, theirs.get_slice("big")[:10])


def test_arguments_and_results_as_safetensors_gives_them(mounted, tmp_path):
    """Errors of the same type and message for names and backends that are not strings, and
    for paths that cannot be opened; a new metadata dict and new NumPy memory each call."""
    for bad in (1, None, b"big"):
        for call in ("get_tensor", "get_slice"):
            with safetensors.safe_open(mounted["source"], framework="pt") as theirs, pytest.raises(TypeError) as want:
                getattr(theirs, call)(bad)
            with cozytensors.safe_open(mounted["file"], framework="pt") as ours, pytest.raises(TypeError) as got:
                getattr(ours, call)(bad)
            assert str(got.value) == str(want.value)
    for backend in (None, 3, "bogus"):
        with pytest.raises(Exception) as want:
            safetensors.safe_open(mounted["source"], framework="pt", backend=backend)
        with pytest.raises(want.type) as got:
            cozytensors.safe_open(mounted["file"], framework="pt", backend=backend)
        assert str(got.value) == str(want.value)
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    (tmp_path / "plain").write_bytes(b"x")
    for path in (str(loop), str(tmp_path / "plain" / "x"), str(tmp_path / ("n" * 300)), "nul\x00name"):
        with pytest.raises(Exception) as want:
            safetensors.safe_open(path, framework="pt")
        with pytest.raises(want.type):
            cozytensors.safe_open(path, framework="pt")
    # Filenames that are not paths, NumPy on another device, what __exit__ returns.
    for filename, framework, device in ((b"x", "pt", "cpu"), (3, "pt", "cpu"), (None, "pt", "cpu"),
                                        (mounted["file"], "numpy", "cuda"), (mounted["file"], "np", "cuda:1")):
        source = mounted["source"] if filename == mounted["file"] else filename
        with pytest.raises(Exception) as want:
            safetensors.safe_open(source, framework=framework, device=device)
        with pytest.raises(want.type) as got:
            cozytensors.safe_open(filename, framework=framework, device=device)
        assert str(got.value) == str(want.value)
    theirs = safetensors.safe_open(mounted["source"], framework="pt")
    ours = cozytensors.safe_open(mounted["file"], framework="pt")
    assert ours.__exit__(None, None, None) == theirs.__exit__(None, None, None)
    with cozytensors.safe_open(mounted["file"], framework="np") as ours:
        meta = ours.metadata()
        meta["note"] = "changed"
        assert ours.metadata()["note"] == "cozytensors"
        a, b = ours.get_tensor("layer.0.weight"), ours.get_tensor("layer.0.weight")
        a[0] = 99.0
        assert b[0] != 99.0 and ours.get_tensor("layer.0.weight")[0] != 99.0


def test_a_zero_size_tensor_of_huge_dimensions_is_empty_as_safetensors_gives_it(tmp_path):
    """`torch.empty(shape)` overflows its strides for [0, 2^32, 2^32]; safetensors gives it."""
    prerequisites()
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "model.safetensors"
    save_file({"e": torch.empty(0).reshape(0, 2**32, 2**32), "w": torch.ones(3)}, str(source))
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    tensorfs(store, "import", source, "--name", "local/e")
    mnt.mkdir()
    tensorfs(store, "mount", mnt, "--log-file", tmp_path / "mount.log")
    try:
        with cozytensors.safe_open(mnt / "local/e/latest/f32/model.safetensors", framework="pt") as ours, \
                safetensors.safe_open(source, framework="pt") as theirs:
            assert ours._fast
            got, want = ours.get_tensor("e"), theirs.get_tensor("e")
            assert got.shape == want.shape and got.dtype == want.dtype
    finally:
        unmount(mnt)


def _digest(tensor) -> str:
    """The sha256 of a CPU tensor's bytes, without torch's thread pool (fork-safe)."""
    import hashlib

    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_a_fork_while_another_thread_proves_a_blob_leaves_the_child_able_to_read(tmp_path, backend):
    """A child forked while another thread is inside the native reader (hashing a blob whose
    stamp changed) got that lock held by a thread it does not have, and waited forever on its
    first read; `os.fork()` now waits until no native work is under way."""
    source, store, mnt, file = _victim(tmp_path)
    try:
        with safetensors.safe_open(source, framework="pt") as theirs:
            expected = _digest(theirs.get_tensor("b.weight"))
        with cozytensors.safe_open(file, framework="pt", backend=backend) as f:
            assert _digest(f.get_tensor("b.weight")) == expected
            for blob in (store / "blobs").rglob("*"):
                if blob.is_file():
                    os.utime(blob)  # a new stamp: the reader proves the blob again, by hashing
        with cozytensors.safe_open(file, framework="pt", backend=backend) as f:
            reader = threading.Thread(target=lambda: f.get_tensor("b.weight"))
            reader.start()
            time.sleep(0.02)
            pid = os.fork()
            if pid == 0:
                try:
                    os._exit(0 if _digest(f.get_tensor("b.weight")) == expected else 1)
                except BaseException:
                    os._exit(2)
            reader.join()
            deadline = time.monotonic() + 120
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    pytest.fail("the forked child still waits on its first read after 120 s")
                time.sleep(0.05)
            assert os.waitstatus_to_exitcode(status) == 0, "the child read the tensor's own bytes"
    finally:
        unmount(mnt)


@pytest.mark.parametrize("device", [True, False, "cuda:01", "cuda:+1"])
def test_a_device_safetensors_takes_is_taken_alike(mounted, device):
    safetensors.safe_open(mounted["source"], framework="pt", device=device)
    cozytensors.safe_open(mounted["file"], framework="pt", device=device)


def test_an_empty_blob_is_never_mapped(tmp_path):
    """A zero-length blob (an empty tensor's) is refused with EINVAL naming it, never mapped:
    mmap of zero bytes is an error the loader must not turn into a buffer."""
    import hashlib

    prerequisites()
    store = tmp_path / "store"
    save_file({"x": torch.ones(4)}, str(tmp_path / "x.safetensors"))
    tensorfs(store, "import", tmp_path / "x.safetensors", "--name", "local/x")
    sha = hashlib.sha256(b"").hexdigest()
    blob = blob_path(store, sha)
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(b"")
    with pytest.raises(OSError) as raised:
        _native.map_extents(str(store), [(sha, 0, 0, 0, None)], "empty.safetensors: tensor 'e'")
    assert raised.value.errno == errno.EINVAL
    assert sha in str(raised.value) and "cannot be mapped" in str(raised.value)


def test_ranges_past_their_blob_are_refused_and_unstitchable_ones_left_to_reading(tmp_path):
    """`map_extents` refuses a range past its blob's end (EINVAL naming the blob: a mapping
    there would fault), and gives None for ranges that do not meet on page boundaries, which
    the loader then reads; ranges that do meet map end to end, as the file lays them."""
    import hashlib

    prerequisites()
    store = tmp_path / "store"
    save_file({"x": torch.ones(4)}, str(tmp_path / "x.safetensors"))
    tensorfs(store, "import", tmp_path / "x.safetensors", "--name", "local/x")
    data = bytes(range(256)) * 64  # 16 KiB: four pages
    sha = hashlib.sha256(data).hexdigest()
    blob = blob_path(store, sha)
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    what = "x.safetensors: tensor 'x'"
    with pytest.raises(OSError) as raised:
        _native.map_extents(str(store), [(sha, len(data), len(data) - 8, 16, None)], what)
    assert raised.value.errno == errno.EINVAL and sha in str(raised.value)
    # A first range ending inside a page: the next cannot follow it in memory.
    assert _native.map_extents(str(store), [(sha, len(data), 0, 100, None), (sha, len(data), 0, 8, None)], what) is None
    # Page-aligned ranges stitch: the blob's last page, then its first.
    stitched = _native.map_extents(
        str(store), [(sha, len(data), 12288, 4096, None), (sha, len(data), 0, 4096, None)], what
    )
    assert stitched is not None and stitched.length == 8192
    assert ctypes.string_at(stitched.address, 8192) == data[12288:] + data[:4096]
