"""The HTML report's critical-path section: the path's length, the time on it by bound type, the
ops and kernels on it, the modules they ran in and, for a path through several ranks, the ranks.
Static tables, every value escaped (the same figures as ``analyze --critical-path``)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from layerscope.analysis.device import kernel_function_name
from layerscope.model.critical_path import CriticalPath, PathShare
from layerscope.render.critical_path import rank_lines
from layerscope.render.html_tables import static_table
from layerscope.units import fmt_share, fmt_time_us

#: Rows of the op and module tables.
TOP_ROWS = 15


def _shares(title: str, rows: Sequence[PathShare], whole_us: float, ranks: bool) -> str:
    """A table of ops, kernels or modules: name (a kernel's without its parameters), (phase,)
    (rank,) time on the path, share."""
    phases = any(r.phase is not None for r in rows)
    headers = [title, *(["Phase"] if phases else []), *(["Rank"] if ranks else []), "On path", "Share"]
    body = [
        [
            kernel_function_name(r.name),
            *([r.phase or ""] if phases else []),
            *([str(r.rank)] if ranks else []),
            fmt_time_us(r.us) or "0",
            fmt_share(r.us, whole_us),
        ]
        for r in rows[:TOP_ROWS]
    ]
    return static_table(headers, body, text_columns=2 if phases else 1, styled=False)


def critical_path_section_html(path: CriticalPath) -> str:
    """The ``<section id="critical-path">`` of the report."""
    start, end = path.window_us
    lines = [
        f"Critical path: {fmt_time_us(path.length_us) or '0'} through {path.nodes} nodes of a "
        f"{fmt_time_us(end - start)} window: the chain of CPU ops, launches, kernels and "
        "synchronisations that sets its length (what, made faster, makes it shorter).",
        *rank_lines(path, ascii_only=True),
    ]
    parts = [f"<p>{html.escape(line)}</p>" for line in lines]
    kinds = sorted(path.by_type.items(), key=lambda kv: -kv[1])
    rows = [[k, fmt_time_us(us) or "0", fmt_share(us, path.length_us)] for k, us in kinds]
    parts.append("<h3>Bound by</h3>")
    parts.append(static_table(["Bound by", "On path", "Share"], rows, styled=False))
    across = path.ranks is not None
    if across and path.ranks:
        ranks = sorted(path.ranks.items())
        offsets = path.clock_offsets_us or {}
        body = [
            [
                str(r),
                fmt_time_us(us) or "0",
                fmt_share(us, path.length_us),
                fmt_time_us(offsets.get(r, 0.0)) or "0",
            ]
            for r, us in ranks
        ]
        parts.append("<h3>Ranks</h3>")
        parts.append(static_table(["Rank", "On path", "Share", "Clock offset"], body, styled=False))
    parts.append("<h3>Ops and kernels on the path</h3>")
    parts.append(_shares("Op or kernel", path.top, path.length_us, across))
    if path.modules:
        parts.append("<h3>Modules on the path</h3>")
        parts.append(_shares("Module", path.modules, path.length_us, across))
    # kernels' template arguments make names longer than the page: they wrap anywhere
    style = "<style>#critical-path td.l { white-space: normal; overflow-wrap: anywhere; }</style>"
    return f'<section id="critical-path"><h2>Critical path</h2>{style}' + "".join(parts) + "</section>"
