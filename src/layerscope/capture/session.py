"""``layerscope.profile``: the lifecycle of a profiling block (start, steps, cycles, stop).

Everything is decided before the block: ``options.py`` checks the arguments once into a frozen
``CaptureOptions`` (when the session is made), ``scope_plan.py`` decides each module's scope when it
starts. What runs beside torch is ``instruments.py``; what happens after torch stops belongs to
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

from layerscope.capture.block_error import block_error
from layerscope.capture.compile_watch import collecting_compile_info, should_collect
from layerscope.capture.compiled_modules import is_compiled
from layerscope.capture.instruments import Instruments
from layerscope.capture.one_session import claim, release
from layerscope.capture.options import (
    MODULE_SCOPE_KINDS,
    CaptureOptions,
    OptionsReadBack,
    check_options,
    parse_activities,
)
from layerscope.capture.recording import CompileInfoWarning, Cycle, Recording
from layerscope.capture.scope_plan import ScopePlan, plan_block
from layerscope.capture.torch_session import (
    break_action_cycle,
    current_action,
    make_torch_profiler,
    quiet_cycle_warning,
)
from layerscope.errors import CaptureError
from layerscope.model.meta import BlockError
from layerscope.model.profile import Profile

__all__ = ["MODULE_SCOPE_KINDS", "CompileInfoWarning", "Cycle", "parse_activities", "profile"]


class profile(OptionsReadBack):
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
        #: The checked options (frozen): everything below reads them, nothing checks them again.
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
            schedule=schedule,
            on_trace_ready=on_trace_ready,
        )
        self.model = model
        self.cycles: list[Cycle] = []
        self.step_count = 0
        self._torch_profiler: torch.profiler.profile | None = None
        self._plan: ScopePlan | None = None
        self._instruments: Instruments | None = None
        self._block_error: BlockError | None = None
        self._recording: Recording | None = None
        self._stack = ExitStack()
        self._started_ns = 0
        self._wall_ns = 0
        self._finished = False

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
            self._torch_profiler = make_torch_profiler(self.options, self._cycle_ready)
            self._plan = plan_block(self.model, self.options)  # the scope decision, made once
            instruments = self._instruments = Instruments.prepare(self.model, self.options, self._plan)
            if should_collect() or is_compiled(self.model):
                stack.enter_context(collecting_compile_info())
            with quiet_cycle_warning():
                self._torch_profiler.__enter__()  # type: ignore[no-untyped-call]
            stack.callback(break_action_cycle, self._torch_profiler)  # runs after __exit__
            stack.callback(self._torch_profiler.__exit__, None, None, None)
            instruments.start(stack, self.action())
        except BaseException:
            self._finished = True
            stack.close()
            raise
        self._started_ns = time.perf_counter_ns()
        return self

    def stop(self) -> None:
        """Stop profiling: remove every scope, stop the marks and torch.profiler (in that order)."""
        if not self.is_running:
            raise CaptureError("this layerscope.profile is not running (start() it first)")
        self._stop(None, None, None)

    def _stop(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Undo what :meth:`start` did; the block's exception (if any) is handed to the ExitStack, so
        a failing clean-up step chains it instead of hiding it. Then the block's recording ends."""
        self._wall_ns = time.perf_counter_ns() - self._started_ns
        instruments = self._instruments
        assert instruments is not None, "running: start() made them"
        instruments.block_ending()
        try:
            self._stack.__exit__(exc_type, exc, tb)
        finally:
            self._finished = True
            if exc is not None:
                self._block_error = block_error(exc, self.model)
            # what was recorded stays readable even when a clean-up step failed
            if not self.options.scheduled:  # a schedule's recordings end with its cycles
                context = instruments.end_recording(self._block_error)
                self._recording = Recording(self.torch_profiler, context, block_us=self._wall_ns / 1000.0)
            instruments.release_watch()

    # ----- steps and cycles ------------------------------------------------------------------------
    def step(self) -> None:
        """Mark the end of a training step (drives the schedule, like torch.profiler's ``step``)."""
        if not self.is_running:
            raise CaptureError("prof.step() belongs inside the `with layerscope.profile(...)` block")
        assert self._instruments is not None, "running: start() made them"
        before = self.action()
        self._instruments.before_step(before)
        with quiet_cycle_warning():
            self.torch_profiler.step()
        self.step_count += 1
        self._instruments.follow(before, self.action())

    def step_before_next_top_level_call(self, then: Callable[[], None] | None = None) -> None:
        """End the current step just before the next top-level module call (global mode only).

        For hooks that fire inside a profiler range (an optimizer step post-hook runs inside torch's
        ``Optimizer.step#...`` range): stepping there would cut that range across two steps.
        Several requests before the next call end one step. ``then`` runs right after that step, at
        the same point, outside every range: it may :meth:`stop` the session (the module call then
        runs unprofiled).
        """
        assert self._instruments is not None, "only inside the profiling block"
        scopes = self._instruments.scopes

        def fire() -> None:
            scopes.before_top_level_call = None
            self.step()
            if then is not None:
                then()

        scopes.before_top_level_call = fire

    def flush_pending_step(self) -> bool:
        """End a step requested by :meth:`step_before_next_top_level_call` now; True if there was one."""
        scopes = self._instruments.scopes if self._instruments is not None else None
        if scopes is None or scopes.before_top_level_call is None:
            return False
        scopes.before_top_level_call()
        return True

    def action(self, step: int | None = None) -> ProfilerAction:
        """What the schedule does at ``step`` (default: the current one, as torch's profiler has it):
        ``ProfilerAction.NONE`` (wait), ``WARMUP``, ``RECORD`` or ``RECORD_AND_SAVE`` (``RECORD``
        when there is no schedule)."""
        if step is None and self._torch_profiler is not None:
            return current_action(self._torch_profiler)
        if self.options.schedule is None:
            return ProfilerAction.RECORD
        return self.options.schedule(self.step_count if step is None else step)  # type: ignore[no-any-return]

    def _cycle_ready(self, tp: torch.profiler.profile) -> None:
        """torch's on_trace_ready: one cycle's recording ended; build its Profile, call the handler."""
        assert self._instruments is not None
        block_us = self._wall_ns / 1000.0  # set when the last cycle ends with the block
        context = self._instruments.end_recording(self._block_error)
        recording = Recording(tp, context, block_us=block_us, cycle=len(self.cycles))
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
        if self.options.scheduled:
            if not self.cycles:
                raise CaptureError("no profiling cycle completed (the schedule reached no active step)")
            return self.cycles[-1].recording
        if self._recording is None:  # start() failed before anything was recorded
            raise CaptureError("this layerscope.profile never started, so it recorded nothing")
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
