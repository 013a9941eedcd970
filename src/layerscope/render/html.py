"""The HTML report: one self-contained file (no network), our own small JS and CSS inlined, the
profile embedded as compact columnar JSON with a string table. Every name reaches the page through
``textContent`` (never as HTML), and the embedded JSON cannot close its script element."""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from importlib.resources import files
from pathlib import Path
from typing import Any

import orjson

from layerscope.analysis.report import ReportData, build_report
from layerscope.model.meta import Environment, ProfileMeta
from layerscope.model.meta_json import to_json
from layerscope.model.metrics import FIELD_NAMES
from layerscope.model.profile import ModuleNode, Profile
from layerscope.model.serialize import StringTable
from layerscope.render.critical_path_html import critical_path_section_html
from layerscope.render.device_html import device_section_html
from layerscope.render.first_screen import first_screen_html
from layerscope.render.flamegraph import stacks_svg
from layerscope.render.memory_chart import memory_chart_svg
from layerscope.render.memory_html import memory_peak_html
from layerscope.render.roofline_chart import roofline_section_html
from layerscope.render.source_view import source_data, source_section_html
from layerscope.render.steps_chart import steps_chart_svg
from layerscope.units import fmt_shapes

#: How the flame graphs' metrics (analysis/report.py's ``FLAME_METRICS``) are named on the page.
FLAME_LABELS = {
    "cpu_us": "CPU time",
    "device_us": "device time",
    "cpu_alloc_bytes": "memory allocated",
    "flops": "FLOPs",
}


def asset_text(name: str) -> str:
    """The text of one of the report's inlined assets (render/assets/NAME)."""
    return (files("layerscope.render") / "assets" / name).read_text(encoding="utf-8")


def _module_data(
    nodes: list[ModuleNode], parent: list[int], sid: Callable[[str | None], int]
) -> dict[str, Any]:
    """The tree's columns: path, type, parent index, calls, params, where forward is defined, the
    first call's output and input shapes (compact), forward and backward metrics."""
    return {
        "path": [sid(n.path) for n in nodes],
        "type": [sid(n.type_name) for n in nodes],
        "parent": parent,
        "calls": [n.calls for n in nodes],
        # shown as "+Nr": calls made again by activation checkpointing's recomputation (backward)
        "recompute": [n.recompute_calls for n in nodes],
        "params": [n.params_total for n in nodes],
        "source": [sid(n.source) for n in nodes],
        "out": [sid(fmt_shapes(n.output_shapes) or None) for n in nodes],
        "in": [sid(fmt_shapes(n.input_shapes) or None) for n in nodes],
        "fwd": [compact(n.forward.to_list()) for n in nodes],
        "bwd": [compact(n.backward.to_list()) for n in nodes],
    }


def compact(values: list[Any]) -> list[Any]:
    """Figures as the page needs them: whole numbers without a fraction, the rest to 3 decimals
    (ns in µs), so that a big profile's page stays small."""
    return [v if isinstance(v, int) else int(v) if v.is_integer() else round(v, 3) for v in values]


def without_trailing_zeros(values: list[Any]) -> list[Any]:
    """An op row's figures less its trailing zeros (most rows have no device or memory figures)."""
    end = len(values)
    while end and values[end - 1] == 0:
        end -= 1
    return values[:end]


def report_data(profile: Profile) -> dict[str, Any]:
    """The page's data of ``profile``: see :func:`page_data`."""
    return page_data(build_report(profile))


def page_data(report: ReportData) -> dict[str, Any]:
    """The page's data: columnar, names in one string table."""
    profile = report.profile
    table = StringTable()
    sid = table.id

    nodes = list(profile.modules())
    index = {node.path: k for k, node in enumerate(nodes)}
    parent = [-1] * len(nodes)
    for node in nodes:
        for child in node.children:
            parent[index[child.path]] = index[node.path]
    rows = profile.op_rows
    meta = profile.meta
    totals = profile.totals
    return {
        "fields": list(FIELD_NAMES),
        "meta": _page_meta(meta),
        "totals": {
            "cpu_us": totals.cpu_us,
            "device_us": totals.device_us,
            "flops": totals.flops,
            "cpu_relative_peak_bytes": totals.cpu_relative_peak_bytes,
            "device_relative_peak_bytes": totals.device_relative_peak_bytes,
        },
        "modules": _module_data(nodes, parent, sid),
        "ops": {
            "name": [sid(r.name) for r in rows],
            "phase": [sid(r.phase.value) if r.phase else -1 for r in rows],
            "module": [sid(r.module) for r in rows],
            "shapes": [sid(r.input_shapes) for r in rows],
            "scope": [sid(r.scope) for r in rows],
            "calls": [r.calls for r in rows],
            "m": [without_trailing_zeros(compact(r.metrics.to_list())) for r in rows],
            # source locations (with_stack): the user's 5 innermost frames, one per line
            **(
                {
                    "stack": [
                        sid("\n".join(frames[:5])) if r.stack else -1
                        for r, frames in zip(rows, report.user_stacks, strict=True)
                    ]
                }
                if profile.has_stacks
                else {}
            ),
        },
        # the annotated source: the user's files read now, each line with its figures
        "source": source_data(report),
        "steps": [
            [
                r.step,
                r.wall_us,
                r.cpu_us,
                r.device_us,
                r.forward_us,
                r.backward_us,
                r.outlier,
                f"slow: {r.cause}" if r.outlier else "",
            ]
            for r in report.steps
        ],
        # a step's tree when its bar is chosen: [module path id, forward µs, backward µs]
        "step_trees": {
            str(step): [[sid(path), round(f, 3), round(b, 3)] for path, f, b in modules]
            for step, modules in report.step_trees.items()
        },
        "memory": meta.memory_timeline.to_json() if meta.memory_timeline is not None else None,
        "strings": table.strings,
    }


def options_text(meta: ProfileMeta) -> str:
    """The capture options in words: what was recorded (``CPU and CUDA; memory, shapes, FLOPs``)."""
    if meta.capture is None:
        return f"from a trace{' with memory events' if meta.memory_recorded else ''}"
    options = meta.capture.options
    recorded = " and ".join(a.upper() if a in ("cpu", "cuda") else a for a in options.activities)
    flags = [
        name
        for name, on in (
            ("memory", options.memory),
            ("shapes", options.shapes),
            ("FLOPs", options.flops),
            ("stacks", options.with_stack),
            ("call lines", options.lines),
            ("NVTX", options.nvtx),
            ("all threads", options.all_threads),
        )
        if on
    ]
    scope = [f"depth {options.depth}"] if options.depth is not None else []
    scope += [f"paths {', '.join(options.paths)}"] if options.paths else []
    return "; ".join(part for part in (f"recorded {recorded}", ", ".join(flags), ", ".join(scope)) if part)


def _page_meta(meta: ProfileMeta) -> dict[str, Any]:
    """What the page's header line shows: model, versions, devices, options, wall time."""
    env = meta.environment or Environment()
    return {
        "model": meta.model,
        "torch_version": env.torch_version or None,
        "layerscope_version": env.layerscope_version or None,
        "created_at": env.created_at or None,
        "devices": [{"name": name} for name in meta.device_names],
        "options": to_json(meta.capture.options) if meta.capture else {"memory": meta.memory_recorded},
        "options_text": options_text(meta),
        "wall_us": meta.wall_us,
        "source": meta.source,
        "trace_file": meta.trace_file,
    }


def _embedded_json(data: dict[str, Any]) -> str:
    # "</script" would end the element early and "<!--" changes how it is parsed: "<" is written as
    # the JSON escape \u003c (still valid JSON), so no name can ever reach the markup.
    return orjson.dumps(data).decode().replace("<", "\\u003c")


def write_html_report(profile: Profile, path: Path) -> Path:
    """Write the HTML report of ``profile`` to ``path``, through the output assembler (atomically)."""
    from layerscope.render.writers import Output, write_outputs

    return write_outputs(profile, [Output(Path(path), "html")])[0]


def _totals_note(profile: Profile) -> str:
    """Which figures the page shows when there are several steps: totals (the console's tree shows
    means per step)."""
    steps = len(profile.steps)
    if steps < 2:
        return ""
    return f'<p class="muted">Totals over {steps} steps (the Steps section has each step).</p>'


def html_report(profile: Profile) -> str:
    """The whole page as one string."""
    return draw_report(build_report(profile))


def _flames(report: ReportData) -> tuple[str, str]:
    """The metric picker's options and the flame graphs' markup."""
    options: dict[str, str] = {}
    flames = []
    for flame in report.flames:
        label = FLAME_LABELS[flame.metric]
        options.setdefault(flame.metric, f'<option value="{flame.metric}">{escape(label)}</option>')
        what = "source lines" if flame.frames_of == "source" else "modules"
        svg = stacks_svg(
            flame.stacks,
            flame.metric,
            title=f"{what} and ops by {label}",
            standalone=False,
            frames_of=flame.frames_of,
        )
        flames.append(
            f'<div class="flame" data-metric="{flame.metric}" data-frames="{flame.frames_of}">{svg}</div>'
        )
    return "".join(options.values()), "".join(flames)


def _memory_over_time(profile: Profile) -> str:
    """The memory chart (absolute, by category) with what was live at the peak beside it; a
    profile saved before 0.2 has no chart by category: the script draws its net timeline."""
    report = profile.meta.memory
    main = report.main_class() if report is not None else None
    chart = memory_chart_svg(main.over_time, main.device) if main is not None and main.over_time else ""
    if not chart:
        return f'<div id="memplot"></div>{memory_peak_html(report)}'
    beside, _, below = memory_peak_html(report, split=True).partition("<!--detail-->")
    row = f'<div class="memchart">{chart}</div><div class="mempeak">{beside}</div>'
    return f'<div class="memrow">{row}</div>{below}'


def draw_report(report: ReportData) -> str:
    """The whole page of a report's data as one string (nothing computed here, only drawn)."""
    profile = report.profile
    options, flames = _flames(report)
    has_stacks = report.lines is not None
    frames_pick = (
        ' frames <select id="flameframes"><option value="modules">modules</option>'
        '<option value="source">source (Python stacks)</option></select>'
        if has_stacks
        else ""
    )
    source_group = '<option value="source">name and source location</option>' if has_stacks else ""
    summary = profile.meta.device
    device = device_section_html(summary) if summary is not None else ""
    if report.critical_path is not None:
        device += critical_path_section_html(report.critical_path)
    data = page_data(report)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>layerscope report</title>
<style>{asset_text("report.css")}</style></head>
<body>
<header><h1 id="title">layerscope</h1><div class="sub" id="sub"></div></header>
<main>
{first_screen_html(report.first_screen)}
<section id="modules"><h2>Modules</h2>{_totals_note(profile)}
<div class="controls"><span id="phase"><button data-phase="forward">forward</button>
<button data-phase="backward">backward</button><button data-phase="both" class="on">both</button></span>
<input type="search" id="treefilter" placeholder="filter modules by name"></div>
<div class="scroll"><table id="tree"><thead><tr></tr></thead><tbody></tbody></table></div></section>
<section id="flames"><h2>Flame chart</h2>
<div class="controls">weigh by <select id="flamemetric">{options}</select>{frames_pick}
<span class="muted">click a frame to zoom, "Reset zoom" to go back</span></div>{flames}</section>
<section id="opsection"><h2>Ops</h2>{_totals_note(profile)}
<div class="controls">group by <select id="opgroup"><option value="name">name</option>
<option value="shapes">name and input shapes</option><option value="module">name and module</option>
{source_group}</select>
<input type="search" id="opfilter" placeholder="filter ops or modules">
<span class="muted" id="opcount"></span></div>
<div class="scroll"><table id="ops"><thead><tr></tr></thead><tbody></tbody></table></div></section>
{roofline_section_html(report.roofline)}
{source_section_html(data["source"])}
<section id="memory"><h2>Memory</h2>{_memory_over_time(profile)}
<h3>Allocated per module (forward)</h3>
<table id="memtable"><thead><tr><th class="l">Module (forward)</th><th>Allocated</th>
<th title="allocated minus freed inside the module: what it leaves alive (activations kept for
backward); negative when it frees more than it allocates">Net alloc</th><th>Peak</th></tr></thead>
<tbody></tbody></table></section>
{device}
<section id="steps"><h2>Steps</h2>{steps_chart_svg(report.steps)}
<div id="steptree" class="muted">Click a step's bar (or Tab to it and press Enter) to see its heaviest
modules.</div>
<table><thead><tr><th>Step</th><th>Wall</th><th>CPU</th><th>Device</th>
<th>Forward</th><th>Backward</th><th class="l">Note</th></tr></thead><tbody></tbody></table></section>
</main>
<script type="application/json" id="data">{_embedded_json(data)}</script>
<script>{asset_text("report.js")}</script>
</body></html>
"""
