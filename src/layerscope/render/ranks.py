"""Views of a RankMerge: the ranks table, the modules that differ most across ranks, the straggler."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from layerscope.analysis.ranks import RankMerge
from layerscope.render.console import _FittedTable, _wants_ascii
from layerscope.units import fmt_time_us


def straggler_line(merged: RankMerge) -> str:
    """One sentence: which rank, where it loses time, whether the others wait for it."""
    s = merged.straggler
    if s is None or not s.is_straggler:
        return "No straggler: the ranks' model work is within 5% of each other."
    where = (
        f" in {s.module or '(root)'} ({s.phase}, +{fmt_time_us(s.module_excess_us)} per step)"
        if s.module
        else ""
    )
    wait = (
        f"; the other ranks wait {fmt_time_us(s.others_wait_us)} per step in collectives for it"
        if s.others_wait_us > 0
        else ""
    )
    return (
        f"Straggler: rank {s.rank} does {fmt_time_us(s.step_us)} of model work per step against a median of "
        f"{fmt_time_us(s.median_step_us)}{where}{wait}."
    )


def ranks_view(merged: RankMerge, top: int = 10, ascii_only: bool | None = None) -> RenderableType:
    """The per-rank split, the modules with the largest spread across ranks, the straggler."""
    if ascii_only is None:
        ascii_only = _wants_ascii()
    parts: list[RenderableType] = []
    ranks = [
        (
            str(s.rank),
            fmt_time_us(s.wall_us),
            fmt_time_us(s.module_us),
            fmt_time_us(s.communication_us),
            fmt_time_us(s.other_us),
        )
        for s in merged.summaries
    ]
    parts.append(
        _FittedTable(
            headers=["Rank", "Step", "Model", "Collectives", "Other"],
            sections=[ranks],
            ascii_only=ascii_only,
            caption="",
            drop_order=["Other"],
        )
    )
    rows = sorted(merged.modules, key=lambda r: -(max(r.present) - min(r.present)) if r.present else 0.0)[
        :top
    ]
    body = [
        (
            f"{r.path or '(root)'} [{r.phase}]",
            fmt_time_us(r.mean),
            fmt_time_us(min(r.present)),
            fmt_time_us(max(r.present)),
            str(merged.slowest_rank(r)),
            f"{r.skew:.2f}",
        )
        for r in rows
    ]
    metric = "device" if merged.metric == "device_us" else "CPU"
    parts.append(
        _FittedTable(
            headers=[f"Module self {metric} time", "Mean", "Min", "Max", "Slowest", "Skew"],
            sections=[body],
            ascii_only=ascii_only,
            caption="",
            drop_order=["Min"],
        )
    )
    if merged.gaps:
        parts.append(
            Text(
                f"Modules missing on some ranks (gaps): {', '.join(merged.gaps[:10])}"
                + (" ..." if len(merged.gaps) > 10 else "")
            )
        )
    parts.append(Text(straggler_line(merged), style="bold"))
    return Group(*parts)
