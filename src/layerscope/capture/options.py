"""The options of ``ls.profile``, checked once into a frozen :class:`CaptureOptions`: what to record,
which modules, how to scope them, the schedule. Nothing downstream checks an option again."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity

from layerscope.capture.nvtx_ranges import check_nvtx_available
from layerscope.errors import UsageError
from layerscope.model.meta import SavedOptions

_ACTIVITY_NAMES: dict[str, ProfilerActivity] = {
    "cpu": ProfilerActivity.CPU,
    "cuda": ProfilerActivity.CUDA,
}
for _name in ("XPU", "MTIA", "PrivateUse1", "HPU"):
    if hasattr(ProfilerActivity, _name):
        _ACTIVITY_NAMES[_name.lower()] = getattr(ProfilerActivity, _name)

#: ``ls.profile(module_scopes=...)``: ``auto`` (marks on torch's clock where the native module can
#: serve, else profiler ranges), ``ranges`` (always profiler ranges, which torch's own tools see too),
#: ``hooks`` (forward hooks on every module instead of class wrappers: slower, for comparison).
MODULE_SCOPE_KINDS = ("auto", "ranges", "hooks")

#: The environment variable that gives ``module_scopes`` its default.
MODULE_SCOPES_VARIABLE = "LAYERSCOPE_MODULE_SCOPES"


def parse_activities(activities: Iterable[str | ProfilerActivity] | str | None) -> list[ProfilerActivity]:
    """Turn user activity names (or ProfilerActivity members) into ProfilerActivity; the default is
    CPU plus every accelerator torch reports as available."""
    if activities is None:
        chosen = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            chosen.append(ProfilerActivity.CUDA)
        xpu = getattr(torch, "xpu", None)
        if xpu is not None and hasattr(ProfilerActivity, "XPU") and xpu.is_available():
            chosen.append(ProfilerActivity.XPU)
        return chosen
    if isinstance(activities, str | ProfilerActivity):
        activities = [activities]
    result: list[ProfilerActivity] = []
    for item in activities:
        if isinstance(item, ProfilerActivity):
            result.append(item)
            continue
        if not isinstance(item, str) or item.lower() not in _ACTIVITY_NAMES:
            raise UsageError(f"unknown activity {item!r}; choose from {', '.join(sorted(_ACTIVITY_NAMES))}")
        result.append(_ACTIVITY_NAMES[item.lower()])
    if not result:
        raise UsageError("activities is empty; choose at least one of " + ", ".join(sorted(_ACTIVITY_NAMES)))
    return list(dict.fromkeys(result))


def module_scopes_option(value: str | None) -> str:
    """``module_scopes`` as given, or its default from ``$LAYERSCOPE_MODULE_SCOPES`` (else ``auto``)."""
    source = "module_scopes"
    if value is None:
        value = os.environ.get(MODULE_SCOPES_VARIABLE, "auto").strip().lower() or "auto"
        source = f"${MODULE_SCOPES_VARIABLE}"
        if value == "auto" and _old_marks_switch_off():
            value = "ranges"
    if value not in MODULE_SCOPE_KINDS:
        raise UsageError(f"{source} must be one of {', '.join(MODULE_SCOPE_KINDS)}, not {value!r}")
    return value


def _old_marks_switch_off() -> bool:
    """``LAYERSCOPE_MODULE_MARKS=0`` (before 0.2) still means ranges, with a warning naming its successor."""
    if os.environ.get("LAYERSCOPE_MODULE_MARKS", "1").strip().lower() not in {"0", "false", "no", "off"}:
        return False
    warnings.warn(
        f"LAYERSCOPE_MODULE_MARKS=0 is deprecated: set {MODULE_SCOPES_VARIABLE}=ranges instead",
        DeprecationWarning,
        stacklevel=4,
    )
    return True


@dataclass(frozen=True)
class ModuleSelection:
    """Which module paths get rows: ``depth`` and ``paths`` fold the others into their ancestors."""

    paths: tuple[str, ...] | None = None
    depth: int | None = None

    def keeps(self, path: str) -> bool:
        """Whether ``path`` gets its own row (the root always does)."""
        return self.why_folded(path) is None

    def why_folded(self, path: str) -> str | None:
        """Why ``path`` gets no row of its own, or None when it gets one."""
        if path == "":
            return None
        if self.depth is not None and path.count(".") + 1 > self.depth:
            return f"folded into its ancestor (deeper than depth={self.depth})"
        if self.paths is None:
            return None
        if any(path == p or path.startswith(p + ".") or p.startswith(path + ".") for p in self.paths):
            return None
        return "folded into its ancestor (outside paths)"


@dataclass(frozen=True)
class CaptureOptions:
    """What one ``ls.profile`` records, checked once by :func:`check_options` when the session is
    made; immutable, so every part of capture reads the same decision."""

    activities: tuple[ProfilerActivity, ...]
    memory: bool
    shapes: bool
    flops: bool
    with_stack: bool
    selection: ModuleSelection
    all_threads: bool
    module_scopes: str
    #: Extra ``torch.profiler.profile`` arguments, ``experimental_config`` added for ``all_threads``.
    profiler_kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: Record the line of the user's code that called each op (``capture/call_lines.py``).
    lines: bool = False
    #: NVTX ranges by module for Nsight Systems (``capture/nvtx_ranges.py``).
    nvtx: bool = False
    #: ``layerscope.schedule(...)`` or torch's, else None (every step recorded).
    schedule: Callable[[int], Any] | None = None
    #: Called with each finished ``Cycle`` (a schedule's recorded steps).
    on_trace_ready: Callable[[Any], Any] | None = None
    #: Only CPU events can occur (the reader then skips the device columns).
    cpu_only: bool = False
    #: Input shapes come from layerscope's own callback, not torch's ``record_shapes`` (the flight
    #: recorder's detailed steps, which export no trace: ``capture/flight_shapes.py``).
    own_shapes: bool = False

    @property
    def scheduled(self) -> bool:
        """Whether the block runs in cycles (a schedule or an ``on_trace_ready`` handler)."""
        return self.schedule is not None or self.on_trace_ready is not None

    def torch_kwargs(self) -> dict[str, Any]:
        """The arguments of ``torch.profiler.profile`` these options stand for (no schedule)."""
        return {
            "activities": list(self.activities),
            "record_shapes": (self.shapes or self.flops) and not self.own_shapes,
            "profile_memory": self.memory,
            "with_stack": self.with_stack,
            **self.profiler_kwargs,
        }

    def saved(self) -> SavedOptions:
        """The options as a profile keeps them (``ProfileMeta.capture.options``)."""
        return SavedOptions(
            activities=tuple(str(a).rsplit(".", 1)[-1].lower() for a in self.activities),
            memory=self.memory,
            shapes=self.shapes,
            flops=self.flops,
            with_stack=self.with_stack,
            lines=self.lines,
            nvtx=self.nvtx,
            paths=tuple(self.selection.paths) if self.selection.paths is not None else None,
            depth=self.selection.depth,
            all_threads=self.all_threads,
        )


class OptionsReadBack:
    """The options a profile session was made with, read back through the session (deprecated:
    read ``prof.options``). ``prof.on_trace_ready`` stays: the integrations' docs read the files
    their handler wrote from it."""

    options: CaptureOptions

    @property
    def on_trace_ready(self) -> Callable[[Any], Any] | None:
        """The handler called with each finished ``Cycle``."""
        return self.options.on_trace_ready

    @property
    def schedule(self) -> Callable[[int], Any] | None:
        """Deprecated: ``prof.options.schedule``."""
        _read_back_deprecated("schedule")
        return self.options.schedule

    @property
    def module_scopes(self) -> str:
        """Deprecated: ``prof.options.module_scopes``."""
        _read_back_deprecated("module_scopes")
        return self.options.module_scopes

    @property
    def profiler_kwargs(self) -> dict[str, Any]:
        """Deprecated: ``prof.options.profiler_kwargs`` (a read-only mapping)."""
        _read_back_deprecated("profiler_kwargs")
        return dict(self.options.profiler_kwargs)

    @property
    def all_threads(self) -> bool:
        """Deprecated: ``prof.options.all_threads``."""
        _read_back_deprecated("all_threads")
        return self.options.all_threads

    @property
    def scheduled(self) -> bool:
        """Deprecated: ``prof.options.scheduled``."""
        _read_back_deprecated("scheduled")
        return self.options.scheduled


def _read_back_deprecated(name: str) -> None:
    warnings.warn(
        f"prof.{name} is deprecated and goes in 0.3: read prof.options.{name}",
        DeprecationWarning,
        stacklevel=3,
    )


def check_options(
    model: Any,
    *,
    activities: Iterable[str | ProfilerActivity] | str | None,
    memory: bool,
    shapes: bool,
    flops: bool,
    with_stack: bool,
    paths: Sequence[str] | None,
    depth: int | None,
    all_threads: bool | None,
    profiler_kwargs: dict[str, Any] | None,
    module_scopes: str | None,
    lines: bool = False,
    nvtx: bool = False,
    schedule: Callable[[int], Any] | None = None,
    on_trace_ready: Callable[[Any], Any] | None = None,
) -> CaptureOptions:
    """Check ``ls.profile``'s arguments (a one-line :class:`UsageError` naming the first bad one,
    and the choices where there are a few) and return them as :class:`CaptureOptions`."""
    if model is not None and not isinstance(model, nn.Module):
        raise UsageError(f"model must be a torch.nn.Module or None, not {type(model).__name__}")
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
        raise UsageError(f"depth must be a non-negative integer or None, not {depth!r}")
    if paths is not None and (isinstance(paths, str) or not all(isinstance(p, str) for p in paths)):
        raise UsageError("paths must be a list of qualified module paths such as ['layer1.0', 'fc']")
    _check_profiler_kwargs(profiler_kwargs)
    _check_callables(schedule, on_trace_ready)
    if nvtx:
        check_nvtx_available()
    kwargs = dict(profiler_kwargs or {})
    if all_threads and memory:
        # torch records no [memory] event while it profiles all threads (docs/architecture.md).
        raise UsageError(
            "all_threads=True and memory=True cannot be combined: torch.profiler records "
            "no allocations when it profiles all threads; choose one"
        )
    want_all = (not memory) if all_threads is None else bool(all_threads)
    chosen = tuple(parse_activities(activities))
    return CaptureOptions(
        activities=chosen,
        memory=bool(memory),
        shapes=bool(shapes),
        flops=bool(flops),
        with_stack=bool(with_stack),
        selection=ModuleSelection(tuple(paths) if paths is not None else None, depth),
        all_threads=want_all and _enable_all_threads(kwargs),
        module_scopes=module_scopes_option(module_scopes),
        profiler_kwargs=MappingProxyType(kwargs),
        lines=bool(lines),
        nvtx=bool(nvtx),
        schedule=schedule,
        on_trace_ready=on_trace_ready,
        cpu_only=chosen == (ProfilerActivity.CPU,) and not with_stack and not torch.cuda.is_available(),
    )


def _check_callables(schedule: Any, on_trace_ready: Any) -> None:
    if schedule is not None and not callable(schedule):
        raise UsageError("schedule must be layerscope.schedule(...) or a torch.profiler.schedule")
    if on_trace_ready is not None and not callable(on_trace_ready):
        raise UsageError("on_trace_ready must be a callable taking a layerscope Cycle")


def _check_profiler_kwargs(profiler_kwargs: Any) -> None:
    if profiler_kwargs is not None and not isinstance(profiler_kwargs, dict):
        raise UsageError("profiler_kwargs must be a dict of torch.profiler.profile arguments")
    reserved = {"activities", "record_shapes", "profile_memory", "with_stack", "with_flops"}
    clash = reserved & set(profiler_kwargs or {})
    if clash:
        raise UsageError(
            f"set {', '.join(sorted(clash))} through layerscope's own options, not profiler_kwargs"
        )
    own = {"schedule", "on_trace_ready"} & set(profiler_kwargs or {})
    if own:
        raise UsageError(
            f"pass {', '.join(sorted(own))} to layerscope.profile itself, not in profiler_kwargs "
            "(layerscope's handler receives a Cycle with its Profile)"
        )


def _enable_all_threads(profiler_kwargs: dict[str, Any]) -> bool:
    """Ask torch to record every thread (torch.profiler records only the entering thread by default).

    Sets ``experimental_config`` in ``profiler_kwargs`` unless the caller passed their own; returns
    whether all threads will be recorded.
    """
    if "experimental_config" in profiler_kwargs:
        return bool(getattr(profiler_kwargs["experimental_config"], "profile_all_threads", False))
    try:
        from torch._C._profiler import _ExperimentalConfig

        profiler_kwargs["experimental_config"] = _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):  # older torch: the option does not exist
        return False
    return True
