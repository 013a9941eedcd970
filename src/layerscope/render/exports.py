"""File exports of a Profile: CSV (module rows and op rows) and collapsed stacks for flame graphs
(the stacks' weights are computed by analysis/stacks.py; ``stack_values`` is importable here too)."""

from __future__ import annotations

import csv
import io

from layerscope.analysis.stacks import FRAME_KINDS, STACK_METRICS, stack_values
from layerscope.model.metrics import FIELD_NAMES, Metrics
from layerscope.model.profile import Profile


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


__all__ = ["FRAME_KINDS", "STACK_METRICS", "collapsed_stacks", "modules_csv", "ops_csv", "stack_values"]
