"""Turning the native reader's output (``native_reader.cpp``: int64 buffers, each distinct name and
shapes string once) into an EventTable."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from layerscope.capture.device_streams import stream_threads
from layerscope.capture.event_columns import (
    count_flops,
    count_flops_by_call,
    decode_names,
    flop_candidates,
    kind_of_activity,
    set_flop_dtypes,
)
from layerscope.capture.flops import FlopCalculator
from layerscope.events.shapes import dtypes_key_from_json, first_input_dtype, shapes_key_from_json
from layerscope.events.table import EventKind, EventTable, OutOfMemory


def _column(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.int64)


def table_from_native(
    module: Any,
    kineto_results: Any,
    flops: FlopCalculator | None,
    shapes: bool,
    cpu_only: bool = False,
    threads: int = 0,
) -> EventTable:
    """Read ``profiler.kineto_results`` with the native reader (``native_reader.cpp``): one C++ pass
    hands back int64 columns and each distinct name and shapes list once. Gives the same table as
    :func:`layerscope.capture.bindings_reader.table_from_bindings` (tested column by column).
    ``threads``: the C++ pass's threads (0: as many as pay off; 1: the calling thread alone)."""
    cols = _read_columns(module, kineto_results, flops, shapes, threads)
    table = EventTable()
    arrays = _memory_arrays(cols, cpu_only)
    mem_bytes = arrays.get("mem_bytes", ())
    table.out_of_memory = _out_of_memory(cols, cpu_only)
    table.clock_stamps = _clock_stamps(cols)
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
    if "span_handle" in cols:
        table.op_handles = _column(cols["span_handle"])

    kinds = arrays["span_kind"] = _span_kinds(module, kineto_results, cols, cpu_only)
    for column in ("span_ts", "span_dur", "span_tid", "span_seq", "span_fwd_tid"):
        arrays[column] = _column(cols[column])
    arrays["span_corr"] = np.zeros(len(span_name), dtype=np.int64)
    # As in the bindings path: device work links to its op by linked_correlation_id, a CPU op holds
    # its own external id in correlation_id, runtime calls hold none.
    device_work = kinds >= int(EventKind.KERNEL)
    if device_work.any():
        ext = np.where(device_work, _column(cols["span_linked"]), _column(cols["span_corr"]))
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
        if "span_dtypes" in cols:  # a module built before dtypes were read has none
            table.span_dtypes = _interned(table, cols["dtypes"], _column(cols["span_dtypes"]))
    else:
        arrays["span_shapes"] = np.full(len(span_name), -1, dtype=np.int64)

    if not cpu_only:
        table.threads = _on_streams(cols, arrays)
    table.set_columns(arrays)  # attribution reads them as arrays: kept, not converted back
    span_flops = np.zeros(len(span_name), dtype=np.int64)  # an array: attribution reads it as one
    if flops is not None:
        picked = flop_candidates(table, set(name_of_local.tolist()), flops)
        if picked:
            indices = _column(cols["span_index"])[picked]
            read = _column(cols.get("span_concrete", b""))
            text_ids = read[picked] if len(read) == len(span_name) else None
            if text_ids is not None and not (text_ids < -1).any():  # the pass read every picked op's
                _count_flops_by_call(module, kineto_results, table, flops, span_flops, picked, cols, text_ids)
            else:  # a reader that does not read them in its pass (flight_shapes.JoinedReader)
                shapes_raw = [shape_texts[i] for i in local_shapes[picked].tolist()]
                keys, concrete = _concrete_inputs(module, kineto_results, indices)
                listed = [0] * len(span_name)
                count_flops(table, flops, listed, picked, shapes_raw, keys, concrete)
                span_flops = np.asarray(listed, dtype=np.int64)
            if hasattr(module, "first_dtypes"):
                set_flop_dtypes(table, picked, _first_dtypes(module, kineto_results, cols, picked, indices))
    table.set_columns({"span_flops": span_flops})
    return table


def _read_columns(
    module: Any, kineto_results: Any, flops: FlopCalculator | None, shapes: bool, threads: int
) -> Any:
    """The reader's pass: shapes when asked for or FLOPs are counted, and the FLOP formulas' scalar
    inputs with them (``span_concrete``: each distinct text numbered)."""
    wanted = flops.op_names() if flops is not None else []
    return module.read_columns(kineto_results, bool(shapes or flops is not None), threads, wanted)


def _memory_arrays(cols: dict[str, Any], cpu_only: bool) -> dict[str, np.ndarray]:
    """The memory events' columns (none without memory events)."""
    mem_bytes = _column(cols["mem_bytes"])
    if not len(mem_bytes):
        return {}
    on_device = (
        np.zeros(len(mem_bytes), dtype=bool) if cpu_only else _column(cols["mem_device"]) != 0
    )  # DeviceType.CPU is 0
    return {
        "mem_bytes": mem_bytes,
        "mem_ts": _column(cols["mem_ts"]),
        "mem_tid": _column(cols["mem_tid"]),
        "mem_on_device": on_device,
        "mem_addr": _column(cols["mem_addr"]),
    }


def _on_streams(cols: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[int, tuple[int, int]]:
    """Device spans moved onto one thread per stream (``device_streams``); their thread map. The
    reader lists the spans on a device; those of a device kind move (a Vulkan op is a CPU op)."""
    rows = _column(cols["device_row"])
    device_kind = arrays["span_kind"][rows] >= int(EventKind.KERNEL)
    if not device_kind.any():
        return {}
    tid = arrays["span_tid"] = arrays["span_tid"].copy()  # the reader's buffer is read-only
    mem_tid = arrays.get("mem_tid", np.zeros(0, dtype=np.int64))
    device, stream = _column(cols["device_index"]), _column(cols["device_stream"])
    return stream_threads(tid, mem_tid, rows[device_kind], device[device_kind], stream[device_kind])


def _interned(table: EventTable, texts: list[bytes], local: np.ndarray) -> np.ndarray:
    """Each span's dtypes list (``local``: an index into ``texts``, JSON) as a name id, -1 none."""
    ids = [dtypes_key_from_json(b) for b in texts]
    found = np.array([table.intern(k) if k is not None else -1 for k in ids], dtype=np.int64)
    return found[local] if len(texts) else local


def _first_dtypes(
    module: Any, kineto_results: Any, cols: dict[str, Any], picked: list[int], indices: np.ndarray
) -> list[str]:
    """The first typed input's dtype of each picked span ("" when none), as ``module.first_dtypes``
    reads it: from the dtypes list the reader interned for the span (each distinct list parsed
    once: reading every event's list again cost ~2 µs an event), and from torch for the spans read
    without one (an op recorded without shapes)."""
    if "span_dtypes" not in cols:
        found: list[str] = module.first_dtypes(kineto_results, indices.tobytes())
        return found
    texts: list[bytes] = cols["dtypes"]
    first = [first_input_dtype(orjson.loads(text)) or "" for text in texts]
    local = _column(cols["span_dtypes"])[picked].tolist()
    found = [first[i] for i in local]
    unread = [k for k, i in enumerate(local) if texts[i] == b"[]"]
    if unread:
        for k, dtype in zip(
            unread, module.first_dtypes(kineto_results, indices[unread].tobytes()), strict=True
        ):
            found[k] = dtype
    return found


def _clock_stamps(cols: dict[str, Any]) -> list[tuple[int, int, int]]:
    """The clock anchors' ranges as (thread, start, end), which the reader leaves out of the spans."""
    starts = _column(cols["anchor_ts"])
    ends = starts + _column(cols["anchor_dur"])
    return list(zip(_column(cols["anchor_tid"]).tolist(), starts.tolist(), ends.tolist(), strict=True))


def _out_of_memory(cols: dict[str, Any], cpu_only: bool) -> list[OutOfMemory]:
    columns = [_column(cols[name]).tolist() for name in ("oom_tid", "oom_ts", "oom_bytes", "oom_device")]
    allocated = _column(cols["oom_allocated"]).tolist()
    return [
        OutOfMemory(tid, ts, nbytes, on_device=not cpu_only and device != 0, allocated_bytes=live)
        for tid, ts, nbytes, device, live in zip(*columns, allocated, strict=True)
    ]


def _span_kinds(module: Any, kineto_results: Any, cols: dict[str, Any], cpu_only: bool) -> np.ndarray:
    activity = _column(cols["span_activity"])
    if cpu_only:
        return np.full(len(activity), int(EventKind.CPU_OP), dtype=np.int64)
    # Each activity number's name, once per number: from the Kineto headers the module was built
    # against, else from torch's bindings (which name it only from torch 2.12 on).
    index = _column(cols["span_index"])
    codes, first = np.unique(activity, return_index=True)
    lookup = np.zeros(int(codes.max()) + 1 if len(codes) else 1, dtype=np.int64)
    for code, at in zip(codes.tolist(), first.tolist(), strict=True):
        name = module.activity_name(int(code))
        if name is None:
            event = module.event_at(kineto_results, int(index[at]))
            if not hasattr(event, "activity_type"):
                raise RuntimeError(f"no name for Kineto activity {code} in this torch's headers or bindings")
            name = event.activity_type()
        lookup[code] = int(kind_of_activity(name))
    return lookup[activity] if len(activity) else activity


def _count_flops_by_call(
    module: Any,
    kineto_results: Any,
    table: EventTable,
    flops: FlopCalculator,
    span_flops: np.ndarray,
    picked: list[int],
    cols: dict[str, Any],
    text_ids: np.ndarray,
) -> None:
    """FLOPs of the picked spans, each distinct call counted once: the reader's pass numbers the
    scalar arguments' texts (``text_ids``: the picked spans' ``span_concrete``), so a call is (name,
    shapes, arguments) as three numbers. Arguments the C++
    writer leaves to torch are keyed by their JSON, as :func:`_concrete_inputs` keys them, in the
    same numbering (one text, one number, whichever wrote it)."""
    indices = _column(cols["span_index"])[picked]
    text_ids, texts = text_ids.copy(), list(cols["concrete"])
    torch_values: dict[int, Any] = {}  # by position in picked: the values torch's bindings gave
    unknown = np.flatnonzero(text_ids < 0).tolist()
    if unknown:
        number = {text: i for i, text in enumerate(texts)}
        for k in unknown:
            value = module.event_at(kineto_results, int(indices[k])).concrete_inputs()
            text_ids[k] = number.setdefault(orjson.dumps(value, default=str), len(number))
            torch_values[k] = value
    local_shapes = _column(cols["span_shapes"])[picked]
    shape_texts: list[bytes] = cols["shapes"]
    width = int(text_ids.max()) + 1 if text_ids.size else 1
    call_of = (table.array("span_name")[picked] * (len(shape_texts) + 1) + local_shapes) * width + text_ids

    def call_inputs(k: int) -> tuple[bytes, Any]:
        inputs = torch_values[k] if k in torch_values else texts[int(text_ids[k])]
        return shape_texts[int(local_shapes[k])], inputs

    count_flops_by_call(table, flops, span_flops, picked, call_of, call_inputs)


def _concrete_inputs(
    module: Any, kineto_results: Any, event_index: np.ndarray
) -> tuple[list[bytes], list[Any]]:
    """The FLOP formulas' scalar inputs of the picked events: (cache key, value) per event; the value
    is JSON text (parsed when counted) or, for input kinds the C++ writer leaves to torch, torch's own."""
    keys: list[bytes] = []
    concrete: list[Any] = []
    for k, text in enumerate(module.concrete_inputs(kineto_results, event_index.tobytes())):
        if text is None:
            text = module.event_at(kineto_results, int(event_index[k])).concrete_inputs()
            keys.append(orjson.dumps(text, default=str))
        else:
            keys.append(text)
        concrete.append(text)
    return keys, concrete
