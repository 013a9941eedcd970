"""An SVG flame graph (icicle: roots on top) of a Profile, drawn by layerscope: no Perl, no network.

Frames are modules, then ops (as in the collapsed stacks); hover shows name, value and share, a
click zooms into a frame, "Search" highlights matching frames and totals their share, "Reset" zooms
out. Every name is XML-escaped. Frames narrower than a pixel are not drawn (their time still counts
in their parents' width), so thousands of frames stay readable.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from html import escape

from layerscope.analysis.stacks import stack_values
from layerscope.model.profile import Profile

WIDTH = 1200
ROW = 18
TOP = 40
FONT = 12
CHAR = 7.0  # average glyph width at FONT px, for deciding whether a label fits


@dataclass
class _Frame:
    name: str
    value: float = 0.0
    children: dict[str, _Frame] = field(default_factory=dict)


def _tree(stacks: dict[tuple[str, ...], float], root_name: str) -> _Frame:
    root = _Frame(root_name)
    for stack, value in stacks.items():
        root.value += value
        node = root
        for name in stack:
            node = node.children.setdefault(name, _Frame(name))
            node.value += value
    return root


def _colour(name: str, kind: str) -> str:
    shade = int(hashlib.md5(name.encode()).hexdigest()[:2], 16) / 255.0
    if kind == "special":
        return f"rgb({150 + int(40 * shade)},{150 + int(40 * shade)},{170 + int(40 * shade)})"
    if kind == "module":
        return f"rgb({80 + int(50 * shade)},{140 + int(50 * shade)},{215 + int(30 * shade)})"
    return f"rgb({230 + int(25 * shade)},{120 + int(80 * shade)},{50 + int(30 * shade)})"


def _kind(name: str, depth: int, leaf: bool) -> str:
    if name.startswith("["):
        return "special"
    return "op" if leaf and depth > 1 else "module"


def flamegraph_svg(
    profile: Profile,
    metric: str = "cpu_us",
    title: str | None = None,
    standalone: bool = True,
    frames_of: str = "modules",
    internal_frames: bool = False,
) -> str:
    """The flame graph of ``profile`` weighted by ``metric`` (see ``STACK_METRICS``), as SVG text;
    ``frames_of`` picks module frames or Python source frames (see ``stack_values``)."""
    stacks = stack_values(profile, metric, frames_of, internal_frames)
    return stacks_svg(stacks, metric, title, standalone, frames_of)


def stacks_svg(
    stacks: dict[tuple[str, ...], float],
    metric: str,
    title: str | None = None,
    standalone: bool = True,
    frames_of: str = "modules",
) -> str:
    """The flame graph of weights already computed (analysis/stacks.py), as SVG text."""
    root = _tree(stacks, "all")
    total = root.value or 1.0
    unit = {"cpu_us": "µs", "device_us": "µs", "flops": "FLOPs"}.get(metric, "bytes")
    frames: list[str] = []
    max_depth = 0

    def draw(node: _Frame, depth: int, x: float) -> None:
        nonlocal max_depth
        width = node.value / total * WIDTH
        if width < 0.5:  # like FlameGraph's minwidth: sub-pixel frames would only add weight
            return
        max_depth = max(max_depth, depth)
        leaf = not node.children
        kind = _kind(node.name, depth, leaf)
        share = 100.0 * node.value / total
        label = escape(node.name)
        fitted = _fit(node.name, width)  # no <text> when nothing fits: the script adds one on zoom
        frames.append(
            f'<g class="f" data-x="{x / WIDTH:.6f}" data-w="{width / WIDTH:.6f}" data-d="{depth}" '
            f'data-v="{node.value:.3f}"><title>{label} — {node.value:,.1f} {unit} ({share:.2f}%)</title>'
            f'<rect x="{x:.2f}" y="{TOP + depth * ROW}" width="{max(width - 0.5, 0.5):.2f}" '
            f'height="{ROW - 1}" fill="{_colour(node.name, kind)}" rx="2"/>'
            + (
                f'<text x="{x + 3:.2f}" y="{TOP + depth * ROW + FONT}">{escape(fitted)}</text>'
                if fitted
                else ""
            )
            + "</g>"
        )
        cursor = x
        for child in sorted(node.children.values(), key=lambda c: -c.value):
            draw(child, depth + 1, cursor)
            cursor += child.value / total * WIDTH

    draw(root, 0, 0.0)
    height = TOP + (max_depth + 1) * ROW + 40
    heading = escape(
        title or f"layerscope flame graph — {metric}" + (" — source" if frames_of == "source" else "")
    )
    declaration = '<?xml version="1.0" encoding="UTF-8"?>\n' if standalone else ""
    return (
        declaration
        + f"""<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}"
     viewBox="0 0 {WIDTH} {height}" font-family="Verdana, sans-serif" font-size="{FONT}"
     data-total="{total:.3f}" data-unit="{unit}" data-char="{CHAR}">
<style>
  text {{ pointer-events: none; fill: #111; }}
  .f:hover rect {{ stroke: #000; stroke-width: 0.7; }}
  .hit rect {{ fill: rgb(230,0,230) !important; }}
  .button {{ cursor: pointer; fill: #0645ad; }}
</style>
<rect width="100%" height="100%" fill="#fafafa"/>
<text x="10" y="20" font-size="16" font-weight="bold">{heading}</text>
<text class="button reset" x="{WIDTH - 170}" y="20" style="pointer-events: all">Reset zoom</text>
<text class="button search" x="{WIDTH - 70}" y="20" style="pointer-events: all">Search</text>
<text class="details" x="10" y="{height - 15}"> </text>
{"".join(frames)}
<script><![CDATA[
{_script()}
]]></script>
</svg>
"""
    )


def _script() -> str:
    """The flame graph's own script (assets/flamegraph.js), inlined: the SVG works offline."""
    from importlib.resources import files

    return (files("layerscope.render") / "assets" / "flamegraph.js").read_text(encoding="utf-8")


def _fit(text: str, width: float) -> str:
    room = int((width - 6) / CHAR)
    if room < 3:
        return ""
    return text if len(text) <= room else text[: room - 1] + "…"
