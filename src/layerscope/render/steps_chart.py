"""The report's step chart: one bar per step (its wall time, forward and backward drawn inside it),
slow steps (the step table's outliers) in red with their cause; static SVG, every name escaped."""

from __future__ import annotations

from html import escape

from layerscope.analysis.steps import StepRow
from layerscope.units import fmt_time_us

WIDTH, HEIGHT, LEFT = 900, 140, 70
COLOURS = {"forward": "#4e79a7", "backward": "#f28e2b", "rest": "#d0d5dd", "outlier": "#b42318"}
LABELS = {"rest": "rest of the step", "outlier": "rest of a slow step"}


def _bar(row: StepRow, x: float, width: float, scale: float) -> str:
    """A step's bar: forward at the bottom, backward above, the rest of the wall time on top."""
    parts, y = [], float(HEIGHT)
    rest = max(row.wall_us - row.forward_us - row.backward_us, 0.0)
    for key, us in (("forward", row.forward_us), ("backward", row.backward_us), ("rest", rest)):
        h = us * scale
        if h > 0:
            colour = COLOURS["outlier"] if key == "rest" and row.outlier else COLOURS[key]
            parts.append(
                f'<rect x="{x:.1f}" y="{y - h:.1f}" width="{width:.1f}" height="{h:.1f}" fill="{colour}"/>'
            )
            y -= h
    note = f"step {row.step}: {fmt_time_us(row.wall_us)} (forward {fmt_time_us(row.forward_us) or '0'}, "
    note += f"backward {fmt_time_us(row.backward_us) or '0'})"
    if row.outlier:
        note += f"; slow: {row.cause or 'cause unknown'}"
    outlier = ' class="outlier"' if row.outlier else ""
    label = f'tabindex="0" role="button" aria-label="{escape(note)}"'
    return f'<g data-step="{row.step}"{outlier} {label}><title>{escape(note)}</title>{"".join(parts)}</g>'


def steps_chart_svg(rows: list[StepRow]) -> str:
    """The chart (empty below two steps)."""
    if len(rows) < 2:
        return ""
    longest = max(r.wall_us for r in rows) or 1.0
    scale = (HEIGHT - 16) / longest
    slot = (WIDTH - LEFT) / len(rows)
    width = max(slot * 0.8, 0.5)
    bars = "".join(_bar(r, LEFT + k * slot, width, scale) for k, r in enumerate(rows))
    axis = (
        f'<text x="{LEFT - 6}" y="{HEIGHT - longest * scale + 4:.1f}" text-anchor="end">'
        f"{fmt_time_us(longest)}</text>"
        f'<text x="{LEFT - 6}" y="{HEIGHT}" text-anchor="end">0</text>'
        f'<text x="{LEFT}" y="{HEIGHT + 14}">step {rows[0].step}</text>'
        f'<text x="{WIDTH}" y="{HEIGHT + 14}" text-anchor="end">step {rows[-1].step}</text>'
    )
    legend = "".join(
        f'<span class="key"><i style="background:{c}"></i>{escape(LABELS.get(k, k))}</span>'
        for k, c in COLOURS.items()
    )
    return (
        f'<svg id="stepchart" viewBox="0 0 {WIDTH} {HEIGHT + 20}" width="100%" font-size="11" role="img" '
        f'aria-label="step times">{bars}{axis}</svg><div class="legend">{legend}</div>'
    )


__all__ = ["steps_chart_svg"]
