"""The console table of source lines (``Profile.lines()``, ``layerscope show --by line``)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from rich.console import RenderableType

from layerscope.model.metrics import Metrics
from layerscope.model.tables import LineStats, LineTable
from layerscope.render.table_fit import Column, FittedTable, wants_ascii
from layerscope.units import fmt_bytes, fmt_share, fmt_si, fmt_time_us

#: The widest location cell; the label column shrinks to 24 characters on narrow terminals anyway.
LOCATION_WIDTH = 24


def short_path(path: str, base: str | None = None) -> str:
    """``path`` relative to ``base`` (default: the working directory) when it lies below it."""
    base = base if base is not None else os.getcwd()
    if os.path.isabs(path) and path.startswith(base.rstrip(os.sep) + os.sep):
        return os.path.relpath(path, base)
    return path


def _location(r: LineStats) -> str:
    """``file:line``; a long path keeps only the file's name (the label column is cut to 24
    characters on narrow terminals, and the line number must survive)."""
    if r.line is None:
        return r.location
    text = f"{short_path(r.file)}:{r.line}"
    return text if len(text) <= LOCATION_WIDTH else f"{os.path.basename(r.file)}:{r.line}"


def _module(r: LineStats) -> str:
    if not r.modules:
        return ""
    first = r.modules[0] or "(root)"
    more = f" +{len(r.modules) - 1}" if len(r.modules) > 1 else ""
    return (first if len(first) <= 28 else first[:27] + "…") + more


def line_columns(rows: Sequence[LineStats], time_kind: str) -> tuple[Column[LineStats], ...]:
    """The line table's columns; times are device time when the profile has it, else CPU time."""

    def time(m: Metrics) -> float:
        return m.self_device_us if time_kind == "device" else m.self_cpu_us

    whole = sum(time(r.forward) + time(r.backward) for r in rows)
    memory = any(r.alloc_bytes for r in rows)
    backward = any(time(r.backward) for r in rows)
    label = "device" if time_kind == "device" else "CPU"
    return (
        Column("location", "Line", _location, "left"),
        Column("function", "Function", lambda r: r.function, "left", drop=3),
        Column("module", "Module", _module, "left", style="cyan", drop=4),
        Column("forward", f"Forward {label}", lambda r: fmt_time_us(time(r.forward))),
        Column("backward", f"Backward {label}", lambda r: fmt_time_us(time(r.backward)), shown=backward),
        Column("share", "Share", lambda r: fmt_share(time(r.forward) + time(r.backward), whole), drop=6),
        Column("flops", "FLOPs", lambda r: fmt_si(r.flops), drop=5, shown=any(r.flops for r in rows)),
        Column("alloc", "Alloc", lambda r: fmt_bytes(r.alloc_bytes), drop=1, shown=memory),
        Column("calls", "Op calls", lambda r: str(r.calls), drop=2),
    )


def lines_table(rows: LineTable, ascii_only: bool | None = None, title: str | None = None) -> RenderableType:
    """Source lines, heaviest first: forward and backward time, share, FLOPs, allocations."""
    if ascii_only is None:
        ascii_only = wants_ascii()
    kind = (
        "call lines"
        if rows.call_lines
        else "function lines (with_stack: torch names each frame by its def line)"
    )
    return FittedTable(
        line_columns(rows, rows.time_kind), [rows], ascii_only=ascii_only, title=title or f"Source {kind}"
    )
