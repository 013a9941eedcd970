"""One profile session at a time: torch runs one profiler per process, so a second block (nested,
or beside a plain torch.profiler session) is refused before it starts anything."""

from __future__ import annotations

import threading
from typing import Any

import torch

from layerscope.errors import CaptureError

_active_lock = threading.Lock()
_active: list[Any] = []


def claim(session: Any, already_used: bool) -> None:
    """Register ``session`` as the one running block, or raise :class:`CaptureError` saying why not."""
    with _active_lock:
        if _active:
            raise CaptureError(
                "layerscope.profile is already active; profiling blocks cannot be "
                "nested (end the outer block first)"
            )
        if already_used:
            raise CaptureError("this layerscope.profile object was already used; create a new one")
        if torch._C._autograd._profiler_enabled():
            # torch would start no second session and, on exit, stop the running one.
            raise CaptureError(
                "another torch.profiler session is already running; end it before "
                "layerscope.profile (or use layerscope's own torch_profiler)"
            )
        _active.append(session)


def release(session: Any) -> None:
    """Forget ``session`` (it ended, or failed to start)."""
    with _active_lock:
        if session in _active:
            _active.remove(session)
