"""File exports of a Profile: CSV (module rows and op rows) and collapsed stacks for flame graphs."""

from __future__ import annotations

import csv
import io

from layerscope.attribution.stacks import user_frames
from layerscope.errors import UsageError
from layerscope.model.metrics import FIELD_NAMES, Metrics
from layerscope.model.profile import Phase, Profile

#: Metrics a collapsed-stack export can weigh frames by (their self figure is used).
STACK_METRICS = ("cpu_us", "device_us", "cpu_alloc_bytes", "device_alloc_bytes", "flops")
#: What a flame graph's frames are: the module tree, or the ops' Python call stacks.
FRAME_KINDS = ("modules", "source")


def modules_csv(profile: Profile) -> str:
    """One row per module and phase: path, type, calls, recomputations (activation checkpointing),
    params, and every metric."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["path", "type", "calls", "recompute_calls", "params_total", "phase", *FIELD_NAMES])
    for node in profile.modules():
        for phase in ("forward", "backward"):
            metrics: Metrics = getattr(node, phase)
            writer.writerow(
                [
                    node.path,
                    node.type_name,
                    node.calls,
                    node.recompute_calls,
                    node.params_total,
                    phase,
                    *metrics.to_list(),
                ]
            )
    return out.getvalue()


def ops_csv(profile: Profile) -> str:
    """One row per op row: name, phase, module (or the unattributed label), input shapes, metrics."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["name", "phase", "module", "unattributed", "input_shapes", "calls", *FIELD_NAMES])
    for row in profile.op_rows:
        writer.writerow(
            [
                row.name,
                row.phase.value if row.phase else "",
                row.module if row.module is not None else "",
                row.scope,
                row.input_shapes or "",
                row.calls,
                *row.metrics.to_list(),
            ]
        )
    return out.getvalue()


def stack_values(
    profile: Profile, metric: str = "cpu_us", frames_of: str = "modules", internal_frames: bool = False
) -> dict[tuple[str, ...], float]:
    """Stack (frames from the root down, ending in an op or ``[python]``) -> the metric's self value.

    ``frames_of="modules"``: module frames from the root down, then the op; a module's own Python
    time as ``[python]``; backward work under a ``[backward]`` root, unattributed work under
    ``[unattributed]``. ``frames_of="source"``: the op's Python call stack (``with_stack``), outermost
    frame first, the user's frames only unless ``internal_frames``; backward ops under
    ``[backward]``, ops without a stack under ``[no stack]``. Source stacks weigh ops only."""
    if metric not in STACK_METRICS:
        raise UsageError(f"cannot weigh stacks by {metric!r}; choose from {', '.join(STACK_METRICS)}")
    if frames_of not in FRAME_KINDS:
        raise UsageError(f"unknown frames {frames_of!r}; choose from {', '.join(FRAME_KINDS)}")
    self_field = f"self_{metric}"
    if frames_of == "source":
        return _source_stack_values(profile, self_field, internal_frames)
    root_name = profile.root.type_name or "(root)"
    frames: dict[str, list[str]] = {}
    for node in profile.modules():
        frames[node.path] = [root_name, *(node.path.split(".") if node.path else [])]
    values: dict[tuple[str, ...], float] = {}

    def add(stack: list[str], value: float) -> None:
        if value > 0:
            key = tuple(stack)
            values[key] = values.get(key, 0.0) + value

    op_self: dict[tuple[str, Phase], float] = {}
    label_self: dict[tuple[str, Phase | None], float] = {}
    for row in profile.op_rows:
        value = float(getattr(row.metrics, self_field))
        if row.module is not None and row.phase is not None:
            op_self[(row.module, row.phase)] = op_self.get((row.module, row.phase), 0.0) + value
            prefix = ["[backward]"] if row.phase is Phase.BACKWARD else []
            add([*prefix, *frames.get(row.module, [root_name, row.module]), row.name], value)
        else:
            label_self[(row.scope, row.phase)] = label_self.get((row.scope, row.phase), 0.0) + value
            add(["[unattributed]", row.scope or "(other)", row.name], value)
    if metric == "cpu_us":  # time in a module or an unattributed entry that no op covers
        for entry in profile.unattributed:
            rest = entry.metrics.self_cpu_us - label_self.get((entry.label, entry.phase), 0.0)
            add(["[unattributed]", entry.label, "[python]"], rest)
        for node in profile.modules():
            for phase in (Phase.FORWARD, Phase.BACKWARD):
                metrics: Metrics = node.backward if phase is Phase.BACKWARD else node.forward
                rest = float(getattr(metrics, self_field)) - op_self.get((node.path, phase), 0.0)
                prefix = ["[backward]"] if phase is Phase.BACKWARD else []
                add([*prefix, *frames[node.path], "[python]"], rest)
    return values


def _source_stack_values(
    profile: Profile, self_field: str, internal_frames: bool
) -> dict[tuple[str, ...], float]:
    values: dict[tuple[str, ...], float] = {}
    for row in profile.op_rows:
        value = float(getattr(row.metrics, self_field))
        if value <= 0:
            continue
        frames = user_frames(row.stack, internal_frames)
        stack = [*reversed(frames)] if frames else ["[no stack]"]
        if row.phase is Phase.BACKWARD:
            stack.insert(0, "[backward]")
        key = (*stack, row.name)
        values[key] = values.get(key, 0.0) + value
    return values


def collapsed_stacks(
    profile: Profile, metric: str = "cpu_us", frames_of: str = "modules", internal_frames: bool = False
) -> str:
    """``frame;frame;op value`` lines (FlameGraph, speedscope and Perfetto read them), from
    :func:`stack_values`. Values are integers (µs, bytes, FLOPs); zero lines are left out."""
    lines = []
    for stack, value in stack_values(profile, metric, frames_of, internal_frames).items():
        if round(value) > 0:
            lines.append(
                ";".join(f.replace(";", ",").replace(" ", "_") for f in stack) + f" {round(value)}\n"
            )
    return "".join(lines)
