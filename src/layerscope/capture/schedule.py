"""``layerscope.schedule``: torch.profiler's schedule semantics, with argument checks; what its
actions (torch's ``ProfilerAction``, the one spelling capture uses) mean to layerscope."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerAction

from layerscope.errors import UsageError

#: The actions on which torch keeps what it records (warm-up records too, but drops it).
RECORDING = frozenset({ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE})

_LABELS = {
    ProfilerAction.NONE: "wait",
    ProfilerAction.WARMUP: "warmup",
    ProfilerAction.RECORD: "record",
    ProfilerAction.RECORD_AND_SAVE: "record_and_save",
}


def action_label(action: ProfilerAction) -> str:
    """How progress lines name ``action``: ``wait``, ``warmup``, ``record`` or ``record_and_save``."""
    return _LABELS[action]


def schedule(
    *, wait: int = 0, warmup: int = 0, active: int = 1, repeat: int = 0, skip_first: int = 0
) -> Callable[[int], Any]:
    """Which steps to profile, exactly as ``torch.profiler.schedule``: skip ``skip_first`` steps, then
    cycles of ``wait`` idle, ``warmup`` (profiler on, results dropped) and ``active`` recorded steps,
    ``repeat`` times (0 = until the block ends). Call ``prof.step()`` after every training step."""
    values = {"wait": wait, "warmup": warmup, "active": active, "repeat": repeat, "skip_first": skip_first}
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise UsageError(f"schedule {name} must be a non-negative integer, not {value!r}")
    if active < 1:
        raise UsageError("schedule active must be at least 1 (the steps that are recorded)")
    with warnings.catch_warnings():
        # torch advises a warm-up step when warmup=0; here it was asked for explicitly.
        warnings.filterwarnings("ignore", message=".*won't be using warmup.*")
        fn: Callable[[int], Any] = torch.profiler.schedule(
            wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first
        )
    return fn
