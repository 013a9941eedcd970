"""The critical path on the console (``layerscope analyze --critical-path``): its length, the time
on it by bound type, the ops and kernels on it, and the modules they ran in."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from layerscope.analysis.critical_path import CriticalPath, PathShare
from layerscope.render.table_fit import Column, FittedTable, wants_ascii
from layerscope.units import fmt_share, fmt_time_us


def _share_columns(title: str, whole_us: float) -> tuple[Column[PathShare], ...]:
    """Name, time on the path, share of the path."""
    return (
        Column("name", title, lambda s: s.name, "left"),
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
    kinds = sorted(path.by_type.items(), key=lambda kv: -kv[1])
    parts.append(FittedTable(_type_columns(path.length_us), [kinds], ascii_only=ascii_only))
    parts.append(FittedTable(_share_columns("Op or kernel", path.length_us), [path.top[:top]], ascii_only))
    if path.modules:
        parts.append(FittedTable(_share_columns("Module", path.length_us), [path.modules[:top]], ascii_only))
    return Group(*parts)
