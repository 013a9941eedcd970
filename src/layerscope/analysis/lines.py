"""Source lines: a Profile's op rows summed by the line of the user's code that called them.

Each op row carries its Python stack (innermost first). With call lines (``ls.profile(lines=True)``)
the innermost frame is the exact line that called the op, and an op's backward carries the line of
the forward op that created it, so a line has forward and backward figures. With only
``with_stack`` stacks, torch names frames by their function's definition line: the table still
works, one row per function (``LineTable.call_lines`` tells which kind a table is).

Only self figures are summed (exclusive CPU time, device time the ops launched, FLOPs, allocations),
so nothing is counted twice and the totals equal the op table's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from layerscope.analysis.ops import in_subtree
from layerscope.attribution.stacks import user_frames
from layerscope.errors import UsageError
from layerscope.model.metrics import Metrics
from layerscope.model.profile import OpStats, Phase, Profile
from layerscope.model.sort_keys import LINE_SORT_KEYS, check_sort_key, metric_sort_value
from layerscope.model.tables import NO_LINE, LineStats, LineTable

#: ``path/to/file.py(LINE): function``, as torch's tracer and layerscope's call lines write frames.
_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<function>.*)$")


def parse_frame(frame: str) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of a frame string, or None when it names no line."""
    found = _FRAME.match(frame)
    if found is None:
        return None
    return found["file"], int(found["line"]), found["function"]


def line_table(
    profile: Profile,
    sort_by: str = "time",
    limit: int | None = None,
    module: str | None = None,
    user_stacks: Sequence[tuple[str, ...]] | None = None,
) -> LineTable:
    """Op rows summed per innermost user frame (see the module's docstring). ``module`` keeps the
    work that ran in that module's subtree; ``sort_by`` is one of :data:`LINE_SORT_KEYS`;
    ``user_stacks`` (analysis/stacks.py's ``op_user_stacks``) saves filtering the stacks again."""
    if not profile.has_stacks and profile.meta.call_lines is None:
        raise UsageError(
            "this profile has no source lines: record with lines=True (`--lines`), or with_stack=True"
        )
    sort_by = check_sort_key(sort_by, LINE_SORT_KEYS, "lines")
    if limit is not None and limit < 0:
        raise UsageError(f"limit must be >= 0, not {limit}")
    groups: dict[tuple[str, int | None, str], list[OpStats]] = {}
    frame_of: dict[tuple[str, ...], tuple[str, int | None, str]] = {}
    for k, row in enumerate(profile.op_rows):
        if module is not None and not in_subtree(row.module, module):
            continue
        key = frame_of.get(row.stack)
        if key is None:
            frames = user_frames(row.stack, depth=1) if user_stacks is None else user_stacks[k][:1]
            parsed = parse_frame(frames[0]) if frames else None
            key = frame_of[row.stack] = parsed if parsed is not None else (NO_LINE, None, "")
        groups.setdefault(key, []).append(row)
    time_kind = "device" if profile.has_device_time else "cpu"
    table = LineTable(_line_stats(key, rows) for key, rows in groups.items())
    table.sort(key=_sort_key(sort_by, profile.has_device_time))
    result = LineTable(table[:limit] if limit is not None else table)
    result.call_lines = profile.meta.call_lines is not None
    result.time_kind = time_kind
    return result


def _line_stats(key: tuple[str, int | None, str], rows: list[OpStats]) -> LineStats:
    forward, backward = Metrics(), Metrics()
    weight: dict[str, float] = {}
    calls = 0
    for row in rows:
        if row.phase is Phase.BACKWARD:
            backward = backward.merged(row.metrics.own())
        else:
            forward = forward.merged(row.metrics.own())
            calls += row.calls
        where = row.module if row.module is not None else row.scope
        weight[where] = weight.get(where, 0.0) + row.metrics.self_cpu_us + row.metrics.self_device_us
    modules = tuple(sorted(weight, key=lambda m: -weight[m]))
    return LineStats(key[0], key[1], key[2], forward, backward, calls, modules)


def _sort_key(sort_by: str, has_device_time: bool) -> Callable[[LineStats], Any]:
    if sort_by == "name":
        return lambda r: (r.line is None, r.file, r.line or 0)
    if sort_by == "calls":
        return lambda r: -r.calls
    value = metric_sort_value(sort_by, has_device_time)
    return lambda r: -(value(r.forward) + value(r.backward))


__all__ = ["LINE_SORT_KEYS", "NO_LINE", "LineStats", "LineTable", "line_table", "parse_frame"]
