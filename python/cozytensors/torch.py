"""`safetensors.torch.load_file`'s counterpart: torch tensors from a TensorFS mount's blobs."""

from ._loader import load_file

__all__ = ["load_file"]
