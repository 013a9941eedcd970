"""``layerscope show RUN --memory-peak``: what was live at the peak of memory, by category and module,
and the tensors each module saved for backward."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from layerscope.model.memory_view import MemoryAtPeak
from layerscope.units import fmt_bytes, fmt_share, fmt_time_us


def memory_peak_table(at_peak: MemoryAtPeak, ascii_only: bool = False, rows: int = 25) -> RenderableType:
    """The peak line, live bytes per category, the largest (category, module, phase) rows, and the
    saved-for-backward bytes per keeping module."""
    style = box.ASCII2 if ascii_only else box.SIMPLE_HEAVY
    where = at_peak.where or {}
    place = (
        f"{where.get('module', '')} {where.get('phase', '')} ({where.get('op', '')})"
        if where
        else "the start"
    )
    when = f" at {fmt_time_us(at_peak.time_us)}" if at_peak.time_us is not None else ""
    device = "device" if at_peak.device else "CPU"
    head = Text(
        f"{device} memory peak {fmt_bytes(at_peak.absolute_peak_bytes)}{when}, in {place}; "
        f"{fmt_bytes(at_peak.baseline_bytes) or '0 B'} was live before the block",
        style="bold",
    )
    categories = Table(
        box=style, show_edge=False, title="Live at the peak, by category", title_justify="left"
    )
    categories.add_column("Category", justify="left")
    categories.add_column("Bytes", justify="right")
    categories.add_column("Share", justify="right")
    for category, nbytes in at_peak.by_category().items():
        categories.add_row(category, fmt_bytes(nbytes), fmt_share(nbytes, at_peak.absolute_peak_bytes))
    detail = Table(box=style, show_edge=False, title="Largest live rows", title_justify="left")
    for title in ("Category", "Allocated by", "Phase"):
        detail.add_column(title, justify="left")
    detail.add_column("Bytes", justify="right")
    for row in at_peak.rows[:rows]:
        detail.add_row(row.category, row.module, row.phase, fmt_bytes(row.bytes))
    parts: list[RenderableType] = [head, categories, detail]
    if len(at_peak.rows) > rows:
        parts.append(Text(f"{len(at_peak.rows) - rows} smaller rows not shown"))
    if at_peak.saved:
        saved = Table(
            box=style, show_edge=False, title="Saved for backward, by keeping module", title_justify="left"
        )
        for title, justify in (
            ("Module", "left"),
            ("Activation", "right"),
            ("Parameter", "right"),
            ("Input", "right"),
        ):
            saved.add_column(title, justify=justify)  # type: ignore[arg-type]
        ordered = sorted(at_peak.saved.items(), key=lambda kv: -sum(kv[1].values()))
        for path, figures in ordered:
            saved.add_row(
                path or "(root)",
                fmt_bytes(figures.get("activation", 0)),
                fmt_bytes(figures.get("parameter", 0)),
                fmt_bytes(figures.get("input", 0)),
            )
        parts.append(saved)
    if not at_peak.categorised:
        parts.append(Text("categories need a live capture with memory=True: here only temporary and other"))
    return Group(*parts)
