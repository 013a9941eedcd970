"""The console view as plain text (``.txt`` outputs): the module tree, the step table and the top ops."""

from __future__ import annotations

import io

from layerscope.analysis.steps import step_rows
from layerscope.model.profile import Profile
from layerscope.render.console import make_console, ops_table, steps_table, tree_table

#: Op rows in a text report.
TEXT_REPORT_OPS = 15


def text_report(profile: Profile, width: int = 160) -> str:
    """The module tree, the step table (with several steps) and the top ops, as plain text (Unicode
    tree guides, no colour), ``width`` columns wide."""
    buffer = io.StringIO()
    console = make_console(buffer, width=width)
    console.no_color = True
    console.print(tree_table(profile, ascii_only=False))
    if len(profile.steps) > 1:
        console.print(steps_table(step_rows(profile.steps), ascii_only=False))
    rows = profile.ops(limit=TEXT_REPORT_OPS)
    console.print(ops_table(rows, ascii_only=False, total_cpu_us=profile.totals.cpu_us))
    return buffer.getvalue()
