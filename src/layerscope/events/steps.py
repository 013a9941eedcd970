"""Step windows: the one notion of a training step, shared by attribution, memory and the verdicts.

A *step* is a CPU-side range that marks one training step (see :mod:`layerscope.events.names`):

* user step annotations: ``record_function`` ranges named ``step N`` / ``step#N`` / ``step_N``; or,
  in a trace that has none of them,
* torch's ``ProfilerStep#N`` ranges, which ``prof.step()`` opens under a schedule (and ``ls.profile``
  around the whole block without one).

Both kinds are step ranges to attribution wherever they are (never op rows; their own time is the
"Python between ops" entry); only one kind gives the windows.

Device-side copies of a range (Kineto mirrors ``ProfilerStep#N`` on the GPU timeline as a
``gpu_user_annotation``) are not steps. A step's *window* is ``[start, end)`` of its range, in the
table's nanoseconds, and windows never overlap:

* a step range nested in an earlier one (same start or later, same end or earlier: a second thread
  or a framework marking the same step) is no step of its own;
* a step range that starts inside an earlier one and ends after it cuts the earlier window at its
  start (the CPU work that starts in between belongs to one step only).

Time between two windows (torch's own ``prof.step()`` call, or whatever runs outside the user's
ranges) belongs to no step. A step's number is the one its name carries; where two steps would
share one (a loop that counts from 0 again each epoch, or names without a number), the steps are
numbered in time order from 0 instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layerscope.events.names import profiler_step_number, user_step_number
from layerscope.events.table import CPU_KINDS, EventKind, EventTable


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


def step_name_ids(names: Sequence[str]) -> tuple[dict[int, int], dict[int, int]]:
    """Per name id that marks a step, its number: torch's ``ProfilerStep#N`` names, then user step
    annotations (``events/names.py``)."""
    torch_steps: dict[int, int] = {}
    user_steps: dict[int, int] = {}
    for name_id, name in enumerate(names):
        number = profiler_step_number(name)
        if number is not None:
            torch_steps[name_id] = number
        elif (number := user_step_number(name)) is not None:
            user_steps[name_id] = number
    return torch_steps, user_steps


def step_windows(table: EventTable) -> list[StepWindow]:
    """The steps of ``table`` in time order, each with its window (the module docstring's rules);
    found once per table (attribution, the verdicts and the device report each ask)."""
    return list(table.derived("step_windows", _step_windows))


def _step_windows(table: EventTable) -> list[StepWindow]:
    torch_steps, user_steps = step_name_ids(table.names)
    if not torch_steps and not user_steps:
        return []
    name_arr = table.array("span_name")
    cpu_side = _marked(table.array("span_kind"), [int(k) for k in CPU_KINDS], len(EventKind))
    # the user's own step marks win: torch's may be one range around the whole block (ls.profile
    # without a schedule) or the same steps again
    ids = user_steps
    candidates = np.flatnonzero(cpu_side & _marked(name_arr, list(user_steps), len(table.names)))
    if not candidates.size:
        ids = torch_steps
        candidates = np.flatnonzero(cpu_side & _marked(name_arr, list(torch_steps), len(table.names)))
    ts, dur = table.array("span_ts"), table.array("span_dur")
    # by start, the longest first among equal starts: an enclosing range comes before those inside
    candidates = candidates[np.lexsort((-dur[candidates], ts[candidates]))]
    kept: list[tuple[int, int, int]] = []  # (span, start, the range's own end)
    for i in candidates.tolist():
        start, end = int(ts[i]), int(ts[i] + dur[i])
        if kept and end <= kept[-1][2]:
            continue  # nested in the previous step (every earlier one ends before that one does)
        kept.append((i, start, end))
    numbers = [ids[int(name_arr[i])] for i, _, _ in kept]
    if len(set(numbers)) < len(numbers):  # a loop that counts from 0 each epoch: number in time order
        numbers = list(range(len(kept)))
    windows = []
    for k, (i, start, end) in enumerate(kept):
        cut = min(end, kept[k + 1][1]) if k + 1 < len(kept) else end
        windows.append(StepWindow(numbers[k], i, start, cut))
    return windows


def _marked(values: np.ndarray, wanted: list[int], bound: int) -> np.ndarray:
    """``np.isin(values, wanted)`` for ids in ``range(bound)`` (a table's name ids and kinds always
    are): one lookup per value in a table of flags, where ``isin`` sorts by the thousands of step
    names a long trace has."""
    flags = np.zeros(bound, dtype=bool)
    flags[wanted] = True
    found: np.ndarray = flags[values]
    return found
