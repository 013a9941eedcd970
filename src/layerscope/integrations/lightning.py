"""PyTorch Lightning: ``Trainer(profiler=LayerscopeProfiler(active=3))``.

Follows Lightning's ``Profiler`` interface: the profiling session starts with the first
``run_training_batch`` action, each finished ``run_training_batch`` (forward, backward and optimizer
step of one batch) is a step of the schedule, and ``teardown`` ends it. (Stepping at the end of
``training_step``, as Lightning's PyTorchProfiler does, would cut torch's ``Optimizer.step`` range in
two: with automatic optimisation, ``training_step`` runs inside the optimizer's closure.)
Modules are named by their attribute path in the LightningModule. Each cycle is saved (profile,
text report, HTML report, optionally the Chrome trace) into ``<dirpath>/layerscope`` (default: the
Trainer's log dir), with the global rank in the names; the main process says on stderr, one line per
cycle, which files it wrote where. ``summary()`` is the last cycle's report.

``torch.compile`` is watched from ``setup`` (before Lightning compiles and first runs the model),
so ``trainer.fit(torch.compile(model))`` shows the model's modules.

``LayerscopeProfiler(flight_recorder=True)`` runs the flight recorder instead (``ls.flight_recorder``:
every training batch recorded lightly, the last ``keep`` dumped into ``<dirpath>/layerscope`` on a
slow step or SIGUSR1).

Lightning tells a profiler nothing of an exception, and on that path it never calls ``teardown``: the
profiler sees one escape a training batch in ``stop``, which Lightning's ``profile`` context manager
calls from a ``finally`` while the exception passes (``sys.exc_info()`` holds it there; the one held
at the batch's start, if it ran inside an ``except``, is not taken for it). There the flight recorder
dumps it (reason ``exception`` or ``oom``, naming the module it passed), and the recorder, a
profiling session and the compile watch end, so nothing stays hooked to the model or to torch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.profilers import Profiler
from lightning.pytorch.utilities import rank_zero_only

from layerscope.integrations._common import (
    FlightOptions,
    save_with_report,
    start_flight_recorder,
    text_report,
)

_STEP_ACTION = "run_training_batch"


def _global_rank() -> int:
    """This process's rank among all of the run's (Lightning sets it when its strategy starts)."""
    return int(getattr(rank_zero_only, "rank", 0) or 0)


def _flow_control(exception: BaseException) -> bool:
    """An exception Lightning's loops use to end an epoch, not an error: a ``training_step`` that
    takes ``dataloader_iter`` raises ``StopIteration`` inside the batch when the data runs out."""
    return isinstance(exception, StopIteration | GeneratorExit)


class LayerscopeProfiler(Profiler):
    """A Lightning profiler backed by layerscope (module tree, forward and backward)."""

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        *,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        skip_first: int = 0,
        memory: bool = False,
        trace: bool = False,
        depth: int | None = None,
        flight_recorder: bool = False,
        keep: int = 100,
        detail_every: int = 0,
        slow: float | None = 3.0,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.flight = FlightOptions(keep, detail_every, slow) if flight_recorder else None
        #: the running flight recorder (with ``flight_recorder=True``); its ``dumps`` list the files
        self.recorder: Any = None
        self.schedule_args = {
            "wait": wait,
            "warmup": warmup,
            "active": active,
            "repeat": repeat,
            "skip_first": skip_first,
        }
        self.memory = memory
        self.trace = trace
        self.depth = depth
        self.session: Any = None
        self.handler: Any = None
        self._lightning_module: Any = None  # set by Lightning's trainer
        self.compile_watch: Any = None
        #: the exception being handled when the current training batch started (not one it raised)
        self._exception_at_start: BaseException | None = None

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        from layerscope.capture.compile_watch import CompileWatch

        super().setup(stage=stage, local_rank=local_rank, log_dir=log_dir)
        if self.compile_watch is None:
            self.compile_watch = CompileWatch().start()

    @property
    def cycles(self) -> list[Any]:
        """The finished cycles (each with its Profile)."""
        return list(self.session.cycles) if self.session is not None else []

    def start(self, action_name: str) -> None:
        if action_name != _STEP_ACTION:
            return
        self._exception_at_start = sys.exc_info()[1]
        recording = self.recorder is not None and self.recorder.clock.active
        if self.session is not None or recording:
            return
        import layerscope as ls

        folder = Path(self.dirpath) if self.dirpath else Path("lightning_logs")
        module = self._lightning_module
        if self.flight is not None:
            model = module.named_modules.__self__ if module is not None else None
            self.recorder = start_flight_recorder(model, folder / "layerscope", self.flight)
            return
        rank = _global_rank()  # not the local rank: two nodes would both write rank0 files
        self.handler = save_with_report(
            folder / "layerscope", trace=self.trace, rank=rank, announce=rank == 0
        )
        model = module.named_modules.__self__ if module is not None else None  # unwrap the weakref proxy
        self.session = ls.profile(
            model,
            memory=self.memory,
            depth=self.depth,
            schedule=ls.schedule(**self.schedule_args),
            on_trace_ready=self.handler,
        )
        self.session.start()

    def stop(self, action_name: str) -> None:
        if action_name != _STEP_ACTION:
            return
        escaping = sys.exc_info()[1]
        at_start, self._exception_at_start = self._exception_at_start, None  # hold no frames
        if escaping is not None and escaping is not at_start:
            if not _flow_control(escaping):
                self._end_on(escaping)
            return  # the data ran out: no batch ran, no step ended
        if self.recorder is not None:
            self.recorder.step()
        if self.session is not None and self.session.is_running:
            self.session.step()

    def _end_on(self, exception: BaseException | None) -> None:
        """End recording (the recorder dumps ``exception`` when there is one), profiling and the
        compile watch: at ``teardown``, or when an exception escapes a training batch (Lightning
        will not call ``teardown`` then); each even when one before it fails."""
        try:
            if self.recorder is not None and self.recorder.clock.active:
                error = (type(exception), exception, exception.__traceback__) if exception else (None,) * 3
                self.recorder.__exit__(*error)
        finally:
            try:
                if self.session is not None and self.session.is_running:
                    self.session.stop()
            finally:
                if self.compile_watch is not None:
                    self.compile_watch.stop()
                    self.compile_watch = None

    def summary(self) -> str:
        cycles = self.cycles
        return text_report(cycles[-1]) if cycles else ""

    def teardown(self, stage: str | None) -> None:
        try:
            self._end_on(None)
        finally:
            super().teardown(stage=stage)
