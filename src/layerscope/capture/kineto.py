"""Live path: Kineto's results straight into an EventTable, without FunctionEvents or JSON.

torch's own post-processing builds a Python FunctionEvent per event (tens of µs each); exporting
JSON and parsing it back costs several µs per event. Reading the C++ ``_KinetoEvent`` accessors
column by column with ``map`` (no Python loop body per call) is the cheapest way out of torch,
and only the columns an event kind needs are read.
"""

from __future__ import annotations

import operator
import warnings
from itertools import compress
from typing import Any

import numpy as np
import orjson

from layerscope.attribution.buckets import BACKWARD_NODE_PREFIX
from layerscope.attribution.steps import STEP_PREFIX
from layerscope.capture import native
from layerscope.capture.flops import FlopCalculator
from layerscope.errors import LayerscopeError, LayerscopeWarning
from layerscope.events.module_ranges import MODULE_RANGE_PREFIX
from layerscope.events.shapes import shapes_key_from_json
from layerscope.events.table import EventKind, EventTable

_KIND_BY_ACTIVITY: dict[str, EventKind] = {
    "cpu_op": EventKind.CPU_OP,
    "user_annotation": EventKind.USER_ANNOTATION,
    "cuda_runtime": EventKind.RUNTIME,
    "cuda_driver": EventKind.RUNTIME,
    "privateuse1_runtime": EventKind.RUNTIME,
    "privateuse1_driver": EventKind.RUNTIME,
    "xpu_runtime": EventKind.RUNTIME,
    "mtia_runtime": EventKind.RUNTIME,
    "python_function": EventKind.PYTHON,
    "kernel": EventKind.KERNEL,
    "gpu_memcpy": EventKind.MEMCPY,
    "gpu_memset": EventKind.MEMSET,
    "mtia_ccp_events": EventKind.KERNEL,
    "gpu_user_annotation": EventKind.DEVICE_OTHER,
}


def kind_of_activity(activity: str) -> EventKind:
    """EventKind of a Kineto activity type name (unknown CPU-side names count as CPU ops)."""
    found = _KIND_BY_ACTIVITY.get(activity)
    if found is not None:
        return found
    return EventKind.CPU_OP if activity.startswith("cpu") else EventKind.DEVICE_OTHER


#: What an event whose name torch cannot decode is called (see :func:`_read_names`).
UNDECODABLE_NAME = "(undecodable name)"


def _read_names(spans: list[Any], event_type: Any) -> tuple[list[str], int]:
    """Every span's name, and how many could not be decoded.

    With ``with_stack=True``, torch occasionally hands back a Python-function event whose name is not
    valid UTF-8 (seen about once in 15 fresh processes on torch 2.13: the bytes after the first ~37
    are garbage, as if read from a freed string), and ``name()`` raises ``UnicodeDecodeError``. A
    profile must never fail on a name: such events get a visible placeholder and are counted.
    """
    try:
        return list(map(event_type.name, spans)), 0
    except UnicodeDecodeError:
        pass
    names: list[str] = []
    bad = 0
    for event in spans:
        try:
            names.append(event.name())
        except UnicodeDecodeError:
            names.append(UNDECODABLE_NAME)
            bad += 1
    return names, bad


def _signed(values: list[int]) -> list[int]:
    """Thread ids as signed 64-bit numbers. torch reports ``2**64 - 1`` ("unknown") for the Python
    frames of threads that were already running when profiling started (with_stack and all
    threads); numpy columns hold int64."""
    if values and max(values) >= 2**63:
        return [v - 2**64 if v >= 2**63 else v for v in values]
    return values


def _records_no_inputs(name: str) -> bool:
    """Spans whose ``shapes()`` is always empty: layerscope's module ranges, autograd's
    ``evaluate_function`` wrappers and ``ProfilerStep#N`` (checked on torch 2.13 captures)."""
    return name.startswith((MODULE_RANGE_PREFIX, BACKWARD_NODE_PREFIX, STEP_PREFIX))


def table_from_kineto(
    kineto_results: Any,
    flops: FlopCalculator | None,
    shapes: bool,
    cpu_only: bool = False,
    use_native: bool | None = None,
) -> EventTable:
    """Read ``profiler.kineto_results`` (torch's ``_ProfilerResult``) into an EventTable.

    Uses the native reader (``capture/native.py``) when it is built for this torch, else torch's
    Python bindings; both give the same table. ``use_native`` forces one or the other (False: the
    bindings; True: the native reader, raising when it is missing).
    """
    if use_native is not False:
        module = native.load()
        if module is None and use_native:
            raise LayerscopeError(f"native reader unavailable: {native.status().reason}")
        if module is not None and hasattr(_event_type(), "activity_type"):
            try:
                table = table_from_native(module, kineto_results, flops, shapes, cpu_only)
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


def _event_type() -> Any:
    from torch._C._autograd import _KinetoEvent

    return _KinetoEvent


def table_from_bindings(
    kineto_results: Any, flops: FlopCalculator | None, shapes: bool, cpu_only: bool = False
) -> EventTable:
    """Read ``profiler.kineto_results`` through torch's Python bindings, column by column.

    ``cpu_only`` (no accelerator activity, no Python stacks recorded) lets the reader skip the
    accessors whose answer is then known: every span is CPU-side, every allocation host memory.
    Each skipped accessor saves ~0.3 µs per event.
    """
    events = kineto_results.events()
    table = EventTable()
    if not events:
        return table
    event_type = type(events[0])
    # Only allocation/free events carry a byte count, so nbytes() both finds them and reads them
    # (cheaper than asking every event for its name).
    all_bytes = list(map(event_type.nbytes, events))
    is_memory = list(map(bool, all_bytes))
    is_span = list(map(operator.not_, is_memory))
    memory = list(compress(events, is_memory))
    spans = list(compress(events, is_span))
    span_names, undecodable = _read_names(spans, event_type)
    if undecodable:
        table.meta["undecodable_names"] = undecodable

    if memory:
        table.mem_bytes = list(compress(all_bytes, is_memory))
        table.mem_ts = list(map(event_type.start_ns, memory))
        table.mem_tid = _signed(list(map(event_type.start_thread_id, memory)))
        if cpu_only:
            table.mem_on_device = [False] * len(memory)
        else:  # DeviceType.CPU is 0; any other device type is accelerator memory.
            table.mem_on_device = [int(d) != 0 for d in map(event_type.device_type, memory)]

    name_ids = {name: table.intern(name) for name in dict.fromkeys(span_names)}
    table.span_name = list(map(name_ids.__getitem__, span_names))
    if cpu_only:
        # CPU ops and user annotations are attributed alike (by name), so one kind serves both.
        kind_ids = {"cpu_op": int(EventKind.CPU_OP)}
        kinds = [int(EventKind.CPU_OP)] * len(spans)
    elif hasattr(event_type, "activity_type"):
        activities = list(map(event_type.activity_type, spans))
        kind_ids = {a: int(kind_of_activity(a)) for a in set(activities)}
        kinds = list(map(kind_ids.__getitem__, activities))
    else:
        # torch < 2.5 has no activity_type(): events on the host are CPU ops, the rest device work
        # (degraded: Python-function events then count as ops, runtime calls as CPU ops).
        on_device = [int(d) != 0 for d in map(event_type.device_type, spans)]
        kind_ids = {"cpu_op": int(EventKind.CPU_OP), "kernel": int(EventKind.KERNEL)}
        kinds = [kind_ids["kernel"] if d else kind_ids["cpu_op"] for d in on_device]
    table.span_kind = kinds
    table.span_ts = list(map(event_type.start_ns, spans))
    table.span_dur = list(map(event_type.duration_ns, spans))
    table.span_tid = _signed(list(map(event_type.start_thread_id, spans)))
    table.span_seq = seq = list(map(event_type.sequence_nr, spans))
    # Only autograd-recorded ops (sequence number >= 0) have a forward thread worth asking for.
    has_seq = [q >= 0 for q in seq]
    fwd_tid = [0] * len(spans)
    for j, value in zip(
        compress(range(len(spans)), has_seq),
        map(event_type.fwd_thread_id, compress(spans, has_seq)),
        strict=True,
    ):
        fwd_tid[j] = value
    table.span_fwd_tid = fwd_tid
    table.span_corr = [0] * len(spans)
    if any(k >= EventKind.KERNEL for k in kind_ids.values()):
        # A CPU op's correlation_id() is its external id; device work's linked_correlation_id()
        # names the op that launched it (torch's own FunctionEvent linking uses the same pair).
        table.span_ext = [
            (
                e.linked_correlation_id()
                if k >= EventKind.KERNEL
                else (0 if k == EventKind.RUNTIME else e.correlation_id())
            )
            for e, k in zip(spans, kinds, strict=True)
        ]
    else:
        table.span_ext = [0] * len(spans)
    raw_shapes: list[bytes] | None = None
    if shapes:
        # orjson.dumps is ~10x faster than str() on nested lists; only distinct shapes are
        # formatted into their display form. Ranges (module scopes, autograd's evaluate_function
        # wrappers, steps) record no inputs: their shapes() is always empty, so it is not asked.
        no_inputs = {i for n, i in name_ids.items() if _records_no_inputs(n)}
        if no_inputs:
            asks = [n not in no_inputs for n in table.span_name]
            raw_shapes = [b"[]"] * len(spans)
            for j, value in zip(
                compress(range(len(spans)), asks),
                map(orjson.dumps, map(event_type.shapes, compress(spans, asks))),
                strict=True,
            ):
                raw_shapes[j] = value
        else:
            raw_shapes = list(map(orjson.dumps, map(event_type.shapes, spans)))
        shape_ids = {
            b: (table.intern(shapes_key_from_json(b)) if b != b"[]" else -1)
            for b in dict.fromkeys(raw_shapes)
        }
        table.span_shapes = list(map(shape_ids.__getitem__, raw_shapes))
    else:
        table.span_shapes = [-1] * len(spans)
    span_flops = [0] * len(spans)
    if flops is not None:
        picked = _flop_candidates(table, name_ids.values(), flops)
        if picked:
            shapes_raw = [
                raw_shapes[j] if raw_shapes is not None else orjson.dumps(spans[j].shapes()) for j in picked
            ]
            concrete = [spans[j].concrete_inputs() for j in picked]
            keys = [orjson.dumps(c, default=str) for c in concrete]
            _count_flops(table, flops, span_flops, picked, shapes_raw, keys, concrete)
    table.span_flops = span_flops
    return table


def _flop_candidates(table: EventTable, name_ids: Any, flops: FlopCalculator) -> list[int]:
    """Span positions whose op has a FLOP formula (only those need concrete inputs read)."""
    wanted = [i for i in name_ids if flops.needs(table.names[i])]
    if not wanted:
        return []
    return np.flatnonzero(np.isin(table.array("span_name"), wanted)).tolist()


def _count_flops(
    table: EventTable,
    flops: FlopCalculator,
    span_flops: list[int],
    picked: list[int],
    shapes_raw: list[bytes],
    concrete_keys: list[bytes],
    concrete: list[Any],
) -> None:
    """Fill ``span_flops`` at ``picked`` positions. Training repeats the same calls step after step:
    each distinct (op, shapes, scalar arguments) is counted once."""
    cache: dict[tuple[int, bytes, bytes], int] = {}
    for j, shapes_json, key_bytes, inputs in zip(picked, shapes_raw, concrete_keys, concrete, strict=True):
        key = (table.span_name[j], shapes_json, key_bytes)
        found = cache.get(key)
        if found is None:
            values = orjson.loads(inputs) if isinstance(inputs, bytes) else inputs
            found = cache[key] = flops.count(table.names[key[0]], orjson.loads(shapes_json), values)
        span_flops[j] = found


def decode_names(raw_names: list[bytes]) -> tuple[list[str], list[int]]:
    """Distinct event names as text, and the positions of those that are not valid UTF-8 (they
    become :data:`UNDECODABLE_NAME`, as in the bindings path)."""
    decoded: list[str] = []
    bad: list[int] = []
    for i, raw in enumerate(raw_names):
        try:
            decoded.append(raw.decode())
        except UnicodeDecodeError:
            decoded.append(UNDECODABLE_NAME)
            bad.append(i)
    return decoded, bad


def _column(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.int64)


def table_from_native(
    module: Any, kineto_results: Any, flops: FlopCalculator | None, shapes: bool, cpu_only: bool = False
) -> EventTable:
    """Read ``profiler.kineto_results`` with the native reader (``native_reader.cpp``): one C++ pass
    hands back int64 columns and each distinct name and shapes list once. Gives the same table as
    :func:`table_from_bindings` (tested column by column)."""
    cols = module.read_columns(kineto_results, bool(shapes or flops is not None))
    table = EventTable()
    arrays: dict[str, np.ndarray] = {}
    mem_bytes = _column(cols["mem_bytes"])
    if len(mem_bytes):
        arrays["mem_bytes"], arrays["mem_ts"] = mem_bytes, _column(cols["mem_ts"])
        arrays["mem_tid"] = _column(cols["mem_tid"])
        on_device = (
            np.zeros(len(mem_bytes), dtype=bool) if cpu_only else _column(cols["mem_device"]) != 0
        )  # DeviceType.CPU is 0
        arrays["mem_on_device"] = on_device
    span_local_name = _column(cols["span_name"])
    if len(span_local_name) == 0 and not len(mem_bytes):
        return table

    # Names: decoded once each; the table interns them in first-seen order, as the bindings path does.
    decoded, bad_local = decode_names(cols["names"])
    name_of_local = np.array([table.intern(n) for n in decoded], dtype=np.int64)
    span_name = name_of_local[span_local_name] if len(decoded) else span_local_name
    if bad_local:
        table.meta["undecodable_names"] = int(np.isin(span_local_name, bad_local).sum())
    arrays["span_name"] = span_name

    activity = _column(cols["span_activity"])
    if cpu_only:
        kinds = np.full(len(span_name), int(EventKind.CPU_OP), dtype=np.int64)
    else:
        # torch's bindings turn the activity number into its name; ask them once per number.
        index = _column(cols["span_index"])
        codes, first = np.unique(activity, return_index=True)
        lookup = np.zeros(int(codes.max()) + 1 if len(codes) else 1, dtype=np.int64)
        for code, at in zip(codes.tolist(), first.tolist(), strict=True):
            name = module.event_at(kineto_results, int(index[at])).activity_type()
            lookup[code] = int(kind_of_activity(name))
        kinds = lookup[activity] if len(activity) else activity
    arrays["span_kind"] = kinds
    for column in ("span_ts", "span_dur", "span_tid", "span_seq", "span_fwd_tid"):
        arrays[column] = _column(cols[column])
    arrays["span_corr"] = np.zeros(len(span_name), dtype=np.int64)
    # As in the bindings path: device work links to its op by linked_correlation_id, a CPU op holds
    # its own external id in correlation_id, runtime calls hold none.
    on_device = kinds >= int(EventKind.KERNEL)
    if on_device.any():
        ext = np.where(on_device, _column(cols["span_linked"]), _column(cols["span_corr"]))
        ext[kinds == int(EventKind.RUNTIME)] = 0
    else:  # nothing to link
        ext = np.zeros(len(span_name), dtype=np.int64)
    arrays["span_ext"] = ext

    shape_texts: list[bytes] = cols["shapes"]
    local_shapes = _column(cols["span_shapes"])
    if shapes:
        shape_ids = np.array(
            [table.intern(shapes_key_from_json(b)) if b != b"[]" else -1 for b in shape_texts], dtype=np.int64
        )
        arrays["span_shapes"] = shape_ids[local_shapes] if len(shape_texts) else local_shapes
    else:
        arrays["span_shapes"] = np.full(len(span_name), -1, dtype=np.int64)

    for column, values in arrays.items():
        setattr(table, column, values.tolist())
    table._arrays.update(arrays)  # the attribution reads these columns as arrays: no second conversion
    span_flops = [0] * len(span_name)
    if flops is not None:
        picked = _flop_candidates(table, range(len(table.names)), flops)
        if picked:
            event_index = _column(cols["span_index"])[picked]
            keys: list[bytes | None] = module.concrete_inputs(kineto_results, event_index.tobytes())
            concrete: list[Any] = list(keys)
            for k, key in enumerate(keys):
                if key is None:  # an input kind the C++ writer leaves to torch's bindings
                    concrete[k] = module.event_at(kineto_results, int(event_index[k])).concrete_inputs()
                    keys[k] = orjson.dumps(concrete[k], default=str)
            shapes_raw = [shape_texts[i] for i in local_shapes[picked].tolist()]
            _count_flops(table, flops, span_flops, picked, shapes_raw, [k or b"" for k in keys], concrete)
    table.span_flops = span_flops
    return table
