"""The ``torch.profiler.profile`` a layerscope session drives: its schedule when there is none, its
cycle warning, and the reference cycles it would otherwise keep the session and model in."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.profiler import ProfilerAction


def break_action_cycle(tp: torch.profiler.profile) -> None:
    """torch's profiler keeps its schedule's transitions as bound methods of itself (``action_map``):
    a reference cycle that would keep it, and all it recorded, alive until the cyclic GC runs. Once
    it has stopped the map is never read again; emptying it lets reference counting free it."""
    action_map = getattr(tp, "action_map", None)
    if isinstance(action_map, dict):
        action_map.clear()


def weakly(method: Callable[[Any], None]) -> Callable[[Any], None]:
    """``method`` called through a weak reference to its object (a no-op once that is gone)."""
    ref = weakref.WeakMethod(method)

    def call(arg: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(arg)

    return call


def always_record(step: int) -> ProfilerAction:
    """The schedule of an unscheduled block: every step is recorded."""
    return torch.profiler.ProfilerAction.RECORD


@contextmanager
def quiet_cycle_warning() -> Iterator[None]:
    """torch warns that a schedule clears events between cycles: that is what we want (each cycle
    becomes its own Profile), so the warning would only confuse."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle.*")
        yield
