"""What the flight recorder keeps of each step, as torch-free columns (``ls.flight_recorder``).

A step's record is two small integer arrays, filled by the recorder's hooks and read back by
``attribution/flight_profile.py`` only when a dump is written (nothing is paired while the job runs):

- ``forward``: one row per mark, ``(time ns, code, thread)``; code ``+m`` opens a call of module ``m``
  (1-based in the recorder's module list), ``-m`` closes it. Calls nest per thread.
- ``backward``: one row per event of the backward pass, ``(time ns, call)``: ``call`` is the row of
  ``forward`` where that call's forward ended, recorded when the first autograd node of its output
  is about to run (its backward starts); :data:`PASS_END` marks the end of a backward pass,
  :data:`PASS_START` the start of one no hooked node began.

Times are ``time.perf_counter_ns()`` (monotonic, process-wide), converted to Unix time by
``clock_offset_ns`` when the record is written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

#: ``backward`` rows whose call is this mark the end of a backward pass (the autograd engine's
#: final callback).
PASS_END = -1

#: ``backward`` rows whose call is this mark the start of a backward pass that began with no hooked
#: node (a module call opened inside it first: reentrant checkpointing of a whole model).
PASS_START = -2

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class FlightModule:
    """One module the recorder scopes: its path in the model, its class, its own and total
    parameters."""

    path: str
    type_name: str
    params: int = 0
    params_total: int = 0


@dataclass(frozen=True)
class FlightStep:
    """One step's record: its number, its window on the recorder's clock, the marks of its forward
    calls and the events of its backward passes (see the module docstring), and on CUDA the device
    time between the step boundaries (None until known or without CUDA). ``complete`` is False for
    the step still running when a dump was taken (a signal, an exception): its window ends then."""

    step: int
    start_ns: int
    end_ns: int
    forward: Int64Array  # shape (n, 3): time ns, code, thread
    backward: Int64Array  # shape (k, 2): time ns, call (forward row) or PASS_END
    device_us: float | None = None
    complete: bool = True

    @property
    def wall_ns(self) -> int:
        """The step's length on the recorder's clock."""
        return self.end_ns - self.start_ns

    @property
    def nbytes(self) -> int:
        """The bytes its arrays hold (the ring's memory per step)."""
        return int(self.forward.nbytes + self.backward.nbytes)


def forward_rows(marks: list[tuple[int, int, int]]) -> Int64Array:
    """The ``forward`` array of a step from the recorder's list of marks."""
    if not marks:
        return np.zeros((0, 3), dtype=np.int64)
    return np.array(marks, dtype=np.int64).reshape(-1, 3)


def backward_rows(events: list[tuple[int, int]]) -> Int64Array:
    """The ``backward`` array of a step from the recorder's list of backward events."""
    if not events:
        return np.zeros((0, 2), dtype=np.int64)
    return np.array(events, dtype=np.int64).reshape(-1, 2)
