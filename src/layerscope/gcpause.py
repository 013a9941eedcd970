"""Pausing Python's cyclic garbage collector around bulk work."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector inside the block (restoring its previous state).

    Reading a capture or a trace creates millions of short-lived containers; the collector would
    walk the whole, growing heap again and again meanwhile (shape reads many times slower on live
    captures, super-linear times on GB traces: docs/architecture.md). None of these objects form
    cycles: reference counting frees them, so pausing the collector is safe.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
