"""TensorFS for Python loaders, and the format's own API.

`cozytensors.safe_open` and `cozytensors.torch.load_file` take safetensors' arguments and
give its results; for a file of a TensorFS mount whose store this process can read, tensor
bytes come from the store's chunk blobs instead of through FUSE. Anything else is safetensors
itself. See `cozytensors._loader` for the rules, and `cozytensors._hook` for routing unmodified
loaders here (`COZYTENSORS_HOOK=1`).

`cozytensors.open(name, release=…, lane=…)` opens a checkpoint of a local store by name: its
components' classes, configs, assets and tensors, read as stored or decoded into DLPack
arrays, with errors of one family (`cozytensors.Error`, `.code`, `.detail`). See
`cozytensors._api`.

Importing the package imports nothing else: its names load on first use, so the start-up hook
costs nothing until a loader opens a file.
"""

_LOADER = ("load_file", "safe_open")
_API = (
    "Array", "Checkpoint", "ClassRef", "Component", "DecodeError", "DiskFullError", "Encoded",
    "Encoding", "Error", "FormatError", "IntegrityError", "InvalidError", "NetworkError", "NotFoundError",
    "Pipeline", "StorageError", "TensorMetadata", "Tensors", "UnknownSchemeError",
    "UnsupportedError", "open",
)

__all__ = ["SafetensorError", *_LOADER, *_API]


def __getattr__(name):
    if name in _LOADER:
        from . import _loader

        return getattr(_loader, name)
    if name in _API:
        from . import _api

        return getattr(_api, name)
    if name == "SafetensorError":
        from safetensors import SafetensorError

        return SafetensorError
    raise AttributeError(f"module 'cozytensors' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
