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
step, saved beside the dumps. The recorder never raises into the loop (a failure is a warning) and
never writes on the step's thread, except that an exception's dump is waited for (the process may be
about to end).
"""

from __future__ import annotations

import collections
import os
import signal as signals
import statistics
import threading
import time
import warnings
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import torch
from torch import nn

from layerscope.capture.block_error import block_error
from layerscope.capture.environment import distributed_info, environment
from layerscope.capture.flight_dump import (
    DetailJob,
    DumpJob,
    DumpWriter,
    FlightDumpWarning,
    detail_path,
    dump_path,
    make_folder,
)
from layerscope.capture.flight_scopes import FlightClock, FlightScopes
from layerscope.errors import UsageError
from layerscope.events.flight_records import FlightStep
from layerscope.model.meta import FlightInfo, FlightTrigger, ProfileMeta

_now = time.perf_counter_ns

#: Steps the rolling median of step times spans.
MEDIAN_WINDOW = 100


class FlightRecorder:
    """The recorder of one model (see the module docstring); made by :func:`flight_recorder`."""

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
    ) -> None:
        _check_options(model, keep, detail_every, slow, warmup, after)
        self.model = model
        self.keep, self.detail_every, self.slow = keep, detail_every, slow
        self.out = Path(out)
        self.signal, self.memory_threshold = signal, memory_threshold
        self.warmup, self.after = warmup, after
        self.clock = FlightClock()
        self.ring: collections.deque[FlightStep] = collections.deque(maxlen=keep)
        self._events: collections.deque[tuple[Any, Any] | None] = collections.deque(maxlen=keep)
        self._walls: collections.deque[int] = collections.deque(maxlen=MEDIAN_WINDOW)
        self._writer = DumpWriter()
        self._scopes: FlightScopes | None = None
        self._step = 0
        self._step_start = 0
        self._step_event: Any = None
        self._pending: tuple[FlightTrigger, int] | None = None  # a trigger and the step to dump at
        self._quiet_until = -1  # no slow-step trigger before this step (one per ring)
        self._memory_fired = False
        self._writer_busy = False  # the writer had work when the running step began
        self._previous_handler: Any = None
        self._detail: Any = None  # the running detailed profile session
        self._detail_file: tuple[Path, int] | None = None
        self._rank: int | None = None
        self._meta = ProfileMeta()

    # ----- the block ---------------------------------------------------------------------------------
    def __enter__(self) -> FlightRecorder:
        self.out = make_folder(self.out)
        info = distributed_info()
        self._rank = info.rank if info is not None else None
        name = type(self.model).__name__ if self.model is not None else None
        self._meta = ProfileMeta(model=name, environment=environment())
        scopes = FlightScopes(self.model, self.clock)
        try:
            scopes.install()
            self._scopes = scopes
            self._writer.start()
            self._install_signal()
        except BaseException:
            scopes.remove()
            self._writer.stop(timeout=0.0)
            raise
        self.clock.start()
        self._start_step(_now())
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc is not None:
                self._dump_exception(exc)
            elif self._pending is not None:
                self._write(self._pending[0], running=False)
        finally:
            self.clock.stop()
            self._stop_detail()
            if self._scopes is not None:
                self._scopes.remove()
                self._scopes = None
            self._restore_signal()
            if not self._writer.stop(timeout=60.0):
                _warn("dumps still being written after 60 s")

    def step(self) -> None:
        """End the current step (call it at the end of each step, as with ``torch.profiler``)."""
        now = _now()
        forward, backward = self.clock.take_step()
        try:
            start_event = self._step_event
            self._stop_detail()
            end_event = _cuda_event()
            self.ring.append(FlightStep(self._step, self._step_start, now, forward, backward))
            self._events.append((start_event, end_event) if start_event is not None else None)
            self._check_triggers(now - self._step_start)
            self._step += 1
            self._start_step(now, end_event)
        except Exception as exc:  # never into the program
            _warn(f"step {self._step}: {type(exc).__name__}: {exc}")
            self._step += 1
            self._step_start = now

    def dump(self, reason: str = "manual") -> Path:
        """Write a dump now (off this thread) of the kept steps and the running one; its path."""
        return self._write(FlightTrigger(reason, self._step), running=True)

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
        self._step_event = event if event is not None else _cuda_event()
        if self.detail_every and self._step % self.detail_every == 0 and self._step > 0:
            self._start_detail()

    def _check_triggers(self, wall_ns: int) -> None:
        step = self._step
        if self._pending is not None and step >= self._pending[1]:
            trigger, self._pending = self._pending[0], None
            self._write(trigger, running=False)
        # the detailed profile's start and stop, or our writer's work, are in these steps: a step
        # slower for them is not the job being slow
        busy, self._writer_busy = self._writer_busy or self._writer.busy, self._writer.busy
        if not self._detailed(step) and not busy:
            self._check_slow(step, wall_ns)
        if self._memory_passed():
            self._memory_fired = True
            self._write(FlightTrigger("memory", step), running=False)

    def _check_slow(self, step: int, wall_ns: int) -> None:
        median = statistics.median(self._walls) if len(self._walls) >= self.warmup else None
        self._walls.append(wall_ns)
        slow = self.slow is not None and median is not None and wall_ns > self.slow * median
        if slow and self._pending is None and step >= self._quiet_until:
            self._pending = (FlightTrigger("slow_step", step), step + self.after)
            self._quiet_until = step + self.keep

    def _detailed(self, step: int) -> bool:
        """Whether a detailed profile ran in ``step`` or stopped at its start (its cost is there)."""
        every = self.detail_every
        return bool(every) and any(k > 0 and k % every == 0 for k in (step, step - 1))

    def _memory_passed(self) -> bool:
        """Whether CUDA memory passed the threshold for the first time."""
        if self.memory_threshold is None or self._memory_fired or not _cuda_in_use():
            return False
        return bool(torch.cuda.max_memory_allocated() > self.memory_threshold)

    def _median_us(self) -> float | None:
        if len(self._walls) < self.warmup:
            return None
        return float(statistics.median(self._walls)) / 1000.0

    def _write(self, trigger: FlightTrigger, running: bool) -> Path:
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
            median_step_us=self._median_us(),
            detail_every=self.detail_every,
            detail_file=str(self._detail_file[0]) if self._detail_file else None,
            detail_step=self._detail_file[1] if self._detail_file else None,
            ring_bytes=sum(step.nbytes for step in steps),
        )
        modules = self._scopes.modules if self._scopes is not None else []
        path = dump_path(self.out, trigger.step, trigger.reason, self._rank)
        self._writer.submit(DumpJob(path, steps, events, modules, flight, self._meta))
        return path

    def _dump_exception(self, exc: BaseException) -> None:
        reason = "oom" if _is_out_of_memory(exc) else "exception"
        paths = self._scopes.module_paths() if self._scopes is not None else None
        error = block_error(exc, self.model, paths)
        module = error.module if error.module is not None else self._running_module()
        self._write(FlightTrigger(reason, self._step, module, f"{error.type}: {error.message}"), running=True)

    def _running_module(self) -> str | None:
        """The module whose backward started last in the running step (an exception in backward has
        no module's ``forward`` in its traceback)."""
        if self._scopes is None:
            return None
        forward, backward = self.clock.peek_step()
        starts = backward[backward[:, 1] >= 0]
        if len(starts) and starts[-1, 1] < len(forward):
            return self._scopes.modules[abs(int(forward[starts[-1, 1], 1])) - 1].path
        return None

    # ----- the detailed profile ----------------------------------------------------------------------
    def _start_detail(self) -> None:
        from layerscope.capture.session import profile

        session = profile(self.model, memory=True)
        session.__enter__()
        self._detail = (session, self._step)

    def _stop_detail(self) -> None:
        if self._detail is None:
            return
        (session, step), self._detail = self._detail, None
        session.__exit__(None, None, None)
        path = detail_path(self.out, step, self._rank)
        self._writer.submit(DetailJob(path, lambda: session.profile))
        self._detail_file = (path, step)

    # ----- the signal --------------------------------------------------------------------------------
    def _install_signal(self) -> None:
        if self.signal is None or threading.current_thread() is not threading.main_thread():
            return
        self._previous_handler = signals.signal(self.signal, self._on_signal)

    def _restore_signal(self) -> None:
        if self.signal is not None and self._previous_handler is not None:
            signals.signal(self.signal, self._previous_handler)
            self._previous_handler = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        try:
            self._write(FlightTrigger("signal", self._step), running=True)
        except Exception as exc:
            _warn(f"signal dump: {type(exc).__name__}: {exc}")
        previous = self._previous_handler
        if callable(previous):
            previous(signum, frame)


def flight_recorder(
    model: nn.Module | None,
    keep: int = 100,
    detail_every: int = 0,
    out: str | os.PathLike[str] = "flight",
    slow: float | None = 3.0,
    signal: int | None = signals.SIGUSR1,
    memory_threshold: int | None = None,
    warmup: int = 10,
    after: int = 3,
) -> FlightRecorder:
    """A flight recorder for ``model``: use it as a context manager around the loop and call
    ``step()`` at the end of each step (see :mod:`layerscope.capture.flight_recorder`). Without a
    model (None), every module called is recorded (torch's global module hooks).

    ``keep``: steps kept; ``detail_every``: a full profile every N steps (0: never); ``out``: the
    dumps' folder; ``slow``: a step this many times the rolling median is dumped (None: never);
    ``signal``: the signal that dumps (None: none); ``memory_threshold``: CUDA bytes that dump once
    when passed; ``warmup``: steps before the slow-step trigger arms; ``after``: steps a slow step's
    dump waits for.
    """
    return FlightRecorder(model, keep, detail_every, out, slow, signal, memory_threshold, warmup, after)


def _check_options(
    model: Any, keep: int, detail_every: int, slow: float | None, warmup: int, after: int
) -> None:
    if model is not None and not isinstance(model, nn.Module):
        raise UsageError(
            f"flight_recorder: model must be a torch.nn.Module or None, not {type(model).__name__}"
        )
    if not isinstance(keep, int) or keep < 1:
        raise UsageError(f"flight_recorder: keep must be a positive number of steps, not {keep!r}")
    if not isinstance(detail_every, int) or detail_every < 0:
        raise UsageError(
            f"flight_recorder: detail_every must be 0 (never) or a number of steps, not {detail_every!r}"
        )
    if slow is not None and not (isinstance(slow, int | float) and slow > 1):
        raise UsageError(f"flight_recorder: slow must be a factor above 1 (or None), not {slow!r}")
    if warmup < 1 or after < 0:
        raise UsageError("flight_recorder: warmup must be at least 1 step and after at least 0")


def _warn(message: str) -> None:
    warnings.warn(f"layerscope flight recorder: {message}", FlightDumpWarning, stacklevel=3)


def _cuda_in_use() -> bool:
    """Whether the program has initialised CUDA (the recorder never does)."""
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def _cuda_event() -> Any:
    """A CUDA event recorded now on the current stream, or None where CUDA is not in use."""
    if not _cuda_in_use():
        return None
    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record()
    return event


def _is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text
