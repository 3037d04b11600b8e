# `cozytensors._native`, the compiled half (python/src/lib.rs), for type checkers.
from os import PathLike
from typing import Any, Optional, Tuple, Union

_Path = Union[str, PathLike[str]]

class Failure(Exception):
    """args: (code, detail); `cozytensors` raises it as its `Error` of that code."""

class Array:
    """Owned bytes (host memory, or a CUDA device's) of a safetensors dtype and shape, shared
    through DLPack."""

    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> str: ...
    def tobytes(self) -> bytes: ...
    def __dlpack__(
        self,
        *,
        stream: object = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> object: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

class Checkpoint:
    def identity(self) -> Tuple[Optional[str], Optional[str], str, str, str, str]: ...
    def describe(self) -> dict[str, Any]: ...
    def read(
        self, component: str, key: str, decode: bool = False, device: Optional[int] = None
    ) -> Any: ...
    def asset(self, component: str, name: str) -> bytes: ...
    def close(self) -> None: ...

def open_checkpoint(
    store: _Path,
    name: str,
    release: Optional[str] = None,
    lane: Optional[str] = None,
    endpoint: Optional[str] = None,
    token: Optional[str] = None,
) -> Checkpoint: ...
def default_store() -> Optional[str]: ...
def mounts() -> list[str]: ...
def locate(fd: int, path: str, name: str) -> Optional[dict[str, Any]]: ...
def describe(fd: int, path: str) -> Optional[str]: ...
def is_fuse(fd: int) -> bool: ...
def header(
    fd: int, path: str
) -> Optional[Tuple[dict[str, Tuple[str, Tuple[int, ...], int, int]], Optional[dict[str, str]]]]: ...
def index(
    fd: int, path: str
) -> Optional[
    Tuple[
        str,
        dict[Tuple[int, int], Tuple[Tuple[str, int, int, int, int, Optional[list[int]]], ...]],
        frozenset[Tuple[int, int]],
    ]
]: ...
class BlobMap:
    @property
    def address(self) -> int: ...
    @property
    def length(self) -> int: ...

def map_blob(
    store: _Path, sha256: str, length: int, what: str, stamp: Optional[list[int]] = None
) -> BlobMap: ...
def will_need(address: int, length: int) -> None: ...
def read(store: _Path, extents: list[Tuple[str, int, int, int]], length: int, what: str) -> bytearray: ...
# Only in builds with the `cuda` feature (the wheel's).
def to_device(
    store: _Path,
    extents: list[Tuple[str, int, int, int, Optional[list[int]]]],
    address: int,
    length: int,
    ordinal: int,
    stream: int,
    file: str,
    tensor: str,
) -> None: ...
