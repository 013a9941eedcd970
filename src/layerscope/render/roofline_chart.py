"""The report's roofline chart: every module, forward and backward, as a point at (arithmetic
intensity, achieved FLOP/s) on log-log axes under the device's roofs (memory bandwidth up to the
ridge point, then the peak FLOP/s of the run's dtype mix; each other dtype class's peak that a module
is held to, dashed). Hovering a point names the module and its figures. Static SVG (no script),
every name escaped."""

from __future__ import annotations

import math
from html import escape

from layerscope.model.roofline import Roofline, RooflineRow
from layerscope.render.memory_chart import PHASE_COLOURS
from layerscope.units import fmt_bytes, fmt_si, fmt_time_us

WIDTH, HEIGHT, LEFT, TOP, BOTTOM = 900, 340, 80, 12, 36
ROOF_COLOUR = "#b42318"


def _drawable(row: RooflineRow) -> bool:
    return bool(row.intensity and row.achieved_flops_per_s)


def _decades(low: float, high: float) -> tuple[int, int]:
    return math.floor(math.log10(low)), math.ceil(math.log10(high))


class _Axes:
    """Log-log mapping of (FLOP/byte, FLOP/s) to the plot area."""

    def __init__(self, xs: tuple[int, int], ys: tuple[int, int]) -> None:
        self.xs, self.ys = xs, ys

    def x(self, value: float) -> float:
        lo, hi = self.xs
        return LEFT + (WIDTH - LEFT - 10) * (math.log10(value) - lo) / (hi - lo)

    def y(self, value: float) -> float:
        lo, hi = self.ys
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - (math.log10(value) - lo) / (hi - lo))

    def ticks(self) -> list[str]:
        out = []
        for k in range(self.xs[0], self.xs[1] + 1):
            x = self.x(10.0**k)
            out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}" class="grid"/>')
            label, anchor = _num(10.0**k), "end" if k == self.xs[1] else "middle"
            out.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 14}" text-anchor="{anchor}">{label}</text>')
        for k in range(self.ys[0], self.ys[1] + 1):
            y = self.y(10.0**k)
            out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - 10}" y2="{y:.1f}" class="grid"/>')
            out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt_si(10.0**k)}</text>')
        return out


def _num(value: float) -> str:
    return f"{value:g}" if 1e-3 <= value < 1e4 else fmt_si(value) if value >= 1 else f"{value:.0e}"


def _roofs(roofline: Roofline, axes: _Axes, peaks: list[float]) -> list[str]:
    """The memory roof up to the run's ridge point and the run's compute roof (solid), every other
    dtype class's compute roof (dashed)."""
    bw, peak = roofline.bandwidth_bytes_per_s, roofline.peak_flops_per_s
    x0, x1 = 10.0 ** axes.xs[0], 10.0 ** axes.xs[1]
    y_floor = 10.0 ** axes.ys[0]
    start = max(x0, y_floor / bw)
    points = [(start, bw * start), (peak / bw, peak), (x1, peak)]
    line = " ".join(f"{axes.x(a):.1f},{axes.y(b):.1f}" for a, b in points)
    label = f"{fmt_si(peak, 'FLOP/s')}, {fmt_si(bw, 'B/s')}: ridge {peak / bw:.3g} FLOP/byte"
    out = [
        f'<polyline id="roof" points="{line}" fill="none" stroke="{ROOF_COLOUR}" stroke-width="2">'
        f"<title>{escape(label)}</title></polyline>"
    ]
    for other in peaks:
        if abs(other - peak) > 1e-6 * peak:
            y = axes.y(other)
            out.append(
                f'<line class="roof-dtype" x1="{axes.x(max(other / bw, x0)):.1f}" y1="{y:.1f}" '
                f'x2="{WIDTH - 10}" y2="{y:.1f}" stroke="{ROOF_COLOUR}" stroke-dasharray="4 3">'
                f"<title>{escape(fmt_si(other, 'FLOP/s'))}</title></line>"
            )
    return out


def _point(row: RooflineRow, axes: _Axes) -> str:
    assert row.intensity is not None and row.achieved_flops_per_s is not None
    name = row.module or "(root)"
    share = f"{row.roof_fraction:.1%} of the roof" if row.roof_fraction is not None else ""
    tip = (
        f"{name} {row.phase}: {fmt_si(row.achieved_flops_per_s, 'FLOP/s')} at {row.intensity:.3g} FLOP/byte\n"
        f"{fmt_si(row.flops)} FLOPs, {fmt_bytes(row.bytes or 0)}, {fmt_time_us(row.time_us)}\n"
        f"{row.bound}-bound, {share}"
    )
    return (
        f'<circle cx="{axes.x(row.intensity):.1f}" cy="{axes.y(row.achieved_flops_per_s):.1f}" '
        f'r="{6 if not row.module else 4}" fill="{PHASE_COLOURS.get(row.phase, "#667085")}" '
        f'fill-opacity="0.75" data-module="{escape(name)}" data-phase="{escape(row.phase)}" '
        f'data-bound="{escape(row.bound)}"><title>{escape(tip)}</title></circle>'
    )


def roofline_chart_svg(roofline: Roofline) -> str:
    """The chart, its legend and a line on what it leaves out; empty when no module has both FLOPs
    and bytes."""
    rows = [r for r in roofline.modules if _drawable(r)]
    if not rows:
        return ""
    intensities = [r.intensity or 0.0 for r in rows] + [roofline.ridge_point]
    rates = [r.achieved_flops_per_s or 0.0 for r in rows]
    peaks = sorted({r.peak_flops_per_s for r in rows} | {roofline.peak_flops_per_s})
    axes = _Axes(
        _decades(min(intensities) / 2, max(intensities) * 2), _decades(min(rates) / 2, max(peaks) * 2)
    )
    body = axes.ticks() + _roofs(roofline, axes, peaks) + [_point(r, axes) for r in rows]
    axis_names = (
        f'<text x="{(LEFT + WIDTH) / 2:.0f}" y="{HEIGHT - 4}" text-anchor="middle">'
        "arithmetic intensity (FLOP/byte)</text>"
        f'<text x="14" y="{(TOP + HEIGHT - BOTTOM) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(TOP + HEIGHT - BOTTOM) / 2:.0f})">achieved FLOP/s</text>'
    )
    svg = (
        f'<svg id="rooflinechart" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" font-size="11" role="img" '
        f'aria-label="roofline: modules by arithmetic intensity and achieved FLOP/s">'
        f"<style>.grid{{stroke:#eaecf0}}</style>{''.join(body)}{axis_names}</svg>"
    )
    keys = [(f"{phase} (a module)", colour) for phase, colour in PHASE_COLOURS.items()]
    keys.append(("roof (dashed: another dtype's peak)", ROOF_COLOUR))
    legend = "".join(f'<span class="key"><i style="background:{c}"></i>{escape(k)}</span>' for k, c in keys)
    return f'{svg}<div class="legend">{legend}</div>{_memory_only(roofline, len(rows))}'


def _memory_only(roofline: Roofline, drawn: int) -> str:
    """Modules that moved bytes without FLOPs (norms, activations): no point on a roofline, so a
    table of the bandwidth they reached; and how many rows neither shows."""
    rows = [r for r in roofline.modules if not r.flops and r.bytes and r.achieved_bytes_per_s]
    body = "".join(
        f'<tr><td class="l">{escape(r.module or "(root)")}</td><td class="l">{escape(r.phase)}</td>'
        f"<td>{fmt_bytes(r.bytes or 0)}</td><td>{fmt_time_us(r.time_us)}</td>"
        f"<td>{fmt_si(r.achieved_bytes_per_s or 0, 'B/s')}</td>"
        f"<td>{(r.achieved_bytes_per_s or 0) / roofline.bandwidth_bytes_per_s:.1%}</td>"
        f'<td class="l">{escape(r.bound)}</td></tr>'
        for r in rows
    )
    left_out = len(roofline.modules) - drawn - len(rows)
    note = f"{left_out} module rows with neither FLOPs nor known bytes are not shown." if left_out else ""
    table = (
        '<h3>Memory work without FLOPs</h3><table id="rooflinememory"><thead><tr>'
        '<th class="l">Module</th><th class="l">Phase</th><th>Bytes</th><th>Time</th><th>Bytes/s</th>'
        '<th>Of bandwidth</th><th class="l">Bound</th></tr></thead><tbody>'
        f"{body}</tbody></table>"
        if rows
        else ""
    )
    return f'{table}<p class="muted">{escape(note)}</p>' if note else table


def roofline_section_html(roofline: Roofline | None) -> str:
    """The report's Roofline section; empty without a roofline (no device spec known)."""
    if roofline is None:
        return ""
    chart = roofline_chart_svg(roofline)
    head = (
        f"Against {roofline.device}: {fmt_si(roofline.peak_flops_per_s, 'FLOP/s')}, "
        f"{fmt_si(roofline.bandwidth_bytes_per_s, 'B/s')} ({roofline.time_source} time). Bytes are "
        "inputs read + outputs written, from shapes and dtypes: a lower bound."
    )
    body = chart or '<p class="muted">No module has both FLOPs and bytes to place.</p>'
    return f'<section id="roofline"><h2>Roofline</h2><p class="muted">{escape(head)}</p>{body}</section>'


__all__ = ["roofline_chart_svg", "roofline_section_html"]
