"""``layerscope.profile``: a context manager around ``torch.profiler.profile`` plus module scopes."""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerAction, ProfilerActivity

from layerscope.attribution.attribute import build_profile
from layerscope.capture import native
from layerscope.capture.compiled import (
    collecting_compile_info,
    is_compiled,
    known_graphs,
    should_collect,
    unwrap_compiled,
)
from layerscope.capture.flops import FlopCalculator
from layerscope.capture.kineto import table_from_kineto
from layerscope.capture.module_marks import ModuleMarks
from layerscope.capture.scopes import ModuleScopes
from layerscope.errors import CaptureError, LayerscopeWarning, UsageError
from layerscope.gcpause import gc_paused
from layerscope.model.profile import SCHEMA_VERSION, Profile

_ACTIVITY_NAMES: dict[str, ProfilerActivity] = {
    "cpu": ProfilerActivity.CPU,
    "cuda": ProfilerActivity.CUDA,
}
for _name in ("XPU", "MTIA", "PrivateUse1", "HPU"):
    if hasattr(ProfilerActivity, _name):
        _ACTIVITY_NAMES[_name.lower()] = getattr(ProfilerActivity, _name)

_active_lock = threading.Lock()
_active: list[profile] = []


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


def _check_options(model: Any, paths: Any, depth: Any, profiler_kwargs: Any) -> None:
    if model is not None and not isinstance(model, nn.Module):
        raise UsageError(f"model must be a torch.nn.Module or None, not {type(model).__name__}")
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
        raise UsageError(f"depth must be a non-negative integer or None, not {depth!r}")
    if paths is not None and (isinstance(paths, str) or not all(isinstance(p, str) for p in paths)):
        raise UsageError("paths must be a list of qualified module paths such as ['layer1.0', 'fc']")
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


#: ``ls.profile(module_scopes=...)``: "auto" (marks when the native module is built) or "ranges".
MODULE_SCOPE_KINDS = ("auto", "ranges")


class profile:
    """Profile the enclosed block module by module, forward and backward.

    >>> with layerscope.profile(model, memory=True) as prof:
    ...     model(x).sum().backward()
    >>> print(prof.profile)

    Options: ``model`` (None hooks every module called in the block), ``activities`` (``"cpu"``,
    ``"cuda"``... or ``ProfilerActivity``; default CPU plus available accelerators), ``memory``,
    ``shapes``, ``flops`` (needs shapes, which it turns on), ``with_stack``, ``paths`` (only these
    module paths and their subtrees get rows), ``depth`` (deeper modules fold into their ancestor),
    ``all_threads`` (record every thread, not only the one that entered the block; default on
    unless ``memory``, since torch records no allocations in that mode), ``schedule``
    (``layerscope.schedule(...)`` or torch's; call ``prof.step()`` after each training step) with
    ``on_trace_ready`` (called with each finished :class:`Cycle`), ``profiler_kwargs``
    (passed to ``torch.profiler.profile``), ``module_scopes`` (``"auto"``: marks on torch's clock
    when the native module is built, else profiler ranges; ``"ranges"``: always profiler ranges,
    which torch's own tools on ``prof.torch_profiler`` see too).
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        activities: Iterable[str | ProfilerActivity] | str | None = None,
        memory: bool = False,
        shapes: bool = True,
        flops: bool = True,
        with_stack: bool = False,
        paths: Sequence[str] | None = None,
        depth: int | None = None,
        all_threads: bool | None = None,
        schedule: Callable[[int], Any] | None = None,
        on_trace_ready: Callable[[Cycle], Any] | None = None,
        profiler_kwargs: dict[str, Any] | None = None,
        module_scopes: str = "auto",
    ) -> None:
        _check_options(model, paths, depth, profiler_kwargs)
        if module_scopes not in MODULE_SCOPE_KINDS:
            raise UsageError(
                f"module_scopes must be one of {', '.join(MODULE_SCOPE_KINDS)}, not {module_scopes!r}"
            )
        self.module_scopes = module_scopes
        if schedule is not None and not callable(schedule):
            raise UsageError("schedule must be layerscope.schedule(...) or a torch.profiler.schedule")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise UsageError("on_trace_ready must be a callable taking a layerscope Cycle")
        self.schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.cycles: list[Cycle] = []
        self.step_count = 0
        self.model = model
        self.activities = parse_activities(activities)
        self.memory = bool(memory)
        self.shapes = bool(shapes)
        self.flops = bool(flops)
        self.with_stack = bool(with_stack)
        self.paths = list(paths) if paths is not None else None
        self.depth = depth
        self.profiler_kwargs = dict(profiler_kwargs or {})
        if all_threads and memory:
            # Measured on torch 2.13: with profile_all_threads on, no [memory] event is recorded.
            raise UsageError(
                "all_threads=True and memory=True cannot be combined: torch.profiler records "
                "no allocations when it profiles all threads; choose one"
            )
        want_all = (not memory) if all_threads is None else bool(all_threads)
        self.all_threads = want_all and _enable_all_threads(self.profiler_kwargs)
        self._torch_profiler: torch.profiler.profile | None = None
        self._scopes: ModuleScopes | None = None
        self._marks: ModuleMarks | None = None
        self._scope_kinds = "ranges"  # what meta["module_scopes"] reports
        self._profile: Profile | None = None
        self._trace: dict[str, Any] | None = None
        self._catalog: list[Any] | None = None
        self._wall_ns = 0
        self._started_ns = 0
        self._finished = False
        self._compile_info = ExitStack()

    # ----- context manager -------------------------------------------------------------------------
    def __enter__(self) -> profile:
        with _active_lock:
            if _active:
                raise CaptureError(
                    "layerscope.profile is already active; profiling blocks cannot be "
                    "nested (end the outer block first)"
                )
            if self._torch_profiler is not None:
                raise CaptureError("this layerscope.profile object was already used; create a new one")
            if torch._C._autograd._profiler_enabled():
                # torch would start no second session and, on exit, stop the running one.
                raise CaptureError(
                    "another torch.profiler session is already running; end it before "
                    "layerscope.profile (or use layerscope's own torch_profiler)"
                )
            _active.append(self)
        try:
            cycle_kwargs: dict[str, Any] = {}
            if self.schedule is not None or self.on_trace_ready is not None:
                cycle_kwargs["on_trace_ready"] = self._cycle_ready
            # torch marks ProfilerStep#N ranges only under a schedule: without one, "always record"
            # keeps prof.step() meaningful (per-step statistics) and changes nothing else.
            cycle_kwargs["schedule"] = self.schedule if self.schedule is not None else _always_record
            self._torch_profiler = torch.profiler.profile(
                **cycle_kwargs,
                activities=self.activities,
                record_shapes=self.shapes or self.flops,
                profile_memory=self.memory,
                with_stack=self.with_stack,
                **self.profiler_kwargs,
            )
            self._marks = self._module_marks()
            self._scopes = ModuleScopes(self.model, self.paths, self.depth, marks=self._marks)
            if should_collect() or is_compiled(self.model):
                self._compile_info.enter_context(collecting_compile_info())
            with _quiet_cycle_warning():
                self._torch_profiler.__enter__()  # type: ignore[no-untyped-call]
            try:
                if self._marks is not None:
                    self._marks.start()
                self._scopes.install()
                self._scope_kinds = self._scopes.scope_kinds()
            except BaseException:
                if self._marks is not None:
                    self._marks.stop()
                self._torch_profiler.__exit__(None, None, None)  # type: ignore[no-untyped-call]
                raise
        except BaseException as exc:
            if self._scopes is not None:
                self._scopes.remove()
            self._compile_info.close()
            _release(self)
            if isinstance(exc, TypeError):
                raise UsageError(f"torch.profiler.profile rejected the options: {exc}") from exc
            raise
        self._started_ns = time.perf_counter_ns()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._wall_ns = time.perf_counter_ns() - self._started_ns
        try:
            assert self._scopes is not None and self._torch_profiler is not None
            try:
                self._scopes.remove()
            finally:
                try:
                    if self._marks is not None:
                        self._marks.stop()
                finally:
                    try:
                        self._torch_profiler.__exit__(exc_type, exc, tb)  # type: ignore[no-untyped-call]
                    finally:
                        self._compile_info.close()
            self._catalog = self._scopes.catalog()
        finally:
            self._finished = True
            _release(self)

    def _module_marks(self) -> ModuleMarks | None:
        """Marks for module scopes where they can serve: the native module is built, a model is
        given (global mode uses hooks), and the block is one cycle (under a schedule, torch drops the
        events of steps it does not record, and each cycle's trace goes out through torch's own
        exporters, which would not carry the marks). ``module_scopes="ranges"`` or
        ``LAYERSCOPE_MODULE_MARKS=0`` turns them off."""
        if self.module_scopes == "ranges" or self.model is None:
            return None
        if self.schedule is not None or self.on_trace_ready is not None:
            return None
        if native.turned_off("LAYERSCOPE_MODULE_MARKS"):
            return None
        if not sys.platform.startswith("linux"):
            return None  # the OS thread ids of exported traces are read on Linux only
        module = native.load()
        if module is None:
            return None
        if not hasattr(torch._C._autograd._KinetoEvent, "activity_type"):
            return None  # torch < 2.5: no native reader, and its traces' time base is not checked
        return ModuleMarks(module)

    # ----- steps and cycles ------------------------------------------------------------------------
    def step(self) -> None:
        """Mark the end of a training step (drives the schedule, like torch.profiler's ``step``)."""
        if self._finished or self._torch_profiler is None:
            raise CaptureError("prof.step() belongs inside the `with layerscope.profile(...)` block")
        with _quiet_cycle_warning():
            self.torch_profiler.step()
        self.step_count += 1

    def step_before_next_top_level_call(self) -> None:
        """End the current step just before the next top-level module call (global mode only).

        For hooks that fire inside a profiler range (an optimizer step post-hook runs inside torch's
        ``Optimizer.step#...`` range): stepping there would cut that range across two steps.
        Several requests before the next call end one step.
        """
        assert self._scopes is not None, "only inside the profiling block"
        scopes = self._scopes

        def fire() -> None:
            scopes.before_top_level_call = None
            self.step()

        scopes.before_top_level_call = fire

    def flush_pending_step(self) -> bool:
        """End a step requested by :meth:`step_before_next_top_level_call` now; True if there was one."""
        if self._scopes is None or self._scopes.before_top_level_call is None:
            return False
        self._scopes.before_top_level_call()
        return True

    def action(self, step: int | None = None) -> str:
        """What the schedule does at ``step`` (default: the current one): ``wait``, ``warmup``,
        ``record`` or ``record_and_save`` (``record`` when there is no schedule)."""
        if self.schedule is None:
            return "record"
        value = self.schedule(self.step_count if step is None else step)
        return {"NONE": "wait"}.get(getattr(value, "name", str(value)), getattr(value, "name", "").lower())

    def _cycle_ready(self, tp: torch.profiler.profile) -> None:
        """torch's on_trace_ready: one cycle's results are in; build its Profile, call the handler."""
        assert self._scopes is not None
        catalog = self._scopes.catalog()
        with gc_paused():
            profile = self._build_from(tp, catalog, cycle=len(self.cycles))
        cycle = Cycle(index=len(self.cycles), profile=profile, torch_profiler=tp)
        self.cycles.append(cycle)
        if self.on_trace_ready is not None:
            self.on_trace_ready(cycle)

    # ----- exports -----------------------------------------------------------------------------------
    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write the run's Chrome/Perfetto trace (``.json`` or ``.json.gz``) with a "modules (backward)"
        track showing where each module's backward ran. Unlike torch's, it can be called again."""
        import tempfile

        import orjson

        from layerscope.render.chrome import with_backward_tracks, write_trace

        if not self._finished:
            raise CaptureError("export the trace after the `with layerscope.profile(...)` block")
        if self._trace is None:
            handle, tmp = tempfile.mkstemp(suffix=".json")
            os.close(handle)
            try:
                self.torch_profiler.export_chrome_trace(tmp)
                trace = orjson.loads(Path(tmp).read_bytes())
                if self._marks is not None:  # module calls as the ranges torch would have written
                    base = int(trace.get("baseTimeNanoseconds", 0))
                    cpu_kinds = ("cpu_op", "user_annotation")
                    threads = {e.get("tid") for e in trace["traceEvents"] if e.get("cat") in cpu_kinds}
                    marked = self._marks.trace_events(base, {t for t in threads if isinstance(t, int)})
                    trace["traceEvents"] = [*trace["traceEvents"], *marked]
                self._trace = with_backward_tracks(trace)
                graphs = known_graphs()
                if graphs and self._catalog:
                    # What `analyze` needs to place compiled kernels in modules without ranges; first
                    # in the file, where the block reader reads the header (before traceEvents).
                    own = {
                        "compiled_graphs": graphs,
                        "modules": [[info.path, info.type_name] for info in self._catalog],
                    }
                    self._trace = {"layerscope": own, **self._trace}
            finally:
                os.unlink(tmp)
        return write_trace(self._trace, Path(path))

    # ----- results -----------------------------------------------------------------------------------
    @property
    def torch_profiler(self) -> torch.profiler.profile:
        """The underlying ``torch.profiler.profile`` (for anything torch offers directly)."""
        if self._torch_profiler is None:
            raise CaptureError("the profiling block has not started yet")
        return self._torch_profiler

    @property
    def profile(self) -> Profile:
        """The Profile of the block, built on first access (after the block ended)."""
        if not self._finished:
            raise CaptureError("the profile is available after the `with layerscope.profile(...)` block")
        if self.schedule is not None or self.on_trace_ready is not None:
            if not self.cycles:
                raise CaptureError("no profiling cycle completed (the schedule reached no active step)")
            return self.cycles[-1].profile
        if self._profile is None:
            with gc_paused():
                self._profile = self._build_from(self.torch_profiler, self._catalog, cycle=None)
        return self._profile

    def _build_from(
        self, tp: torch.profiler.profile, catalog: list[Any] | None, cycle: int | None
    ) -> Profile:
        results = tp.profiler.kineto_results if tp.profiler is not None else None
        if results is None:
            raise CaptureError("torch.profiler recorded no results")
        calculator = FlopCalculator() if self.flops else None
        cpu_only = (
            self.activities == [ProfilerActivity.CPU]
            and not self.with_stack
            and not torch.cuda.is_available()
        )
        table = table_from_kineto(results, calculator, shapes=self.shapes, cpu_only=cpu_only)
        if self._marks is not None:
            self._marks.add_to(table)
        meta = self._meta()
        meta["reader"] = table.meta["reader"]
        meta["module_scopes"] = self._scope_kinds
        if self._marks is not None and self._marks.unmatched:  # calls still running at the end
            meta["unmatched_module_marks"] = self._marks.unmatched
        if table.meta.get("undecodable_names"):
            meta["undecodable_names"] = table.meta["undecodable_names"]
        if cycle is not None:
            meta["cycle"] = cycle
        profile = build_profile(table, catalog, meta, compiled_graphs=known_graphs())
        compiled = profile.meta.get("compiled")
        if compiled and compiled["mapped_graph_calls"] < compiled["graph_calls"]:
            unmapped = compiled["graph_calls"] - compiled["mapped_graph_calls"]
            note = (
                f"{unmapped} of {compiled['graph_calls']} compiled graph calls ran code compiled before "
                "layerscope could watch, so their kernels stay with the compiled module; make the first "
                "call of the compiled model inside layerscope.profile(...) or layerscope.compile_info() "
                "to see the modules inside"
            )
            compiled["note"] = note
            warnings.warn(note, CompileInfoWarning, stacklevel=3)
        return profile

    def _meta(self) -> dict[str, Any]:
        from layerscope.version import __version__

        model_type = type(unwrap_compiled(self.model)).__name__ if self.model is not None else None
        devices: list[dict[str, Any]] = []
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                devices.append({"index": i, "name": props.name, "total_memory": int(props.total_memory)})
        return {
            "schema_version": SCHEMA_VERSION,
            "layerscope_version": __version__,
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "source": "live",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": model_type,
            "distributed": distributed_info(),
            "block_us": self._wall_ns / 1000.0,
            "devices": devices,
            "options": {
                "activities": [str(a).rsplit(".", 1)[-1].lower() for a in self.activities],
                "memory": self.memory,
                "shapes": self.shapes,
                "flops": self.flops,
                "with_stack": self.with_stack,
                "paths": self.paths,
                "depth": self.depth,
                "all_threads": self.all_threads,
            },
        }


class CompileInfoWarning(LayerscopeWarning):
    """Compiled code ran whose kernels layerscope cannot place in modules (it compiled unwatched)."""


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


def distributed_info() -> dict[str, Any] | None:
    """rank, world size and backend of a torch.distributed job (or torchrun's environment)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return {
            "rank": int(dist.get_rank()),
            "world_size": int(dist.get_world_size()),
            "backend": str(dist.get_backend()),
        }
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        try:
            return {
                "rank": int(os.environ["RANK"]),
                "world_size": int(os.environ["WORLD_SIZE"]),
                "backend": None,
            }
        except ValueError:
            return None
    return None


def _always_record(step: int) -> ProfilerAction:
    """The schedule of an unscheduled block: every step is recorded."""
    return torch.profiler.ProfilerAction.RECORD


@contextmanager
def _quiet_cycle_warning() -> Iterator[None]:
    """torch warns that a schedule clears events between cycles: that is what we want (each cycle
    becomes its own Profile), so the warning would only confuse."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle.*")
        yield


@dataclass
class Cycle:
    """One finished profiling cycle (a schedule's active steps, or the whole block), as handed to
    ``on_trace_ready``."""

    index: int
    profile: Profile
    torch_profiler: torch.profiler.profile

    @property
    def steps(self) -> tuple[int, int] | None:
        """(first, last) step number recorded in this cycle, or None without steps."""
        if not self.profile.steps:
            return None
        return self.profile.steps[0].step, self.profile.steps[-1].step

    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write this cycle's Chrome trace (``.json`` or ``.json.gz``). Valid inside the handler only:
        torch reuses its profiler for the next cycle."""
        target = Path(path)
        self.torch_profiler.export_chrome_trace(str(target))
        return target


def _release(session: profile) -> None:
    with _active_lock:
        if session in _active:
            _active.remove(session)
