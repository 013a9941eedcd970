"""Live path: torch's profiler results (``profiler.kineto_results``) into an EventTable.

Two readers give the same table: the native one (``native_table.py`` over ``native_reader.cpp``) when
it is built for this torch, else torch's Python bindings (``bindings_reader.py``, several times slower:
docs/benchmarks.md). ``table_from_kineto`` picks one and never loses a profile to the fast one.
"""

from __future__ import annotations

import warnings
from typing import Any

from layerscope.attribution import nest_native, op_rows
from layerscope.capture import native
from layerscope.capture.bindings_reader import table_from_bindings
from layerscope.capture.flops import FlopCalculator
from layerscope.capture.native_table import table_from_native
from layerscope.errors import LayerscopeError, LayerscopeWarning
from layerscope.events.table import EventTable


def table_from_kineto(
    kineto_results: Any,
    flops: FlopCalculator | None,
    shapes: bool,
    cpu_only: bool = False,
    use_native: bool | None = None,
    reader: Any = None,
    threads: int = 0,
) -> EventTable:
    """Read ``profiler.kineto_results`` (torch's ``_ProfilerResult``) into an EventTable.

    Uses the native reader (``capture/native.py``) when it is built for this torch, else torch's
    Python bindings; both give the same table. ``use_native`` forces one or the other (False: the
    bindings; True: the native reader, raising when it is missing). ``reader`` stands in for the
    native module (``flight_shapes.JoinedReader``: torch recorded no shapes, the reader joins its
    own); it is used alone, its failures raised (the bindings would read no shapes). ``threads``:
    the native reader's (0: as many as pay off; 1: the calling thread alone).
    """
    # Attribution's kernels (nesting, grouping) come with the torch-free native module: handed over
    # here, since attribution cannot import capture; numpy where it is not built or turned off.
    nest_native.use(native.load_trace_reader())
    # So does the maker of op rows' objects, in this module (filling their slots directly).
    op_rows.use(native.load())
    if reader is not None:
        table = table_from_native(reader, kineto_results, flops, shapes, cpu_only, threads)
        table.meta["reader"] = "native"
        return table
    if use_native is not False:
        module = native.load()
        if use_native and module is None:
            raise LayerscopeError(f"native reader unavailable: {native.status().reason}")
        if module is not None:
            try:
                table = table_from_native(module, kineto_results, flops, shapes, cpu_only, threads)
            except Exception as exc:
                if use_native:
                    raise
                # Never lose a profile to the fast path: say so once and read it the slow way.
                native.disable_for_process(f"raised {type(exc).__name__}: {exc}")
                warnings.warn(
                    f"native reader failed ({type(exc).__name__}: {exc}); using the Python reader",
                    LayerscopeWarning,
                    stacklevel=2,
                )
            else:
                table.meta["reader"] = "native"
                return table
    table = table_from_bindings(kineto_results, flops, shapes, cpu_only)
    table.meta["reader"] = "python"
    return table
