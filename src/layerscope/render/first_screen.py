"""The report's first screen (``<section id="summary">``): the step time, where the time goes as one
bar, the absolute memory peak with where it happened, and the top findings. Static HTML: it reads
without scripts, and a 1366x768 screen shows all of it."""

from __future__ import annotations

from html import escape

from layerscope.analysis.first_screen import PARTS, FirstScreen
from layerscope.units import fmt_bytes, fmt_time_us

#: One colour per part of the time bar.
PART_COLOURS = {
    "forward": "#4e79a7",
    "backward": "#f28e2b",
    "optimizer": "#59a14f",
    "data loading": "#e15759",
    "other": "#bab0ac",
}


def _card(value: str, label: str, title: str = "") -> str:
    hint = f' title="{escape(title)}"' if title else ""
    body = f'<div class="v">{escape(value)}</div><div class="k">{escape(label)}</div>'
    return f'<div class="card"{hint}>{body}</div>'


def _step_card(screen: FirstScreen) -> str:
    found = screen.step_time
    if found is None:
        return _card(fmt_time_us(screen.wall_us) or "0", "Wall time (no steps recorded)")
    if found.steps == 1:
        return _card(fmt_time_us(found.median_us), "Step time (one step recorded)")
    spread = f"{fmt_time_us(found.min_us)} – {fmt_time_us(found.max_us)} over {found.steps} steps"
    if found.outliers:
        spread += f", {found.outliers} slow"
    return _card(fmt_time_us(found.median_us), f"Step time (median); {spread}")


def _peak_card(screen: FirstScreen) -> str:
    peak = screen.peak
    if peak is None:
        return _card("–", "Memory peak (profile with memory=True)")
    where = peak.where
    place = (
        f"{where['module'] or '(outside modules)'} {where['phase']} ({where['op']})" if where else "the start"
    )
    what = "Device" if peak.device else "CPU"
    detail = f"{what} memory peak (absolute) in {place}"
    return _card(
        fmt_bytes(peak.absolute_peak_bytes), detail, f"{fmt_bytes(peak.baseline_bytes)} live before the block"
    )


def _time_bar(screen: FirstScreen) -> str:
    total = screen.wall_us or 1.0
    segments, legend = [], []
    for part in PARTS:
        us = screen.time_parts.get(part, 0.0)
        if us <= 0:
            continue
        share = 100.0 * us / total
        colour = PART_COLOURS[part]
        label = f"{part} {fmt_time_us(us)} ({share:.0f}%)"
        segments.append(
            f'<span class="seg" style="width:{share:.3f}%;background:{colour}" '
            f'title="{escape(label)}"></span>'
        )
        legend.append(f'<span class="key"><i style="background:{colour}"></i>{escape(label)}</span>')
    idle = screen.device_idle_share
    if idle is not None:
        legend.append(f'<span class="key">device idle {100 * idle:.0f}% of its window</span>')
    return (
        f'<div class="timebar" role="img" aria-label="where the time goes">{"".join(segments)}</div>'
        f'<div class="legend">{"".join(legend)}</div>'
    )


def _findings(screen: FirstScreen) -> str:
    if not screen.findings:
        return '<p class="muted">Findings: no rule fired on this profile.</p>'
    items = "".join(
        f"<li><b>{escape(a.rule)}</b>: {escape(a.message)}"
        + (f' <span class="muted">({escape(a.where)})</span>' if a.where else "")
        + "</li>"
        for a in screen.findings
    )
    return f'<p class="muted">Top findings:</p><ol id="findings">{items}</ol>'


def first_screen_html(screen: FirstScreen) -> str:
    """The summary section."""
    cards = _step_card(screen) + _peak_card(screen)
    trigger = (
        f'<p id="trigger"><b>Flight recorder dump</b>: {escape(screen.trigger)}</p>' if screen.trigger else ""
    )
    return (
        f'<section id="summary"><h2>Summary</h2>{trigger}'
        f'<div class="cards" id="headline">{cards}</div><div class="cards" id="cards"></div>'
        f'<p class="muted">Where the time goes ({fmt_time_us(screen.wall_us) or "0"} recorded):</p>'
        f"{_time_bar(screen)}{_findings(screen)}"
        '<p class="muted">Hottest modules:</p><ol id="hot"></ol></section>'
    )


__all__ = ["PART_COLOURS", "first_screen_html"]
