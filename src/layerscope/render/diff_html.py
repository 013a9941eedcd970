"""``layerscope diff A B -o diff.html``: the comparison as one self-contained page — the gate's
verdict (or the total change) at the top, the two module trees side by side with their deltas
(faster in green, slower in red, where the change is beyond noise: ``ProfileDiff.beyond_noise``),
then the ops that changed most. Static HTML: no script, no request, every name escaped."""

from __future__ import annotations

from html import escape

from layerscope.analysis.diff import NOISE_SHARE_OF_ROW, NOISE_SHARE_OF_TOTAL, DiffRow, ProfileDiff
from layerscope.render.diff import row_cells, summary_line, value_formatter
from layerscope.render.html import asset_text

_STYLE = """
.verdict { font-size: 18px; font-weight: 600; padding: 10px 14px; border-radius: 6px; }
.verdict.pass { background: #ecfdf3; color: #067647; } .verdict.fail { background: #fef3f2; color: #b42318; }
.verdict.info { background: #f2f4f7; color: #1d2330; }
tr.slower td.d { color: #b42318; font-weight: 600; } tr.faster td.d { color: #067647; font-weight: 600; }
td.k { text-align: left; } .new, .vanished { color: #667085; font-style: italic; }
"""


def verdict_html(d: ProfileDiff, gate_percent: float | None) -> str:
    """The line at the top: PASS/FAIL against ``gate_percent`` (``--fail-over``), else the change."""
    line = summary_line(d)
    if gate_percent is None:
        return f'<p class="verdict info" id="verdict">{escape(line)}</p>'
    failed = d.regressed(gate_percent)
    word, kind = ("FAIL", "fail") if failed else ("PASS", "pass")
    detail = f"B against A, limit +{gate_percent:g}%: {line}"
    return f'<p class="verdict {kind}" id="verdict" data-gate="{kind}">{word} — {escape(detail)}</p>'


def _row_class(d: ProfileDiff, row: DiffRow) -> str:
    if not d.beyond_noise(row):
        return ""
    return "slower" if row.delta > 0 else "faster"


def _figures(a: str, b: str, delta: str, percent: str, status: str) -> str:
    """A row's cells after its name: A, B, the change, its percent, new/vanished."""
    figures = "".join(f"<td>{escape(v)}</td>" for v in (a, b))
    change = "".join(f'<td class="d">{escape(v)}</td>' for v in (delta, percent))
    return f'{figures}{change}<td class="k">{escape(status)}</td>'


def _tree_rows(d: ProfileDiff) -> str:
    fmt = value_formatter(d.metric)
    lines = []
    for row in d.tree or d.modules:
        path = row.key
        key, a, b, delta, percent, status = row_cells(row, fmt)
        depth = 0 if not path else path.count(".") + 1
        name = key if not path else path.rsplit(".", 1)[-1]
        label = f'<span class="{status}">{escape(name)}</span>' if status else escape(name)
        title = f' title="{escape(path)}"' if path else ""
        name_cell = f'<td class="k" style="padding-left:{8 + 16 * depth}px"{title}>{label}</td>'
        lines.append(
            f'<tr class="{_row_class(d, row)}" data-path="{escape(path)}">{name_cell}'
            f"{_figures(a, b, delta, percent, status)}</tr>"
        )
    return "".join(lines)


def _op_rows(d: ProfileDiff, top: int) -> str:
    fmt = value_formatter(d.metric)
    out = []
    for row in d.ops[:top]:
        key, a, b, delta, percent, status = row_cells(row, fmt)
        name_cell = f'<td class="k">{escape(key)}</td>'
        out.append(
            f'<tr class="{_row_class(d, row)}">{name_cell}{_figures(a, b, delta, percent, status)}</tr>'
        )
    return "".join(out)


def diff_html(
    d: ProfileDiff, a_name: str, b_name: str, gate_percent: float | None = None, top: int = 30
) -> str:
    """The whole page."""
    per = " per step" if d.per_step else ""
    head = "<tr><th class='l'>{}</th><th>A</th><th>B</th><th>Change</th><th>%</th><th class='l'></th></tr>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>layerscope diff</title><style>{asset_text("report.css")}{_STYLE}</style></head>
<body><header><h1>layerscope diff</h1><div class="sub">A (baseline): {escape(a_name)} · B: {escape(b_name)}
 · {escape(d.metric)}{per}</div></header>
<main><section id="summary">{verdict_html(d, gate_percent)}
<p class="muted">Coloured where the change is beyond noise: more than {NOISE_SHARE_OF_ROW:.0%} of the
row's baseline and more than {NOISE_SHARE_OF_TOTAL:.1%} of the baseline's total (red slower, green
faster). Modules are inclusive, forward and backward together.</p></section>
<section id="modules"><h2>Modules</h2><div class="scroll"><table id="difftree">
<thead>{head.format("Module")}</thead>
<tbody>{_tree_rows(d)}</tbody></table></div></section>
<section id="ops"><h2>Ops that changed most</h2><table id="diffops"><thead>{head.format("Op")}</thead>
<tbody>{_op_rows(d, top)}</tbody></table></section></main></body></html>
"""


__all__ = ["diff_html", "verdict_html"]
