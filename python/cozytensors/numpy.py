"""`safetensors.numpy.load_file`'s counterpart: numpy arrays from a TensorFS mount's blobs."""

from typing import TYPE_CHECKING, Dict

from ._loader import safe_open

if TYPE_CHECKING:
    import numpy

__all__ = ["load_file"]


def load_file(filename) -> Dict[str, "numpy.ndarray"]:
    """Every tensor of a safetensors file as numpy arrays."""
    with safe_open(filename, framework="np") as f:
        return f.get_tensors()
