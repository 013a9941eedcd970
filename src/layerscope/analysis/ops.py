"""Operator tables: aggregate a Profile's op rows by any of name, input shapes, module, phase and
Python call stack (source location)."""

from __future__ import annotations

from collections.abc import Sequence

from layerscope.attribution.stacks import user_frames
from layerscope.errors import UsageError
from layerscope.model.profile import OpStats, OpTable, Phase, Profile
from layerscope.model.sort_keys import OP_SORT_KEYS, check_sort_key, metric_sort_value

GROUP_KEYS = ("name", "input_shapes", "module", "phase", "stack")
SORT_KEYS = OP_SORT_KEYS


def op_table(
    profile: Profile,
    sort_by: str = "self_cpu_us",
    group_by: Sequence[str] = ("name",),
    phase: Phase | str | None = None,
    module: str | None = None,
    limit: int | None = None,
    stack_depth: int | None = 5,
    internal_frames: bool = False,
) -> OpTable:
    """Aggregate op rows. Grouping keeps totals: the sum of any additive metric over the result
    equals the sum over the rows that pass the filters. Fields that differ inside a group become None.

    Grouping by ``"stack"`` (profiles recorded ``with_stack``) splits ops by source location: the
    ``stack_depth`` innermost frames of the user's code (None: all), frames inside torch and
    layerscope left out unless ``internal_frames``; each row's ``stack`` holds those frames."""
    if isinstance(group_by, str):
        group_by = (group_by,)
    bad = [g for g in group_by if g not in GROUP_KEYS]
    if bad:
        raise UsageError(f"cannot group ops by {bad[0]!r}; choose from {', '.join(GROUP_KEYS)}")
    sort_by = check_sort_key(sort_by, OP_SORT_KEYS, "ops")
    wanted_phase = _parse_phase(phase)
    if limit is not None and limit < 0:
        raise UsageError(f"limit must be >= 0, not {limit}")
    if stack_depth is not None and (
        not isinstance(stack_depth, int) or isinstance(stack_depth, bool) or stack_depth < 1
    ):
        raise UsageError(f"stack_depth must be a positive integer or None, not {stack_depth!r}")
    by_stack = "stack" in group_by
    shown: dict[tuple[str, ...], tuple[str, ...]] = {}  # a row's stack -> the frames grouped by
    groups: dict[tuple[object, ...], list[OpStats]] = {}
    for row in profile.op_rows:
        if wanted_phase is not None and row.phase is not wanted_phase:
            continue
        if module is not None and not in_subtree(row.module, module):
            continue
        if by_stack:
            frames = shown.get(row.stack)
            if frames is None:
                frames = shown[row.stack] = user_frames(row.stack, internal_frames, stack_depth)
            key = tuple(frames if g == "stack" else getattr(row, g) for g in group_by)
        else:
            key = tuple(getattr(row, g) for g in group_by)
        groups.setdefault(key, []).append(row)
    result = [_merge(rows, group_by, shown[rows[0].stack] if by_stack else ()) for rows in groups.values()]
    if sort_by == "name":
        result.sort(key=lambda r: r.name)
    elif sort_by == "calls":
        result.sort(key=lambda r: -r.calls)
    else:
        value = metric_sort_value(sort_by, profile.has_device_time)
        result.sort(key=lambda r: -value(r.metrics))
    return OpTable(result[:limit] if limit is not None else result)


def _parse_phase(phase: Phase | str | None) -> Phase | None:
    if phase is None or phase == "both":
        return None
    try:
        return Phase(phase)
    except ValueError:
        raise UsageError(f"unknown phase {phase!r}; choose from forward, backward, other, both") from None


def in_subtree(path: str | None, root: str) -> bool:
    """Whether module ``path`` lies in the subtree rooted at ``root`` (``""``: the whole tree)."""
    if path is None:
        return False
    return root == "" or path == root or path.startswith(root + ".")


def _merge(rows: list[OpStats], group_by: Sequence[str], stack: tuple[str, ...]) -> OpStats:
    first = rows[0]
    metrics = first.metrics
    for row in rows[1:]:
        metrics = metrics.merged(row.metrics)
    same = {
        field: all(getattr(r, field) == getattr(first, field) for r in rows)
        for field in ("name", "input_shapes", "module", "phase", "scope", "dtype")
    }
    moved = [r.bytes for r in rows]
    return OpStats(
        name=first.name if same["name"] else "(several)",
        phase=first.phase if same["phase"] else None,
        module=first.module if same["module"] else None,
        input_shapes=first.input_shapes if same["input_shapes"] else None,
        calls=sum(r.calls for r in rows),
        metrics=metrics if len(rows) > 1 else first.metrics,
        scope=first.scope if same["scope"] else "",
        stack=stack,
        bytes=None if None in moved else sum(b for b in moved if b is not None),
        dtype=first.dtype if same["dtype"] else None,
    )


__all__ = ["GROUP_KEYS", "SORT_KEYS", "OpTable", "op_table"]
