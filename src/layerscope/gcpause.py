"""Pausing Python's cyclic garbage collector around bulk work."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
#: Blocks inside ``gc_paused`` now, in any thread, and whether the collector ran before the first.
_paused = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector inside the block (restoring its previous state).

    Reading a capture or a trace creates millions of short-lived containers; the collector would
    walk the whole, growing heap again and again meanwhile (shape reads many times slower on live
    captures, super-linear times on GB traces: docs/architecture.md). None of these objects form
    cycles: reference counting frees them, so pausing the collector is safe.

    The collector is one per process, so blocks in several threads (files read in parallel) share
    the pause: the first one in pauses it, the last one out restores the state the first one found.
    """
    global _paused, _was_enabled
    with _lock:
        if _paused == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _lock:
            _paused -= 1
            if _paused == 0 and _was_enabled:
                gc.enable()
