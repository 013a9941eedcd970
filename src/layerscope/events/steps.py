"""Step windows: the one notion of a training step, shared by attribution, memory and the verdicts.

A *step* is a CPU-side range that marks one training step (see :mod:`layerscope.events.names`):

* torch's ``ProfilerStep#N`` ranges, which ``prof.step()`` opens under a schedule; or, in a trace
  that has none of them,
* user step annotations: ``record_function`` ranges named ``step N`` / ``step#N`` / ``step_N``.

Device-side copies of a range (Kineto mirrors ``ProfilerStep#N`` on the GPU timeline as a
``gpu_user_annotation``) are not steps. A step's *window* is ``[start, end)`` of its range, in the
table's nanoseconds, and windows never overlap:

* a step range nested in an earlier one (same start or later, same end or earlier: a second thread
  or a framework marking the same step) is no step of its own;
* a step range that starts inside an earlier one and ends after it cuts the earlier window at its
  start (the CPU work that starts in between belongs to one step only).

Time between two windows (torch's own ``prof.step()`` call, or whatever runs outside the user's
ranges) belongs to no step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layerscope.events.names import profiler_step_number, user_step_number
from layerscope.events.table import CPU_KINDS, EventTable


@dataclass(frozen=True, slots=True)
class StepWindow:
    """One step: its number, the span of its range, and its window ``[start, end)`` in ns."""

    number: int
    span: int
    start: int
    end: int

    @property
    def wall_ns(self) -> int:
        """The window's length (ns): the step's wall time."""
        return self.end - self.start


def step_name_ids(names: Sequence[str]) -> dict[int, int]:
    """Per name id that marks a step, the step's number: torch's ``ProfilerStep#N`` names, or,
    where ``names`` holds none, user step annotations (torch's steps win: a user range inside
    ``prof.step()``'s steps would count each step twice)."""
    found: dict[int, int] = {}
    for name_id, name in enumerate(names):
        number = profiler_step_number(name)
        if number is not None:
            found[name_id] = number
    if found:
        return found
    for name_id, name in enumerate(names):
        number = user_step_number(name)
        if number is not None:
            found[name_id] = number
    return found


def step_windows(table: EventTable) -> list[StepWindow]:
    """The steps of ``table`` in time order, each with its window (the module docstring's rules)."""
    ids = step_name_ids(table.names)
    if not ids:
        return []
    name_arr = table.array("span_name")
    cpu_side = np.isin(table.array("span_kind"), [int(k) for k in CPU_KINDS])
    candidates = np.flatnonzero(cpu_side & np.isin(name_arr, list(ids)))
    ts, dur = table.array("span_ts"), table.array("span_dur")
    # by start, the longest first among equal starts: an enclosing range comes before those inside
    candidates = candidates[np.lexsort((-dur[candidates], ts[candidates]))]
    kept: list[tuple[int, int, int]] = []  # (span, start, the range's own end)
    for i in candidates.tolist():
        start, end = int(ts[i]), int(ts[i] + dur[i])
        if kept and end <= kept[-1][2]:
            continue  # nested in the previous step (every earlier one ends before that one does)
        kept.append((i, start, end))
    windows = []
    for k, (i, start, end) in enumerate(kept):
        cut = min(end, kept[k + 1][1]) if k + 1 < len(kept) else end
        windows.append(StepWindow(ids[int(name_arr[i])], i, start, cut))
    return windows
