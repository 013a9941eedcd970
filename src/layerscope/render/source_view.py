"""The HTML report's annotated source: the user's files that ran, each line with the figures of the
ops it called (the line table of :class:`layerscope.analysis.report.ReportData`), like a line
profiler's listing.

Files are read when the report is written, so the page stays self-contained: the heaviest
:data:`MAX_FILES` files, whole when short, else windows of :data:`CONTEXT` lines around the lines
that have figures. A file that cannot be read (moved, another machine's path, over
:data:`MAX_FILE_BYTES`) keeps its figures, on bare line numbers, with a note saying why.

The result is plain data for the page's JSON; ``report.js`` draws it through ``textContent`` only,
so source text (which may hold anything, markup included) is never parsed as HTML.
"""

from __future__ import annotations

import sys
from collections.abc import Container, Iterable
from html import escape
from pathlib import Path
from typing import Any

from layerscope.analysis.report import ReportData
from layerscope.model.metrics import Metrics
from layerscope.model.tables import NO_LINE, LineStats

#: The heaviest files shown; the rest are summed into one "more files" figure.
MAX_FILES = 10
#: Files larger than this are not read (a generated or data file): their lines show figures only.
MAX_FILE_BYTES = 1 << 20
#: Lines shown on each side of a line with figures, in files longer than :data:`WHOLE_FILE_LINES`.
CONTEXT = 8
#: Files up to this many lines are shown whole.
WHOLE_FILE_LINES = 150
#: Windows closer than this many hidden lines are joined (a gap of one or two lines hides nothing).
_JOIN_GAP = 3

NOT_FOUND = "source not found"
TOO_LARGE = f"source not shown: the file is over {MAX_FILE_BYTES >> 20} MiB"


def source_data(report: ReportData) -> dict[str, Any] | None:
    """The section's data, from the report's line table; None when the profile has no stacks.

    ``files`` holds the heaviest files, heaviest first, each with its lines' figures as columns
    (``lines``, ``fwd``, ``bwd``, ``flops``, ``module``, ``function``, ``calls``) and ``windows``
    of source text (``[first line number, [text, ...]]``); ``no_line`` the ops no user line called;
    ``more`` the files left out. Times are the table's ``time_kind`` (device, else exclusive CPU)."""
    table = report.lines
    if table is None:
        return None
    kind = table.time_kind
    by_file: dict[str, list[LineStats]] = {}
    no_line: LineStats | None = None
    for row in table:
        if row.line is None:
            no_line = row
        else:
            by_file.setdefault(row.file, []).append(row)
    ranked = sorted(by_file.items(), key=lambda item: (-_rows_time(item[1], kind), item[0]))
    shown, rest = ranked[:MAX_FILES], ranked[MAX_FILES:]
    left_out = [row for _, rows in rest for row in rows]
    paths = {node.path for node in report.profile.modules()}
    return {
        "call_lines": table.call_lines,
        "time_kind": kind,
        "total": _rows_time(table, kind),
        "files": [file_data(path, rows, kind, paths) for path, rows in shown],
        "no_line": _summary(no_line, kind, paths) if no_line is not None else None,
        "more": {"files": len(rest), **_sums(left_out, kind)} if rest else None,
    }


def file_data(
    path: str, rows: list[LineStats], kind: str, paths: Container[str] | None = None
) -> dict[str, Any]:
    """One file: its lines' figures (ordered by line) and the source windows around them; ``paths``
    as for :func:`line_module`."""
    rows = sorted(rows, key=lambda r: r.line or 0)
    numbers = [r.line or 0 for r in rows]
    text, note = read_source(path)
    shown = [[a, text[a - 1 : b]] for a, b in windows(numbers, len(text))] if text is not None else []
    return {
        "path": path,
        "note": note,
        "lines": numbers,
        "fwd": [line_time(r.forward, kind) for r in rows],
        "bwd": [line_time(r.backward, kind) for r in rows],
        "flops": [r.flops for r in rows],
        "module": [line_module(r, paths) for r in rows],
        "function": [r.function for r in rows],
        "calls": [r.calls for r in rows],
        "windows": shown,
    }


def read_source(path: str) -> tuple[list[str] | None, str]:
    """The file's lines (utf-8, undecodable bytes replaced; numbered as Python numbers them) and an
    empty note, or None and the note saying why there is no text."""
    found = _resolve(path)
    if found is None:
        return None, NOT_FOUND
    try:
        if found.stat().st_size > MAX_FILE_BYTES:
            return None, TOO_LARGE
        # universal newlines: "\r\n" and a lone "\r" end a line, as they do for Python's tokenizer
        with found.open(encoding="utf-8", errors="replace") as source:
            content = source.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None, NOT_FOUND
    lines = content.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line starts no line of its own
    return lines, ""


def _resolve(path: str) -> Path | None:
    """The regular file a frame names. Call lines are absolute; torch's with_stack frames are
    relative to the sys.path entry the module was imported from, so those are looked up there."""
    candidate = Path(path)
    if candidate.suffix not in (".py", ".pyw"):
        return None  # a profile from elsewhere must not make a report embed other files of this machine
    bases = [Path()] if candidate.is_absolute() else [Path(), *(Path(p) for p in sys.path if p)]
    for base in bases:
        full = base / candidate
        try:
            # a regular file only: a FIFO or a device would block or never end
            if full.is_file():
                return full
        except OSError:
            continue
    return None


def windows(lines: list[int], length: int, context: int = CONTEXT) -> list[tuple[int, int]]:
    """``(first, last)`` line numbers (1-based, inclusive) to show of a file of ``length`` lines:
    the whole file when it is short, else ``context`` lines around each of ``lines``, joined where
    they meet. Lines past the end (the file changed since the profile) add no window."""
    if length == 0:
        return []
    if length <= WHOLE_FILE_LINES:
        return [(1, length)]
    spans: list[tuple[int, int]] = []
    for line in sorted(set(lines)):
        if not 1 <= line <= length:
            continue
        first, last = max(1, line - context), min(length, line + context)
        if spans and first <= spans[-1][1] + _JOIN_GAP:
            spans[-1] = (spans[-1][0], max(spans[-1][1], last))
        else:
            spans.append((first, last))
    return spans


def source_section_html(source: dict[str, Any] | None) -> str:
    """The section's static frame (what its lines are, which time); ``report.js`` fills in the files
    from the page's data. Empty without source data."""
    if source is None:
        return ""
    if source["call_lines"]:
        kind = (
            "Exact call lines: each op is counted on the line of your code that called it, and its "
            "backward on the line of the forward op that created it."
        )
    else:
        kind = (
            "Function definition lines (with_stack only): torch names each frame by the line its "
            "function starts on, so all of a function's ops show on its def line. Profile with "
            "lines=True (--lines) for exact call lines."
        )
    time = "device time" if source["time_kind"] == "device" else "exclusive CPU time"
    note = (
        f"{kind} Times are {time}; the shading is each line's share of the total. "
        f"Files as read when this report was written (at most the {MAX_FILES} heaviest)."
    )
    return (
        '<section id="source"><h2>Annotated source</h2>'
        f'<p class="muted" id="sourcenote">{escape(note)}</p>'
        '<table id="sourcefiles"><thead><tr></tr></thead><tbody></tbody></table>'
        '<div id="sourcelist"></div></section>'
    )


def line_time(metrics: Metrics, kind: str) -> float:
    """A line's time in one phase: device time for ``kind == "device"``, else exclusive CPU time."""
    # self figures only: a line's ops never nest in each other's totals (see analysis/lines.py)
    return metrics.self_device_us if kind == "device" else metrics.self_cpu_us


def line_module(row: LineStats, paths: Container[str] | None = None) -> str:
    """The module the line's work ran in (the heaviest of them), the root shown as ``(root)``. Given
    the profile's module ``paths``, work outside every module shows its entry as ``[label]``, as the
    op table does."""
    if not row.modules:
        return ""
    where = row.modules[0]
    if paths is not None and where not in paths:
        return f"[{where}]"
    return where or "(root)"


def _rows_time(rows: Iterable[LineStats], kind: str) -> float:
    return sum(line_time(r.forward, kind) + line_time(r.backward, kind) for r in rows)


def _sums(rows: list[LineStats], kind: str) -> dict[str, Any]:
    return {
        "fwd": sum(line_time(r.forward, kind) for r in rows),
        "bwd": sum(line_time(r.backward, kind) for r in rows),
        "flops": sum(r.flops for r in rows),
    }


def _summary(row: LineStats, kind: str, paths: Container[str]) -> dict[str, Any]:
    """The row of ops no user line called, as one summary row."""
    return {"label": NO_LINE, "module": line_module(row, paths), "calls": row.calls, **_sums([row], kind)}


__all__ = [
    "CONTEXT",
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "WHOLE_FILE_LINES",
    "file_data",
    "line_module",
    "line_time",
    "read_source",
    "source_data",
    "source_section_html",
    "windows",
]
