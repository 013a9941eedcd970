"""Views of a RankMerge: the ranks table, the modules that differ most across ranks, the straggler."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from layerscope.analysis.ranks import ModuleAcrossRanks, RankMerge, RankSummary, StepAcrossRanks
from layerscope.render.table_fit import Column, FittedTable, wants_ascii
from layerscope.units import fmt_share, fmt_time_us


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


def late_line(merged: RankMerge) -> str | None:
    """Which rank the others wait for in collectives, from communication kernels' start times."""
    late = merged.straggler.late if merged.straggler is not None else None
    if late is None:
        return None
    step = f" in step {late.worst_step}" if late.worst_step is not None else ""
    return (
        f"Late to collectives: rank {late.rank} starts {late.matched} matched collective kernels "
        f"{fmt_time_us(late.late_us)} after the first rank in all; worst {late.worst_name} "
        f"{fmt_time_us(late.worst_us)} late{step}."
    )


def critical_path_line(merged: RankMerge) -> str | None:
    """The rank and the module (or, without module ranges, the op or kernel) that hold the critical
    path through the ranks; None when it was not computed."""
    path = merged.critical_path
    if path is None or not path.ranks or path.length_us <= 0:
        return None
    rank, us = max(path.ranks.items(), key=lambda kv: (kv[1], -kv[0]))
    modules = [m for m in path.modules or () if m.rank == rank]
    ops = [s for s in path.top if s.rank == rank]
    if modules:
        where = f"; most in module {modules[0].name} ({modules[0].phase}, {fmt_time_us(modules[0].us)})"
    elif ops:
        where = f"; most in {ops[0].name} ({fmt_time_us(ops[0].us)}; the traces have no module ranges)"
    else:
        where = ""
    return (
        f"Critical path: {fmt_time_us(path.length_us)} through {len(path.ranks)} ranks; rank {rank} holds "
        f"{fmt_time_us(us)} ({fmt_share(us, path.length_us)}){where}."
    )


def collectives_title(merged: RankMerge) -> str:
    """The communication column's title: kernel time or CPU time in collective ops."""
    return "Comm kernels" if all(s.comm_source == "kernels" for s in merged.summaries) else "Collectives"


def rank_columns(merged: RankMerge) -> tuple[Column[RankSummary], ...]:
    """The ranks table: communication as kernel time where the traces have it, and its overlap."""
    has_overlap = any(s.comm_overlap is not None for s in merged.summaries)
    return (
        *RANK_COLUMNS[:3],
        Column("collectives", collectives_title(merged), lambda s: fmt_time_us(s.communication_us)),
        Column(
            "overlap",
            "Comm overlap",
            lambda s: "" if s.comm_overlap is None else f"{100 * s.comm_overlap:.1f}%",
            drop=2,
            shown=has_overlap,
        ),
        RANK_COLUMNS[4],
    )


RANK_COLUMNS: tuple[Column[RankSummary], ...] = (
    Column("rank", "Rank", lambda s: str(s.rank), justify="left"),
    Column("step", "Step", lambda s: fmt_time_us(s.wall_us)),
    Column("model", "Model", lambda s: fmt_time_us(s.module_us)),
    Column("collectives", "Collectives", lambda s: fmt_time_us(s.communication_us)),
    Column("other", "Other", lambda s: fmt_time_us(s.other_us), drop=1),
)


def spread_columns(merged: RankMerge) -> tuple[Column[ModuleAcrossRanks], ...]:
    """The columns of the modules that differ most across ranks."""
    metric = "device" if merged.metric == "device_us" else "CPU"
    return (
        Column("module", f"Module self {metric} time", lambda r: f"{r.path or '(root)'} [{r.phase}]", "left"),
        Column("mean", "Mean", lambda r: fmt_time_us(r.mean)),
        Column("min", "Min", lambda r: fmt_time_us(min(r.present)), drop=1),
        Column("max", "Max", lambda r: fmt_time_us(max(r.present))),
        Column("slowest", "Slowest", lambda r: str(merged.slowest_rank(r))),
        Column("skew", "Skew", lambda r: f"{r.skew:.2f}"),
    )


def steps_across_table(merged: RankMerge, top: int, ascii_only: bool) -> RenderableType:
    """The ``top`` step numbers whose wall time differs most across ranks, in step order."""
    rows = sorted(sorted(merged.steps, key=lambda s: -s.spread_us)[:top], key=lambda s: s.step)

    def wall(k: int) -> Column[StepAcrossRanks]:
        return Column(
            f"rank{k}",
            f"Rank {merged.ranks[k]}",
            lambda s: "" if s.wall_us[k] is None else fmt_time_us(s.wall_us[k] or 0.0),
        )

    def slowest(s: StepAcrossRanks) -> str:
        pairs = [(v, r) for v, r in zip(s.wall_us, merged.ranks, strict=True) if v is not None]
        return str(max(pairs)[1])

    columns = (
        Column("step", "Step", lambda s: str(s.step), justify="left"),
        *(wall(k) for k in range(len(merged.ranks))),
        Column("slowest", "Slowest", slowest),
        Column("spread", "Spread", lambda s: fmt_time_us(s.spread_us)),
    )
    caption = f"steps lined up across ranks: the {len(rows)} of {len(merged.steps)} that differ most"
    return FittedTable(columns, [rows], ascii_only=ascii_only, caption=caption)


def ranks_view(merged: RankMerge, top: int = 10, ascii_only: bool | None = None) -> RenderableType:
    """The per-rank split, the modules with the largest spread across ranks, the straggler."""
    if ascii_only is None:
        ascii_only = wants_ascii()
    parts: list[RenderableType] = [
        FittedTable(rank_columns(merged), [merged.summaries], ascii_only=ascii_only)
    ]
    rows = sorted(merged.modules, key=lambda r: -(max(r.present) - min(r.present)) if r.present else 0.0)[
        :top
    ]
    parts.append(FittedTable(spread_columns(merged), [rows], ascii_only=ascii_only))
    if merged.gaps:
        parts.append(
            Text(
                f"Modules missing on some ranks (gaps): {', '.join(merged.gaps[:10])}"
                + (" ..." if len(merged.gaps) > 10 else "")
            )
        )
    if merged.steps:
        parts.append(steps_across_table(merged, top, ascii_only))
    parts.append(Text(straggler_line(merged), style="bold"))
    for line in (late_line(merged), critical_path_line(merged)):
        if line is not None:
            parts.append(Text(line))
    return Group(*parts)
