"""Reading a flight recorder's dump: what triggered it and, for a slow step, where the time went.

The slow step is compared with the median of the other kept steps, module by module (each step's
inclusive forward and backward time per module, ``StepStats.modules``): starting at the root's phase
with the larger excess, the walk goes down into the child holding the largest excess while that
child holds at least half of its parent's, and names the module it stops at. Time outside every
module call (the optimizer, the data loader) is a candidate of its own.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from layerscope.attribution.flight_profile import OUTSIDE_MODULES
from layerscope.model.profile import Profile, StepStats
from layerscope.units import fmt_time_us

#: A module's excess over the median step in one phase (0 forward, 1 backward), µs.
Excess = Callable[[str, int], float]


@dataclass(frozen=True)
class SlowStepCulprit:
    """Where a slow step's extra time is: ``module`` (a path, None for time outside every module
    call), ``phase`` (``forward``/``backward``/``outside``), the step's excess over the median step
    there, and the step's own excess over the median step in all."""

    module: str | None
    phase: str
    extra_us: float
    step_extra_us: float


def slow_step_culprit(profile: Profile, step: int) -> SlowStepCulprit | None:
    """Where ``step``'s extra time went (see the module docstring); None when the profile has no
    such step or no other step to compare with."""
    found = [s for s in profile.steps if s.step == step]
    others = [s for s in profile.steps if s.step != step]
    if not found or not others:
        return None
    slow = found[0]
    median_wall = statistics.median(s.wall_us for s in others)

    def extra(path: str, phase: int) -> float:
        typical = statistics.median(s.modules.get(path, (0.0, 0.0))[phase] for s in others)
        return slow.modules.get(path, (0.0, 0.0))[phase] - typical

    outside = slow.unattributed.get(OUTSIDE_MODULES, 0.0) - statistics.median(
        s.unattributed.get(OUTSIDE_MODULES, 0.0) for s in others
    )
    roots = [""] if "" in slow.modules else [p for p in slow.modules if "." not in p]
    if not roots:
        return SlowStepCulprit(None, "outside", outside, slow.wall_us - median_wall)
    phase, path = max((extra(p, ph), ph, p) for p in roots for ph in (0, 1))[1:]
    if outside > extra(path, phase):
        return SlowStepCulprit(None, "outside", outside, slow.wall_us - median_wall)
    path = _descend(slow, path, phase, extra)
    phase_name = ("forward", "backward")[phase]
    return SlowStepCulprit(path, phase_name, extra(path, phase), slow.wall_us - median_wall)


def _descend(slow: StepStats, path: str, phase: int, extra: Excess) -> str:
    while True:
        prefix = f"{path}." if path else ""
        children = [
            p for p in slow.modules if p.startswith(prefix) and p != path and "." not in p[len(prefix) :]
        ]
        if not children:
            return path
        best = max(children, key=lambda p: extra(p, phase))
        if extra(best, phase) < 0.5 * extra(path, phase) or extra(best, phase) <= 0:
            return path
        path = best


def trigger_line(profile: Profile) -> str | None:
    """The first line ``show`` prints for a dump: what triggered it, which step, and for a slow
    step where the extra time went. None for a profile that is not a dump."""
    flight = profile.meta.flight
    if flight is None:
        return None
    trigger = flight.trigger
    where = f" in {trigger.module}" if trigger.module else ""
    if trigger.reason == "slow_step":
        return _slow_line(profile, trigger.step, flight.median_step_us)
    what = {
        "signal": "signal",
        "exception": "exception",
        "oom": "out of memory",
        "manual": "dump()",
        "memory": "memory threshold",
    }.get(trigger.reason, trigger.reason)
    message = f": {trigger.message}" if trigger.message else ""
    return f"{what} at step {trigger.step}{where}{message}"


def _slow_line(profile: Profile, step: int, median_us: float | None) -> str:
    found = [s for s in profile.steps if s.step == step]
    if not found:
        return f"slow step {step} (not among the kept steps)"
    wall = found[0].wall_us
    median = f" vs median {fmt_time_us(median_us)}" if median_us is not None else ""
    line = f"slow step {step}: {fmt_time_us(wall)}{median}"
    culprit = slow_step_culprit(profile, step)
    if culprit is None:
        return line
    where = "outside modules" if culprit.module is None else f"{culprit.module or '(root)'} ({culprit.phase})"
    return f"{line}; +{fmt_time_us(culprit.extra_us)} in {where}"
