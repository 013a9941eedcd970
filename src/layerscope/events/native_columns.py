"""The native trace reader's columns (``capture/native_trace.cpp``) into the EventTable that
``chrome.TraceTableBuilder`` makes from the same file, equal field for field.

Per-event work is numpy; what the Python path computes per event from a distinct value (shapes
strings, FLOP formulas, dtypes) is computed once per distinct value. Names are interned in the Python
path's order: for each kept span its name, then its shapes, then its FLOPs' dtype.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import orjson

from layerscope.events import names as event_names
from layerscope.events.chrome import FlopCounter, TraceTableBuilder
from layerscope.events.chrome_links import module_ranges_from_python_events
from layerscope.events.shapes import dtypes_key, first_input_dtype, shapes_key
from layerscope.events.table import EventKind, EventTable, OutOfMemory

_NONE = np.iinfo(np.int64).min  # the reader's None in its Python-id columns
_INT64_MAX = (1 << 63) - 1


class Declined(Exception):
    """The columns cannot stand for the Python path's reading; the Python path reads the file."""


def _i64(found: dict[str, Any], key: str) -> np.ndarray:
    # the reader's own column (read-only, no copy): the table keeps it as it is
    return np.frombuffer(found[key], dtype=np.int64)


def _i32(found: dict[str, Any], key: str) -> np.ndarray:
    # ids the table never keeps as they are (they index per-distinct arrays): no widening copy
    return np.frombuffer(found[key], dtype=np.int32)


def _int_array(found: dict[str, Any], key: str) -> array[int]:
    # an array("q") of an int64 column, copied as bytes (array() of an ndarray goes item by item)
    out = array("q")
    out.frombytes(_i64(found, key).data.cast("B"))
    return out


def _op_flops(found: dict[str, Any], builder: TraceTableBuilder, dims: list[Any]) -> np.ndarray:
    """Each span's FLOPs: the formula once per distinct call (name, shapes, concrete inputs), which
    the reader numbered as it met them, or the trace's own ``flops`` where there is no FLOP counter."""
    if builder.flops is None:
        return _i64(found, "flops")
    calls = _i32(found, "calls").reshape(-1, 3)
    values = np.zeros(len(calls) + 1, dtype=np.int64)  # the last: spans that are no call (id -1)
    names, concrete = found["names"], found["concrete"]
    # the formulas run in the order of (name, shapes, concrete inputs) ids, as they always have
    for k in np.lexsort((calls[:, 2], calls[:, 1], calls[:, 0])).tolist():
        n, d, c = calls[k].tolist()
        try:
            value = builder._flops(names[n], dims[d], None if c < 0 else orjson.loads(concrete[c]))
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
            raise Declined(f"a FLOP formula failed: {exc}") from None
        if type(value) is not int or not -_INT64_MAX <= value <= _INT64_MAX:
            raise Declined("a FLOP count that is not an int64")
        values[k] = value
    out: np.ndarray = values[_i32(found, "call_id")]
    return out


def _first_at(ids: np.ndarray, count: int, mask: np.ndarray | None = None) -> np.ndarray:
    """Each id in ``range(count)``: the first span holding it (where ``mask``), else the span count.
    ``minimum.at`` is one pass, where ``unique(return_index=True)`` sorts every span."""
    first = np.full(count, ids.size, dtype=np.int64)
    if mask is None:
        np.minimum.at(first, ids, np.arange(ids.size))
    else:
        picked = np.flatnonzero(mask)
        np.minimum.at(first, ids[picked], picked)
    return first


def _intern_in_order(
    table: EventTable, found: dict[str, Any], dims: list[Any], op_flops: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Fill ``table.names`` as the Python path would have: for each span in order its name, shapes,
    dtype, then input dtypes list, each text at its first use. Returns span_name, span_shapes,
    span_dtype and span_dtypes (None when no span has one). Only distinct texts are handled in
    Python: a text's place is the first (span, slot) using it, found a slot family at a time."""
    name, dims_id, types_id = _i32(found, "name"), _i32(found, "dims_id"), _i32(found, "types_id")
    types = [orjson.loads(t) for t in found["types"]]
    with_dtype = (op_flops != 0) & (types_id >= 0)
    with_list = (dims_id >= 0) & (types_id >= 0)
    families: list[tuple[list[str | None], np.ndarray]] = [  # slot by slot: texts, first span of each
        (found["names"], _first_at(name, len(found["names"]))),
        ([shapes_key(d) for d in dims], _first_at(dims_id, len(dims), dims_id >= 0)),
        ([first_input_dtype(t) for t in types], _first_at(types_id, len(types), with_dtype)),
        ([dtypes_key(t) for t in types], _first_at(types_id, len(types), with_list)),  # for bytes per op
    ]
    place: dict[str, int] = {}
    for slot, (texts, first) in enumerate(families):
        for text, at in zip(texts, (first * 4 + slot).tolist(), strict=True):
            if text is not None and at < name.size * 4 and at < place.get(text, at + 1):
                place[text] = at
    table.names = sorted(place, key=place.__getitem__)
    table._name_ids = {word: i for i, word in enumerate(table.names)}

    def remap(texts: list[str | None], first: np.ndarray) -> np.ndarray:
        # each local id's name id (-1: none), and a trailing -1 for spans without one
        ids = [
            -1 if t is None or f >= name.size else table._name_ids[t]
            for t, f in zip(texts, first.tolist(), strict=True)
        ]
        return np.asarray([*ids, -1], dtype=np.int64)

    maps = [remap(texts, first) for texts, first in families]
    # the dtype columns are name ids, never arithmetic: int32 (half the memory of a column per span)
    of_dtype, of_list = maps[2].astype(np.int32), maps[3].astype(np.int32)
    has_dtype = (of_dtype >= 0).any() and with_dtype.any()
    dtype = of_dtype[np.where(with_dtype, types_id, -1)] if has_dtype else None
    lists = of_list[np.where(with_list, types_id, -1)] if (of_list >= 0).any() and with_list.any() else None
    return maps[0][name], maps[1][dims_id], dtype, lists


def _spans_at(
    kind: np.ndarray, tid: np.ndarray, ts: np.ndarray, q_tid: np.ndarray, q_ts: np.ndarray
) -> np.ndarray:
    """``TraceTableBuilder.span_at`` for each query (thread, time): the first op or annotation that
    starts there, -1 where none does. (thread, time) pairs are numbered through the distinct times,
    so both sides become one int64 and the first span of each is one ``unique``."""
    candidate = (kind == EventKind.CPU_OP) | (kind == EventKind.USER_ANNOTATION)
    picked = np.flatnonzero(candidate & np.isin(ts, q_ts))
    _, rank = np.unique(np.concatenate([ts[picked], q_ts]), return_inverse=True)
    width = int(max(tid[picked].max(initial=0), q_tid.max(initial=0))) + 1  # thread ids are small
    pair = rank.reshape(-1) * width + np.concatenate([tid[picked], q_tid])
    pairs, first = np.unique(pair[: picked.size], return_index=True)
    asked = pair[picked.size :]
    at = np.minimum(np.searchsorted(pairs, asked), max(pairs.size - 1, 0))
    hit = (pairs[at] == asked) if pairs.size else np.zeros(asked.size, dtype=bool)
    return np.where(hit, picked[first[at]] if pairs.size else -1, -1)


def _forward_threads(
    kind: np.ndarray, tid: np.ndarray, ts: np.ndarray, seq: np.ndarray, raw: np.ndarray, found: dict[str, Any]
) -> np.ndarray:
    """``chrome_links.resolve_forward_threads`` on columns (same rules, same result): a flow id's
    last start and last end (its dict entries), flows in the order their ids first start, and per
    backward thread id the first flow whose ends both hit a span."""
    start = _i64(found, "flow_start") != 0
    key, flow_tid, flow_ts = _i32(found, "flow_key"), _i64(found, "flow_tid"), _i64(found, "flow_ts")
    mapping: dict[int, int] = {}
    if key.size:
        rows = np.arange(key.size)
        last = np.full((2, int(key.max()) + 1), -1, dtype=np.int64)  # per id: last end, last start
        np.maximum.at(last, (start.astype(np.int64), key), rows)
        first_start = np.full(last.shape[1], key.size, dtype=np.int64)
        np.minimum.at(first_start, key[start], rows[start])
        ids = np.flatnonzero((last >= 0).all(axis=0))
        ids = ids[np.argsort(first_start[ids], kind="stable")]
        asked = np.concatenate([last[1, ids], last[0, ids]])  # the starts' rows, then the ends'
        spans = _spans_at(kind, tid, ts, flow_tid[asked], flow_ts[asked])
        fwd_span, bwd_span = spans[: ids.size], spans[ids.size :]
        ok = (fwd_span >= 0) & (bwd_span >= 0)
        ok[ok] = raw[bwd_span[ok]] != 0
        backward_ids, first = np.unique(raw[bwd_span[ok]], return_index=True)  # the first flow wins
        mapping = dict(zip(backward_ids.tolist(), tid[fwd_span[ok][first]].tolist(), strict=True))
    forward = tid[(seq >= 0) & (raw == 0) & (kind == EventKind.CPU_OP)]
    only = int(forward[0]) if forward.size and bool((forward == forward[0]).all()) else 0  # one thread
    out = np.zeros(raw.size, dtype=np.int64)
    backward = np.flatnonzero(raw)
    if backward.size:
        distinct, inverse = np.unique(raw[backward], return_inverse=True)
        out[backward] = np.asarray([mapping.get(f, only or -1) for f in distinct.tolist()])[inverse]
    return out


def _memory(builder: TraceTableBuilder, found: dict[str, Any]) -> dict[str, np.ndarray]:
    """Allocation columns, refused allocations, and the running figures the Python path keeps per
    event (highest ``Total Allocated``, the allocator's state before the earliest event)."""
    on_device = np.frombuffer(found["mem_on_device"], dtype=np.uint8).astype(bool)
    ts, nbytes, total = _i64(found, "mem_ts"), _i64(found, "mem_bytes"), _i64(found, "mem_total")
    has_total = np.frombuffer(found["mem_has_total"], dtype=np.uint8).astype(bool)
    peaks, firsts = [], []
    for where, mask in (("cpu", ~on_device), ("device", on_device)):
        positive = np.flatnonzero(mask & (total > 0))
        if positive.size:  # the dict's order is the order each class first raised its peak
            peaks.append((int(positive[0]), where, int(total[mask].max())))
        with_total = np.flatnonzero(mask & has_total)
        if with_total.size:
            earliest = int(with_total[np.argmin(ts[with_total])])
            firsts.append(
                (int(with_total[0]), where, (int(ts[earliest]), int(total[earliest] - nbytes[earliest])))
            )
    builder.peak_allocated = {where: value for _, where, value in sorted(peaks)}
    builder.first_allocated = {where: value for _, where, value in sorted(firsts)}
    oom = _i64(found, "oom").reshape(-1, 5).tolist()
    builder.table.out_of_memory = [OutOfMemory(t, s, r, bool(d), a) for t, s, r, d, a in oom]
    return {
        "mem_tid": _i64(found, "mem_tid"),
        "mem_ts": ts,
        "mem_bytes": nbytes,
        "mem_on_device": on_device,
        "mem_addr": _i64(found, "mem_addr"),
    }


def _side_tables(builder: TraceTableBuilder, found: dict[str, Any], dur: np.ndarray) -> None:
    """What the Python path gathers from a few events: collectives (their args read as it reads
    them), memory copies' bytes, syncs waiting on recorded events, ops' RecordFunction ids."""
    for span, raw in zip(_i64(found, "comms_span").tolist(), found["comms_args"], strict=True):
        try:
            args = orjson.loads(raw)
            builder._collective(args if isinstance(args, dict) else {}, int(dur[span]))
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
            raise Declined(f"a record_param_comms event the Python path finds malformed: {exc}") from None
    names = found["names"]
    copies = zip(_i32(found, "copy_name").tolist(), _i64(found, "copy_bytes").tolist(), strict=True)
    builder.copy_bytes = {names[n]: b for n, b in copies}
    sync = zip(_i64(found, "sync_stream").tolist(), _i64(found, "sync_corr").tolist(), strict=True)
    builder.table.sync_waits = dict(zip(_i64(found, "sync_span").tolist(), sync, strict=True))
    builder.handles.spans = _int_array(found, "handle_span")
    builder.handles.handles = _int_array(found, "handle")


def _python_ids(found: dict[str, Any]) -> dict[int, tuple[Any, Any]]:
    ids = [None if v == _NONE else v for v in _i64(found, "py_id").tolist()]
    parents = [None if v == _NONE else v for v in _i64(found, "py_parent").tolist()]
    return dict(zip(_i64(found, "py_span").tolist(), zip(ids, parents, strict=True), strict=True))


def table_from_columns(found: dict[str, Any], flops: FlopCounter | None, source: str) -> EventTable:
    """The EventTable of the reader's ``finish()`` result (raises Declined where the Python path
    would have read the trace differently)."""
    try:
        header = orjson.loads(found["header"])
        dims = [orjson.loads(t) for t in found["dims"]]
    except orjson.JSONDecodeError as exc:
        raise Declined(f"invalid JSON: {exc}") from None
    builder = TraceTableBuilder(flops, source)
    table = builder.table
    builder.skipped = int(found["skipped"])
    kind, tid, ts = _i64(found, "kind"), _i64(found, "tid"), _i64(found, "ts")
    seq, dur = _i64(found, "seq"), _i64(found, "dur")
    op_flops = _op_flops(found, builder, dims)
    span_name, span_shapes, span_dtype, span_dtypes = _intern_in_order(table, found, dims, op_flops)
    _side_tables(builder, found, dur)
    builder.thread_ids = {key: i + 1 for i, key in enumerate(found["threads"])}
    table.span_dtype, table.span_dtypes = span_dtype, span_dtypes
    python_ids = _python_ids(found) if not _has_module_ranges(table) else {}
    if python_ids:  # nn.Module events may become module ranges: renamed in the lists
        table.span_name, table.span_kind = span_name.tolist(), kind.tolist()
        module_ranges_from_python_events(table, python_ids)
    fwd = _forward_threads(kind, tid, ts, seq, _i64(found, "fwd"), found)
    columns = {
        "span_tid": tid,
        "span_ts": ts,
        "span_dur": dur,
        "span_seq": seq,
        "span_fwd_tid": fwd,
        "span_corr": _i64(found, "corr"),
        "span_ext": _i64(found, "ext"),
        "span_shapes": span_shapes,
        "span_flops": op_flops,
        **_memory(builder, found),
    }
    if not python_ids:  # module ranges renamed nothing: the name and kind arrays are still right
        columns.update(span_name=span_name, span_kind=kind)
    table.set_columns(columns)
    return builder.finish_meta(header)


def _has_module_ranges(table: EventTable) -> bool:
    return any(name.startswith(event_names.MODULE_RANGE_PREFIX) for name in table.names)
