"""Views of a ProfileDiff: console table, Markdown (for PR comments), JSON."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import orjson
from rich.console import Group, RenderableType
from rich.text import Text

from layerscope.analysis.diff import DiffRow, ProfileDiff
from layerscope.render.table_fit import Cell, Column, FittedTable, item, wants_ascii
from layerscope.units import fmt_bytes, fmt_si, fmt_time_us


def value_formatter(metric: str) -> Callable[[float], str]:
    """How to print values of ``metric`` (time, bytes or FLOPs)."""
    if metric.endswith("_us"):
        return fmt_time_us
    if metric.endswith("_bytes"):
        return fmt_bytes
    return fmt_si


def _signed(value: float, fmt: Callable[[float], str]) -> str:
    text = fmt(abs(value)) or "0"
    return ("+" if value > 0 else "-" if value < 0 else "") + text


def _percent(row_pct: float | None) -> str:
    return "" if row_pct is None else f"{row_pct:+.1f}%"


def row_cells(row: DiffRow, fmt: Callable[[float], str]) -> tuple[str, ...]:
    """One diff row as display cells: key, A, B, change, percent, status."""
    status = {"new": "new", "vanished": "vanished"}.get(row.status, "")
    return (
        row.key or "(root)",
        fmt(row.a) if row.a is not None else "—",
        fmt(row.b) if row.b is not None else "—",
        _signed(row.delta, fmt),
        _percent(row.percent),
        status,
    )


def summary_line(d: ProfileDiff) -> str:
    """``cpu_us: 120.3ms -> 131.0ms (+10.7ms, +8.9%)``, per step when both had several."""
    fmt = value_formatter(d.metric)
    per = " per step" if d.per_step else ""
    return (
        f"{d.metric}{per}: {fmt(d.total_a) or '0'} -> {fmt(d.total_b) or '0'} "
        f"({_signed(d.total_delta, fmt)}, {_percent(d.total_percent) or 'n/a'})"
    )


def diff_columns(title: str) -> tuple[Column[Sequence[Cell]], ...]:
    """The console diff table's columns, over :func:`row_cells` tuples."""
    return (
        Column("key", title, item(0), justify="left"),
        Column("a", "A", item(1)),
        Column("b", "B", item(2)),
        Column("change", "Change", item(3)),
        Column("percent", "%", item(4), drop=2),
        Column("status", "Status", item(5), justify="left", drop=1),
    )


def diff_table(d: ProfileDiff, top: int = 15, ascii_only: bool | None = None) -> RenderableType:
    """Total change, then the modules and ops that changed most (absolute), new and vanished ones."""
    if ascii_only is None:
        ascii_only = wants_ascii()
    fmt = value_formatter(d.metric)
    summary = summary_line(d)
    parts: list[RenderableType] = [Text(summary.replace("µ", "u") if ascii_only else summary, style="bold")]
    for title, rows in (("Modules", d.modules), ("Ops", d.ops)):
        if not rows:
            continue
        parts.append(
            FittedTable(
                diff_columns(title),
                [[row_cells(r, fmt) for r in rows[:top]]],
                ascii_only=ascii_only,
                caption=f"{len(rows) - top} more" if len(rows) > top else "",
            )
        )
    return Group(*parts)


def diff_markdown(d: ProfileDiff, top: int = 15) -> str:
    """A Markdown summary for pull-request comments."""
    fmt = value_formatter(d.metric)
    lines = [f"**layerscope diff** — {summary_line(d)}", ""]
    for title, rows in (("Module", d.modules), ("Op", d.ops)):
        if not rows:
            continue
        lines += [f"| {title} | A | B | Change | % | |", "|---|---:|---:|---:|---:|---|"]
        for r in rows[:top]:
            cells = [c.replace("|", "\\|") for c in row_cells(r, fmt)]
            cells[0] = f"`{cells[0]}`"
            lines.append("| " + " | ".join(cells) + " |")
        if len(rows) > top:
            lines.append(f"\n_{len(rows) - top} more {title.lower()}s changed._")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def diff_json(d: ProfileDiff) -> str:
    """The whole diff as JSON (every row, raw numbers)."""

    def rows(items: tuple[DiffRow, ...]) -> list[dict[str, object]]:
        return [
            {"key": r.key, "a": r.a, "b": r.b, "delta": r.delta, "percent": r.percent, "status": r.status}
            for r in items
        ]

    payload = {
        "metric": d.metric,
        "per_step": d.per_step,
        "total_a": d.total_a,
        "total_b": d.total_b,
        "total_delta": d.total_delta,
        "total_percent": d.total_percent,
        "modules": rows(d.modules),
        "ops": rows(d.ops),
    }
    return orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode() + "\n"
