"""``ls.flight_recorder``: a light record of every step of a long job, dumped when something goes wrong.

Around a training or serving loop, with ``rec.step()`` at the end of each step::

    with ls.flight_recorder(model, keep=100, out="flight/") as rec:
        for batch in loader:
            train_step(batch)
            rec.step()

Every step keeps module calls' wall times, forward and backward (``flight_scopes.py``), the step's
time and, on CUDA, the device time between step boundaries (two CUDA events per step, read only when
a dump is written), in a ring of the last ``keep`` steps. A dump (``flight_dump.py``, a profile
``ls.load`` reads) is written when: a signal arrives (``SIGUSR1`` by default), a step takes more than
``slow`` times the rolling median (after ``warmup`` steps; the dump waits ``after`` more steps so it
shows what followed), an exception leaves the block (``oom`` for an out-of-memory error; the module
it passed through is named), CUDA memory passes ``memory_threshold`` bytes, or ``rec.dump()`` is
called. ``detail_every=N`` also takes a full layerscope profile (ops, FLOPs, memory) of every N-th
step, and ``detail_budget`` spaces them further where their measured cost would pass that share of
the job's time (``detail_schedule.py``). The latest is kept as its events table (torch's results
are read and let go off the step's thread) and built and saved beside the dumps only when a dump is
written and when the block ends: a long job pays for recording its detailed steps, not for building
the many that no dump asks for. The recorder never raises into the loop (a failure is a warning) and
never writes on the step's thread, except that an exception's dump is waited for (the process may be
about to end).
"""

from __future__ import annotations

import collections
import os
import signal as signals
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn

from layerscope.capture.block_error import block_error
from layerscope.capture.detail_schedule import DetailSchedule
from layerscope.capture.environment import distributed_info, environment
from layerscope.capture.flight_clock import FlightClock
from layerscope.capture.flight_dump import (
    DetailJob,
    DumpJob,
    DumpWriter,
    ReadJob,
    detail_path,
    dump_path,
    make_folder,
)
from layerscope.capture.flight_scopes import FlightScopes
from layerscope.capture.flight_shapes import DetailedProfile
from layerscope.capture.flight_triggers import (
    SignalTrigger,
    SlowSteps,
    check_budget,
    check_options,
    cuda_event,
    cuda_in_use,
    is_out_of_memory,
    warn,
)
from layerscope.capture.recording import Recording
from layerscope.events.flight_records import FlightModule, FlightStep
from layerscope.model.meta import FlightInfo, FlightTrigger, ProfileMeta

_now = time.perf_counter_ns


class FlightRecorder:
    """A flight recorder for ``model`` (``ls.flight_recorder``): use it as a context manager around
    the loop and call ``step()`` at the end of each step (see the module docstring). Without a model
    (None), every module called is recorded (torch's global module hooks).

    ``keep``: steps kept; ``detail_every``: a full profile every N steps (0: never);
    ``detail_budget``: the share of the job's time the detailed steps may cost (e.g. 0.01; None: no
    cap), which spaces them further apart than ``detail_every`` where needed; ``out``: the dumps'
    folder; ``slow``: a step this many times the rolling median is dumped (None: never); ``signal``:
    the signal that dumps (None: none); ``memory_threshold``: CUDA bytes that dump once when passed;
    ``warmup``: steps before the slow-step trigger arms; ``after``: steps a slow step's dump waits
    for (below ``keep``).
    """

    def __init__(
        self,
        model: nn.Module | None,
        keep: int = 100,
        detail_every: int = 0,
        out: str | os.PathLike[str] = "flight",
        slow: float | None = 3.0,
        signal: int | None = signals.SIGUSR1,
        memory_threshold: int | None = None,
        warmup: int = 10,
        after: int = 3,
        detail_budget: float | None = None,
    ) -> None:
        check_options(model, keep, detail_every, slow, signal, warmup, after)
        check_budget(detail_every, detail_budget)
        self.model = model
        self.keep, self.slow = keep, slow
        self.schedule = DetailSchedule(detail_every, detail_budget)
        self.out = Path(out)
        self.memory_threshold = memory_threshold
        self.clock = FlightClock()
        self.ring: collections.deque[FlightStep] = collections.deque(maxlen=keep)
        self._events: collections.deque[tuple[Any, Any] | None] = collections.deque(maxlen=keep)
        self._slow = SlowSteps(slow, warmup, after, keep)
        self._signal = SignalTrigger(signal, self._on_signal, lambda: self._writer.flush(10.0))
        self._writer = DumpWriter()
        self._scopes: FlightScopes | None = None
        self._modules: list[FlightModule] = []  # the scopes' list, kept after the block
        self._step = 0
        self._step_start = 0
        self._step_event: Any = None
        self._memory_fired = False
        self._writer_busy = False  # the writer had work when the running step began
        self._detail: tuple[DetailedProfile, int] | None = None  # the running detailed profile, its step
        self._detail_failed = False
        self._detail_file: tuple[Path, int] | None = None  # the latest detailed profile written
        # the latest detailed step not written yet: its file, step and recording (events table
        # only), as a list of at most one taken by pop(), one call, so that a signal handler and the
        # loop (or rec.dump() on another thread) never both take it
        self._detail_kept: list[tuple[Path, int, Recording]] = []
        self._names_taken: set[Path] = set()
        self._rank: int | None = None
        self._meta = ProfileMeta()

    # ----- the block ---------------------------------------------------------------------------------
    def __enter__(self) -> FlightRecorder:
        self.out = make_folder(self.out)
        info = distributed_info()
        self._rank = info.rank if info is not None else None
        name = type(self.model).__name__ if self.model is not None else None
        # devices only where the program already uses CUDA: reading them would initialise it
        self._meta = ProfileMeta(model=name, environment=environment(with_devices=cuda_in_use()))
        try:
            # the clock first: the scopes take its hot calls (native or Python) when made
            self.clock.start()
            scopes = self._scopes = FlightScopes(self.model, self.clock)
            self._modules = scopes.modules
            scopes.install()
            self._writer.start()
            self._signal.install()
            self._start_step(_now())
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._detail_failed = True  # no detailed profile starts while the block ends
            if exc is not None:
                self._dump_exception(exc)
            elif self._slow.pending is not None:
                pending = self._slow.pending
                self._write(pending.trigger, running=False, median_us=pending.median_us)
        finally:
            self._close()

    def _close(self) -> None:
        """Undo everything the block did, each step even when one before it fails."""
        failures = []
        undo_steps = (
            self.clock.stop,
            self._drop_detail,
            self._remove_scopes,
            self._signal.restore,
            self._write_detail,
        )
        for undo in undo_steps:
            try:
                undo()
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
        if not self._writer.stop(timeout=60.0):
            failures.append("dumps still being written after 60 s")
        if failures:
            warn("; ".join(failures))

    def _remove_scopes(self) -> None:
        if self._scopes is not None:
            scopes, self._scopes = self._scopes, None
            scopes.remove()

    def step(self) -> None:
        """End the current step (call it at the end of each step, as with ``torch.profiler``); does
        nothing outside the block."""
        if not self.clock.active:
            return
        now = _now()
        forward, backward = self.clock.take_step()
        try:
            start_event = self._step_event
            self._stop_detail()
            end_event = cuda_event()
            self.ring.append(FlightStep(self._step, self._step_start, now, forward, backward))
            self._events.append((start_event, end_event) if start_event is not None else None)
            self._check_triggers(now - self._step_start)
        except Exception as exc:  # never into the program
            warn(f"step {self._step}: {type(exc).__name__}: {exc}")
            end_event = None
        self._step += 1
        self._start_step(now, end_event)

    def dump(self, reason: str = "manual") -> Path:
        """Write a dump now (off this thread inside the block, at once after it) of the kept steps and
        the running one; its path."""
        return self._write(FlightTrigger(reason, self._step), running=self.clock.active)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the dumps requested so far to be written; whether they all were."""
        return self._writer.flush(timeout)

    @property
    def dumps(self) -> list[Path]:
        """The dump files written so far (and detailed profiles)."""
        return list(self._writer.written)

    @property
    def steps_seen(self) -> int:
        """The steps ended so far (``step()`` calls)."""
        return self._step

    @property
    def ring_bytes(self) -> int:
        """The bytes the kept step records hold."""
        return sum(step.nbytes for step in self.ring)

    # ----- steps and triggers ------------------------------------------------------------------------
    def _start_step(self, now: int, event: Any = None) -> None:
        self._step_start = now
        self._step_event = event if event is not None else cuda_event()
        if self.schedule.due(self._step) and not self._detail_failed:
            self._start_detail()

    def _check_triggers(self, wall_ns: int) -> None:
        step = self._step
        # the detailed profile's start and stop, or our writer's work, are in these steps: a step
        # slower for them is not the job being slow
        busy, self._writer_busy = self._writer_busy or self._writer.busy, self._writer.busy
        if not self.schedule.profiled(step) and not busy:
            self._slow.see(step, wall_ns)
        self.schedule.see(step, wall_ns, busy)
        due = self._slow.due(step)
        if due is not None:
            self._write(due.trigger, running=False, median_us=due.median_us)
        if self._memory_passed():
            self._memory_fired = True
            self._write(FlightTrigger("memory", step), running=False)

    def _memory_passed(self) -> bool:
        """Whether CUDA memory passed the threshold for the first time."""
        if self.memory_threshold is None or self._memory_fired or not cuda_in_use():
            return False
        return bool(torch.cuda.max_memory_allocated() > self.memory_threshold)

    def _write(self, trigger: FlightTrigger, running: bool, median_us: float | None = None) -> Path:
        detail = self._take_detail()  # the dump names it; it is built after the dump is written
        steps, events = list(self.ring), list(self._events)
        if running:
            forward, backward = self.clock.peek_step()
            steps.append(FlightStep(self._step, self._step_start, _now(), forward, backward, complete=False))
            events.append(None)
        flight = FlightInfo(
            trigger=trigger,
            keep=self.keep,
            steps_seen=self._step + (1 if running else 0),
            slow=self.slow,
            median_step_us=median_us if median_us is not None else self._slow.median_us(),
            detail_every=self.schedule.every,
            detail_budget=self.schedule.budget,
            detail_file=str(self._detail_file[0]) if self._detail_file else None,
            detail_step=self._detail_file[1] if self._detail_file else None,
            ring_bytes=sum(step.nbytes for step in steps),
        )
        path = dump_path(self.out, trigger.step, trigger.reason, self._rank, self._names_taken)
        self._names_taken.add(path)
        self._writer.submit(DumpJob(path, steps, events, list(self._modules), flight, self._meta))
        if detail is not None:  # after the dump: a signal's default action waits for the dump only
            self._writer.submit(detail)
        return path

    def _on_signal(self) -> None:
        self._write(FlightTrigger("signal", self._step), running=self.clock.active)

    def _dump_exception(self, exc: BaseException) -> None:
        reason = "oom" if is_out_of_memory(exc) else "exception"
        paths = self._scopes.module_paths() if self._scopes is not None else None
        error = block_error(exc, self.model, paths)
        module = error.module if error.module is not None else self._running_backward_module()
        self._write(FlightTrigger(reason, self._step, module, f"{error.type}: {error.message}"), running=True)

    def _running_backward_module(self) -> str | None:
        """The module whose backward is running in this step (an exception in backward has no
        module's ``forward`` in its traceback); None once the pass has ended."""
        forward, backward = self.clock.peek_step()
        if not len(backward) or backward[-1, 1] < 0 or backward[-1, 1] >= len(forward):
            return None
        return self._modules[abs(int(forward[backward[-1, 1], 1])) - 1].path

    # ----- the detailed profile ----------------------------------------------------------------------
    def _start_detail(self) -> None:
        try:
            # Without a model (``run``), steps end in torch's optimizer hooks, where the memory
            # watch could not add its own: the detailed profile records no memory there. The
            # shapes are recorded beside torch where the native module can (``flight_shapes.py``).
            detail = DetailedProfile(self.model, memory=self.model is not None)
            detail.start()
        except Exception as exc:  # e.g. another profiler is running: no detailed steps from now on
            self._detail_failed = True
            warn(f"no detailed profiles ({type(exc).__name__}: {exc})")
            return
        self._detail = (detail, self._step)
        self.schedule.started(self._step, self._slow.median_us())

    def _drop_detail(self) -> None:
        """Stop a detailed profile whose step never ended (the block did): nothing to keep."""
        if self._detail is not None:
            (detail, _), self._detail = self._detail, None
            detail.stop()

    def _stop_detail(self) -> None:
        if self._detail is None:
            return
        (detail, step), self._detail = self._detail, None
        recording = detail.stop()
        # read and built beside the program: its collector and its cores are its own
        recording.pause_gc, recording.reader_threads = False, 1
        # torch's results (~3 kB per event) are read into a table and let go on the writer thread;
        # the table (~130 B per event) is all that is kept, one detailed step at a time
        self._writer.submit(ReadJob(step, recording))
        self._detail_kept[:] = [(detail_path(self.out, step, self._rank), step, recording)]

    def _take_detail(self) -> DetailJob | None:
        """The job building and saving the latest detailed step's profile, taken once (a dump names
        it, or the block ends; safe in a signal handler: one pop, no lock)."""
        try:
            path, step, recording = self._detail_kept.pop()
        except IndexError:
            return None
        self._detail_file = (path, step)
        return DetailJob(path, recording.build)

    def _write_detail(self) -> None:
        """At the block's end: queue the latest detailed step's profile, if no dump took it."""
        job = self._take_detail()
        if job is not None:
            self._writer.submit(job)


#: ``ls.flight_recorder(model, keep=100, ...)``: the recorder is made by its class.
flight_recorder = FlightRecorder
