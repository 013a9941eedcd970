"""Step analysis: per-step tables, outlier steps and what made them slow, spread across steps."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from layerscope.attribution.buckets import LABEL_STEP_GAPS
from layerscope.events.names import DATA_LOADER_PREFIX, OPTIMIZER_STEP_PREFIX, OPTIMIZER_ZERO_GRAD_PREFIX
from layerscope.model.metrics import renamed
from layerscope.model.profile import Profile, StepStats

#: A step is an outlier when its wall time exceeds this multiple of the median step's.
OUTLIER_RATIO = 1.5

_FRIENDLY = (
    (DATA_LOADER_PREFIX, "data loader"),
    (OPTIMIZER_STEP_PREFIX, "optimizer step"),
    (OPTIMIZER_ZERO_GRAD_PREFIX, "optimizer zero_grad"),
    (LABEL_STEP_GAPS, "Python between ops"),
)


@dataclass(frozen=True, slots=True)
class StepRow:
    """One step in the step table; ``cause`` names what made an outlier slow."""

    step: int
    wall_us: float
    cpu_us: float
    device_us: float
    forward_us: float
    backward_us: float
    ratio_to_median: float
    outlier: bool
    cause: str | None = None
    cause_excess_us: float = 0.0
    absolute_peak_bytes: int | None = None  # the step's absolute peak of live memory (with memory)
    net_bytes: int | None = None  # what the step left allocated

    peak_bytes = renamed("absolute_peak_bytes", "peak_bytes", "StepRow")


@dataclass(frozen=True, slots=True)
class Spread:
    """Forward + backward CPU time of one module across steps."""

    mean_us: float
    min_us: float
    max_us: float
    stdev_us: float

    @property
    def relative(self) -> float:
        """Standard deviation over mean (0 when the mean is 0)."""
        return self.stdev_us / self.mean_us if self.mean_us > 0 else 0.0


def friendly_label(label: str) -> str:
    """Readable names for the usual unattributed labels (data loader, optimizer step...)."""
    for prefix, name in _FRIENDLY:
        if label.startswith(prefix):
            return name
    return label


def components(step: StepStats) -> dict[str, float]:
    """Where a step's CPU time went: each top-level module (forward + backward, with children),
    the root's own work, and each unattributed label."""
    parts: dict[str, float] = {}
    root_fwd, root_bwd = step.modules.get("", (0.0, 0.0))
    children = [p for p in step.modules if p and "." not in p]
    own = root_fwd + root_bwd - sum(sum(step.modules[c]) for c in children)
    for path in children:
        parts[f"module {path}"] = sum(step.modules[path])
    if "" in step.modules:
        parts["root module's own work"] = own
    for label, value in step.unattributed.items():
        name = friendly_label(label)
        parts[name] = parts.get(name, 0.0) + value
    return parts


def step_rows(steps: Sequence[StepStats], ratio: float = OUTLIER_RATIO) -> list[StepRow]:
    """The step table: each step against the median step; outliers name their cause, the part
    (module or label) whose time exceeds its own median the most."""
    if not steps:
        return []
    median_wall = statistics.median(s.wall_us for s in steps)
    parts = [components(s) for s in steps]
    names = sorted({name for p in parts for name in p})
    medians = {name: statistics.median(p.get(name, 0.0) for p in parts) for name in names}
    rows = []
    for step, part in zip(steps, parts, strict=True):
        rel = step.wall_us / median_wall if median_wall > 0 else 1.0
        outlier = len(steps) > 2 and rel > ratio
        cause, excess = None, 0.0
        if outlier:
            excess_by_part = {name: part.get(name, 0.0) - medians[name] for name in names}
            cause = max(excess_by_part, key=lambda name: excess_by_part[name])
            excess = excess_by_part[cause]
            if excess <= 0:
                cause, excess = "time outside recorded ops (waiting, I/O, other threads)", 0.0
        rows.append(
            StepRow(
                step.step,
                step.wall_us,
                step.cpu_us,
                step.device_us,
                step.forward_us,
                step.backward_us,
                rel,
                outlier,
                cause,
                excess,
                step.absolute_peak_bytes,
                step.net_bytes,
            )
        )
    return rows


def module_spread(profile: Profile) -> dict[str, Spread]:
    """Per module, the spread of its forward + backward time across the profile's steps."""
    if len(profile.steps) < 2:
        return {}
    result: dict[str, Spread] = {}
    for node in profile.modules():
        values = [sum(s.modules.get(node.path, (0.0, 0.0))) for s in profile.steps]
        mean = statistics.fmean(values)
        stdev = statistics.stdev(values) if len(values) > 1 else 0.0
        result[node.path] = Spread(mean, min(values), max(values), 0.0 if math.isnan(stdev) else stdev)
    return result
