"""What the HTML report shows, computed once: :func:`build_report` turns a Profile into one
:class:`ReportData` that render/html.py draws without computing anything of its own.

The user's frames of every op row are filtered once (:func:`op_user_stacks`) and serve the ops
table's source column, the annotated source (the line table) and the source flame graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerscope.analysis.critical_path import PathWindow, profile_critical_path
from layerscope.analysis.first_screen import FirstScreen, first_screen
from layerscope.analysis.lines import line_table
from layerscope.analysis.roofline import profile_roofline
from layerscope.analysis.stacks import op_user_stacks, stack_values
from layerscope.analysis.steps import StepRow, step_rows
from layerscope.errors import TraceFormatError, UsageError
from layerscope.model.critical_path import CriticalPath
from layerscope.model.meta import TRACE
from layerscope.model.profile import Profile
from layerscope.model.roofline import Roofline
from layerscope.model.tables import LineTable

#: Modules a step's tree shows (its heaviest, forward + backward, in tree order).
STEP_TREE_MODULES = 12

#: The metrics the report has a flame graph for (each only when the profile has any of it).
FLAME_METRICS = ("cpu_us", "device_us", "cpu_alloc_bytes", "flops")


@dataclass(frozen=True)
class Flame:
    """One flame graph's weights: ``stacks`` (frames from the root down) -> the ``metric``'s self
    value, over module frames or the ops' Python stacks (``frames_of``: modules, source)."""

    metric: str
    frames_of: str
    stacks: dict[tuple[str, ...], float]


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows beyond the profile's own records: ``user_stacks`` (per op row,
    the user's frames, innermost first), ``lines`` (the line table by location; None without
    stacks), ``steps`` (the step table with outliers), ``flames`` (every flame graph's weights),
    ``first_screen`` (the summary that answers first), ``roofline`` (None without a device spec or
    without bytes)."""

    profile: Profile
    user_stacks: tuple[tuple[str, ...], ...]
    lines: LineTable | None
    steps: list[StepRow]
    flames: tuple[Flame, ...]
    first_screen: FirstScreen
    #: step -> its heaviest modules in tree order: (path, forward µs, backward µs), inclusive
    step_trees: dict[int, list[tuple[str, float, float]]]
    #: the whole trace's critical path, for profiles read from a trace still there (else None)
    critical_path: CriticalPath | None = None
    #: modules and ops against the device's roofs, when ops have bytes and the device is known
    roofline: Roofline | None = None


def build_report(profile: Profile, device: Any = None) -> ReportData:
    """The report's data (see :class:`ReportData`); ``device`` the roofline's (a spec key or a
    ``DeviceSpec``; default: the device the profile ran on, when the spec table knows it)."""
    has_stacks = profile.has_stacks
    stacks = op_user_stacks(profile) if has_stacks else tuple(() for _ in profile.op_rows)
    lines = line_table(profile, sort_by="location", user_stacks=stacks) if has_stacks else None
    flames = []
    for metric in FLAME_METRICS:
        total = getattr(profile.totals, metric)
        if not total:
            continue
        flames.append(Flame(metric, "modules", stack_values(profile, metric)))
        if has_stacks:  # the same weights over the ops' Python call stacks
            weights = stack_values(profile, metric, frames_of="source", user_stacks=stacks)
            flames.append(Flame(metric, "source", weights))
    steps = step_rows(profile.steps)
    trees = step_trees(profile)
    screen, roofline = first_screen(profile, steps), report_roofline(profile, device)
    path = report_critical_path(profile)
    return ReportData(profile, stacks, lines, steps, tuple(flames), screen, trees, path, roofline)


def report_critical_path(profile: Profile) -> CriticalPath | None:
    """The critical path of the whole trace a profile was read from (the trace is read again: a
    Profile keeps no events); None for live captures and saved profiles whose trace is gone, and
    for traces with no CPU op or device work on a path."""
    trace = profile.meta.trace_file
    if profile.meta.source != TRACE or not trace or not Path(trace).is_file():
        return None
    try:
        path = profile_critical_path(profile, PathWindow())
    except (UsageError, TraceFormatError, ValueError, OSError):
        return None
    return path if path.nodes else None


def report_roofline(profile: Profile, device: Any = None) -> Roofline | None:
    """The roofline the report draws: None when no op has bytes or no device spec is known."""
    if not any(r.bytes for r in profile.op_rows):
        return None
    try:
        return profile_roofline(profile, device)
    except UsageError:
        if device is not None:  # a device asked for by name that the table lacks: say so
            raise
        return None


def step_trees(profile: Profile) -> dict[int, list[tuple[str, float, float]]]:
    """Each step's heaviest modules (below the root), in the tree's order, with their forward and
    backward time in that step."""
    order = {node.path: k for k, node in enumerate(profile.modules())}
    trees = {}
    for step in profile.steps:
        found = [(p, f, b) for p, (f, b) in step.modules.items() if p and p in order]
        heaviest = sorted(found, key=lambda m: -(m[1] + m[2]))[:STEP_TREE_MODULES]
        trees[step.step] = sorted(heaviest, key=lambda m: order[m[0]])
    return trees


__all__ = ["FLAME_METRICS", "Flame", "ReportData", "build_report", "report_critical_path"]
