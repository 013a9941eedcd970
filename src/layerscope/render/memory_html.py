"""The HTML report's "live at the peak" panel: what was live at the peak of memory, by category and
by the module whose work allocated it (bars sized by bytes), and the saved-for-backward bytes per
keeping module. Static markup, every value escaped."""

from __future__ import annotations

import html

from layerscope.errors import LayerscopeError
from layerscope.model.memory import MemoryReport
from layerscope.model.memory_view import memory_at_peak
from layerscope.render.html_tables import static_table
from layerscope.units import fmt_bytes, fmt_share

#: Bar colours per category (the same order as the console's categories).
CATEGORY_COLOURS = {
    "parameter": "#4e79a7",
    "gradient": "#f28e2b",
    "optimizer_state": "#e15759",
    "activation": "#76b7b2",
    "input": "#59a14f",
    "temporary": "#edc948",
    "other": "#bab0ac",
}


def memory_peak_html(report: MemoryReport | None, rows: int = 20, split: bool = False) -> str:
    """The panel, or an empty string when the profile has no memory figures. ``split``: the head
    and the category table, then ``<!--detail-->``, then the rest (for a page that sets the first
    part beside its chart)."""
    try:
        at_peak = memory_at_peak(report)
    except LayerscopeError:
        return ""
    where = at_peak.where
    place = f"{where['module']} {where['phase']} ({where['op']})" if where else "the start"
    head = (
        f"{'Device' if at_peak.device else 'CPU'} memory peak {fmt_bytes(at_peak.absolute_peak_bytes)} in "
        f"{place}; {fmt_bytes(at_peak.baseline_bytes) or '0 B'} was live before the block."
    )
    largest = max((r.bytes for r in at_peak.rows), default=1) or 1
    lines = []
    for row in at_peak.rows[:rows]:
        width = max(1.0, 100.0 * row.bytes / largest)
        colour = CATEGORY_COLOURS.get(row.category, "#bab0ac")
        label = html.escape(f"{row.category} · {row.module} {row.phase}".strip())
        lines.append(
            '<div class="peakrow" style="display:flex;gap:8px;align-items:center;margin:2px 0">'
            f'<span title="{label}" style="flex:0 0 22em;overflow:hidden;text-overflow:ellipsis;'
            f'white-space:nowrap">{label}</span>'
            f'<span style="flex:1"><span style="display:inline-block;height:0.9em;width:{width:.1f}%;'
            f'background:{colour}"></span></span>'
            f'<span style="flex:0 0 7em;text-align:right">{html.escape(fmt_bytes(row.bytes))}</span></div>'
        )
    categories = [
        [category, fmt_bytes(nbytes), fmt_share(nbytes, at_peak.absolute_peak_bytes)]
        for category, nbytes in at_peak.by_category().items()
    ]
    parts = [
        '<div id="memorypeak"><h3>Live at the peak</h3>',
        f"<p>{html.escape(head)}</p>",
        static_table(["Category", "Bytes", "Share"], categories, styled=False),
        '</div><!--detail--><div class="peakdetail">' if split else "",
        '<p class="muted">By category and the module whose work allocated it:</p>',
        *lines,
    ]
    if at_peak.saved:
        saved = [
            [
                path or "(root)",
                fmt_bytes(figures.get("activation", 0)),
                fmt_bytes(figures.get("parameter", 0)),
                fmt_bytes(figures.get("input", 0)),
            ]
            for path, figures in sorted(at_peak.saved.items(), key=lambda kv: -sum(kv[1].values()))
        ]
        parts.append("<h3>Saved for backward, by keeping module</h3>")
        parts.append(static_table(["Module", "Activation", "Parameter", "Input"], saved, styled=False))
    parts.append("</div>")
    return "\n".join(parts)
