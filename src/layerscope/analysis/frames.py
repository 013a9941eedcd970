"""Profiles as pandas data frames (``Profile.to_pandas``), and achieved FLOP/s.

pandas is optional: it is imported when a frame is asked for, with one clear error without it.
Columns (documented in docs/usage.md):

* ``modules``: ``path``, ``type``, ``parent``, ``depth``, ``calls``, ``recompute_calls``, ``params``,
  ``params_total``, then ``{phase}_{metric}`` for ``forward`` and ``backward`` and every
  :class:`Metrics` field (``forward_self_cpu_us``, ``backward_flops``...), then ``{phase}_flops_per_s``.
* ``ops``: ``name``, ``phase``, ``module``, ``scope``, ``input_shapes``, ``calls``, every metric,
  ``flops_per_s``, ``bytes`` (read and written, a lower bound; None unknown), ``dtype``.
* ``unattributed``: ``label``, ``phase``, ``calls``, every metric.
* ``roofline``: :data:`layerscope.model.roofline.COLUMNS`, against the profile's own device
  (``Profile.roofline(device=...).to_pandas()`` for another, or for a CPU profile).
* ``steps``: ``step``, ``wall_us``, ``cpu_us``, ``device_us``, ``forward_us``, ``backward_us``.
* ``streams``, ``device_steps``, ``copies``: a trace's device report (``meta.device``, profiles
  built from traces with device work): per stream ``device``, ``stream``, ``kernels``, ``work``,
  ``busy_us``, ``host_wait_us``, ``kernel_wait_us``, ``other_us``, ``queue_mean``, ``queue_max``,
  ``launch_delay_median_us``, ``launch_delay_p95_us``, ``full_queue_us``; per step ``step``, ``wall_us``,
  ``device_busy_us``, ``utilisation``, the three idle causes, ``comm_overlap``, ``verdict``; per
  copy kind ``kind``, ``count``, ``bytes``, ``time_us``, ``gb_per_s``.

Self columns add up: modules' ``forward_self_*`` + ``backward_self_*`` plus the unattributed entries
equal the profile's totals.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from layerscope.errors import UsageError
from layerscope.model.metrics import FIELD_NAMES, Metrics
from layerscope.model.profile import ModuleNode, Profile
from layerscope.model.roofline import COLUMNS as ROOFLINE_COLUMNS

TABLES = (
    "modules",
    "ops",
    "lines",
    "types",
    "unattributed",
    "steps",
    "memory_peak",
    "streams",
    "device_steps",
    "copies",
    "roofline",
)


def achieved_flops_per_s(metrics: Metrics) -> float | None:
    """FLOPs per second of a scope: its FLOPs over its device time when it has device time, else its
    CPU time (inclusive figures). None when it has no FLOPs or no time."""
    if metrics.flops <= 0:
        return None
    seconds = (metrics.device_us if metrics.device_us > 0 else metrics.cpu_us) / 1e6
    return metrics.flops / seconds if seconds > 0 else None


def _metric_columns(metrics: Metrics, prefix: str = "") -> dict[str, Any]:
    return {f"{prefix}{name}": value for name, value in zip(FIELD_NAMES, metrics.to_list(), strict=True)}


def frame_rows(profile: Profile, table: str) -> list[dict[str, Any]]:
    """The rows of one table as plain dicts (what ``to_pandas`` hands to pandas)."""
    if table == "lines":
        return _line_rows(profile)
    if table == "types":
        return _type_rows(profile)
    if table == "modules":
        return _module_rows(profile)
    if table == "ops":
        return [
            {
                "name": r.name,
                "phase": str(r.phase) if r.phase is not None else None,
                "module": r.module,
                "scope": r.scope,
                "input_shapes": r.input_shapes,
                "calls": r.calls,
                **_metric_columns(r.metrics),
                "flops_per_s": achieved_flops_per_s(r.metrics),
                "bytes": r.bytes,
                "dtype": r.dtype,
            }
            for r in profile.op_rows
        ]
    if table == "unattributed":
        return [
            {
                "label": u.label,
                "phase": str(u.phase),
                "calls": u.calls,
                **_metric_columns(u.metrics),
            }
            for u in profile.unattributed
        ]
    if table == "steps":
        return [
            {
                "step": s.step,
                "wall_us": s.wall_us,
                "cpu_us": s.cpu_us,
                "device_us": s.device_us,
                "forward_us": s.forward_us,
                "backward_us": s.backward_us,
                "absolute_peak_bytes": s.absolute_peak_bytes,
                "alloc_bytes": s.alloc_bytes,
                "net_bytes": s.net_bytes,
            }
            for s in profile.steps
        ]
    if table == "roofline":
        return [asdict(r) for r in profile.roofline().rows()]
    if table == "memory_peak":
        at_peak = profile.memory_at_peak()
        return [
            {"category": r.category, "module": r.module, "phase": r.phase, "bytes": r.bytes}
            for r in at_peak.rows
        ]
    if table in ("streams", "device_steps", "copies"):
        device = profile.meta.device
        if device is None:
            raise UsageError(
                f"no {table} table: this profile has no device report (it comes with profiles built "
                "from traces that have device work: layerscope.load, layerscope analyze -o)"
            )
        rows = {"streams": device.streams, "device_steps": device.steps, "copies": device.copies}[table]
        return [dict(row) for row in rows]
    raise UsageError(f"unknown table {table!r}; choose from {', '.join(TABLES)}")


def _module_rows(profile: Profile) -> list[dict[str, Any]]:
    """One row per module: path, type, parent, depth, calls, params, shapes, per-phase metrics."""
    rows = []
    # parent and depth from the tree itself (with folding, a parent is not always the path's prefix)
    stack: list[tuple[ModuleNode, str | None, int]] = [(profile.root, None, 0)]
    while stack:
        node, parent, depth = stack.pop()
        stack.extend((child, node.path, depth + 1) for child in reversed(node.children))
        row: dict[str, Any] = {
            "path": node.path,
            "type": node.type_name,
            "parent": parent,
            "depth": depth,
            "calls": node.calls,
            "recompute_calls": node.recompute_calls,
            "params": node.params,
            "params_total": node.params_total,
            "input_shapes": node.input_shapes,
            "output_shapes": node.output_shapes,
        }
        for phase, metrics in (("forward", node.forward), ("backward", node.backward)):
            row.update(_metric_columns(metrics, f"{phase}_"))
        for phase, metrics in (("forward", node.forward), ("backward", node.backward)):
            row[f"{phase}_flops_per_s"] = achieved_flops_per_s(metrics)
        rows.append(row)
    return rows


def _line_rows(profile: Profile) -> list[dict[str, Any]]:
    """Source lines (``Profile.lines()``), heaviest first: forward and backward self figures."""
    from layerscope.analysis.lines import line_table

    rows = []
    for r in line_table(profile):
        row: dict[str, Any] = {"file": r.file, "line": r.line, "function": r.function, "calls": r.calls}
        for phase, metrics in (("forward", r.forward), ("backward", r.backward)):
            row[f"{phase}_self_cpu_us"] = metrics.self_cpu_us
            row[f"{phase}_self_device_us"] = metrics.self_device_us
            row[f"{phase}_flops"] = metrics.self_flops
            row[f"{phase}_alloc_bytes"] = metrics.self_cpu_alloc_bytes + metrics.self_device_alloc_bytes
        row["module"] = r.modules[0] if r.modules else None
        row["modules"] = list(r.modules)
        rows.append(row)
    return rows


def _type_rows(profile: Profile) -> list[dict[str, Any]]:
    """Modules summed per type (``Profile.by_type()``): self figures, heaviest first."""
    from layerscope.analysis.types import type_table

    table = type_table(profile)
    rows = []
    for r in table:
        row: dict[str, Any] = {
            "type": r.type_name,
            "modules": r.modules,
            "calls": r.calls,
            "params": r.params,
        }
        for phase, metrics in (("forward", r.forward), ("backward", r.backward)):
            row[f"{phase}_cpu_us"] = metrics.cpu_us
            row[f"{phase}_device_us"] = metrics.device_us
            row[f"{phase}_flops"] = metrics.flops
        row["share"] = table.share(r)
        rows.append(row)
    return rows


def to_pandas(profile: Profile, table: str = "modules") -> Any:
    """One table of the profile as a ``pandas.DataFrame`` (see the module doc for the columns)."""
    rows = frame_rows(profile, table)
    try:
        import pandas
    except ImportError:
        raise UsageError("to_pandas needs pandas: pip install pandas") from None
    if table == "roofline":
        return pandas.DataFrame(rows, columns=list(ROOFLINE_COLUMNS))
    return pandas.DataFrame(rows)
