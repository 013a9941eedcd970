"""The critical path on the console (``layerscope analyze --critical-path``): its length, the time
on it by bound type, the ops and kernels on it, and the modules they ran in."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from layerscope.analysis.critical_path import CriticalPath, PathShare
from layerscope.render.table_fit import Column, FittedTable, wants_ascii
from layerscope.units import fmt_share, fmt_time_us


def _share_columns(title: str, whole_us: float, ranks: bool = False) -> tuple[Column[PathShare], ...]:
    """Name, (rank,) time on the path, share of the path."""
    return (
        Column("name", title, lambda s: s.name, "left"),
        Column("rank", "Rank", lambda s: "" if s.rank is None else str(s.rank), shown=ranks),
        Column("phase", "Phase", lambda s: s.phase or "", "left", drop=1, shown=title == "Module"),
        Column("time", "On path", lambda s: fmt_time_us(s.us)),
        Column("share", "Share", lambda s: fmt_share(s.us, whole_us), style="bold"),
    )


def _type_columns(whole_us: float) -> tuple[Column[tuple[str, float]], ...]:
    return (
        Column("type", "Bound by", lambda kv: kv[0], "left"),
        Column("time", "On path", lambda kv: fmt_time_us(kv[1])),
        Column("share", "Share", lambda kv: fmt_share(kv[1], whole_us), style="bold"),
    )


def critical_path_section(
    path: CriticalPath, top: int = 10, ascii_only: bool | None = None
) -> RenderableType:
    """The section ``analyze --critical-path`` prints for one trace."""
    if ascii_only is None:
        ascii_only = wants_ascii()
    start, end = path.window_us
    parts: list[RenderableType] = [
        Text(
            f"Critical path: {fmt_time_us(path.length_us) or '0'} through {path.nodes} nodes, "
            f"window {fmt_time_us(end - start)}",
            style="bold",
        )
    ]
    if not path.nodes:
        parts.append(Text("No CPU op or device work in the window.", style="dim"))
        return Group(*parts)
    across = path.ranks is not None
    parts.extend(Text(line) for line in rank_lines(path, ascii_only))
    kinds = sorted(path.by_type.items(), key=lambda kv: -kv[1])
    parts.append(FittedTable(_type_columns(path.length_us), [kinds], ascii_only=ascii_only))
    ops = _share_columns("Op or kernel", path.length_us, across)
    parts.append(FittedTable(ops, [path.top[:top]], ascii_only))
    if path.modules:
        modules = _share_columns("Module", path.length_us, across)
        parts.append(FittedTable(modules, [path.modules[:top]], ascii_only))
    return Group(*parts)


#: Stretches of a path through ranks that the text names, at most.
SEGMENTS_SHOWN = 8


def rank_lines(path: CriticalPath, ascii_only: bool = False) -> list[str]:
    """A path through several ranks: the time on it per rank, the clocks' offsets, and the ranks
    it runs through in order (none for a one-rank path)."""
    if path.ranks is None:
        return []
    ranks = sorted(path.ranks.items(), key=lambda kv: (-kv[1], kv[0]))
    shares = ", ".join(
        f"rank {r} {fmt_time_us(us) or '0'} ({fmt_share(us, path.length_us)})" for r, us in ranks
    )
    joined = f"{path.collectives} collective{'s' if path.collectives != 1 else ''} matched across them"
    lines = [f"Through {len(ranks)} ranks ({joined}): {shares}."]
    offsets = {r: us for r, us in (path.clock_offsets_us or {}).items() if us}
    if offsets:
        told = ", ".join(
            f"rank {r} {'+' if us > 0 else '-'}{fmt_time_us(abs(us))}" for r, us in offsets.items()
        )
        lines.append(f"Clocks aligned by the collectives' ends: {told} from rank {min(path.ranks)}'s clock.")
    arrow = " -> " if ascii_only else " → "
    hops = [f"rank {s.rank} ({fmt_time_us(s.us) or '0'})" for s in path.segments[:SEGMENTS_SHOWN]]
    more = (
        f"{arrow}... {len(path.segments) - SEGMENTS_SHOWN} more"
        if len(path.segments) > SEGMENTS_SHOWN
        else ""
    )
    lines.append(f"Path: {arrow.join(hops)}{more}")
    return lines
