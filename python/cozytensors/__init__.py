"""cozytensors: load safetensors files of TensorFS mounts straight from the store's blobs.

`cozytensors.safe_open` and `cozytensors.torch.load_file` take safetensors' arguments and
give its results; for a file of a TensorFS mount whose store this process can read, tensor
bytes come from the store's chunk blobs instead of through FUSE. Anything else is safetensors
itself. See `cozytensors._loader` for the rules.
"""

from safetensors import SafetensorError

from ._loader import load_file, safe_open

__all__ = ["SafetensorError", "load_file", "safe_open"]
