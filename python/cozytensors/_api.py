"""The format's API, with the reference implementation's names: a checkpoint of a local
TensorFS store opened by name, its components' classes, configs and assets, and its tensors read
as stored or decoded, into DLPack arrays.

    import cozytensors, torch
    with cozytensors.open("local/sd15", lane="f16") as ckpt:
        unet = ckpt.components["unet"]
        unet.tensors["conv_in.weight"].shape                 # (320, 4, 3, 3)
        weight = torch.from_dlpack(unet.tensors.read("conv_in.weight"))

Reads come from the store's chunk blobs, proven as they are read (the store's ledger, or
hashed once per process). While a checkpoint is open its objects are held (`holds/`), so a
collection keeps them even if its ref is removed meanwhile.
"""

import json
import os
from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence, Tuple, Union, overload

from . import _fork, _native  # noqa: F401 (_fork: the native reader's locks across fork())
from ._native import Array

__all__ = [
    "Array", "Checkpoint", "ClassRef", "Component", "DecodeError", "Encoded", "Encoding",
    "Error", "FormatError", "IntegrityError", "InvalidError", "NetworkError", "NotFoundError", "Pipeline",
    "StorageError", "TensorMetadata", "Tensors", "UnknownSchemeError", "UnsupportedError",
    "DiskFullError", "open",
]


class Error(Exception):
    """A cozytensors error. `.code` names its family (the reference's codes); `.detail` says
    what happened, naming the checkpoint, component and tensor."""

    code = "error"

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail

    def __str__(self) -> str:
        return self.detail


class InvalidError(Error):
    """An argument or name breaks a rule (`invalid`): several lanes and none named, a
    malformed digest."""

    code = "invalid"


class FormatError(Error):
    """A document of another kind or major version, or a folder that is not a store
    (`format`)."""

    code = "format"


class NotFoundError(Error, KeyError):
    """No such store, repo, release, lane, component, tensor, asset or object (`not_found`).
    Also a `KeyError`, which is what the reference raises for an absent tensor key."""

    code = "not_found"


class IntegrityError(Error):
    """Bytes that do not match their digest or length (`integrity`)."""

    code = "integrity"


class UnknownSchemeError(Error):
    """The tensor's scheme has no decoder here; its parts still read (`unknown_scheme`)."""

    code = "unknown_scheme"


class DecodeError(Error):
    """A known scheme whose parts or params break its definition (`decode`)."""

    code = "decode"


class StorageError(Error):
    """The filesystem failed (`io`)."""

    code = "io"


class DiskFullError(Error):
    """The disk is full, or would cross the store's reserve (`full`)."""

    code = "full"


class UnsupportedError(Error):
    """Something this build cannot do or represent (`unsupported`)."""

    code = "unsupported"


class NetworkError(Error):
    """A transfer from an endpoint failed or stalled (`network`)."""

    code = "network"


_BY_CODE = {cls.code: cls for cls in Error.__subclasses__()}


def _call(fn, *args, **kwargs):
    """Runs a native call, raising its `Failure(code, detail)` as this module's error."""
    try:
        return fn(*args, **kwargs)
    except _native.Failure as e:
        code, detail = e.args
        raise _BY_CODE.get(code, Error)(detail) from None


class ClassRef(tuple):
    """A class as `(library, version, name)`, as the header records it; `("", "", "")` is an
    unknown model. Iterates as the 3-tuple; equal and hashable by value."""

    def __new__(cls, library: str, version: str, name: str):
        return super().__new__(cls, (library, version, name))

    @property
    def library(self) -> str:
        return self[0]

    @property
    def version(self) -> str:
        return self[1]

    @property
    def name(self) -> str:
        return self[2]

    def __repr__(self) -> str:
        return f"ClassRef({self[0]!r}, {self[1]!r}, {self[2]!r})"


class Encoding:
    """A scheme and its complete params (spec §6); str() is `scheme {key: value, ...}`."""

    __slots__ = ("scheme", "params")

    def __init__(self, scheme: str, params: Dict[str, Any]):
        self.scheme, self.params = scheme, params

    def __str__(self) -> str:
        # As the reference writes it: `mxfp8 {block_size: 32, scale_layout: "row_major"}`.
        params = ", ".join(f"{k}: {json.dumps(v)}" for k, v in self.params.items())
        return f"{self.scheme} {{{params}}}"

    def __repr__(self) -> str:
        return f"Encoding({self.scheme!r}, {self.params!r})"


class TensorMetadata:
    """A tensor's logical dtype (a safetensors dtype name) and shape, its encoding (None when
    plain), and for an encoded tensor its stored parts as `(role, dtype, shape)`."""

    __slots__ = ("dtype", "shape", "encoding", "parts")

    def __init__(self, dtype: str, shape, encoding: Optional[Encoding], parts):
        self.dtype, self.shape, self.encoding = dtype, tuple(shape), encoding
        self.parts = [(role, d, tuple(s)) for role, d, s in parts]

    def __repr__(self) -> str:
        encoding = f", encoding={self.encoding}" if self.encoding else ""
        return f"TensorMetadata(dtype={self.dtype!r}, shape={self.shape}{encoding})"


class Encoded:
    """An encoded tensor as stored (`decode=False`): its logical dtype and shape, scheme,
    params and part arrays by role."""

    __slots__ = ("dtype", "shape", "scheme", "params", "parts")

    def __init__(self, dtype, shape, scheme, params, parts: Dict[str, Array]):
        self.dtype, self.shape, self.scheme, self.params = dtype, tuple(shape), scheme, params
        self.parts = parts

    def __repr__(self) -> str:
        return f"Encoded({self.scheme!r}, dtype={self.dtype!r}, shape={self.shape}, parts={list(self.parts)})"


class Tensors(Mapping):
    """A component's tensors: `key → TensorMetadata` in construction order, and `read`."""

    def __init__(self, checkpoint: "Checkpoint", component: str, tensors: Dict[str, TensorMetadata]):
        self._checkpoint, self._component, self._tensors = checkpoint, component, tensors

    def __getitem__(self, key: str) -> TensorMetadata:
        return self._tensors[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    # One key gives its tensor (an array with `decode=True`), several or none a dict. (A dict
    # of arrays for `decode=True` would overlap the last signature unsafely: dict values are
    # invariant.)
    @overload
    def read(self, keys: str, *, device: Union[str, int, Any, None] = ..., decode: Literal[True]) -> Array: ...
    @overload
    def read(
        self, keys: str, *, device: Union[str, int, Any, None] = ..., decode: bool = ...
    ) -> Union[Array, Encoded]: ...
    @overload
    def read(
        self,
        keys: Union[List[str], Tuple[str, ...], None] = ...,
        *,
        device: Union[str, int, Any, None] = ...,
        decode: bool = ...,
    ) -> Dict[str, Union[Array, Encoded]]: ...

    def read(
        self,
        keys: Union[str, Sequence[str], None] = None,
        *,
        device: Union[str, int, Any, None] = "cpu",
        decode: bool = False,
    ) -> Union[Array, Encoded, Dict[str, Union[Array, Encoded]]]:
        """Reads one tensor (`keys` a key: its array), several (a list or tuple: a dict in
        that order) or all (`None`: a dict in construction order). A plain tensor is an
        `Array` of its bytes; an encoded one is an `Encoded` (its parts as stored) unless
        `decode`, which decodes it into an `Array` of its logical dtype.

        `device`: `cpu` (host memory), or a CUDA device (`cuda`, `cuda:N`, `N`, a
        `torch.device`), into whose memory the bytes are read straight from the store's blobs
        (a decoded tensor: decoded on the host, then copied); `cuda` alone is torch's current
        device when torch is imported, else device 0.

        Raises `NotFoundError` (no such tensor, an absent blob), `IntegrityError` (a damaged
        blob), `UnknownSchemeError` or `DecodeError` (with `decode`), `InvalidError` (a device
        that is not `cpu` or CUDA's), `UnsupportedError` (CUDA not available: no driver or no
        such device)."""
        ordinal = _device_ordinal(device)
        if isinstance(keys, str):
            return self._read(keys, decode, ordinal)
        if keys is not None and not isinstance(keys, (list, tuple)):
            raise TypeError(f"keys: a key (str), a list or tuple of keys, or None, not {type(keys).__name__}")
        names = list(self._tensors) if keys is None else list(keys)
        return {key: self._read(key, decode, ordinal) for key in names}

    def _read(self, key: str, decode: bool, ordinal: Optional[int]):
        native = self._checkpoint._native_handle()
        got = _call(native.read, self._component, key, decode, ordinal)
        if isinstance(got, Array):
            return got
        scheme, params, parts = got
        meta = self._tensors[key]
        return Encoded(meta.dtype, meta.shape, scheme, params, dict(parts))


def _device_ordinal(device) -> Optional[int]:
    """`None` for the host, else the CUDA device's ordinal."""
    if device is None or device == "cpu":
        return None
    kind, index = getattr(device, "type", None), getattr(device, "index", None)
    if kind is None:  # not a torch.device
        if isinstance(device, int) and not isinstance(device, bool):
            kind, index = "cuda", device
        elif isinstance(device, str):
            kind, _, text = device.partition(":")
            index = int(text) if text.isdigit() else -1 if text else None
        else:
            kind = None
    if kind == "cpu" and index is None:
        return None
    if kind != "cuda" or (index is not None and index < 0):
        raise InvalidError(f"device {device!r}: expected 'cpu', 'cuda', 'cuda:N' or N")
    if index is None:
        import sys

        torch = sys.modules.get("torch")
        index = torch.cuda.current_device() if torch is not None and torch.cuda.is_initialized() else 0
    return index


class Component:
    """One component of a checkpoint: its name, class, config, assets and tensors."""

    def __init__(self, checkpoint: "Checkpoint", name, cls, config, config_file, assets, tensors):
        self._checkpoint = checkpoint
        self.name: str = name
        self.cls: ClassRef = ClassRef(*cls)
        self.config: Dict[str, Any] = config
        self.config_file: str = config_file
        self.assets: Dict[str, Tuple[str, int]] = {k: tuple(v) for k, v in assets.items()}
        self.tensors = Tensors(
            checkpoint,
            name,
            {
                key: TensorMetadata(
                    dtype, shape, Encoding(*encoding) if encoding is not None else None, parts
                )
                for key, dtype, shape, encoding, parts in tensors
            },
        )

    def asset(self, name: str) -> bytes:
        """An asset's bytes (a tokenizer file, a scheduler config), proven."""
        return _call(self._checkpoint._native_handle().asset, self.name, name)

    def __repr__(self) -> str:
        return f"Component({self.name!r}, {self.cls.name or 'unknown'}, {len(self.tensors)} tensors)"


class Pipeline:
    """What `model_index.json` held: its class and config."""

    __slots__ = ("cls", "config")

    def __init__(self, cls, config):
        self.cls, self.config = ClassRef(*cls), config


class Checkpoint:
    """One commit of a store, opened by `open`: `repo_id`, `release`, `lane`, `tree` (the
    commit, `sha256:<hex>`), `id` (its header), `pipeline`, `components` (in construction
    order), `metadata` and `chunks` (the header's chunk objects in order, `(sha256, length)`). A context manager; `close()` releases its hold on the store's
    objects, and arrays read before stay valid."""

    def __init__(self, native):
        self._native = native
        repo, release, lane, tree, header, store = native.identity()
        self.repo_id: Optional[str] = repo
        self.release: Optional[str] = release
        self.lane: str = lane
        self.tree: str = tree
        self.id: str = header
        self.store: str = os.fspath(store)
        described = native.describe()
        pipeline = described["pipeline"]
        self.pipeline: Optional[Pipeline] = Pipeline(*pipeline) if pipeline is not None else None
        self.metadata: Dict[str, Any] = described["metadata"]
        self.chunks: List[Tuple[str, int]] = [tuple(c) for c in described["chunks"]]
        self.components: Dict[str, Component] = {
            c[0]: Component(self, *c) for c in described["components"]
        }

    def _native_handle(self):
        if self._native is None:
            raise InvalidError(f"{self.repo_id or self.tree}: the checkpoint is closed")
        return self._native

    def close(self) -> None:
        if self._native is not None:
            self._native.close()
            self._native = None

    def __enter__(self) -> "Checkpoint":
        self._native_handle()  # a closed checkpoint says so now, not at its first read
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpoint({self.repo_id or self.tree!r}, lane={self.lane!r}, components={list(self.components)})"


def open(
    name: str,
    *,
    release: Optional[str] = None,
    lane: Optional[str] = None,
    store: Union[str, "os.PathLike[str]", None] = None,
    endpoint: Optional[str] = None,
    token: Optional[str] = None,
) -> Checkpoint:
    """Opens the checkpoint `name` (`org/name`, `org/name@revision`, or `sha256:<commit>`) of
    the local store `store` (default: the `tensorfs` command's, $TENSORFS_HOME or
    ~/.cache/tensorfs): `release` a release version or a commit (default: the newest), `lane`
    one of its lanes (default: its only one).

    With `endpoint` (`https://…`, `http://` on loopback, `s3://bucket/prefix`, `file:///dir`:
    what `tensorfs mount --endpoint` takes; `token` its bearer token), `name` is the endpoint's
    `org/name`: its documents are fetched into `store` now and each chunk the first time a
    read needs it, as a lazy mount fetches them, and kept there as cache.

    Raises `NotFoundError` (no such store, repo, release or lane), `InvalidError` (several
    lanes and none named, a malformed name or endpoint), `FormatError`, `IntegrityError`,
    `StorageError`, `NetworkError` (an endpoint that fails)."""
    root = store if store is not None else _native.default_store()
    if root is None:
        raise NotFoundError("no store: pass store= or set TENSORFS_HOME (HOME is unset)")
    return Checkpoint(
        _call(_native.open_checkpoint, os.fspath(root), name, release, lane, endpoint, token)
    )
