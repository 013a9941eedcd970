"""When the flight recorder takes its detailed steps: every ``detail_every`` steps, and — with a
``detail_budget`` — further apart where needed, so that what they cost stays within that share of
the job's time.

A detailed step costs what torch's profiler costs to start and stop around one step (and the step's
slowdown under it) plus layerscope's own part. Against a step, that depends on the job: torch's part
alone is about one plain step on a CPU loop and about two on a short launch-bound GPU step
(``benchmarks/profiler_floor.py``, docs/benchmarks.md), negligible beside a step of seconds. So a
fixed ``detail_every`` is cheap on one job and not on another; a budget holds on both. The cost is
measured, not assumed: the wall time of the detailed step and of the :data:`COST_STEPS` - 1 after it
(the profile's stop lands in the next step, the writer's read beside the one after; while the
writer is still busy, up to :data:`MAX_COST_STEPS` in all) above the rolling median step as it was
when the detailed step began, each step's excess counted when positive. The next detailed step
comes at least ``cost / (budget × median step)`` steps after the last one, never sooner than
``detail_every``, and, under a budget, never while the last one's cost is still being measured.
Before the slow-step trigger's warm-up has given a median, nothing is measured and ``detail_every``
alone decides.
"""

from __future__ import annotations

import math

#: The steps whose time holds a detailed step's cost: the detailed step and the ones after it.
COST_STEPS = 3

#: At most this many, while the writer still reads the detailed step beside the program.
MAX_COST_STEPS = 8

#: The steps whose own time says nothing of the job's pace: the profile started in the first and
#: stopped at the start of the second (the writer's work after that is the recorder's to exclude).
PROFILED_STEPS = 2


class DetailSchedule:
    """The detailed steps' schedule (see the module docstring): ``every`` steps (0: never), spaced
    to keep their measured cost within ``budget`` (a fraction of the job's time; None: no cap)."""

    def __init__(self, every: int, budget: float | None) -> None:
        self.every, self.budget = every, budget
        self.next_step = every  # the first step that may start a detailed profile
        self.last_step: int | None = None  # the latest detailed step
        self.last_cost_us: float | None = None  # the latest measured cost (None before one)
        self.taken = 0  # detailed profiles started
        self._median_us: float | None = None  # the median step when the latest one began
        self._window_end = 0  # the first step after the latest one's cost window
        self._excess_ns = 0.0

    def due(self, step: int) -> bool:
        """Whether step ``step`` should start a detailed profile."""
        if self.every <= 0 or step <= 0 or step < self.next_step:
            return False
        # under a budget, the last one's cost is measured before the next one starts
        return self.budget is None or not self.costs(step)

    def started(self, step: int, median_us: float | None) -> None:
        """A detailed profile started at step ``step``; ``median_us``: the rolling median step then
        (None before the warm-up: this one's cost is not measured)."""
        self.last_step, self._median_us, self._excess_ns = step, median_us, 0.0
        self._window_end = step + COST_STEPS
        self.next_step = step + self.every  # pushed further once the cost is known, under a budget
        self.taken += 1

    def costs(self, step: int) -> bool:
        """Whether ``step``'s time holds some of the latest detailed step's cost."""
        last = self.last_step
        return last is not None and last <= step < self._window_end

    def profiled(self, step: int) -> bool:
        """Whether a detailed profile ran in ``step`` or stopped at its start (the slow-step
        trigger does not judge those steps)."""
        last = self.last_step
        return last is not None and last <= step < last + PROFILED_STEPS

    def see(self, step: int, wall_ns: int, writer_busy: bool = False) -> None:
        """Step ``step`` took ``wall_ns``; ``writer_busy``: the recorder's writer worked during it."""
        median_us = self._median_us
        if not self.costs(step) or median_us is None:
            return
        self._excess_ns += max(0.0, wall_ns - median_us * 1000.0)
        assert self.last_step is not None
        if step != self._window_end - 1:
            return
        if writer_busy and self._window_end < self.last_step + MAX_COST_STEPS:
            self._window_end += 1  # its read still runs beside the program: the next step counts too
            return
        cost_us = self.last_cost_us = self._excess_ns / 1000.0
        if self.budget is not None and median_us > 0:
            spacing = math.ceil(cost_us / (self.budget * median_us))
            self.next_step = max(self.next_step, self.last_step + spacing)
