"""Flame-graph weights: a Profile's self figures per stack of frames (module frames, or the ops'
Python call stacks), what collapsed-stack files and flame graphs draw; and the user's frames of
every op row, computed once per distinct stack."""

from __future__ import annotations

from collections.abc import Sequence

from layerscope.attribution.stacks import user_frames
from layerscope.errors import UsageError
from layerscope.model.metrics import Metrics
from layerscope.model.profile import Phase, Profile

#: Metrics a collapsed-stack export can weigh frames by (their self figure is used).
STACK_METRICS = ("cpu_us", "device_us", "cpu_alloc_bytes", "device_alloc_bytes", "flops")
#: What a flame graph's frames are: the module tree, or the ops' Python call stacks.
FRAME_KINDS = ("modules", "source")


def op_user_stacks(profile: Profile, internal_frames: bool = False) -> tuple[tuple[str, ...], ...]:
    """Each op row's frames worth showing (innermost first; the user's unless ``internal_frames``),
    aligned with ``profile.op_rows``; each distinct stack is filtered once."""
    seen: dict[tuple[str, ...], tuple[str, ...]] = {}
    out = []
    for row in profile.op_rows:
        frames = seen.get(row.stack)
        if frames is None:
            frames = seen[row.stack] = user_frames(row.stack, internal_frames)
        out.append(frames)
    return tuple(out)


def stack_values(
    profile: Profile,
    metric: str = "cpu_us",
    frames_of: str = "modules",
    internal_frames: bool = False,
    user_stacks: Sequence[tuple[str, ...]] | None = None,
) -> dict[tuple[str, ...], float]:
    """Stack (frames from the root down, ending in an op or ``[python]``) -> the metric's self value.

    ``frames_of="modules"``: module frames from the root down, then the op; a module's own Python
    time as ``[python]``; backward work under a ``[backward]`` root, unattributed work under
    ``[unattributed]``. ``frames_of="source"``: the op's Python call stack (``with_stack``), outermost
    frame first, the user's frames only unless ``internal_frames``; backward ops under
    ``[backward]``, ops without a stack under ``[no stack]``. Source stacks weigh ops only;
    ``user_stacks`` (from :func:`op_user_stacks`) saves computing the user's frames again."""
    if metric not in STACK_METRICS:
        raise UsageError(f"cannot weigh stacks by {metric!r}; choose from {', '.join(STACK_METRICS)}")
    if frames_of not in FRAME_KINDS:
        raise UsageError(f"unknown frames {frames_of!r}; choose from {', '.join(FRAME_KINDS)}")
    self_field = f"self_{metric}"
    if frames_of == "source":
        return _source_stack_values(profile, self_field, internal_frames, user_stacks)
    root_name = profile.root.type_name or "(root)"
    frames: dict[str, list[str]] = {}
    for node in profile.modules():
        frames[node.path] = [root_name, *(node.path.split(".") if node.path else [])]
    values: dict[tuple[str, ...], float] = {}

    def add(stack: list[str], value: float) -> None:
        if value > 0:
            key = tuple(stack)
            values[key] = values.get(key, 0.0) + value

    op_self: dict[tuple[str, Phase], float] = {}
    label_self: dict[tuple[str, Phase | None], float] = {}
    for row in profile.op_rows:
        value = float(getattr(row.metrics, self_field))
        if row.module is not None and row.phase is not None:
            op_self[(row.module, row.phase)] = op_self.get((row.module, row.phase), 0.0) + value
            prefix = ["[backward]"] if row.phase is Phase.BACKWARD else []
            add([*prefix, *frames.get(row.module, [root_name, row.module]), row.name], value)
        else:
            label_self[(row.scope, row.phase)] = label_self.get((row.scope, row.phase), 0.0) + value
            add(["[unattributed]", row.scope or "(other)", row.name], value)
    if metric == "cpu_us":  # time in a module or an unattributed entry that no op covers
        for entry in profile.unattributed:
            rest = entry.metrics.self_cpu_us - label_self.get((entry.label, entry.phase), 0.0)
            add(["[unattributed]", entry.label, "[python]"], rest)
        for node in profile.modules():
            for phase in (Phase.FORWARD, Phase.BACKWARD):
                metrics: Metrics = node.backward if phase is Phase.BACKWARD else node.forward
                rest = float(getattr(metrics, self_field)) - op_self.get((node.path, phase), 0.0)
                prefix = ["[backward]"] if phase is Phase.BACKWARD else []
                add([*prefix, *frames[node.path], "[python]"], rest)
    return values


def _source_stack_values(
    profile: Profile,
    self_field: str,
    internal_frames: bool,
    user_stacks: Sequence[tuple[str, ...]] | None,
) -> dict[tuple[str, ...], float]:
    if user_stacks is None:
        user_stacks = op_user_stacks(profile, internal_frames)
    values: dict[tuple[str, ...], float] = {}
    for row, frames in zip(profile.op_rows, user_stacks, strict=True):
        value = float(getattr(row.metrics, self_field))
        if value <= 0:
            continue
        stack = [*reversed(frames)] if frames else ["[no stack]"]
        if row.phase is Phase.BACKWARD:
            stack.insert(0, "[backward]")
        key = (*stack, row.name)
        values[key] = values.get(key, 0.0) + value
    return values


__all__ = ["FRAME_KINDS", "STACK_METRICS", "op_user_stacks", "stack_values"]
