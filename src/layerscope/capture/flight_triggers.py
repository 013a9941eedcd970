"""What makes the flight recorder dump, apart from exceptions: a slow step, a signal, CUDA memory;
and the recorder's option checks.

The slow-step trigger compares each step with the rolling median of the steps before it (after a
warm-up) and, when one is slow, asks for a dump ``after`` steps later, remembering the median it
compared with; at most one per ``keep`` steps. The signal trigger installs a handler on the main
thread and, after asking for a dump, does what the signal did before: calls the previous Python
handler, or — for a signal whose previous action was the default and is not a dump-only signal
(``SIGUSR1``/``SIGUSR2``) — lets the default happen (``SIGTERM`` still ends the job).
"""

from __future__ import annotations

import signal as signals
import statistics
import threading
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch import nn

from layerscope.capture.flight_dump import FlightDumpWarning
from layerscope.capture.signal_actions import handled_outside_python
from layerscope.errors import UsageError
from layerscope.model.meta import FlightTrigger

#: Steps the rolling median of step times spans.
MEDIAN_WINDOW = 100

#: Signals whose only job, under the recorder, is to dump: their default action (ending the
#: process) is not kept.
DUMP_ONLY_SIGNALS = frozenset({signals.SIGUSR1, signals.SIGUSR2})


@dataclass(frozen=True)
class PendingDump:
    """A slow step's dump, written once step ``at`` has ended; the median it was compared with."""

    trigger: FlightTrigger
    at: int
    median_us: float


class SlowSteps:
    """The slow-step trigger (see the module docstring)."""

    def __init__(self, slow: float | None, warmup: int, after: int, keep: int) -> None:
        self.slow, self.warmup, self.after, self.keep = slow, warmup, after, keep
        self.walls: deque[int] = deque(maxlen=MEDIAN_WINDOW)
        self.pending: PendingDump | None = None
        self._quiet_until = -1

    def median_us(self) -> float | None:
        """The rolling median step (µs), None before the warm-up ended."""
        if len(self.walls) < self.warmup:
            return None
        return float(statistics.median(self.walls)) / 1000.0

    def see(self, step: int, wall_ns: int) -> None:
        """Step ``step`` took ``wall_ns``: a slow one asks for a dump (one at a time, one per ring)."""
        median = self.median_us()
        self.walls.append(wall_ns)
        if self.slow is None or median is None or wall_ns / 1000.0 <= self.slow * median:
            return
        if self.pending is None and step >= self._quiet_until:
            self.pending = PendingDump(FlightTrigger("slow_step", step), step + self.after, median)
            self._quiet_until = step + self.keep

    def due(self, step: int) -> PendingDump | None:
        """The pending dump once step ``step`` has ended at or after the one it waits for."""
        found = self.pending
        if found is None or step < found.at:
            return None
        self.pending = None
        return found


class SignalTrigger:
    """A signal that asks for a dump (see the module docstring); installed only from the main thread,
    and never over a handler installed outside Python (``faulthandler.register``): Python could not
    give that one back, so the recorder warns and leaves the signal alone."""

    def __init__(
        self, signum: int | None, on_signal: Callable[[], None], settle: Callable[[], object]
    ) -> None:
        self.signum = signum
        self._on_signal = on_signal
        self._settle = settle  # waits for the dump before the default action ends the process
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        """Take the signal (nothing off the main thread, nothing for None)."""
        if self.signum is None or threading.current_thread() is not threading.main_thread():
            return
        if handled_outside_python(self.signum):
            name = signals.Signals(self.signum).name
            warn(
                f"{name} has a handler installed outside Python (faulthandler.register?): left alone, "
                f"no dumps on {name}; pass signal= another one"
            )
            return
        self._previous = signals.signal(self.signum, self._handle)
        self._installed = True

    def restore(self) -> None:
        """Give the signal its previous handler back."""
        if self._installed and self.signum is not None:
            self._installed = False
            signals.signal(self.signum, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        try:
            self._on_signal()
        except Exception as exc:
            warn(f"signal dump: {type(exc).__name__}: {exc}")
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous == signals.SIG_DFL and signum not in DUMP_ONLY_SIGNALS:
            self._settle()
            self.restore()
            signals.raise_signal(signum)


def check_options(
    model: Any, keep: int, detail_every: int, slow: float | None, signum: int | None, warmup: int, after: int
) -> None:
    """The recorder's arguments, each a one-line :class:`UsageError` when wrong."""
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
    if warmup < 1 or after < 0 or after >= keep:
        raise UsageError(
            "flight_recorder: warmup must be at least 1 step, and after at least 0 and below keep "
            f"(the slow step must still be kept when its dump is written); got warmup={warmup}, "
            f"after={after}, keep={keep}"
        )
    catchable = set(signals.valid_signals()) - {signals.SIGKILL, signals.SIGSTOP}
    if signum is not None and signum not in catchable:
        raise UsageError(f"flight_recorder: signal {signum!r} cannot be caught; use e.g. signal.SIGUSR1")


def check_budget(detail_every: int, detail_budget: float | None) -> None:
    """``detail_budget``: a share of the job's time (0 to 1), and only with ``detail_every``."""
    if detail_budget is None:
        return
    if not isinstance(detail_budget, int | float) or not 0 < detail_budget < 1:
        raise UsageError(
            f"flight_recorder: detail_budget must be a share of the job's time between 0 and 1 "
            f"(e.g. 0.01), not {detail_budget!r}"
        )
    if not detail_every:
        raise UsageError("flight_recorder: detail_budget spaces the detailed steps: give detail_every too")


def warn(message: str) -> None:
    """A :class:`FlightDumpWarning` (the recorder never raises into the program)."""
    warnings.warn(f"layerscope flight recorder: {message}", FlightDumpWarning, stacklevel=3)


def cuda_in_use() -> bool:
    """Whether the program has initialised CUDA (the recorder never does)."""
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def cuda_event() -> Any:
    """A CUDA event recorded now on the current stream, or None where CUDA is not in use."""
    if not cuda_in_use():
        return None
    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record()
    return event


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (torch's, Python's, or one that says so)."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text
