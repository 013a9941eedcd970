"""Reading torch's profiler results through its Python bindings (``_KinetoEvent`` accessors).

The fallback when the native reader is not built, and the reference it is tested against. torch's
own post-processing builds a Python FunctionEvent per event, and exporting JSON to parse it back
makes a Python dict per event; reading the accessors column by column with ``map`` (no Python loop
body per call) is the cheapest way out through the bindings, and only the columns an event kind
needs are read (docs/architecture.md, docs/benchmarks.md).
"""

from __future__ import annotations

import operator
from itertools import compress
from typing import Any

import numpy as np
import orjson

from layerscope.capture.device_streams import stream_threads
from layerscope.capture.event_columns import (
    UNDECODABLE_NAME,
    count_flops,
    flop_candidates,
    guess_activities,
    kind_of_activity,
    set_flop_dtypes,
)
from layerscope.capture.flops import FlopCalculator
from layerscope.events.names import (
    BACKWARD_NODE_PREFIX,
    MODULE_RANGE_PREFIX,
    OUT_OF_MEMORY_EVENT,
    PROFILER_STEP_PREFIX,
)
from layerscope.events.shapes import dtypes_key, shapes_key_from_json
from layerscope.events.table import EventKind, EventTable, OutOfMemory


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
    return name.startswith((MODULE_RANGE_PREFIX, BACKWARD_NODE_PREFIX, PROFILER_STEP_PREFIX))


def table_from_bindings(
    kineto_results: Any, flops: FlopCalculator | None, shapes: bool, cpu_only: bool = False
) -> EventTable:
    """Read ``profiler.kineto_results`` through torch's Python bindings, column by column.

    ``cpu_only`` (no accelerator activity, no Python stacks recorded) lets the reader skip the
    accessors whose answer is then known: every span is CPU-side, every allocation host memory.
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
    memory = list(compress(events, is_memory))
    spans = list(compress(events, map(operator.not_, is_memory)))
    span_names, undecodable = _read_names(spans, event_type)
    if undecodable:
        table.meta["undecodable_names"] = undecodable
    if OUT_OF_MEMORY_EVENT in span_names:  # a refused allocation is no op: its own list
        spans, span_names = _take_out_of_memory(table, spans, span_names, event_type, cpu_only)
    if memory:
        _read_memory(table, memory, list(compress(all_bytes, is_memory)), event_type, cpu_only)
        table.mem_addr = _addresses(kineto_results, table.mem_ts, table.mem_bytes)
    name_ids = {name: table.intern(name) for name in dict.fromkeys(span_names)}
    table.span_name = list(map(name_ids.__getitem__, span_names))
    kind_ids, table.span_kind = _span_kinds(spans, span_names, event_type, cpu_only)
    table.span_ts = list(map(event_type.start_ns, spans))
    table.span_dur = list(map(event_type.duration_ns, spans))
    table.span_tid = _signed(list(map(event_type.start_thread_id, spans)))
    if not cpu_only:
        _on_streams(table, spans, event_type)
    _read_links(table, spans, event_type, launches=any(k >= EventKind.KERNEL for k in kind_ids.values()))
    raw_shapes = _read_shapes(table, spans, name_ids, event_type) if shapes else None
    if raw_shapes is None:
        table.span_shapes = [-1] * len(spans)
    table.span_flops = _read_flops(table, spans, name_ids, raw_shapes, flops)
    return table


def _on_streams(table: EventTable, spans: list[Any], event_type: Any) -> None:
    """Device spans moved onto one thread per stream (``device_streams``), as the native reader does
    (bindings without ``device_resource_id`` leave them on their launching threads)."""
    resource_id = getattr(event_type, "device_resource_id", None)
    if resource_id is None:
        return
    # spans of a device kind (KERNEL and later; a Vulkan op is a CPU op on a device) that run on a
    # device (DeviceType.CPU is 0): only those are asked, not every span
    kinds = table.span_kind
    rows = [k for k in range(len(kinds)) if kinds[k] >= EventKind.KERNEL]
    rows = [k for k in rows if int(event_type.device_type(spans[k])) != 0]
    if not rows:
        return
    device = [event_type.device_index(spans[k]) for k in rows]
    stream = [resource_id(spans[k]) for k in rows]
    tid, mem_tid = np.asarray(table.span_tid, dtype=np.int64), np.asarray(table.mem_tid, dtype=np.int64)
    table.threads = stream_threads(tid, mem_tid, np.asarray(rows), np.asarray(device), np.asarray(stream))
    table.span_tid = tid.tolist()


def _read_memory(
    table: EventTable, memory: list[Any], nbytes: list[int], event_type: Any, cpu_only: bool
) -> None:
    table.mem_bytes = nbytes
    table.mem_ts = list(map(event_type.start_ns, memory))
    table.mem_tid = _signed(list(map(event_type.start_thread_id, memory)))
    if cpu_only:
        table.mem_on_device = [False] * len(memory)
    else:  # DeviceType.CPU is 0; any other device type is accelerator memory.
        table.mem_on_device = [int(d) != 0 for d in map(event_type.device_type, memory)]


def _take_out_of_memory(
    table: EventTable, spans: list[Any], names: list[str], event_type: Any, cpu_only: bool
) -> tuple[list[Any], list[str]]:
    """Move torch's ``[OutOfMemory]`` events out of the spans into ``table.out_of_memory``. Their size
    is not in torch's bindings (``nbytes()`` is 0 and the event's fields are not bound), so it reads
    0 here; the native reader has it."""
    kept = [k for k, name in enumerate(names) if name != OUT_OF_MEMORY_EVENT]
    for k in range(len(names)):
        if names[k] == OUT_OF_MEMORY_EVENT:
            event = spans[k]
            on_device = not cpu_only and int(event_type.device_type(event)) != 0
            tid = _signed([event_type.start_thread_id(event)])[0]
            table.out_of_memory.append(OutOfMemory(tid, event_type.start_ns(event), 0, on_device))
    return [spans[k] for k in kept], [names[k] for k in kept]


def _addresses(kineto_results: Any, mem_ts: list[int], mem_bytes: list[int]) -> list[int]:
    """Each memory event's address, from torch's event tree (the only place the bindings show it),
    matched by (time, bytes); 0 where no tree node matches."""
    by_key: dict[tuple[int, int], list[int]] = {}
    tree = getattr(kineto_results, "experimental_event_tree", None)
    if tree is None:  # a torch without it: addresses unknown
        return [0] * len(mem_ts)
    pending = list(tree())
    found: list[Any] = []
    while pending:  # depth-first, children in order (the order the native reader sees them)
        node = pending.pop()
        found.append(node)
        pending.extend(reversed(node.children))
    for node in found:
        fields = node.extra_fields
        if hasattr(fields, "alloc_size") and hasattr(fields, "ptr"):
            by_key.setdefault((node.start_time_ns, int(fields.alloc_size)), []).append(int(fields.ptr))
    for ptrs in by_key.values():
        ptrs.reverse()  # popped from the end: first found, first taken
    addresses = []
    for ts, nbytes in zip(mem_ts, mem_bytes, strict=True):
        candidates = by_key.get((ts, nbytes))
        addresses.append(candidates.pop() if candidates else 0)
    return addresses


def _span_kinds(
    spans: list[Any], names: list[str], event_type: Any, cpu_only: bool
) -> tuple[dict[str, int], list[int]]:
    """(kind number per activity name seen, each span's kind number)."""
    if cpu_only:
        # CPU ops and user annotations are attributed alike (by name), so one kind serves both.
        return {"cpu_op": int(EventKind.CPU_OP)}, [int(EventKind.CPU_OP)] * len(spans)
    if hasattr(event_type, "activity_type"):
        activities = list(map(event_type.activity_type, spans))
    else:  # torch < 2.12 names no activity: guessed from what it does tell
        on_device = [int(d) != 0 for d in map(event_type.device_type, spans)]
        annotation = (
            list(map(event_type.is_user_annotation, spans))
            if hasattr(event_type, "is_user_annotation")
            else None
        )
        device_index = list(map(event_type.device_index, spans))
        activities = guess_activities(names, on_device, annotation, device_index)
    kind_ids = {a: int(kind_of_activity(a)) for a in set(activities)}
    return kind_ids, list(map(kind_ids.__getitem__, activities))


def _read_links(table: EventTable, spans: list[Any], event_type: Any, launches: bool) -> None:
    """Sequence numbers, forward threads and the ids that link device work to its launching op."""
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
    if not launches:
        table.span_ext = [0] * len(spans)
        return
    # A CPU op's correlation_id() is its external id; device work's linked_correlation_id() names
    # the op that launched it (torch's own FunctionEvent linking uses the same pair).
    table.span_ext = [
        (
            e.linked_correlation_id()
            if k >= EventKind.KERNEL
            else (0 if k == EventKind.RUNTIME else e.correlation_id())
        )
        for e, k in zip(spans, table.span_kind, strict=True)
    ]


def _read_shapes(
    table: EventTable, spans: list[Any], name_ids: dict[str, int], event_type: Any
) -> list[bytes]:
    """Each span's input shapes as JSON (returned for the FLOP formulas), interned into the table."""
    # orjson.dumps beats str() on nested lists by far; only distinct shapes are formatted into their
    # display form. Ranges (module scopes, autograd's evaluate_function wrappers, steps) record no
    # inputs: their shapes() is always empty, so it is not asked.
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
        b: (table.intern(shapes_key_from_json(b)) if b != b"[]" else -1) for b in dict.fromkeys(raw_shapes)
    }
    table.span_shapes = list(map(shape_ids.__getitem__, raw_shapes))
    _read_dtypes(table, spans, event_type)
    return raw_shapes


def _read_dtypes(table: EventTable, spans: list[Any], event_type: Any) -> None:
    """Each op span's input dtypes (spans with shapes only), as the native reader reads them."""
    column = np.full(len(spans), -1, dtype=np.int64)
    with_shapes = [j for j, s in enumerate(table.span_shapes) if s >= 0]
    ids: dict[str, int] = {}
    for j, types in zip(with_shapes, map(event_type.dtypes, (spans[j] for j in with_shapes)), strict=True):
        key = dtypes_key(list(types))
        if key is not None:
            column[j] = ids[key] if key in ids else ids.setdefault(key, table.intern(key))
    table.span_dtypes = column


def _read_flops(
    table: EventTable,
    spans: list[Any],
    name_ids: dict[str, int],
    raw_shapes: list[bytes] | None,
    flops: FlopCalculator | None,
) -> list[int]:
    span_flops = [0] * len(spans)
    if flops is None:
        return span_flops
    picked = flop_candidates(table, name_ids.values(), flops)
    if picked:
        shapes_raw = [
            raw_shapes[j] if raw_shapes is not None else orjson.dumps(spans[j].shapes()) for j in picked
        ]
        concrete = [spans[j].concrete_inputs() for j in picked]
        keys = [orjson.dumps(c, default=str) for c in concrete]
        count_flops(table, flops, span_flops, picked, shapes_raw, keys, concrete)
        set_flop_dtypes(table, picked, [next((d for d in spans[j].dtypes() if d), "") for j in picked])
    return span_flops
