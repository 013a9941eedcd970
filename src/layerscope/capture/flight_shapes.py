"""Input shapes for the flight recorder's detailed steps, recorded by layerscope instead of torch.

With ``record_shapes=True`` torch formats every op's shapes, strides, dtypes and scalar arguments
into strings when its profiler stops, whether or not a trace is written, and frees them later: most
of a detailed step's cost on the step's thread (docs/benchmarks.md). A detailed step exports no
Chrome trace, so it runs torch's profiler without shapes and records them itself: a RecordFunction
callback in the native module (``native_shapes.cpp``) keeps each op's inputs (kind, dtype, sizes,
scalar values) against the op's RecordFunction handle, the id torch keeps on the same event.
:class:`JoinedReader` then stands in for the native module where the reader
(``native_table.table_from_native``) asks it for columns: torch's events read without shapes, their
shapes, dtypes and scalar inputs joined from the record by handle, written as the reader writes
torch's. The table is the one a ``record_shapes=True`` capture gives (tests/test_flight_shapes.py).

The callback is started before torch's profiler and stopped after it (:class:`ShapeRecorder`), so
every op torch records was seen; where the native module lacks the callback, the detailed step
keeps torch's ``record_shapes``.
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import nn

from layerscope.capture import native

if TYPE_CHECKING:
    from layerscope.capture.recording import Recording
    from layerscope.capture.session import profile

#: Record the detailed steps' shapes here where the native module can (False: torch's
#: ``record_shapes``, as before; the benchmark compares the two in one process).
OWN_SHAPES = True


def supported(module: ModuleType | None) -> bool:
    """Whether ``module`` (the native module, or None) records shapes itself."""
    return module is not None and hasattr(module, "shapes_start")


class DetailedProfile:
    """One detailed step's profile block (``memory`` as asked), its shapes recorded beside torch
    where the native module can: the callback starts before torch's profiler and stops after it,
    on every path."""

    def __init__(self, model: nn.Module | None, memory: bool) -> None:
        from layerscope.capture.session import profile

        self.session: profile = profile(model, memory=memory)
        module = native.load()
        self._shapes = (
            ShapeRecorder(module) if OWN_SHAPES and module is not None and supported(module) else None
        )

    @property
    def own_shapes(self) -> bool:
        """Whether this block's shapes are recorded here (else by torch)."""
        return self._shapes is not None

    def start(self) -> None:
        """Start the block (and the shapes callback before it)."""
        shapes = self._shapes
        if shapes is not None:
            try:
                shapes.start()
            except RuntimeError:  # another recording holds the callback: torch records the shapes
                self._shapes = shapes = None
        if shapes is not None:
            self.session.options = replace(self.session.options, own_shapes=True)
        try:
            self.session.__enter__()
        except BaseException:
            if shapes is not None:
                shapes.stop()
            raise

    def stop(self) -> Recording:
        """End the block (the callback after it); its recording, with the shapes to read."""
        try:
            self.session.__exit__(None, None, None)
        finally:
            if self._shapes is not None:
                self._shapes.stop()
        recording = self.session.recording
        if self._shapes is not None:
            recording.own_shapes = self._shapes.take()
        return recording


class ShapeRecorder:
    """The shapes callback of one recording: :meth:`start` before torch's profiler starts,
    :meth:`stop` after it stopped (safe twice, and before a start), :meth:`take` the record."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module
        self._running = False

    def start(self) -> None:
        """Start the callback (one recorder at a time per process)."""
        self._module.shapes_start()
        self._running = True

    def stop(self) -> None:
        """Remove the callback."""
        if self._running:
            self._running = False
            self._module.shapes_stop()

    def take(self) -> JoinedReader:
        """The ops recorded so far (moved out of the callback's buffers), as a reader over them."""
        return JoinedReader(self._module, self._module.shapes_take())


class JoinedReader:
    """The native module as the reader uses it (``read_columns``, ``concrete_inputs``,
    ``first_dtypes``, ``event_at``, ``activity_name``), torch's events joined with a shape record.

    Events are named by their positions in torch's list where the reader asks about picked ones;
    the record knows ops by handle: :meth:`read_columns` keeps each span's position and handle.
    """

    def __init__(self, module: ModuleType, record: Any) -> None:
        self._module = module
        self._record = record
        self._index = np.zeros(0, dtype=np.int64)  # spans' positions in torch's list, ascending
        self._handles = np.zeros(0, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        """The bytes the record holds."""
        return int(self._record.nbytes)

    def read_columns(
        self, results: Any, with_shapes: bool, threads: int = 0, wanted: Any = ()
    ) -> dict[str, Any]:
        """torch's events as the native reader's columns, shapes and dtypes from the record (which
        answers for the scalar inputs too: ``wanted`` is not read from torch's events)."""
        cols: dict[str, Any] = self._module.read_columns(results, False, threads)
        self._index = np.frombuffer(cols["span_index"], dtype=np.int64)
        self._handles = np.frombuffer(cols["span_handle"], dtype=np.int64)
        if with_shapes:
            joined = self._record.join_columns(cols["span_handle"])
            for key in ("shapes", "span_shapes", "dtypes", "span_dtypes"):
                cols[key] = joined[key]
        return cols

    def _handles_at(self, packed_indices: bytes) -> bytes:
        """The handles of the events at ``packed_indices`` (positions in torch's list)."""
        indices = np.frombuffer(packed_indices, dtype=np.int64)
        at = np.searchsorted(self._index, indices)
        if len(indices) and (at.max() >= len(self._index) or not np.array_equal(self._index[at], indices)):
            raise IndexError("event index out of range (not a span read by read_columns)")
        return self._handles[at].tobytes()

    def concrete_inputs(self, results: Any, packed_indices: bytes) -> list[bytes | None]:
        """The scalar inputs of the events at ``packed_indices`` as JSON (None: see :meth:`event_at`)."""
        return list(self._record.concrete(self._handles_at(packed_indices)))

    def first_dtypes(self, results: Any, packed_indices: bytes) -> list[str]:
        """The dtype of each event's first typed input."""
        return list(self._record.first_dtypes(self._handles_at(packed_indices)))

    def event_at(self, results: Any, index: int) -> Any:
        """torch's event at ``index``, its ``concrete_inputs()`` answered from the record (the
        reader asks it for inputs the JSON writer leaves to torch's bindings)."""
        handle = int(
            np.frombuffer(self._handles_at(np.array([index], dtype=np.int64).tobytes()), np.int64)[0]
        )
        return _EventWithInputs(self._module.event_at(results, index), self._record, handle)

    def activity_name(self, code: int) -> str | None:
        """Kineto's name of an activity number (the native module's)."""
        name: str | None = self._module.activity_name(code)
        return name


class _EventWithInputs:
    """torch's event, with the concrete inputs the record has for it."""

    def __init__(self, event: Any, record: Any, handle: int) -> None:
        self._event = event
        self._record = record
        self._handle = handle

    def concrete_inputs(self) -> list[Any]:
        """The op's scalar inputs as torch's bindings give them (None for other inputs)."""
        return list(self._record.concrete_objects(self._handle))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._event, name)
