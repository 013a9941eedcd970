"""File path: Chrome trace JSON written by torch.profiler / Kineto into an EventTable.

Reads ``.json`` and ``.json.gz`` (gzip detected by content). Only the event kinds attribution
needs are kept; names are interned as they are read. Timestamps (µs with ns fractions) become
integer nanoseconds. Backward nodes name their forward thread by an internal id, not the OS thread
id the trace uses; ``fwdbwd`` flow events pair forward and backward ops, and from those pairs the
reader maps internal ids to trace threads (falling back to the only forward thread when unique).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from layerscope.errors import TraceFormatError
from layerscope.events import names as event_names
from layerscope.events.call_lines import HandleColumn, saved_call_lines
from layerscope.events.chrome_links import module_ranges_from_python_events, resolve_forward_threads
from layerscope.events.shapes import dtypes_key, first_input_dtype, shapes_key
from layerscope.events.table import EventKind, EventTable, OutOfMemory

#: Bytes per element of record_param_comms dtypes (unknown: 4).
_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "double": 8,
    "float64": 8,
    "long": 8,
    "int64": 8,
    "int": 4,
    "int32": 4,
    "byte": 1,
    "uint8": 1,
    "char": 1,
    "int8": 1,
    "bool": 1,
    "short": 2,
    "int16": 2,
}

_KIND_BY_CATEGORY: dict[str, EventKind] = {
    "cpu_op": EventKind.CPU_OP,
    # older Kineto versions: lower case, then capitalised (as Holistic Trace Analysis also reads them)
    "operator": EventKind.CPU_OP,
    "Operator": EventKind.CPU_OP,
    "Runtime": EventKind.RUNTIME,
    "Kernel": EventKind.KERNEL,
    "user_annotation": EventKind.USER_ANNOTATION,
    "cuda_runtime": EventKind.RUNTIME,
    "cuda_driver": EventKind.RUNTIME,
    "runtime": EventKind.RUNTIME,
    "privateuse1_runtime": EventKind.RUNTIME,
    # Meta's MTIA accelerator: its runtime calls and the device's work (read as HTA reads them)
    "mtia_runtime": EventKind.RUNTIME,
    "mtia_ccp_events": EventKind.KERNEL,
    "xpu_runtime": EventKind.RUNTIME,
    "python_function": EventKind.PYTHON,
    "kernel": EventKind.KERNEL,
    "gpu_memcpy": EventKind.MEMCPY,
    "Memcpy": EventKind.MEMCPY,
    "gpu_memset": EventKind.MEMSET,
    "Memset": EventKind.MEMSET,
    "gpu_user_annotation": EventKind.DEVICE_OTHER,
    "cuda_sync": EventKind.DEVICE_OTHER,  # synchronisations as the device saw them (critical path)
}

#: A FLOP counter for (op name, input shapes, concrete inputs); None when torch is unavailable.
FlopCounter = Callable[[str, list[Any], list[Any]], int]


def parse_concrete(values: Any) -> list[Any]:
    """Kineto writes concrete inputs as strings (``"[2, 2]"``, ``"1"``, ``"False"``, ``""``)."""
    if not isinstance(values, list):
        return []
    out: list[Any] = []
    for v in values:
        if not isinstance(v, str):
            out.append(v)
        elif v == "":
            out.append(None)
        elif v in ("True", "False"):
            out.append(v == "True")
        else:
            try:
                out.append(orjson.loads(v.replace("True", "true").replace("False", "false")))
            except orjson.JSONDecodeError:
                out.append(v)
    return out


def _args(ev: dict[str, Any]) -> dict[str, Any]:
    """An event's args, or {} when absent or not an object."""
    args = ev.get("args")
    return args if isinstance(args, dict) else {}


#: Larger magnitudes do not fit the int64 columns (2**62 ns is 146 years; byte counts and ids alike).
_INT_LIMIT = 1 << 62


def _int(value: Any) -> int:
    """An integer field of an event; out-of-range values make the event malformed (OverflowError,
    which the reader reports as such), never a crash later in numpy."""
    number = int(value)
    if not -_INT_LIMIT < number < _INT_LIMIT:
        raise OverflowError(f"{number} is out of range")
    return number


def _sync_wait(args: dict[str, Any]) -> tuple[int, int]:
    """(stream waited on, correlation id of the ``cudaEventRecord`` that recorded the event)."""
    return _int(args["wait_on_stream"]), _int(args.get("wait_on_cuda_event_record_corr_id", -1))


def _malformed_reason(ph: Any, exc: Exception) -> str:
    """A short reason to count malformed events by: the phase, the error type and its message with
    numbers blanked (``'X' event: KeyError 'ts'``, ``'i' event: OverflowError N is out of range``)."""
    text = re.sub(r"-?\d[\d.e+]*", "N", str(exc))[:60]
    return f"{str(ph)[:4]!r} event: {type(exc).__name__} {text}".rstrip()


def _ns(value: Any) -> int:
    """Microseconds (a JSON int or float) as integer nanoseconds, exactly. Epoch timestamps in µs
    (~1.7e15) times 1000 exceed a float's 53-bit mantissa, so ``float(value) * 1000`` would round them
    to a multiple of 256 ns: a child could then end after its parent and nest wrongly. The whole
    microseconds are scaled as an int, only the fraction as a float."""
    if type(value) is int:
        return _int(value * 1000)
    number = float(value)
    whole = math.floor(number)
    return _int(whole * 1000 + round((number - whole) * 1000.0))


class TraceTableBuilder:
    """Fills an EventTable from trace events, a batch at a time (so big traces stream through)."""

    def __init__(self, flops: FlopCounter | None = None, source: str = "", strict: bool = False) -> None:
        self.table = EventTable()
        #: strict: a malformed event fails the whole read; otherwise it is skipped and counted here
        #: by reason (a 1 GB trace with one bad event is still worth reading).
        self.strict = strict
        self.malformed: dict[str, int] = {}
        self.flops = flops
        self.flop_dtypes: dict[int, int] = {}  # span -> name id of its dtype, for spans with FLOPs
        self.input_dtypes: dict[int, int] = {}  # op span with shapes -> name id of its dtypes_key
        self.handles = HandleColumn()  # op spans' "Record function id", for call lines
        self.source = source
        self.thread_ids: dict[tuple[Any, Any], int] = {}
        self.span_at: dict[tuple[int, int], int] = {}
        self.flow_starts: dict[Any, tuple[int, int]] = {}
        self.flow_ends: dict[Any, tuple[int, int]] = {}
        self.raw_fwd_tid: list[int] = []
        self.python_ids: dict[int, tuple[Any, Any]] = {}  # python span -> (Python id, Python parent id)
        self.skipped = 0
        self._flop_cache: dict[tuple[str, bytes, bytes], int] = {}
        self.peak_allocated: dict[str, int] = {}  # highest "Total Allocated" seen, cpu / device
        # The earliest allocation event per device class: (time, "Total Allocated" before it).
        self.first_allocated: dict[str, tuple[int, int]] = {}
        self.collectives: dict[tuple[str, str, int, str], list[int]] = {}  # -> [calls, bytes, ns]
        self.copy_bytes: dict[str, int] = {}  # memory copies' "bytes" by copy name

    def _flops(self, name: str, dims: Any, concrete: Any) -> int:
        """FLOPs of one op, computed once per distinct (name, shapes, scalar arguments): training
        repeats the same calls every step, and parsing concrete inputs is the costly part."""
        assert self.flops is not None
        try:
            key = (name, orjson.dumps(dims), orjson.dumps(concrete))
        except TypeError:
            return self.flops(name, dims, parse_concrete(concrete))
        found = self._flop_cache.get(key)
        if found is None:
            found = self._flop_cache[key] = self.flops(name, dims, parse_concrete(concrete))
        return found

    def _collective(self, args: dict[str, Any], dur_ns: int) -> None:
        """Aggregate one ``record_param_comms`` record: collective, process group, message size."""
        dtype = str(args.get("dtype", ""))
        key = (
            str(args.get("Collective name", "?")),
            str(args.get("Process Group Description") or args.get("Process Group Name") or ""),
            int(args.get("Group size", 0) or 0),
            dtype,
        )
        nelems = max(int(args.get("In msg nelems", 0) or 0), int(args.get("Out msg nelems", 0) or 0))
        entry = self.collectives.setdefault(key, [0, 0, 0])
        entry[0] += 1
        entry[1] += nelems * _DTYPE_BYTES.get(dtype.lower(), 4)
        entry[2] += dur_ns

    def _thread(self, ev: dict[str, Any]) -> int:
        key = (ev.get("pid"), ev.get("tid"))
        tid = self.thread_ids.get(key)
        if tid is None:
            tid = self.thread_ids[key] = len(self.thread_ids) + 1
        return tid

    def add_events(self, events: list[Any]) -> None:
        """Read one batch of trace events."""
        table, kinds, flops = self.table, _KIND_BY_CATEGORY, self.flops
        for ev in events:
            if not isinstance(ev, dict):
                self.skipped += 1
                continue
            ph = ev.get("ph")
            try:
                if ph == "X":
                    kind = kinds.get(ev.get("cat", ""))
                    if kind is None:
                        continue
                    tid = self._thread(ev)
                    args = _args(ev)
                    ts = _ns(ev["ts"])
                    dur = max(0, _ns(ev.get("dur", 0)))
                    name = str(ev.get("name", ""))
                    seq = _int(args.get("Sequence number", -1))
                    fwd = _int(args.get("Fwd thread id", 0)) if seq >= 0 else 0
                    # Runtime calls and device work pair by "correlation"; ops and device work by
                    # "External id" (older Kineto writes the runtime's id there for kernels too).
                    corr = _int(args.get("correlation", 0) or 0) if kind != EventKind.CPU_OP else 0
                    ext = _int(args.get("External id", 0) or 0) if kind != EventKind.RUNTIME else 0
                    dims = args.get("Input Dims")
                    shapes = shapes_key(dims) if dims and kind == EventKind.CPU_OP else None
                    op_flops = 0
                    if kind == EventKind.CPU_OP:
                        if flops is not None and dims:
                            op_flops = self._flops(name, dims, args.get("Concrete Inputs"))
                        elif flops is None:
                            op_flops = _int(args.get("flops", 0) or 0)
                    if kind == EventKind.PYTHON:
                        self.python_ids[len(table.span_ts)] = (
                            args.get("Python id"),
                            args.get("Python parent id"),
                        )
                    if name == "record_param_comms":
                        self._collective(args, dur)
                    elif kind == EventKind.MEMCPY:
                        self.copy_bytes[name] = self.copy_bytes.get(name, 0) + _int(args.get("bytes", 0) or 0)
                    elif "wait_on_stream" in args:  # a cuda_sync event waiting on a recorded CUDA event
                        table.sync_waits[len(table.span_ts)] = _sync_wait(args)
                    i = table.add_span(
                        name,
                        kind,
                        tid,
                        ts,
                        dur,
                        seq=seq,
                        fwd_tid=0,
                        corr=corr,
                        ext=ext,
                        shapes=shapes,
                        flops=op_flops,
                    )
                    self.raw_fwd_tid.append(fwd)
                    # the dtype FLOPs ran in, for MFU against that dtype's peak
                    if op_flops and (dtype := first_input_dtype(args.get("Input type"))):
                        self.flop_dtypes[i] = table.intern(dtype)
                    if shapes is not None and (types := dtypes_key(args.get("Input type"))):
                        self.input_dtypes[i] = table.intern(types)
                    if kind == EventKind.CPU_OP:
                        self.handles.add(i, args.get("Record function id"))
                    if kind in (EventKind.CPU_OP, EventKind.USER_ANNOTATION):
                        self.span_at.setdefault((tid, ts), i)
                elif ph == "i" and ev.get("name") in event_names.MEMORY_EVENTS:
                    self._memory_event(ev)
                elif ph in ("s", "f") and ev.get("cat") == "fwdbwd":
                    target = self.flow_starts if ph == "s" else self.flow_ends
                    target[ev.get("id")] = (self._thread(ev), _ns(ev["ts"]))
            except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
                if self.strict:
                    what = str(ev.get("name", ""))[:60]
                    where = self.source or "trace"
                    raise TraceFormatError(f"{where}: malformed {ph!r} event {what!r}: {exc}") from None
                reason = _malformed_reason(ph, exc)
                self.malformed[reason] = self.malformed.get(reason, 0) + 1

    def _memory_event(self, ev: dict[str, Any]) -> None:
        """An allocation, a free, or an allocation the allocator refused (``[OutOfMemory]``)."""
        args = _args(ev)
        on_device = _int(args.get("Device Type", 0) or 0) != 0
        allocated = _int(args.get("Total Allocated", 0) or 0)
        if ev.get("name") == event_names.OUT_OF_MEMORY_EVENT:
            requested = _int(args.get("Bytes", 0) or 0)
            oom = OutOfMemory(self._thread(ev), _ns(ev["ts"]), requested, on_device, allocated)
            self.table.out_of_memory.append(oom)
            return
        self.table.add_memory(
            self._thread(ev),
            _ns(ev["ts"]),
            _int(args.get("Bytes", 0)),
            on_device=on_device,
            addr=_int(args.get("Addr", 0) or 0),
        )
        where = "device" if on_device else "cpu"
        if allocated > self.peak_allocated.get(where, 0):
            self.peak_allocated[where] = allocated
        ts = _ns(ev["ts"])
        if "Total Allocated" in args and ts < self.first_allocated.get(where, (ts + 1, 0))[0]:
            self.first_allocated[where] = (ts, allocated - _int(args.get("Bytes", 0)))

    def finish(self, header: dict[str, Any]) -> EventTable:
        """Link what needs the whole trace (module events, forward threads) and return the table."""
        table = self.table
        if self.flop_dtypes:
            table.span_dtype = np.full(table.span_count, -1, dtype=np.int32)
            table.span_dtype[list(self.flop_dtypes)] = list(self.flop_dtypes.values())
        if self.input_dtypes:
            table.span_dtypes = np.full(table.span_count, -1, dtype=np.int32)
            table.span_dtypes[list(self.input_dtypes)] = list(self.input_dtypes.values())
        module_ranges_from_python_events(table, self.python_ids)
        table.span_fwd_tid = resolve_forward_threads(
            table, self.raw_fwd_tid, self.span_at, self.flow_starts, self.flow_ends
        )
        return self.finish_meta(header)

    def finish_meta(self, header: dict[str, Any]) -> EventTable:
        """The table's threads, meta and call lines, from what was gathered while reading (also the
        last step of the native reader's path, ``native_columns.py``, which fills the same fields)."""
        table = self.table
        table.threads = {tid: key for key, tid in self.thread_ids.items()}
        table.meta = {
            "source": self.source,
            "device_properties": header.get("deviceProperties") or [],
            "distributed": header.get("distributedInfo"),
            "skipped_events": self.skipped,
            "malformed_events": dict(self.malformed),
            "peak_allocated_bytes": dict(self.peak_allocated),
            # what the allocator held before the first event: the baseline of absolute peaks
            "allocated_before_bytes": {k: v for k, (_, v) in self.first_allocated.items()},
            "communication": [
                {
                    "collective": c,
                    "group": g,
                    "group_size": n,
                    "dtype": d,
                    "calls": v[0],
                    "bytes": v[1],
                    "cpu_us": v[2] / 1000.0,
                }
                for (c, g, n, d), v in sorted(self.collectives.items(), key=lambda kv: -kv[1][1])
            ],
            "schema_version": header.get("schemaVersion"),
        }
        if self.copy_bytes:
            table.meta["copy_bytes"] = dict(self.copy_bytes)
        own = header.get("layerscope")
        if isinstance(own, dict):  # what layerscope saved beside torch's trace (compiled graphs, modules)
            table.meta["layerscope"] = {k: v for k, v in own.items() if k != "call_lines"}  # lines: below
            table.call_lines, table.op_handles = saved_call_lines(own, self.handles, table.span_count)
        return table


def table_from_trace(data: dict[str, Any], flops: FlopCounter | None = None, source: str = "") -> EventTable:
    """Build an EventTable from a parsed trace (a dict with ``traceEvents``)."""
    builder = TraceTableBuilder(flops, source)
    builder.add_events(data["traceEvents"])
    return builder.finish(data)
