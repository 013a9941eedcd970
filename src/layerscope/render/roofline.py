"""``layerscope show RUN --roofline``: each module (forward, backward) and the heaviest ops against a
device's roofs (a :class:`~layerscope.model.roofline.Roofline`)."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from layerscope.model.roofline import Roofline, RooflineRow
from layerscope.units import fmt_bytes, fmt_si, fmt_time_us


def roofline_head(roofline: Roofline) -> str:
    """The device, its roofs and where time came from, in one line."""
    return (
        f"roofline on {roofline.device}: {fmt_si(roofline.peak_flops_per_s, 'FLOP/s')} "
        f"(the run's dtype mix), {fmt_si(roofline.bandwidth_bytes_per_s, 'B/s')}, ridge point "
        f"{roofline.ridge_point:.3g} FLOP/byte; {roofline.time_source} time; "
        f"overhead below {roofline.overhead_below:.0%} of the roof"
    )


def roofline_table(roofline: Roofline, ascii_only: bool = False, ops: int = 15) -> RenderableType:
    """The head line, one row per module and phase (tree order), then the ``ops`` slowest op rows."""
    style = box.ASCII2 if ascii_only else box.SIMPLE_HEAVY
    modules = _table("Modules (subtree, per phase)", "Module", style)
    for row in roofline.modules:
        modules.add_row(row.module or "(root)", *_cells(row))
    parts: list[RenderableType] = [Text(roofline_head(roofline), style="bold"), modules]
    if roofline.ops:
        table = _table(f"Slowest ops ({min(ops, len(roofline.ops))} of {len(roofline.ops)})", "Op", style)
        for row in roofline.ops[:ops]:
            table.add_row(f"{row.op} in {row.module or '(root)'}", *_cells(row))
        parts.append(table)
    parts.append(
        Text(
            "bytes: inputs read + outputs written, from shapes and dtypes (a lower bound; "
            "unknown for ops without a rule, compiled kernels included)"
        )
    )
    return Group(*parts)


def _table(title: str, first: str, style: box.Box) -> Table:
    table = Table(box=style, show_edge=False, title=title, title_justify="left")
    table.add_column(first, justify="left")
    table.add_column("Phase", justify="left")
    for name in ("Time", "FLOPs", "Bytes", "FLOP/B", "FLOP/s", "B/s", "Roof"):
        table.add_column(name, justify="right")
    table.add_column("Bound", justify="left")
    return table


def _cells(row: RooflineRow) -> list[str]:
    share = row.unknown_bytes_share if row.op is None else 0.0
    unknown = f" ({share:.0%} unknown)" if share else ""
    return [
        row.phase,
        fmt_time_us(row.time_us),
        fmt_si(row.flops) if row.flops else "",
        (fmt_bytes(row.bytes) if row.bytes is not None else "unknown") + unknown,
        f"{row.intensity:.3g}" if row.intensity is not None else "",
        fmt_si(row.achieved_flops_per_s) if row.achieved_flops_per_s else "",
        fmt_si(row.achieved_bytes_per_s) if row.achieved_bytes_per_s else "",
        f"{row.roof_fraction:.1%}" if row.roof_fraction is not None else "",
        row.bound,
    ]


__all__ = ["roofline_head", "roofline_table"]
