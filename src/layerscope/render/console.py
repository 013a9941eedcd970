"""Console views: the module tree table, the op table and the step table, as rich renderables.

Their columns are specs in :mod:`layerscope.render.columns`; :mod:`layerscope.render.table_fit`
fits them to the terminal.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import IO, Any

from rich.console import Console, Group, RenderableType
from rich.text import Text

from layerscope.analysis.steps import StepRow
from layerscope.analysis.transform import fold_depth, prune_min_share
from layerscope.model.metrics import Metrics
from layerscope.model.profile import ModuleNode, OpStats, Phase, Profile
from layerscope.model.sort_keys import TREE_SORT_KEYS, check_sort_key, metric_sort_value
from layerscope.render.columns import (
    TreeRow,
    TreeView,
    op_columns,
    step_columns,
    tree_columns,
    tree_row,
    tree_view,
)
from layerscope.render.memory_notes import memory_notes
from layerscope.render.table_fit import FittedTable, wants_ascii
from layerscope.units import fmt_bytes, fmt_si, fmt_time_us

_UNICODE_GUIDES = ("├── ", "└── ", "│   ", "    ")
_ASCII_GUIDES = ("|-- ", "`-- ", "|   ", "    ")


def _node_sort_key(sort_by: str, has_device_time: bool) -> Callable[[ModuleNode], Any]:
    if sort_by == "calls":
        return lambda n: -n.calls
    if sort_by == "params":
        return lambda n: -n.params_total
    if sort_by == "name":
        return lambda n: n.name
    value = metric_sort_value(sort_by, has_device_time)
    return lambda n: -value(n.total)


def _rows(
    node: ModuleNode,
    sort_by: Callable[[ModuleNode], Any] | None,
    guides: tuple[str, str, str, str],
    prefix: str = "",
    last: bool = True,
    is_root: bool = True,
) -> list[tuple[str, ModuleNode]]:
    """(label with tree guides, node) in display order; loop-last logic gives the guide shapes."""
    branch, corner, pipe, space = guides
    label = (node.path or "(root)") if is_root else node.name
    out = [(label if is_root else prefix + (corner if last else branch) + label, node)]
    children = list(node.children)
    if sort_by is not None:
        children.sort(key=sort_by)
    child_prefix = "" if is_root else prefix + (space if last else pipe)
    for k, child in enumerate(children):
        out.extend(_rows(child, sort_by, guides, child_prefix, k == len(children) - 1, False))
    return out


def _tree_sections(
    view: Profile,
    v: TreeView,
    sort_by: Callable[[ModuleNode], Any] | None,
    guides: tuple[str, str, str, str],
    max_unattributed: int,
) -> list[list[TreeRow]]:
    """The module rows, the unattributed rows (largest first, the rest merged), the total row."""
    body = [
        tree_row(
            v,
            Text(label, style="bold" if not node.children else ""),
            node.type_name,
            v.calls_cell(node.calls)
            + (f"+{v.calls_cell(node.recompute_calls)}r" if node.recompute_calls else ""),
            node.forward,
            node.backward,
            fmt_si(node.params_total),
            node.path,
            node.output_shapes,
        )
        for label, node in _rows(view.root, sort_by, guides)
    ]
    entries = sorted(
        _merge_unattributed(view),
        key=lambda e: -(e[1].cpu_us + e[2].cpu_us + e[1].device_us + e[2].device_us),
    )
    extra = [
        tree_row(
            v, Text(f"[unattributed] {label}", style="italic"), "", v.calls_cell(count) if count else "", f, b
        )
        for label, f, b, count in entries[:max_unattributed]
    ]
    rest = entries[max_unattributed:]
    if rest:
        fwd_rest, bwd_rest = Metrics(), Metrics()
        for _, f, b, _calls in rest:
            fwd_rest, bwd_rest = fwd_rest.merged(f), bwd_rest.merged(b)
        label_rest = Text(f"[unattributed] {len(rest)} more", style="italic")
        extra.append(tree_row(v, label_rest, "", "", fwd_rest, bwd_rest))
    total_fwd, total_bwd = view.root.forward, view.root.backward
    for _, f, b, _calls in entries:
        total_fwd, total_bwd = total_fwd.merged(f), total_bwd.merged(b)
    total = _block_memory(view, v, tree_row(v, Text("total", style="bold"), "", "", total_fwd, total_bwd))
    return [body, extra, [total]]


def _block_memory(view: Profile, v: TreeView, total: TreeRow) -> TreeRow:
    """The total row's memory is the block's: its net change, and its absolute peak of live memory
    (what was live before it included) where the profile has one."""
    if not v.memory:
        return total
    net = view.totals.net_bytes / v.steps if v.per_step else view.totals.net_bytes
    fwd = replace(total.fwd, net_bytes=round(net))
    both = total.both
    report = view.meta.memory
    if report is not None:  # the column's figure, though absolute here (the total row is the block's)
        peaks = {c.device: c.absolute_peak_bytes for c in report.classes}
        both = replace(
            both, cpu_relative_peak_bytes=peaks.get(False, 0), device_relative_peak_bytes=peaks.get(True, 0)
        )
    return replace(total, fwd=fwd, both=both)


def tree_table(
    profile: Profile,
    depth: int | None = None,
    min_share: float = 0.0,
    sort_by: str = "execution",
    ascii_only: bool | None = None,
    max_unattributed: int = 6,
    per_step: bool = False,
    peak_tflops: float | None = None,
) -> RenderableType:
    """The module tree: one row per module with forward/backward time, device, memory, FLOPs, params.

    With a known peak (``peak_tflops``, or the device's from :mod:`layerscope.analysis.peaks`), an
    MFU column: achieved FLOP/s over the peak.

    ``depth`` and ``min_share`` (percent of the run's total) fold modules into their ancestors.
    Rows are totals over the profile's steps, as in the op table and the HTML report; ``per_step``
    shows means per step instead. With several steps a "± step" column gives the relative standard
    deviation of each module's time across steps.
    """
    sort_by = check_sort_key(sort_by, TREE_SORT_KEYS, "the module tree")
    order = None if sort_by == "execution" else _node_sort_key(sort_by, profile.has_device_time)
    if ascii_only is None:
        ascii_only = wants_ascii()
    folded_note = ""
    view = profile
    if depth is not None:
        view = fold_depth(view, depth)
    if min_share > 0:
        view, count = prune_min_share(view, min_share)
        if count:
            folded_note = (
                f"{count} module{'s' if count != 1 else ''} under {min_share:g}% folded into their parents"
            )
    v = tree_view(view, per_step, peak_tflops)
    guides = _ASCII_GUIDES if ascii_only else _UNICODE_GUIDES
    table = FittedTable(
        tree_columns(v),
        _tree_sections(view, v, order, guides, max_unattributed),
        ascii_only=ascii_only,
        caption=folded_note,
    )
    title = _title(view, v.per_step)
    notes = memory_notes(profile.meta)
    if v.peak_note:
        folded = table.caption
        table.caption = f"{folded}; {v.peak_note}" if folded else v.peak_note
    if ascii_only:
        title = title.replace("·", "|").replace("µ", "u")
        notes = [n.replace("µ", "u") for n in notes]
    return Group(Text(title, style="bold"), table, *(Text(n, style="bold red") for n in notes))


def _merge_unattributed(profile: Profile) -> list[tuple[str, Metrics, Metrics, int]]:
    """Unattributed entries by label; backward-phase work in the backward columns, the rest forward."""
    merged: dict[str, tuple[Metrics, Metrics, int]] = {}
    for entry in profile.unattributed:
        f, b, calls = merged.get(entry.label, (Metrics(), Metrics(), 0))
        if entry.phase is Phase.BACKWARD:
            b = b.merged(entry.metrics)
        else:
            f = f.merged(entry.metrics)
        merged[entry.label] = (f, b, calls + entry.calls)
    return [(label, f, b, c) for label, (f, b, c) in merged.items()]


def _title(profile: Profile, per_step: bool = False) -> str:
    meta = profile.meta
    parts = []
    if meta.model:
        parts.append(meta.model)
    if meta.estimate is not None:  # nothing here was measured: say so before any figure
        parts.append(f"estimate for {meta.estimate.device_name}")
    steps = len(profile.steps)
    if meta.wall_us and meta.estimate is not None:
        parts.append(f"predicted step {fmt_time_us(meta.wall_us)}")
    elif meta.wall_us:
        over = f" for {steps} steps" if steps > 1 else ""
        parts.append(f"wall {fmt_time_us(meta.wall_us)}{over}")
    parts.append(f"CPU {fmt_time_us(profile.totals.cpu_us) or '0'}")
    if profile.has_device_time:
        parts.append(f"device {fmt_time_us(profile.totals.device_us)}")
    if profile.totals.flops:
        parts.append(f"{fmt_si(profile.totals.flops)}FLOPs")
    report = meta.memory
    watched = report.main_class() if report is not None else None
    if watched is not None:
        where = "device" if watched.device else "CPU"
        parts.append(f"{where} peak live {fmt_bytes(watched.absolute_peak_bytes)}")
    if per_step:
        parts.append(f"rows: mean per step of {steps} steps")
    elif steps > 1:
        parts.append(f"rows: totals over {steps} steps")
    return "layerscope · " + " · ".join(parts)


def ops_table(
    rows: Sequence[OpStats],
    ascii_only: bool | None = None,
    title: str | None = None,
    total_cpu_us: float | None = None,
) -> RenderableType:
    """An op table like torch's ``key_averages().table()``, with layerscope's columns."""
    if ascii_only is None:
        ascii_only = wants_ascii()
    whole = total_cpu_us if total_cpu_us is not None else sum(r.metrics.self_cpu_us for r in rows)
    return FittedTable(op_columns(rows, whole), [rows], ascii_only=ascii_only, title=title or "")


def steps_table(rows: Sequence[StepRow], ascii_only: bool | None = None) -> RenderableType:
    """The step table: wall, CPU, device, forward and backward time per step; outliers flagged with
    what made them slow."""
    if ascii_only is None:
        ascii_only = wants_ascii()
    outliers = sum(r.outlier for r in rows)
    caption = (
        f"{outliers} outlier step{'s' if outliers != 1 else ''} (wall > 1.5x the median)" if outliers else ""
    )
    return FittedTable(step_columns(rows), [rows], ascii_only=ascii_only, caption=caption)


def make_console(file: IO[str] | None = None, width: int | None = None) -> Console:
    """A console honouring NO_COLOR and the terminal width (160 columns when not a terminal)."""
    if width is None:
        width = shutil.get_terminal_size((160, 24)).columns
    return Console(
        file=file,
        width=width,
        no_color=bool(os.environ.get("NO_COLOR")) or None,
        highlight=False,
        soft_wrap=False,
    )


def render_to_text(renderable: RenderableType, width: int | None = None) -> str:
    """Render to plain text (no colour codes): what ``str(profile)`` returns."""
    buffer = io.StringIO()
    if width is None:
        width = shutil.get_terminal_size((160, 24)).columns
    console = Console(file=buffer, width=width, color_system=None, highlight=False, force_terminal=False)
    console.print(renderable)
    return buffer.getvalue()
