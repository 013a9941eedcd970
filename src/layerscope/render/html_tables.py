"""Small static HTML tables for notebooks: op tables (``p.ops()``), source lines (``p.lines()``) and
diffs (``ls.diff(a, b)``).

No script and every value escaped: a notebook shows them as they are. The full interactive report
is ``Profile._repr_html_`` (render/notebook.py).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from layerscope.analysis.diff import ProfileDiff
from layerscope.model.profile import OpStats
from layerscope.model.tables import LineStats, LineTable
from layerscope.render.diff import row_cells, summary_line, value_formatter
from layerscope.render.source_view import line_module, line_time
from layerscope.units import fmt_bytes, fmt_si, fmt_time_us

_STYLE = "border-collapse:collapse;font:12px/1.4 ui-monospace,monospace"
_CELL = "padding:2px 8px;border-bottom:1px solid #e4e4e4;text-align:{align}"
# A value and its unit stay on one line ("11.0 MiB", not "11.0" over "MiB"); names may wrap.
_VALUE_CELL = _CELL + ";white-space:nowrap"


def static_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], text_columns: int = 1, styled: bool = True
) -> str:
    """A table with every cell escaped; the first ``text_columns`` left-aligned. ``styled``: inline
    styles (a notebook cell has no stylesheet); without, the page's own table style applies."""

    def cell(tag: str, k: int, value: str) -> str:
        if not styled:
            left = ' class="l"' if k < text_columns else ""
            return f"<{tag}{left}>{html.escape(value)}</{tag}>"
        style = _CELL.format(align="left") if k < text_columns else _VALUE_CELL.format(align="right")
        return f'<{tag} style="{style}">{html.escape(value)}</{tag}>'

    head = "".join(cell("th", k, h) for k, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", k, v) for k, v in enumerate(r)) + "</tr>" for r in rows)
    table_style = f' style="{_STYLE}"' if styled else ""
    return f"<table{table_style}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def ops_html(rows: Sequence[OpStats], limit: int = 50) -> str:
    """Op rows as an HTML table (the first ``limit``; a line says how many more)."""
    headers = [
        "Op",
        "Phase",
        "Module",
        "Input shapes",
        "Calls",
        "Self CPU",
        "CPU total",
        "Device",
        "Alloc",
        "FLOPs",
    ]
    body = [
        [
            r.name,
            str(r.phase) if r.phase is not None else "",
            r.module if r.module is not None else (f"[{r.scope}]" if r.scope else ""),
            r.input_shapes or "",
            str(r.calls),
            fmt_time_us(r.metrics.self_cpu_us),
            fmt_time_us(r.metrics.cpu_us),
            fmt_time_us(r.metrics.device_us),
            fmt_bytes(r.metrics.cpu_alloc_bytes + r.metrics.device_alloc_bytes),
            fmt_si(r.metrics.flops),
        ]
        for r in rows[:limit]
    ]
    more = f"<p>{len(rows) - limit} more rows</p>" if len(rows) > limit else ""
    return static_table(headers, body, text_columns=4) + more


def lines_html(rows: Sequence[LineStats], limit: int = 50) -> str:
    """Source lines as an HTML table (the first ``limit``; a line says how many more). Times are a
    :class:`LineTable`'s ``time_kind`` (device time, else exclusive CPU time)."""
    kind = rows.time_kind if isinstance(rows, LineTable) else "cpu"
    unit = "device" if kind == "device" else "self CPU"
    headers = ["Location", "Function", "Module", "Calls", f"Forward ({unit})", f"Backward ({unit})", "FLOPs"]
    body = [
        [
            r.location,
            r.function,
            line_module(r),
            str(r.calls),
            fmt_time_us(line_time(r.forward, kind)),
            fmt_time_us(line_time(r.backward, kind)),
            fmt_si(r.flops),
        ]
        for r in rows[:limit]
    ]
    note = ""
    if isinstance(rows, LineTable):
        what = "exact call lines" if rows.call_lines else "function definition lines (with_stack)"
        note = f"<p>Source lines: {what}.</p>"
    more = f"<p>{len(rows) - limit} more rows</p>" if len(rows) > limit else ""
    return note + static_table(headers, body, text_columns=3) + more


def diff_html(d: ProfileDiff, top: int = 15) -> str:
    """A diff as its summary line and two HTML tables (modules, ops) of the largest changes."""
    fmt = value_formatter(d.metric)
    parts = [f"<p><b>layerscope diff</b>: {html.escape(summary_line(d))}</p>"]
    for title, rows in (("Module", d.modules), ("Op", d.ops)):
        if rows:
            parts.append(
                static_table(
                    [title, "A", "B", "Change", "%", ""], [list(row_cells(r, fmt)) for r in rows[:top]]
                )
            )
    return "".join(parts)
