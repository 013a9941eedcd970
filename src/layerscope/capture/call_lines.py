"""Call lines (``ls.profile(lines=True)``): the line of the user's code that called each op.

The native module (``native_lines.cpp``) runs a RecordFunction callback at the entry of every
top-level op and reads the calling thread's Python frames: the frames outside torch, layerscope,
the standard library and generated code become the op's stack of call lines, recorded against the
op's RecordFunction handle, which torch's profiler keeps on the same event. Attribution
(``attribution/call_lines.py``) gives nested ops their top-level op's stack and backward work the
stack of the forward op that created it.

This module decides which files are the user's (:func:`internal_prefixes`), drives the recorder and
turns its buffers into :class:`~layerscope.events.call_lines.CallLines`.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import tempfile
import warnings
from contextlib import ExitStack
from types import ModuleType

import numpy as np
from torch.profiler import ProfilerAction

from layerscope.capture import native
from layerscope.errors import LayerscopeWarning
from layerscope.events.call_lines import CallLines

#: Filename prefixes of code that is never the user's, beyond the installed packages' folders:
#: FX's generated ``forward`` and frozen importlib modules.
_GENERATED = ("<eval_with_key", "<frozen ", "<__array_function__")


def internal_prefixes() -> list[str]:
    """Filename prefixes whose frames are not the user's: torch and its sibling packages,
    layerscope, the standard library, the Python launcher scripts (``bin/``), Inductor's generated
    code, FX's generated code. Site-packages inside the standard library's folder stay the user's
    (:func:`user_prefixes`: the longer prefix decides)."""
    import torch

    torch_dir = os.path.dirname(torch.__file__)
    packages = os.path.dirname(torch_dir)
    found = [torch_dir, os.path.join(packages, "torchgen"), os.path.join(packages, "functorch")]
    found.append(os.path.dirname(os.path.dirname(__file__)))  # the layerscope package
    paths = sysconfig.get_paths()
    found += [paths["stdlib"], paths["platstdlib"]]
    found.append(os.path.dirname(sys.executable))  # console scripts (pytest, torchrun, layerscope)
    found.append(_inductor_cache_dir())
    return [*dict.fromkeys(_spellings(found)), *_GENERATED]


def _spellings(folders: list[str]) -> list[str]:
    """Each folder as written and with symlinks resolved, with a trailing separator: a code
    object's filename is the path its module was imported by, resolved or not."""
    out = []
    for folder in folders:
        for form in (os.path.abspath(folder), os.path.realpath(folder)):
            out.append(os.path.normpath(form) + os.sep)
    return out


def user_prefixes() -> list[str]:
    """Site-packages folders: code there is the user's (their libraries' models) even when the
    standard library's folder contains them; torch and layerscope inside are still internal."""
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    return list(dict.fromkeys(_spellings([f for f in folders if f])))


def _inductor_cache_dir() -> str:
    """Where Inductor writes generated Python (its default, without importing Inductor)."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        return configured
    try:
        user = os.getlogin()
    except OSError:
        import getpass

        user = getpass.getuser()
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}".replace(os.sep, "_"))


def supported(module: ModuleType | None) -> bool:
    """Whether ``module`` (the native module, or None) can record call lines on this Python."""
    return module is not None and hasattr(module, "lines_supported") and bool(module.lines_supported())


class CallLineRecorder:
    """Records call lines while it runs; :meth:`take` hands over what was recorded so far."""

    def __init__(self, native_module: ModuleType) -> None:
        self._module = native_module
        self._running = False

    def start(self) -> None:
        """Start the callback (one recorder at a time per process: the profile session claims it)."""
        self._module.lines_start(_classification())
        self._running = True

    def stop(self) -> None:
        """Stop the callback; safe to call twice or before :meth:`start`."""
        if self._running:
            self._running = False
            self._module.lines_stop()

    def follow(self, action: ProfilerAction) -> None:
        """Record only while the profile's schedule records (warm-up included): stopped for
        ``wait`` steps and after the schedule's end, started again (records dropped) when it
        records once more."""
        if action == ProfilerAction.NONE:
            self.stop()
        elif not self._running:
            self.start()

    def take(self) -> CallLines:
        """The call lines recorded since the last take, as stacks of frame strings."""
        threads, node_code, node_line, node_parent, files, functions = self._module.lines_take()
        handles = [np.frombuffer(h, dtype=np.int64) for _, h, _ in threads]
        nodes = [np.frombuffer(n, dtype=np.int64) for _, _, n in threads]
        return CallLines.from_nodes(
            np.concatenate(handles) if handles else np.zeros(0, dtype=np.int64),
            np.concatenate(nodes) if nodes else np.zeros(0, dtype=np.int64),
            np.frombuffer(node_code, dtype=np.int64),
            np.frombuffer(node_line, dtype=np.int64),
            np.frombuffer(node_parent, dtype=np.int64),
            list(files),
            list(functions),
        )


def _classification() -> list[str]:
    """What the native side matches filenames against, longest prefix first: ``+prefix`` for the
    user's folders, ``-prefix`` for internal ones."""
    marked = [(p, "-") for p in internal_prefixes()] + [(p, "+") for p in user_prefixes()]
    marked.sort(key=lambda item: -len(item[0]))
    return [sign + prefix for prefix, sign in marked]


def start_call_lines(stack: ExitStack, action: ProfilerAction) -> CallLineRecorder | None:
    """Start recording call lines for a profile session (unless its schedule's first ``action`` is
    ``wait``), stopped by ``stack``; None (with a warning naming the remedy) where this Python or
    torch cannot record them."""
    module = native.load()
    if not supported(module):
        why = native.status().reason if module is None else "needs CPython 3.11 to 3.13"
        warnings.warn(
            f"lines=True: call lines are not recorded ({why}); run `layerscope native build`",
            LayerscopeWarning,
            stacklevel=4,
        )
        return None
    assert module is not None
    recorder = CallLineRecorder(module)
    stack.callback(recorder.stop)
    recorder.follow(action)
    return recorder
