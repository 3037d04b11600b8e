"""safetensors' `safe_open` for files of TensorFS mounts, reading the store's blobs directly.

A `.safetensors` file of a TensorFS mount is synthesized from chunk blobs of the store. Read
through the mount, every byte crosses FUSE (4 KiB pages, a copy each, on the kernels we
target); read from the blobs, none does. For such a file, `safe_open` parses the header (a few
KiB through the mount), asks the daemon where every tensor lies in one query (the extents
ioctl's ABI 2; a tensor at a time from a daemon that speaks only ABI 1), and builds the tensor
from the blob itself:

- a tensor inside one blob (most: chunks are 64 MiB) is a private, copy-on-write mapping of
  the blob's range, as safetensors' own tensors are of the file (`backend="mmap"`, the default),
  or a read into new memory (`backend="pread"`);
- a tensor spanning blobs is one mapping of its ranges of them, stitched end to end, or with
  `backend="pread"` (or ranges that cannot be stitched) a read into new memory;
- with `device="cuda"`, a tensor is read from its blobs straight into a new torch tensor on the
  device (`_native.to_device`: io_uring into page-locked buffers, copies overlapped).

Each blob's bytes are proven before use (its inode is the one the daemon proved, or the store's
verification ledger shows it unchanged since it was hashed, or it is hashed now, once per
process), so a damaged blob is an error, never wrong values. A tensor a decoded view
(`<lane>@decoded`) decodes as it is read, or a single file's array made when read (OpenCLIP's
transposed `text_projection`), has no blob bytes: safetensors reads it from the file.

Anything else is safetensors itself, with its own errors: a file on another filesystem, a
store this process cannot read (a container that binds only the mount), a framework other than
`pt` and `numpy`, a dtype that framework lacks, and `get_slice` but torch's with `mmap`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import weakref
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

import safetensors
from safetensors import SafetensorError

from . import _fork, _native


def _safetensors_open():
    """safetensors' own `safe_open`, also while the import hook (`cozytensors._hook`) routes
    `safetensors.safe_open` here."""
    return getattr(safetensors.safe_open, "__wrapped__", safetensors.safe_open)


_TORCH_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "F16": "float16", "BF16": "bfloat16", "I32": "int32", "U32": "uint32",
    "F32": "float32", "F64": "float64", "I64": "int64", "U64": "uint64",
    "C64": "complex64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
}

_NUMPY_CODES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "<i2", "U16": "<u2",
    "F16": "<f2", "I32": "<i4", "U32": "<u4", "F32": "<f4", "F64": "<f8",
    "I64": "<i8", "U64": "<u8", "C64": "<c8",
}

# safetensors dtype name -> the framework's dtype (absent: that framework has none, and
# safetensors reads the tensor), made on first use: importing torch or numpy is not free.
_DTYPES: Dict[bool, Dict[str, Any]] = {}


def _dtypes(torch: bool) -> Dict[str, Any]:
    table = _DTYPES.get(torch)
    if table is None:
        if torch:
            import torch as t

            table = {k: getattr(t, v) for k, v in _TORCH_NAMES.items() if hasattr(t, v)}
        else:
            import numpy as np

            table = {k: np.dtype(v) for k, v in _NUMPY_CODES.items()}
        _DTYPES[torch] = table
    return table


# The device names safetensors 0.8 takes, alone or with `:<index>` (`cpu` only alone).
_DEVICES = ("cuda", "mps", "npu", "xpu", "hpu", "mlu", "musa", "xla")


def _index(text: str) -> int:
    """A device index as safetensors parses it (Rust's `usize` parse, and its errors)."""
    if text == "":
        raise ValueError("cannot parse integer from empty string")
    digits = text[1:] if text.startswith("+") else text
    if digits == "" or any(c not in "0123456789" for c in digits):
        raise ValueError("invalid digit found in string")
    value = int(digits)
    if value >= 1 << 64:
        raise ValueError("number too large to fit in target type")
    return value


def _check_device(device):
    """The device as `.to()` takes it, refused as safetensors' `safe_open` refuses it (same
    errors), for the files it does not open itself."""
    if device is None or device == "cpu":
        return "cpu"
    if isinstance(device, bool):
        return int(device)
    if isinstance(device, int):
        if 0 <= device < 1 << 64:
            return device
    elif isinstance(device, str):
        parts = device.split(":")
        if parts[0] in _DEVICES and len(parts) <= 2:
            return device if len(parts) == 1 else f"{parts[0]}:{_index(parts[1])}"
    shown = device if isinstance(device, str) else repr(device)
    raise SafetensorError(f"device {shown} is invalid")


class safe_open:
    """Opens a safetensors file lazily, as `safetensors.safe_open` does, with the same
    arguments and results; tensors of a TensorFS mount come from the store's blobs (see the
    module's doc). `framework` is `pt` or `numpy` (`np`) for that path; others, and files
    elsewhere, are safetensors' own."""

    def __init__(self, filename, framework, device="cpu", *, backend: str = "mmap"):
        try:
            self._path = os.fspath(filename)
        except TypeError as e:
            raise TypeError(f"argument 'filename': {e}") from None
        if not isinstance(self._path, str):
            raise TypeError(f"argument 'filename': {_not_str(self._path)}")
        self._framework = framework
        self._device = device
        self._backend = backend
        self._inner: Any = None
        self._fast = False
        self._fd: Optional[int] = None
        # ABI 2: (begin, end) in the file → the extents of the part there, and the ranges
        # of decoded tensors; None with an ABI 1 daemon (a query per tensor).
        self._parts: Optional[Dict[Tuple[int, int], Tuple[Any, ...]]] = None
        self._decoded: FrozenSet[Tuple[int, int]] = frozenset()
        self._store: Optional[str] = None
        # The mmap backend's copy-on-write mapping of each blob (a buffer over it), shared by
        # the tensors this handle builds from it (as safetensors maps its file once): a model
        # has thousands of tensors but few blobs; and of each tensor that spans chunks, its
        # ranges stitched into one. Found through `_maps` (by blob, or by the tensor's ranges)
        # while a tensor or slice holds it; `_held` also holds it while the file is open.
        # Mappings keep no descriptor.
        self._maps: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
        self._held: Dict[str, Any] = {}
        self._maps_lock = threading.Lock()
        _fork.track(self)
        # Blobs (by store) given to the native reader, which keeps a descriptor of each, and
        # with it a lock that keeps `tensorfs gc` from sweeping it: let go at close.
        self._used: Dict[str, set] = {}
        # What keeps the file open for slices after close ([`_Hold`]): held by the slices
        # alone, and found through this weak reference while one lives.
        self._hold_ref: Optional["weakref.ReferenceType[_Hold]"] = None
        if not isinstance(backend, str):
            raise TypeError(f"argument 'backend': {_not_str(backend)}")
        if backend not in ("mmap", "pread"):
            raise SafetensorError(f'backend "{backend}" is invalid (expected one of: "mmap", "pread")')
        if framework in ("pt", "torch", "numpy", "np"):
            self._device = _check_device(device)
            # NumPy on another device is safetensors' error.
            numpy_elsewhere = framework in ("numpy", "np") and self._device != "cpu"
            self._fast = not numpy_elsewhere and self._open_mounted()
        if not self._fast:
            self._inner = self._open_safetensors()

    def _open_safetensors(self):
        """safetensors' own handle of the file, with this handle's arguments: of the file this
        handle opened, through a copy of its descriptor (or of its slices'), while it is open
        (the path may name another file by now: a relative one after `chdir`, `latest/` after
        a new import). The copy is taken under the lock `_close` takes: a descriptor closed
        meanwhile could be another file's by the time safetensors opened its number. A mounted
        file's handle with neither descriptor is closed."""
        copy = self._copy_fd()
        if copy is None and self._fast:
            raise SafetensorError("File is closed")
        try:
            return _safetensors_open()(
                self._fd_path(copy), framework=self._framework, device=self._device,
                backend=self._backend,
            )
        finally:
            if copy is not None:
                os.close(copy)

    def _what(self, name: str) -> str:
        """How errors name tensor `name`: the file and the tensor."""
        return f"{self._path}: tensor {name!r}"

    def _copy_fd(self) -> Optional[int]:
        """A copy (`os.dup`) of `_open_fd()`, the caller's to close; None when the handle has
        neither descriptor. Taken under the lock `_close` takes: a number read without it may
        be closed meanwhile and be another file's by the time it is used."""
        with self._maps_lock:
            fd = self._open_fd()
            return os.dup(fd) if fd is not None else None

    def _fd_path(self, fd: Optional[int]) -> str:
        """A path that opens the file `fd` is open on (`/proc/self/fd/N`), or this handle's
        path when there is no descriptor, or no `/proc`."""
        if fd is None or not os.path.isdir("/proc/self/fd"):
            return self._path
        return f"/proc/self/fd/{fd}"

    def _open_mounted(self) -> bool:
        """Opens the file when it is a TensorFS file whose store this process can read: its
        header, and where its tensors lie. False leaves it to safetensors (with its errors).

        Raises OSError (EIO) when a mounted file's header cannot be read (a damaged blob
        under it fails the read, and safetensors' own mapping of the file would then die of
        SIGBUS), when the daemon cannot give the file's blobs, or when the header is not what
        the store describes."""
        try:
            # One descriptor for every query: each open of a mounted file is a request to
            # the daemon, which keeps the file's blobs while it is open.
            fd = self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, ValueError):
            # Not a file this process may open (absent, a loop, a NUL in the name…):
            # safetensors says so, with its own error.
            return False
        fast = False
        try:
            fast = _native.is_fuse(fd) and self._take_header(fd) and self._locate_all(fd)
        finally:
            if not fast:
                self._close()
        return fast

    def _take_header(self, fd: int) -> bool:
        """Reads the header through `fd`: False when it is malformed or holds no tensor."""
        # No readahead: the tensors' bytes are read from the blobs, not here.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        parsed = _native.header(fd, self._path)
        if parsed is None:
            return False
        self._tensors, self._metadata = parsed
        return bool(self._tensors)

    def _locate_all(self, fd: int) -> bool:
        """Asks the daemon, through `fd`, where every tensor lies (ABI 2), or, from a daemon
        that speaks only ABI 1, where one does; False when the file is not ours or the store
        cannot be read by this process."""
        store: Optional[str]
        try:
            index = _native.index(fd, self._path, self._tensors)
            if index is not None:
                self._store, self._parts, self._decoded = index
                store = self._store
            else:
                located = _native.locate(fd, self._path, next(iter(self._tensors)))
                if located is None:
                    return False
                store = located["store"]
        except OSError as e:
            if e.errno == errno.EIO:
                # A blob the daemon cannot give, or a header the store does not describe:
                # safetensors' mapping of the file would fault, or read other bytes.
                raise
            return False
        return store is None or os.access(os.path.join(store, "blobs"), os.R_OK | os.X_OK)

    def _safetensors(self):
        if self._inner is None:
            self._inner = self._open_safetensors()
        return self._inner

    def _close(self):
        with self._maps_lock:
            fd, self._fd = self._fd, None
            self._held = {}
            used, self._used = self._used, {}
        if fd is not None:
            os.close(fd)
        for store, blobs in used.items():
            _native.release(store, list(blobs))

    def _reading(self, store: str, blobs, call):
        """`call()`, which gives the native reader `blobs` of `store`: they are let go at
        close, or, once the file is closed (a slice indexed after close), right after."""
        try:
            return call()
        finally:
            with self._maps_lock:
                if self._fd is not None:
                    self._used.setdefault(store, set()).update(blobs)
                    blobs = ()
            if blobs:
                _native.release(store, list(blobs))

    def _open_fd(self) -> Optional[int]:
        """A descriptor of the mounted file: the handle's while it is open, after close the
        one its slices hold; None when neither is."""
        if self._fd is not None:
            return self._fd
        hold = self._live_hold()
        return hold.fd if hold is not None else None

    def _live_hold(self) -> Optional["_Hold"]:
        """The [`_Hold`] a live slice of this handle keeps, if any."""
        return self._hold_ref() if self._hold_ref is not None else None

    def __del__(self):
        if hasattr(self, "_maps_lock"):
            self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._fast:
            # safetensors' own answers "File is closed" from now on.
            return self._inner.__exit__(*exc)
        # Tensors already built stay valid: their mappings and buffers own their bytes. A
        # mounted file is open while its descriptor is.
        if self._inner is not None:
            self._inner.__exit__(*exc)
            self._inner = None
        self._close()
        return None

    def _check_open(self):
        if self._fd is None:
            raise SafetensorError("File is closed")

    def keys(self) -> List[str]:
        if not self._fast:
            return self._inner.keys()
        self._check_open()
        return sorted(self._tensors)

    def offset_keys(self) -> List[str]:
        if not self._fast:
            return self._inner.offset_keys()
        self._check_open()
        # safetensors' order: by data offsets (a zero-size tensor before one starting where
        # it does), then by name.
        return sorted(self._tensors, key=lambda k: (self._tensors[k][2], self._tensors[k][3], k))

    def metadata(self) -> Optional[Dict[str, str]]:
        if not self._fast:
            return self._inner.metadata()
        self._check_open()
        # A new dict each call, as safetensors gives: the caller may change it.
        return None if self._metadata is None else dict(self._metadata)

    def get_slice(self, name: str):
        """A slice object as safetensors' (`get_shape()`, `get_dtype()`, indexing), for the
        torch framework and the mmap backend read from the blobs like `get_tensor`: the index
        is torch's, applied to the tensor's mapping (only the pages it selects are read), and
        the slice stays usable after the file is closed, as safetensors' does. NumPy slices
        are safetensors' own (its slicing rules differ from NumPy's), and so are slices of a
        dtype torch lacks and the pread backend's (its rules for an index differ too)."""
        if not self._fast:
            return self._inner.get_slice(name)
        entry = self._entry(name)
        if self._framework not in ("pt", "torch") or entry[0] not in _dtypes(True) or self._backend == "pread":
            self._read_through_mount(name)
            return self._safetensors().get_slice(name)
        with self._maps_lock:
            hold = self._live_hold()
            if hold is None:
                if self._fd is None:  # closed by another thread since `_entry`
                    raise SafetensorError("File is closed")
                hold = _Hold(self._fd)
                self._hold_ref = weakref.ref(hold)
        return _Slice(self, name, entry, hold)

    def get_tensors(self) -> Dict[str, Any]:
        return {name: self.get_tensor(name) for name in self.offset_keys()}

    def get_tensor(self, name: str):
        if not self._fast:
            return self._inner.get_tensor(name)
        return self._tensor(name, self._entry(name), self._device)

    def _entry(self, name: str):
        """The header entry of tensor `name` of the open file, or safetensors' errors."""
        if not isinstance(name, str):
            raise TypeError(f"argument 'name': {_not_str(name)}")
        self._check_open()
        entry = self._tensors.get(name)
        if entry is None:
            raise SafetensorError(f"File does not contain tensor {name}")
        return entry

    def _tensor(self, name: str, entry, device, whole: bool = True):
        """The tensor `name` (its header entry) on `device`; also after the file is closed,
        for slices taken before. `whole`: all of it will be read (a slice reads part of it, so
        its pages are neither mapped nor asked of the disk ahead)."""
        dtype_name, shape, begin, end = entry
        torch = self._framework in ("pt", "torch")
        dtype = _dtypes(torch).get(dtype_name)
        if dtype is None:
            return self._safetensors_tensor(name)
        count = end - begin
        if count == 0:
            return self._empty(dtype, shape, device)
        if (begin, end) in self._decoded:
            # Decoded as it is read: no blob holds these bytes.
            return self._safetensors_tensor(name)
        if torch and device != "cpu":
            placed = self._on_device(name, begin, end, dtype, shape, device)
            if placed is not None:
                return placed
        try:
            buffer, offset = self._bytes(name, begin, end, whole)
        except PermissionError:
            # A blob this process may not read, in a store whose blobs it may: the daemon
            # reads it for the mount.
            return self._safetensors_tensor(name)
        items = count // dtype.itemsize
        if torch:
            import torch as t

            tensor = t.frombuffer(buffer, dtype=dtype, count=items, offset=offset).reshape(shape)
            if device != "cpu":
                tensor = tensor.to(device)
            return tensor
        import numpy as np

        array = np.frombuffer(buffer, dtype=dtype, count=items, offset=offset).reshape(shape)
        # safetensors' NumPy arrays are new memory each call; a mapping's view would be shared.
        return array if isinstance(buffer, bytearray) else array.copy()

    def _safetensors_tensor(self, name: str):
        """safetensors' own reading of `name` through the mount (a file closed since the
        slice was taken is opened again for it, through the descriptor the slice holds, so
        a file removed meanwhile is still the one read)."""
        self._read_through_mount(name)
        if self._fd is not None:
            return self._safetensors().get_tensor(name)
        with self._open_safetensors() as again:
            return again.get_tensor(name)

    def _read_through_mount(self, name: str):
        """Reads the bytes of tensor `name` through the mount once, before safetensors' own
        reading of the file is handed them: a blob the daemon finds damaged fails a read with
        EIO, which is this `OSError` naming the file and tensor, where a fault on safetensors'
        mapping would kill the process with SIGBUS (and its pread backend would say only
        "Input/output error"). The pages read stay cached for safetensors (the mount keeps a
        file's page cache); only pages the kernel drops meanwhile are read again."""
        _, _, begin, end = self._tensors[name]
        copy = self._copy_fd()
        if copy is None:
            return  # a closed handle: safetensors says so
        buffer = bytearray(min(end - begin, 1 << 20))
        try:
            at = begin
            while at < end:
                view = memoryview(buffer)[: min(len(buffer), end - at)]
                n = os.preadv(copy, [view], at)
                if n == 0:
                    raise OSError(errno.EIO, "the file ends before the tensor does")
                at += n
        except OSError as e:
            why = e.strerror or os.strerror(e.errno or errno.EIO)
            raise OSError(e.errno or errno.EIO, f"{self._what(name)}: reading it through the mount: {why}") from None
        finally:
            os.close(copy)

    def _empty(self, dtype, shape, device):
        # Reshaped from no elements: `empty(shape)` computes strides that overflow for a
        # zero-size shape with huge other dimensions, which safetensors gives.
        if self._framework in ("pt", "torch"):
            import torch

            return torch.empty(0, dtype=dtype, device=device).reshape(shape)
        import numpy as np

        return np.empty(0, dtype=dtype).reshape(shape)

    def _extents(self, name: str, begin: int, end: int):
        """The extents of the file's bytes [begin, end) (a tensor, or a part of an encoded
        one), each `(blob, blob length, offset, length, file offset, stamp)`, and the store."""
        if self._parts is not None:
            extents, store = self._parts.get((begin, end)), self._store
        else:
            extents, store = self._locate(name, begin, end)
        if extents is None:
            raise OSError(
                errno.EIO,
                f"{self._what(name)}: the daemon locates no part at bytes {begin}..{end}",
            )
        return extents, store

    def _on_device(self, name: str, begin: int, end: int, dtype, shape, device):
        """The tensor read from its blobs straight into a new torch tensor on CUDA device
        `device` (`_native.to_device`: io_uring into page-locked buffers, copies overlapped);
        None where that path does not apply: another device, CUDA unavailable to torch (its
        own `.to()` then says why), a build without the `cuda` feature, a blob this process
        may not read."""
        to_device = getattr(_native, "to_device", None)
        if to_device is None:
            return None
        import torch

        target = torch.device(device)
        if target.type != "cuda" or not torch.cuda.is_available():
            return None
        extents, store = self._extents(name, begin, end)
        out = torch.empty(end - begin, dtype=torch.uint8, device=target)
        stream = torch.cuda.current_stream(out.device).cuda_stream
        pieces = [(sha, length_, offset, length, stamp) for sha, length_, offset, length, _, stamp in extents]
        try:
            self._reading(store, [p[0] for p in pieces], lambda: to_device(
                store, pieces, out.data_ptr(), end - begin, out.device.index, stream, self._path, name))
        except PermissionError:
            return None
        return out.view(dtype).reshape(shape)

    def _bytes(self, name: str, begin: int, end: int, whole: bool):
        """A writable buffer holding the file's bytes [begin, end) and the offset of the first
        in it; `whole` as for `_tensor`."""
        extents, store = self._extents(name, begin, end)
        if self._backend == "mmap":
            if len(extents) == 1:
                # The whole blob, shared by the tensors packed in it.
                sha, blob_length, offset, _, _, stamp = extents[0]
                key, pieces = sha, [(sha, blob_length, 0, blob_length, stamp)]
            else:
                # A tensor spanning chunks: its ranges stitched into one, its alone.
                offset = 0
                pieces = [(sha, bl, off, length, stamp) for sha, bl, off, length, _, stamp in extents]
                key = "+".join(f"{p[0]}@{p[2]}" for p in pieces)
            mapping = self._mapping(store, key, pieces, name)
            if mapping is not None:
                if whole:
                    # Cached, its pages are mapped at once; cold, asked of the disk at once.
                    _native.will_need(mapping._blob.address + offset, end - begin)
                return mapping, offset
        ranges = [(sha, blob_length, offset, length) for sha, blob_length, offset, length, _, _ in extents]
        read = lambda: _native.read(store, ranges, end - begin, self._what(name))  # noqa: E731
        return self._reading(store, [r[0] for r in ranges], read), 0

    def _mapping(self, store: str, key: str, pieces, name: str):
        """The handle's mapping `key` of the blob ranges `pieces` (`_native.map_extents`),
        made on first use; None when they cannot be stitched into one range."""
        with self._maps_lock:
            mapping = self._maps.get(key)
        if mapping is not None:
            return mapping
        # Mapped without the lock, which a native call must not hold (the fork gate;
        # `_reading` takes it); a thread that mapped it meanwhile wins.
        made = self._map(store, pieces, name)
        if made is None:
            return None
        with self._maps_lock:
            mapping = self._maps.get(key)
            if mapping is None:
                mapping = self._maps[key] = made
                if self._fd is not None:
                    self._held[key] = mapping
        return mapping

    def _map(self, store: str, pieces, name: str):
        """A writable buffer over a copy-on-write mapping of the blob ranges `pieces`, end to
        end, their blobs' bytes proven; None when they cannot be stitched. The mapping keeps
        no descriptor; it goes with the last buffer over it."""
        # Without the daemon's stamp, or with one the blob no longer has, the native reader
        # proves the blob.
        blob = self._reading(store, [p[0] for p in pieces], lambda: _native.map_extents(store, pieces, self._what(name)))
        if blob is None:
            return None
        view = (ctypes.c_char * blob.length).from_address(blob.address)
        view._blob = blob
        return view

    def _locate(self, name: str, begin: int, end: int):
        """ABI 1: the extents of the part at [begin, end) and the store, asked for this tensor
        through a copy of the handle's descriptor, or after close of its slices' ([`_Hold`]):
        only a slice reads after close."""
        fd = self._copy_fd()
        if fd is None:
            raise SafetensorError("File is closed")
        try:
            located = _native.locate(fd, self._path, name)
        finally:
            os.close(fd)
        if located is None:
            raise OSError(errno.ENOTTY, f"{self._what(name)}: no longer on a TensorFS mount")
        # The part whose bytes these are: the tensor itself, or one part of an encoded tensor.
        part = next((p for p in located["parts"] if (p["begin"], p["end"]) == (begin, end)), None)
        if part is None:
            return None, located["store"]
        return [(*e, None) for e in part["extents"]], located["store"]


def _not_str(value) -> str:
    """What pyo3 says of an argument that is not a `str`, as safetensors' errors say it."""
    if value is None:
        return "'None' is not an instance of 'str'"
    return f"'{type(value).__name__}' object is not an instance of 'str'"


class _Hold:
    """A descriptor of a mounted file, duplicated from its handle's, that the handle's slices
    share: while it is open the daemon keeps the file's blobs from collections, so a slice
    indexed after the file is closed, and after the model is removed and collected, still
    reads its bytes, as a slice of safetensors' own mapping of the file does. Closed with the
    last slice."""

    __slots__ = ("fd", "__weakref__")

    def __init__(self, fd: int):
        self.fd = os.dup(fd)

    def __del__(self):
        fd = getattr(self, "fd", None)
        if fd is not None:
            os.close(fd)


class _Slice:
    """What `safe_open.get_slice` gives for torch: a tensor's dtype and shape from the header,
    and its bytes from the blobs once indexed."""

    __slots__ = ("_file", "_name", "_entry", "_hold")

    def __init__(self, file: "safe_open", name: str, entry, hold: _Hold):
        self._file, self._name, self._entry, self._hold = file, name, entry, hold

    def get_shape(self) -> List[int]:
        return list(self._entry[1])

    def get_dtype(self) -> str:
        return self._entry[0]

    def __getitem__(self, index):
        # Indexed on the CPU mapping, then moved: only the selection travels to the device.
        tensor = self._file._tensor(self._name, self._entry, "cpu", whole=_selects_all(index))
        selected = tensor[index]
        device = self._file._device
        if device != "cpu":
            selected = selected.to(device)
        return selected


def _selects_all(index) -> bool:
    """Whether `index` selects every element (`[...]`, `[:]`, `[:, ...]`, as loaders index a
    slice to read all of it)."""
    def every(i) -> bool:
        # Identity, not `==`: an index may be a tensor, whose `==` is elementwise.
        return i is Ellipsis or (type(i) is slice and i.start is None and i.stop is None and i.step is None)

    return all(every(i) for i in index) if type(index) is tuple else every(index)


def load_file(filename, device="cpu", *, backend: str = "mmap"):
    """Every tensor of a safetensors file as torch tensors on `device`, as
    `safetensors.torch.load_file` does."""
    with safe_open(filename, framework="pt", device=device, backend=backend) as f:
        return f.get_tensors()
