"""The console table of per-type totals (``Profile.by_type()``, ``layerscope show --by type``)."""

from __future__ import annotations

from rich.console import RenderableType

from layerscope.model.metrics import Metrics
from layerscope.model.tables import TypeStats, TypeTable
from layerscope.render.table_fit import Column, FittedTable, wants_ascii
from layerscope.units import fmt_bytes, fmt_share, fmt_si, fmt_time_us


def type_columns(rows: TypeTable) -> tuple[Column[TypeStats], ...]:
    """The per-type table's columns; times are device time when the profile has it, else CPU time."""
    device = rows.time_kind == "device"

    def time(m: Metrics) -> float:
        return m.device_us if device else m.cpu_us

    whole = sum(rows.time_of(r) for r in rows)
    label = "device" if device else "CPU"
    memory = any(r.forward.cpu_alloc_bytes or r.forward.device_alloc_bytes for r in rows)
    return (
        Column("type", "Type", lambda r: r.type_name, "left"),
        Column("modules", "Modules", lambda r: str(r.modules), drop=3),
        Column("calls", "Calls", lambda r: str(r.calls), drop=2),
        Column("forward", f"Forward {label}", lambda r: fmt_time_us(time(r.forward))),
        Column("backward", f"Backward {label}", lambda r: fmt_time_us(time(r.backward))),
        Column("share", "Share", lambda r: fmt_share(rows.time_of(r), whole), drop=6),
        Column("flops", "FLOPs", lambda r: fmt_si(r.flops), drop=5, shown=any(r.flops for r in rows)),
        Column(
            "alloc",
            "Alloc",
            lambda r: fmt_bytes(r.forward.cpu_alloc_bytes + r.forward.device_alloc_bytes),
            drop=1,
            shown=memory,
        ),
        Column("params", "Params", lambda r: fmt_si(r.params), drop=4, shown=any(r.params for r in rows)),
    )


def types_table(rows: TypeTable, ascii_only: bool | None = None) -> RenderableType:
    """Modules summed per type, heaviest first."""
    if ascii_only is None:
        ascii_only = wants_ascii()
    title = (
        "Module types (self figures: the types add up to the tree)"
        if rows.depth is None
        else f"Module types at depth {rows.depth} (inclusive figures)"
    )
    return FittedTable(type_columns(rows), [rows], ascii_only=ascii_only, title=title)
