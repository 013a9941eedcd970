"""``layerscope.profile``: the lifecycle of a profiling block (start, steps, cycles, stop).

What happens before the block is decided elsewhere (``options.py`` checks the arguments,
``scope_plan.py`` decides each module's scope) and what happens after torch stops belongs to
``recording.py``. This module starts and stops things, through one ``ExitStack`` that undoes
whatever was started, in reverse order, whatever goes wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerAction, ProfilerActivity

from layerscope.capture import native
from layerscope.capture.block_error import block_error
from layerscope.capture.call_lines import CallLineRecorder, start_call_lines
from layerscope.capture.compile_watch import collecting_compile_info, should_collect
from layerscope.capture.compiled_modules import is_compiled, unwrap_compiled
from layerscope.capture.memory_watch import MemoryWatch
from layerscope.capture.module_marks import ModuleMarks
from layerscope.capture.nvtx_ranges import start_nvtx_ranges
from layerscope.capture.one_session import claim, release
from layerscope.capture.options import (
    MODULE_SCOPE_KINDS,
    CaptureOptions,
    check_options,
    parse_activities,
)
from layerscope.capture.recording import CompileInfoWarning, Cycle, Recording, RecordingContext
from layerscope.capture.scope_plan import ScopePlan, marks_blocker, plan_scopes
from layerscope.capture.scopes import ModuleScopes
from layerscope.capture.torch_session import always_record, break_action_cycle, quiet_cycle_warning, weakly
from layerscope.errors import CaptureError, UsageError
from layerscope.model.profile import Profile

__all__ = ["MODULE_SCOPE_KINDS", "CompileInfoWarning", "Cycle", "parse_activities", "profile"]


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
    which torch's own tools on ``prof.torch_profiler`` see too; ``"hooks"``: per-module hooks
    instead of class wrappers; default ``$LAYERSCOPE_MODULE_SCOPES``, else ``"auto"``), ``lines``
    (the line that called each op: ``Profile.lines()``), ``nvtx`` (NVTX ranges by module path).

    Outside a ``with`` block, :meth:`start` and :meth:`stop` do the same (``is_running`` tells).
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
        module_scopes: str | None = None,
        lines: bool = False,
        nvtx: bool = False,
    ) -> None:
        self.options: CaptureOptions = check_options(
            model,
            activities=activities,
            memory=memory,
            shapes=shapes,
            flops=flops,
            with_stack=with_stack,
            paths=paths,
            depth=depth,
            all_threads=all_threads,
            profiler_kwargs=profiler_kwargs,
            module_scopes=module_scopes,
            lines=lines,
            nvtx=nvtx,
        )
        if schedule is not None and not callable(schedule):
            raise UsageError("schedule must be layerscope.schedule(...) or a torch.profiler.schedule")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise UsageError("on_trace_ready must be a callable taking a layerscope Cycle")
        self.model = model
        self.schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.cycles: list[Cycle] = []
        self.step_count = 0
        self._torch_profiler: torch.profiler.profile | None = None
        self._scopes: ModuleScopes | None = None
        self._marks: ModuleMarks | None = None
        self._lines: CallLineRecorder | None = None
        self._watch: MemoryWatch | None = None
        self._block_error: dict[str, Any] | None = None
        self._plan: ScopePlan | None = None
        self._recording: Recording | None = None
        self._context: RecordingContext | None = None
        self._stack = ExitStack()
        self._started_ns = 0
        self._wall_ns = 0
        self._finished = False

    # ----- options users read back ---------------------------------------------------------------
    @property
    def module_scopes(self) -> str:
        """The ``module_scopes`` option in force (``auto``, ``ranges`` or ``hooks``)."""
        return self.options.module_scopes

    @property
    def profiler_kwargs(self) -> dict[str, Any]:
        """The extra ``torch.profiler.profile`` arguments (layerscope adds ``experimental_config``)."""
        return self.options.profiler_kwargs

    @property
    def all_threads(self) -> bool:
        """Whether torch records every thread."""
        return self.options.all_threads

    @property
    def scheduled(self) -> bool:
        """Whether the block runs in cycles (a schedule or an ``on_trace_ready`` handler)."""
        return self.schedule is not None or self.on_trace_ready is not None

    # ----- lifecycle -----------------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._torch_profiler is not None and not self._finished

    def __enter__(self) -> profile:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.is_running:  # the block may have called stop() itself
            self._stop(exc_type, exc, tb)

    def start(self) -> profile:
        """Start profiling: torch.profiler, then the module scopes (undone by :meth:`stop`)."""
        claim(self, already_used=self._torch_profiler is not None or self._finished)
        stack = self._stack
        stack.callback(release, self)
        try:
            self._torch_profiler = self._make_torch_profiler()
            plan = self._plan = plan_scopes(
                self.model,
                self.options.selection,
                self.options.module_scopes,
                marks_blocker(self.options.module_scopes, self.model is None, self.scheduled),
            )
            module = native.load() if plan.marks else None
            self._marks = ModuleMarks(module) if module is not None else None
            self._scopes = ModuleScopes(plan, self.options.selection, self._marks)
            self._watch = MemoryWatch.prepare(self.model) if self.options.memory else None
            if should_collect() or is_compiled(self.model):
                stack.enter_context(collecting_compile_info())
            with quiet_cycle_warning():
                self._torch_profiler.__enter__()  # type: ignore[no-untyped-call]
            stack.callback(break_action_cycle, self._torch_profiler)  # runs after __exit__
            stack.callback(self._torch_profiler.__exit__, None, None, None)
            if self._marks is not None:
                stack.callback(self._marks.stop)  # safe on a session that never started
                self._marks.start()
            if self.options.lines:
                self._lines = start_call_lines(stack, self.action())
            stack.callback(self._scopes.remove)
            self._follow_schedule_with_scopes()
            if self.options.nvtx:
                start_nvtx_ranges(self.model, stack)
            if self._watch is not None:
                self._watch.start(self._marks, stack, recording=self.action().startswith("record"))
        except BaseException:
            self._finished = True
            stack.close()
            raise
        self._started_ns = time.perf_counter_ns()
        return self

    def _make_torch_profiler(self) -> torch.profiler.profile:
        cycle_kwargs: dict[str, Any] = {}
        if self.scheduled:
            # torch's profiler holds itself in a cycle (its action map of bound methods): a weak
            # reference keeps this session, and the model, out of it.
            cycle_kwargs["on_trace_ready"] = weakly(self._cycle_ready)
        # torch marks ProfilerStep#N ranges only under a schedule: without one, "always record"
        # keeps prof.step() meaningful (per-step statistics) and changes nothing else.
        cycle_kwargs["schedule"] = self.schedule if self.schedule is not None else always_record
        try:
            return torch.profiler.profile(**cycle_kwargs, **self.options.torch_kwargs())
        except TypeError as exc:
            raise UsageError(f"torch.profiler.profile rejected the options: {exc}") from exc

    def stop(self) -> None:
        """Stop profiling: remove every scope, stop the marks and torch.profiler (in that order)."""
        if not self.is_running:
            raise CaptureError("this layerscope.profile is not running (start() it first)")
        self._stop(None, None, None)

    def _stop(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Undo what :meth:`start` did; the block's exception (if any) is handed to the ExitStack, so
        a failing clean-up step chains it instead of hiding it."""
        self._wall_ns = time.perf_counter_ns() - self._started_ns
        if self._watch is not None:
            self._watch.snapshot_state("end")
        try:
            self._stack.__exit__(exc_type, exc, tb)
        finally:
            self._finished = True
            if exc is not None:
                self._block_error = block_error(exc, self.model)
            # what was recorded stays readable even when a clean-up step failed
            self._context = self._recording_context()
            self._watch = None  # it holds the optimizers: they must not outlive the user's

    def _recording_context(self) -> RecordingContext:
        assert self._scopes is not None and self._plan is not None
        model_type = type(unwrap_compiled(self.model)).__name__ if self.model is not None else None
        return RecordingContext(
            options=self.options,
            plan=self._plan,
            catalog=self._scopes.catalog(),
            called_modules=self._scopes.called_modules(),
            model_type=model_type,
            marks=self._marks,
            call_lines=self._lines.take() if self._lines is not None else None,
            snapshots=self._watch.take() if self._watch is not None else None,
            watch_errors=list(self._watch.errors) if self._watch is not None else [],
            block_error=self._block_error,
        )

    # ----- steps and cycles ------------------------------------------------------------------------
    def step(self) -> None:
        """Mark the end of a training step (drives the schedule, like torch.profiler's ``step``)."""
        if not self.is_running:
            raise CaptureError("prof.step() belongs inside the `with layerscope.profile(...)` block")
        watch = self._watch
        before = self.action() if watch is not None else ""
        if watch is not None:
            watch.before_step(before)
        with quiet_cycle_warning():
            self.torch_profiler.step()
        self.step_count += 1
        self._follow_schedule_with_scopes()
        if self._lines is not None:
            self._lines.follow(self.action())
        if watch is not None:
            watch.after_step(before, self.action())

    def _follow_schedule_with_scopes(self) -> None:
        """Scopes are installed only on steps torch.profiler records or warms up: on ``wait`` steps
        (and after the schedule's last cycle) no class is patched and no hook runs, so a long job
        profiled every N steps runs as it would without us in between. Global mode keeps torch's
        global hooks: they drive the deferred steps of ``layerscope run`` and patch no class."""
        assert self._scopes is not None and self._torch_profiler is not None
        # torch's own current action: calling the user's schedule again could consume their RNG
        current = getattr(self._torch_profiler, "current_action", None)
        waiting = current == ProfilerAction.NONE and not self._scopes.plan.global_mode
        if waiting and self._scopes.installed:
            self._scopes.remove()
        elif not waiting and not self._scopes.installed:
            self._scopes.install()

    def step_before_next_top_level_call(self, then: Callable[[], None] | None = None) -> None:
        """End the current step just before the next top-level module call (global mode only).

        For hooks that fire inside a profiler range (an optimizer step post-hook runs inside torch's
        ``Optimizer.step#...`` range): stepping there would cut that range across two steps.
        Several requests before the next call end one step. ``then`` runs right after that step, at
        the same point, outside every range: it may :meth:`stop` the session (the module call then
        runs unprofiled).
        """
        assert self._scopes is not None, "only inside the profiling block"
        scopes = self._scopes

        def fire() -> None:
            scopes.before_top_level_call = None
            self.step()
            if then is not None:
                then()

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
        block_us = self._wall_ns / 1000.0  # set when the last cycle ends with the block
        recording = Recording(tp, self._recording_context(), block_us=block_us, cycle=len(self.cycles))
        recording.build()  # now: torch reuses its profiler for the next cycle
        cycle = Cycle(index=len(self.cycles), recording=recording)
        self.cycles.append(cycle)
        if self.on_trace_ready is not None:
            self.on_trace_ready(cycle)

    # ----- results -----------------------------------------------------------------------------------
    @property
    def torch_profiler(self) -> torch.profiler.profile:
        """The underlying ``torch.profiler.profile`` (for anything torch offers directly)."""
        if self._torch_profiler is None:
            raise CaptureError("the profiling block has not started yet")
        return self._torch_profiler

    @property
    def recording(self) -> Recording:
        """The block's recording (the last cycle's under a schedule), after the block ended."""
        if not self._finished:
            raise CaptureError("the profile is available after the `with layerscope.profile(...)` block")
        if self.scheduled:
            if not self.cycles:
                raise CaptureError("no profiling cycle completed (the schedule reached no active step)")
            return self.cycles[-1].recording
        if self._context is None:  # start() failed before the scopes existed
            raise CaptureError("this layerscope.profile never started, so it recorded nothing")
        if self._recording is None:
            self._recording = Recording(self.torch_profiler, self._context, block_us=self._wall_ns / 1000.0)
        return self._recording

    @property
    def profile(self) -> Profile:
        """The Profile of the block (the last cycle's under a schedule), built on first access."""
        return self.recording.profile

    @property
    def scope_plan(self) -> ScopePlan:
        """How each module's calls are scoped, and why (decided when the block starts)."""
        if self._plan is None:
            raise CaptureError("the scope plan is made when the block starts")
        return self._plan

    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write the run's Chrome/Perfetto trace (``.json`` or ``.json.gz``) with module calls, a
        "modules (backward)" track and what ``analyze`` needs for compiled models. Unlike torch's, it
        can be called again."""
        if not self._finished:
            raise CaptureError("export the trace after the `with layerscope.profile(...)` block")
        return self.recording.export_chrome_trace(path)
