"""The report's memory chart: absolute memory over time stacked by category (a
:class:`~layerscope.model.memory.MemoryOverTime`), forward and backward marked in a band under it, the
peak marked with its figure; hovering a slice names the time, module, phase and each category.
Static SVG (no script), every name escaped."""

from __future__ import annotations

from html import escape

from layerscope.model.memory import MemoryOverTime
from layerscope.render.memory_html import CATEGORY_COLOURS
from layerscope.units import fmt_bytes, fmt_time_us

WIDTH, HEIGHT, LEFT, BAND = 900, 220, 70, 10
#: Hover slices across the chart (each names the point at its middle).
SLICES = 120
PHASE_COLOURS = {"forward": "#344054", "backward": "#9e77ed"}


def _x(t: float, t0: float, span: float) -> float:
    return LEFT + (WIDTH - LEFT) * (t - t0) / span


def _areas(over: MemoryOverTime, xs: list[float], scale: float) -> list[str]:
    """One polygon per category, stacked in the record's order (parameters at the bottom)."""
    below = [0] * len(xs)
    shapes = []
    for category, series in zip(over.categories, over.bytes_by_category, strict=True):
        top = [b + s for b, s in zip(below, series, strict=True)]
        upper = " ".join(f"{x:.1f},{HEIGHT - v * scale:.0f}" for x, v in zip(xs, top, strict=True))
        lower = " ".join(
            f"{x:.1f},{HEIGHT - v * scale:.0f}" for x, v in zip(reversed(xs), reversed(below), strict=True)
        )
        colour = CATEGORY_COLOURS.get(category, "#bab0ac")
        shapes.append(
            f'<polygon points="{upper} {lower}" fill="{colour}" data-category="{escape(category)}">'
            f"<title>{escape(category)}</title></polygon>"
        )
        below = top
    return shapes


def _phase_band(over: MemoryOverTime, xs: list[float]) -> list[str]:
    """Forward and backward stretches as coloured runs under the chart."""
    runs, start = [], 0
    for k in range(1, len(xs) + 1):
        if k == len(xs) or over.phases[k] != over.phases[start]:
            colour = PHASE_COLOURS.get(over.phases[start])
            if colour is not None:
                end = xs[k] if k < len(xs) else xs[-1]
                runs.append(
                    f'<rect x="{xs[start]:.1f}" y="{HEIGHT + 4}" width="{max(end - xs[start], 0.5):.1f}" '
                    f'height="{BAND}" fill="{colour}"><title>{escape(over.phases[start])}</title></rect>'
                )
            start = k
    return runs


def _hover(over: MemoryOverTime, xs: list[float], totals: list[int]) -> list[str]:
    """Transparent slices whose tooltips read the point at their middle."""
    n, out = len(xs), []
    for s in range(min(SLICES, n)):
        lo, hi = s * n // min(SLICES, n), (s + 1) * n // min(SLICES, n)
        k = max(range(lo, hi), key=lambda i: totals[i])
        parts = [f"{fmt_time_us(over.t_us[k]) or '0'}: {fmt_bytes(totals[k])} live"]
        parts.append(f"{over.modules[k] or '(outside modules)'} {over.phases[k]}".strip())
        parts += [
            f"{c} {fmt_bytes(b[k])}" for c, b in zip(over.categories, over.bytes_by_category, strict=True)
        ]
        x0, x1 = xs[lo], xs[hi - 1] if hi - 1 > lo else xs[lo] + 1
        out.append(
            f'<rect class="hover" x="{x0:.1f}" y="0" width="{max(x1 - x0, 1):.1f}" height="{HEIGHT}" '
            f'fill="transparent"><title>{escape(chr(10).join(parts))}</title></rect>'
        )
    return out


def memory_chart_svg(over: MemoryOverTime, device: bool) -> str:
    """The chart and its legend (empty when the record has no points)."""
    if not over.t_us or not over.categories:
        return ""
    totals = over.totals()
    peak_k = max(range(len(totals)), key=lambda k: totals[k])
    peak = totals[peak_k] or 1
    t0, span = over.t_us[0], (over.t_us[-1] - over.t_us[0]) or 1.0
    xs = [_x(t, t0, span) for t in over.t_us]
    scale = (HEIGHT - 20) / peak
    px, py = xs[peak_k], HEIGHT - totals[peak_k] * scale
    where = f"{over.modules[peak_k] or '(outside modules)'} {over.phases[peak_k]}".strip()
    peak_label = f"peak {fmt_bytes(totals[peak_k])} in {where}"
    axis = (
        f'<text x="{LEFT - 6}" y="{HEIGHT - peak * scale + 4:.1f}" text-anchor="end">{fmt_bytes(peak)}</text>'
        f'<text x="{LEFT - 6}" y="{HEIGHT}" text-anchor="end">0 B</text>'
        f'<text x="{LEFT}" y="{HEIGHT + BAND + 18}">{fmt_time_us(0) or "0"}</text>'
        f'<text x="{WIDTH}" y="{HEIGHT + BAND + 18}" text-anchor="end">{fmt_time_us(span)}</text>'
    )
    marker = (
        f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="#b42318" id="mempeak" '
        f'data-bytes="{totals[peak_k]}"></circle>'
        f'<text x="{min(px + 6, WIDTH - 260):.1f}" y="{max(py - 6, 12):.1f}">{escape(peak_label)}</text>'
    )
    svg = (
        f'<svg id="memchart" viewBox="0 0 {WIDTH} {HEIGHT + BAND + 24}" width="100%" '
        f'font-size="11" role="img" aria-label="memory over time by category">'
        + "".join(_areas(over, xs, scale) + _phase_band(over, xs) + _hover(over, xs, totals))
        + axis
        + marker
        + "</svg>"
    )
    keys = [(c, CATEGORY_COLOURS.get(c, "#bab0ac")) for c in over.categories]
    keys += [(f"{p} (band)", colour) for p, colour in PHASE_COLOURS.items()]
    legend = "".join(f'<span class="key"><i style="background:{c}"></i>{escape(k)}</span>' for k, c in keys)
    what = "Device" if device else "CPU"
    caption = f"{what} memory live over time (absolute: what was live before the block included), by category"
    body = f'<p class="muted">{escape(caption)}</p>{svg}<div class="legend">{legend}</div>'
    return f'<div id="memovertime">{body}</div>'


__all__ = ["memory_chart_svg"]
