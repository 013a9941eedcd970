"""The HTML page of a multi-rank merge: the straggler sentence, each rank's step split as a bar, and a
heatmap of modules x ranks (each cell coloured by how far that rank is from the module's median across
ranks). Drawn entirely on the server: no script, every name through ``html.escape``, one file that
needs no network."""

from __future__ import annotations

import statistics
from html import escape

from layerscope.analysis.ranks import ModuleAcrossRanks, RankMerge, RankSummary
from layerscope.render.critical_path_html import critical_path_section_html
from layerscope.render.html import asset_text
from layerscope.render.ranks import collectives_title, critical_path_line, late_line, straggler_line
from layerscope.units import fmt_time_us

SPLIT_PARTS = (("module_us", "model", "#4f8bd6"), ("communication_us", "collectives", "#e8a33d"))
OTHER_COLOUR = "#c9ced8"


def heatmap_rows(merged: RankMerge, top: int) -> list[ModuleAcrossRanks]:
    """The ``top`` module rows with the largest absolute spread across ranks, largest first."""

    def spread(row: ModuleAcrossRanks) -> float:
        values = row.present
        return max(values) - min(values) if values else 0.0

    rows = [row for row in merged.modules if len(row.present) > 0]
    return sorted(rows, key=spread, reverse=True)[:top]


def _cell_colour(value: float | None, median: float) -> str:
    """White at the median, red above (up to 2x), blue below (down to 0); grey where absent."""
    if value is None:
        return "#eceef2"
    if median <= 0:
        return "#ffffff"
    ratio = value / median
    if ratio >= 1:
        strength = min(ratio - 1.0, 1.0)
        return f"rgb(255,{round(255 - 170 * strength)},{round(255 - 170 * strength)})"
    strength = min(1.0 - ratio, 1.0)
    return f"rgb({round(255 - 150 * strength)},{round(255 - 90 * strength)},255)"


def _overlap(summary: RankSummary) -> str:
    """The share of communication-kernel time hidden by computation, when measured."""
    if summary.comm_overlap is None:
        return ""
    return f' <span class="muted">({100 * summary.comm_overlap:.1f}% overlapped)</span>'


def _split_bars(merged: RankMerge) -> str:
    longest = max((s.wall_us for s in merged.summaries), default=0.0) or 1.0
    rows = []
    for summary in merged.summaries:
        pieces = []
        for field, label, colour in SPLIT_PARTS:
            value = float(getattr(summary, field))
            width = 100.0 * value / longest
            pieces.append(
                f'<span class="seg" style="width:{width:.3f}%;background:{colour}" '
                f'title="{label}: {escape(fmt_time_us(value))}"></span>'
            )
        other = 100.0 * summary.other_us / longest
        pieces.append(
            f'<span class="seg" style="width:{other:.3f}%;background:{OTHER_COLOUR}" '
            f'title="other: {escape(fmt_time_us(summary.other_us))}"></span>'
        )
        rows.append(
            f'<tr><td class="l">rank {summary.rank}</td><td class="l split">{"".join(pieces)}</td>'
            f"<td>{escape(fmt_time_us(summary.wall_us))}</td><td>{escape(fmt_time_us(summary.module_us))}</td>"
            f"<td>{escape(fmt_time_us(summary.communication_us))}{_overlap(summary)}</td>"
            f"<td>{escape(fmt_time_us(summary.other_us))}</td></tr>"
        )
    return "".join(rows)


def _heatmap(merged: RankMerge, top: int) -> str:
    head = "".join(f'<th class="rank">{rank}</th>' for rank in merged.ranks)
    body = []
    straggler = merged.straggler
    for row in heatmap_rows(merged, top):
        median = statistics.median(row.present)
        cells = []
        for rank, value in zip(merged.ranks, row.values, strict=True):
            text = "—" if value is None else fmt_time_us(value)
            mark = (
                " straggler"
                if straggler is not None
                and straggler.is_straggler
                and rank == straggler.rank
                and row.path == straggler.module
                and row.phase == straggler.phase
                else ""
            )
            cells.append(
                f'<td class="cell{mark}" style="background:{_cell_colour(value, median)}" '
                f'title="rank {rank}: {escape(text)}">{escape(text)}</td>'
            )
        body.append(
            f'<tr><td class="l">{escape(row.path or "(root)")}</td><td class="l">{escape(row.phase)}</td>'
            f"{''.join(cells)}</tr>"
        )
    return (
        f'<table id="heatmap"><thead><tr><th class="l">Module</th><th class="l">Phase</th>{head}</tr>'
        f"</thead><tbody>{''.join(body)}</tbody></table>"
    )


def ranks_html(merged: RankMerge, top: int = 40) -> str:
    """The merge as one self-contained HTML page."""
    gaps = (
        f'<p class="muted">Modules missing on some ranks: {escape(", ".join(merged.gaps))}</p>'
        if merged.gaps
        else ""
    )
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:{c}"></span>{label}</span>'
        for _, label, c in (*SPLIT_PARTS, ("", "other", OTHER_COLOUR))
    )
    late = "".join(f"<p>{escape(t)}</p>" for t in (late_line(merged), critical_path_line(merged)) if t)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>layerscope · {len(merged.ranks)} ranks</title>
<style>{asset_text("report.css")}
.split {{ width: 50%; }} .seg {{ display: inline-block; height: 14px; vertical-align: middle; }}
.key {{ margin-right: 14px; }} .swatch {{ display: inline-block; width: 12px; height: 12px; margin-right: 4px;
vertical-align: middle; }} #heatmap td.cell {{ text-align: right; }} th.rank {{ text-align: right; }}
#heatmap td.straggler {{ outline: 2px solid #b42318; outline-offset: -2px; font-weight: 600; }}
</style></head><body>
<header><h1>layerscope · {len(merged.ranks)} ranks</h1>
<div class="sub">metric: {escape(merged.metric)} · per step where the ranks recorded steps</div></header>
<main>
<section id="straggler"><h2>Straggler</h2><p>{escape(straggler_line(merged))}</p>{late}</section>
<section id="split"><h2>Where each rank's step went</h2><p>{legend}</p>
<table id="ranks"><thead><tr><th class="l">Rank</th><th class="l"></th><th>Step</th><th>Model</th>
<th>{collectives_title(merged)}</th><th>Other</th></tr></thead><tbody>{_split_bars(merged)}</tbody></table></section>
<section id="spread"><h2>Modules across ranks</h2>
<p class="muted">Self time of the {len(heatmap_rows(merged, top))} module rows that differ most across
ranks; red: slower than the module's median across ranks (full red at 2x), blue: faster;
outlined: the straggler's module.</p>
<div class="scroll">{_heatmap(merged, top)}</div>{gaps}</section>
{critical_path_section_html(merged.critical_path) if merged.critical_path is not None else ""}
</main></body></html>
"""
