"""`fork()` and the loader's locks.

A child process gets a copy of every lock as it was at the fork, held by threads it does not
have. The native reader's work runs without the GIL, so another thread may be inside it when a
thread forks: `os.fork()` therefore waits until no native work is under way
(`_native.before_fork`) and lets it start again after (`_native.after_fork`), and the child
makes anew the locks of the handles it inherits (`safe_open`'s own lock, which a thread may
hold across a native call).
"""

import os
import threading
import weakref

from . import _native

_HANDLES: "weakref.WeakSet" = weakref.WeakSet()


def track(handle) -> None:
    """Makes `handle._maps_lock` anew in a forked child."""
    _HANDLES.add(handle)


def _in_child() -> None:
    _native.after_fork()
    for handle in list(_HANDLES):
        handle._maps_lock = threading.Lock()


os.register_at_fork(before=_native.before_fork, after_in_parent=_native.after_fork, after_in_child=_in_child)
