"""What a profiling block runs beside torch's profiler: the marks, the module scopes, call lines,
NVTX ranges and the memory watch.

Each is made once from the checked options and the block's scope plan (:meth:`Instruments.prepare`,
before torch starts), started once inside the running profiler (:meth:`Instruments.start`, each
undone by the session's ``ExitStack``), follows the schedule's steps (:meth:`Instruments.follow`),
and hands over what it collected when a recording ends (:meth:`Instruments.end_recording`). The
block's one marks session serves both the scopes' marks and the memory watch's points.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

from torch import nn
from torch.profiler import ProfilerAction

from layerscope.capture import native
from layerscope.capture.call_lines import CallLineRecorder, start_call_lines
from layerscope.capture.compiled_modules import unwrap_compiled
from layerscope.capture.memory_watch import MemoryWatch
from layerscope.capture.module_marks import ModuleMarks
from layerscope.capture.nvtx_ranges import start_nvtx_ranges
from layerscope.capture.options import CaptureOptions
from layerscope.capture.recording import RecordingContext
from layerscope.capture.scope_plan import ScopePlan
from layerscope.capture.scopes import ModuleScopes
from layerscope.model.meta import BlockError


@dataclass
class Instruments:
    """The instruments of one block, in the order they start (see the module docstring)."""

    model: nn.Module | None
    options: CaptureOptions
    plan: ScopePlan
    scopes: ModuleScopes
    #: The block's one marks session: the plan's marks and the memory watch's points.
    marks: ModuleMarks | None = None
    lines: CallLineRecorder | None = None
    watch: MemoryWatch | None = None
    #: The model's type name, read once (a compiled wrapper reads as the module it wraps).
    model_type: str | None = None

    @classmethod
    def prepare(cls, model: nn.Module | None, options: CaptureOptions, plan: ScopePlan) -> Instruments:
        """Everything that can be made before torch starts: the scopes (installed later), and with
        ``memory`` the watch, whose scan of live tensors must not be recorded."""
        wants_marks = plan.marks or options.memory
        marks_module = native.load() if wants_marks else None
        # The scopes' class wrappers take the marks object now; it is started with the block.
        marks = ModuleMarks(marks_module) if marks_module is not None else None
        return cls(
            model=model,
            options=options,
            plan=plan,
            scopes=ModuleScopes(plan, marks if plan.marks else None),
            marks=marks,
            watch=MemoryWatch.prepare(model) if options.memory else None,
            model_type=type(unwrap_compiled(model)).__name__ if model is not None else None,
        )

    def start(self, stack: ExitStack, action: ProfilerAction) -> None:
        """Start each instrument, inside the running profiler at the schedule's ``action``; each
        is undone by ``stack``."""
        if self.marks is not None:
            stack.callback(self.marks.stop)  # safe on a session that never started
            self.marks.start()
        if self.options.lines:
            self.lines = start_call_lines(stack, action)
        stack.callback(self.scopes.remove)
        self._scopes_follow(action)
        if self.options.nvtx:
            start_nvtx_ranges(self.model, stack)
        if self.watch is not None:
            self.watch.start(self.marks, stack, action)

    def before_step(self, action: ProfilerAction) -> None:
        """Just before torch's profiler steps (``action``: what it did in the step that ends)."""
        if self.watch is not None:
            self.watch.before_step(action)

    def follow(self, before: ProfilerAction, after: ProfilerAction) -> None:
        """After torch's profiler stepped from ``before`` to ``after``."""
        self._scopes_follow(after)
        if self.lines is not None:
            self.lines.follow(after)
        if self.watch is not None:
            self.watch.after_step(before, after)

    def _scopes_follow(self, action: ProfilerAction) -> None:
        """Scopes are installed only on steps torch.profiler records or warms up: on ``wait`` steps
        (and after the schedule's last cycle) no class is patched and no hook runs, so a long job
        profiled every N steps runs as it would without us in between (unless the plan says the
        scopes stay: global mode)."""
        waiting = action == ProfilerAction.NONE and self.plan.follows_schedule
        if waiting and self.scopes.installed:
            self.scopes.remove()
        elif not waiting and not self.scopes.installed:
            self.scopes.install()

    def block_ending(self) -> None:
        """The block ends: the memory watch takes its end snapshot (before anything is undone)."""
        if self.watch is not None:
            self.watch.snapshot_state("end")

    def end_recording(self, block_error: BlockError | None) -> RecordingContext:
        """One recording ended (the block's, or a scheduled cycle's): hand over what the instruments
        collected for it (call lines and snapshots are taken: the next recording starts empty)."""
        watch = self.watch
        return RecordingContext(
            options=self.options,
            plan=self.plan,
            catalog=self.scopes.catalog(),
            called_modules=self.scopes.called_modules(),
            model_type=self.model_type,
            marks=self.marks,
            call_lines=self.lines.take() if self.lines is not None else None,
            snapshots=watch.take() if watch is not None else None,
            watch_errors=list(watch.errors) if watch is not None else [],
            block_error=block_error,
        )

    def release_watch(self) -> None:
        """Drop the memory watch: it holds the optimizers, which must not outlive the user's."""
        self.watch = None
