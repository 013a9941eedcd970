"""A signal's action as the operating system holds it, which Python's ``signal`` module cannot see.

``signal.getsignal`` answers from Python's own table: a handler installed outside Python
(``faulthandler.register``, a C extension, a native library) reads as ``SIG_DFL``, and taking the
signal with ``signal.signal`` would silently replace it — and restoring ``SIG_DFL`` afterwards would
not bring it back. Reading the action with libc's ``sigaction`` shows such a handler, so a
layerscope instrument can leave that signal alone.

The action is read into an opaque buffer larger than any platform's ``struct sigaction``; only its
first field, the handler (``sa_handler``/``sa_sigaction``, a union at offset 0 on Linux and macOS),
is interpreted. Where libc or ``sigaction`` is unavailable (Windows), nothing is known and nothing is
reported as foreign.
"""

from __future__ import annotations

import ctypes
import signal as signals
import sys
from functools import cache

#: Bytes read for a ``struct sigaction`` (152 on Linux x86-64 with glibc, 16 on macOS).
_ACTION_BUFFER = 1024


@cache
def _sigaction() -> object | None:
    """libc's ``sigaction``, or None where there is none."""
    if sys.platform == "win32":
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sigaction
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function


def os_handler(signum: int) -> int | None:
    """The address of the handler the operating system runs for ``signum`` (0 for the default
    action, 1 for ignore), or None when it cannot be read."""
    function = _sigaction()
    if function is None:
        return None
    buffer = ctypes.create_string_buffer(_ACTION_BUFFER)
    if function(signum, None, buffer) != 0:  # type: ignore[operator]
        return None
    return int(ctypes.c_void_p.from_buffer(buffer).value or 0)


def handled_outside_python(signum: int) -> bool:
    """Whether ``signum`` has a handler Python did not install: Python's table says default or
    ignore (or does not know), while the operating system runs a function."""
    python_side = signals.getsignal(signum)
    if python_side not in (signals.SIG_DFL, signals.SIG_IGN, None):
        return False  # a Python handler: Python's own C handler runs it
    handler = os_handler(signum)
    return handler is not None and handler not in (int(signals.SIG_DFL), int(signals.SIG_IGN))
