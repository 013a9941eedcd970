"""The ``torch.profiler.profile`` a layerscope session drives: made from the checked options, its
schedule when there is none, its cycle warning, and the reference cycles it would otherwise keep the
session and model in."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.profiler import ProfilerAction

from layerscope.capture.options import CaptureOptions
from layerscope.errors import UsageError


def make_torch_profiler(
    options: CaptureOptions, on_cycle: Callable[[torch.profiler.profile], None]
) -> torch.profiler.profile:
    """torch's profiler for ``options``; under a schedule, ``on_cycle`` receives each finished cycle
    (held weakly: torch's profiler holds itself in a cycle, which must not hold the session)."""
    cycle_kwargs: dict[str, Any] = {}
    if options.scheduled:
        cycle_kwargs["on_trace_ready"] = weakly(on_cycle)
    # torch marks ProfilerStep#N ranges only under a schedule: without one, "always record" keeps
    # prof.step() meaningful (per-step statistics) and changes nothing else.
    cycle_kwargs["schedule"] = options.schedule if options.schedule is not None else always_record
    try:
        return torch.profiler.profile(**cycle_kwargs, **options.torch_kwargs())
    except TypeError as exc:
        raise UsageError(f"torch.profiler.profile rejected the options: {exc}") from exc


def current_action(tp: torch.profiler.profile) -> ProfilerAction:
    """What torch's profiler does at its current step, read from torch itself: calling the user's
    schedule again could consume their RNG or count their calls."""
    action = getattr(tp, "current_action", ProfilerAction.RECORD)
    return action if isinstance(action, ProfilerAction) else ProfilerAction.RECORD


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
