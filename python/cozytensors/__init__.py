"""cozytensors: load safetensors files of TensorFS mounts straight from the store's blobs.

`cozytensors.safe_open` and `cozytensors.torch.load_file` take safetensors' arguments and
give its results; for a file of a TensorFS mount whose store this process can read, tensor
bytes come from the store's chunk blobs instead of through FUSE. Anything else is safetensors
itself. See `cozytensors._loader` for the rules, and `cozytensors._hook` for routing unmodified
loaders here (`COZYTENSORS_HOOK=1`).

Importing the package imports nothing else: its names load on first use, so the start-up hook
costs nothing until a loader opens a file.
"""

__all__ = ["SafetensorError", "load_file", "safe_open"]


def __getattr__(name):
    if name in ("load_file", "safe_open"):
        from . import _loader

        return getattr(_loader, name)
    if name == "SafetensorError":
        from safetensors import SafetensorError

        return SafetensorError
    raise AttributeError(f"module 'cozytensors' has no attribute {name!r}")
