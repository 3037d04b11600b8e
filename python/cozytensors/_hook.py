"""Routes unmodified loaders to cozytensors for files of TensorFS mounts (`COZYTENSORS_HOOK=1`).

The wheel installs `cozytensors.pth`, which Python runs at every start-up: with the
environment variable `COZYTENSORS_HOOK` set (to anything but `0`, `false`, `no` or `off`) it
imports this module, which imports nothing heavy. It puts a finder on `sys.meta_path` that
waits for `safetensors` to be imported and then replaces `safetensors.safe_open` by a class
whose call opens files of TensorFS mounts with `cozytensors.safe_open` (straight from the
store's blobs) and everything else with safetensors' own (kept as its `__wrapped__`;
`isinstance` answers for both). Since `safetensors.torch`, `safetensors.numpy`,
Transformers, Diffusers and ComfyUI take `safe_open` from the `safetensors` module after it is
patched (`from safetensors import safe_open`, `safetensors.safe_open(...)`), their loads go
through it: `safetensors.torch.load_file`, `safe_open(...).get_tensor`, Transformers'
`from_pretrained` (`get_slice(k)[...]`), Diffusers' `load_state_dict`, ComfyUI's
`load_torch_file`. Worker processes inherit the variable (a new interpreter runs the hook
again) or the patched module (fork).

What it cannot reach (docs/python.md lists them): loaders that read the whole file into memory
first (`safetensors.torch.load(bytes)`, `safetensors.deserialize`: the `disable_mmap` paths),
`torch.load` of `.bin`/`.pt` files, readers in other languages, and code that imported
`safetensors._safetensors_rust` itself. Those read through the mount as before.
"""

import os
import sys
from importlib.machinery import PathFinder

__all__ = ["install", "on_tensorfs"]


def on_tensorfs(filename) -> bool:
    """Whether `filename` (a str or path-like path) lies on a TensorFS mount. Anything else,
    bytes among them, is safetensors' to refuse, with its own error."""
    try:
        path = os.fspath(filename)
        if not isinstance(path, str):
            return False
        path = os.path.realpath(path)
    except (TypeError, ValueError):
        return False
    # The native module parses mountinfo as the daemon does; importing it is the first cost
    # the hook has, paid at the first `safe_open`, not at start-up.
    from . import _native

    for point in map(os.fspath, _native.mounts()):
        if path == point or path.startswith(point.rstrip("/") + "/"):
            return True
    return False


class _Routing(type):
    """The metaclass of the patched `safetensors.safe_open`: calling it opens the file with
    cozytensors on a mount and with safetensors elsewhere; `isinstance` answers for both
    kinds of object, as it did for safetensors' class."""

    def __call__(cls, filename, framework, device="cpu", *args, **kwargs):
        if not args and on_tensorfs(filename):
            from ._loader import safe_open as ours

            return ours(filename, framework, device, **kwargs)
        return cls.__wrapped__(filename, framework, device, *args, **kwargs)

    def __instancecheck__(cls, obj):
        from ._loader import safe_open as ours

        return isinstance(obj, (cls.__wrapped__, ours))


def _patch(module):
    original = getattr(module, "safe_open", None)
    if original is None or getattr(original, "__wrapped__", None) is not None:
        return
    safe_open = _Routing(
        "safe_open",
        (),
        {"__wrapped__": original, "__doc__": original.__doc__, "__module__": "safetensors"},
    )
    module.safe_open = safe_open


class _Patching:
    """A loader that runs `safetensors`' own, then patches the module."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Finder:
    """Finds `safetensors` as the path would, with a loader that patches it."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "safetensors":
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Patching(spec.loader)
        return spec


def install():
    """Routes `safetensors.safe_open` to cozytensors for mounted files, now if `safetensors` is
    imported already, else as soon as it is."""
    if "safetensors" in sys.modules:
        _patch(sys.modules["safetensors"])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
