"""What the report's first screen answers (:class:`FirstScreen`): how long a step takes, where the
time goes, the absolute memory peak and where it happened, and the most important findings.

Computed here once, drawn by ``render/first_screen.py``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from layerscope.analysis.advice import Advice, advise
from layerscope.analysis.flight import trigger_line
from layerscope.analysis.steps import StepRow
from layerscope.errors import LayerscopeError
from layerscope.events.names import DATA_LOADER_PREFIX, OPTIMIZER_STEP_PREFIX
from layerscope.model.memory_view import MemoryAtPeak
from layerscope.model.profile import Profile

#: Findings the first screen shows (advice's rules are in order of importance).
TOP_FINDINGS = 3
#: The parts of the recorded time, in the order the bar draws them.
PARTS = ("forward", "backward", "optimizer", "data loading", "other")


@dataclass(frozen=True)
class StepTime:
    """The step time over the recorded steps: median, fastest, slowest, how many, outliers."""

    median_us: float
    min_us: float
    max_us: float
    steps: int
    outliers: int


@dataclass(frozen=True)
class FirstScreen:
    """The report's first screen. ``time_parts``: part of :data:`PARTS` -> CPU wall µs over the
    recorded window (they add up to ``wall_us``; "other" is loss, glue and gaps);
    ``device_idle_share``: the device's idle share of its window (None without device work)."""

    step_time: StepTime | None
    wall_us: float
    time_parts: dict[str, float]
    device_idle_share: float | None
    peak: MemoryAtPeak | None
    findings: tuple[Advice, ...]
    #: a flight recorder's dump: what made it (``analysis/flight.py``'s line), else None
    trigger: str | None = None


def step_time(rows: list[StepRow]) -> StepTime | None:
    """Median and spread of the step table's wall times (None without steps)."""
    if not rows:
        return None
    walls = [r.wall_us for r in rows]
    outliers = sum(r.outlier for r in rows)
    return StepTime(statistics.median(walls), min(walls), max(walls), len(rows), outliers)


def time_parts(profile: Profile) -> tuple[float, dict[str, float]]:
    """The recorded window's wall time and its parts: the model's forward and backward (the root
    module, inclusive), the optimizer and the data loader (their torch ranges outside the model),
    and the rest."""
    root = profile.root
    parts = {"forward": root.forward.cpu_us, "backward": root.backward.cpu_us}
    for part, prefix in (("optimizer", OPTIMIZER_STEP_PREFIX), ("data loading", DATA_LOADER_PREFIX)):
        parts[part] = sum(e.metrics.cpu_us for e in profile.unattributed if e.label.startswith(prefix))
    covered = sum(parts.values())
    wall = max(profile.meta.wall_us or profile.totals.cpu_us, covered)
    parts["other"] = wall - covered
    return wall, parts


def first_screen(profile: Profile, steps: list[StepRow]) -> FirstScreen:
    """The first screen of ``profile``'s report (``steps``: its step table)."""
    wall, parts = time_parts(profile)
    device = profile.meta.device
    try:
        peak: MemoryAtPeak | None = profile.memory_at_peak()
    except LayerscopeError:  # no memory figures
        peak = None
    return FirstScreen(
        step_time=step_time(steps),
        wall_us=wall,
        time_parts=parts,
        device_idle_share=1.0 - device.utilisation if device is not None else None,
        peak=peak,
        findings=tuple(advise(profile, None)[:TOP_FINDINGS]),
        trigger=trigger_line(profile),
    )


__all__ = ["PARTS", "TOP_FINDINGS", "FirstScreen", "StepTime", "first_screen", "step_time", "time_parts"]
