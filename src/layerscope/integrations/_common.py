"""Shared pieces of the integrations: a per-cycle handler that saves, writes a text report and says
where (the one ``layerscope: saved ... in ...`` line of every integration)."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from layerscope.handlers import save_to
from layerscope.model.serialize import write_atomic

if TYPE_CHECKING:
    from layerscope.capture.session import Cycle


def text_report(cycle: Cycle) -> str:
    """The module tree, the step table and the top ops of one cycle, as plain text."""
    from layerscope.analysis.steps import step_rows
    from layerscope.render.console import make_console, ops_table, steps_table, tree_table

    buffer = io.StringIO()
    console = make_console(buffer, width=160)
    profile = cycle.profile
    console.print(tree_table(profile, ascii_only=False))
    if len(profile.steps) > 1:
        console.print(steps_table(step_rows(profile.steps), ascii_only=False))
    console.print(ops_table(profile.ops(limit=15), ascii_only=False, total_cpu_us=profile.totals.cpu_us))
    return buffer.getvalue()


def announce_saved(paths: Sequence[Path], stream: TextIO | None = None) -> None:
    """One line on stderr naming the files a cycle wrote and their folder (frameworks log nothing
    of ours, so without it nobody knows where the profile went)."""
    if not paths:
        return
    names = ", ".join(Path(path).name for path in paths)
    print(f"layerscope: saved {names} in {Path(paths[0]).parent}", file=stream or sys.stderr, flush=True)


def save_with_report(
    directory: str | Path,
    *,
    trace: bool = False,
    rank: int | None = None,
    report: bool = True,
    announce: bool = True,
) -> Callable[[Cycle], None]:
    """``save_to`` plus, per cycle, a ``.txt`` report and the HTML report beside the profile; with
    ``announce`` (the main process: every rank writes, one says so), :func:`announce_saved`."""
    saver = save_to(directory, trace=trace, html=report, rank=rank)
    written: list[Path] = saver.written  # type: ignore[attr-defined]

    def handler(cycle: Cycle) -> None:
        first = len(written)
        saver(cycle)
        if report:
            profile_path = written[first]  # save_to writes the profile first, then trace and HTML
            target = profile_path.with_name(profile_path.name.replace(".json.gz", ".txt"))
            written.append(write_atomic(target, text_report(cycle).encode()))
        if announce:
            announce_saved(written[first:])

    handler.written = written  # type: ignore[attr-defined]
    return handler
