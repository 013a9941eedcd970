"""What both readers of torch's profiler results share: event kinds from Kineto's activity names,
the name of undecodable events, and FLOP counting for the ops that have a formula."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import orjson

from layerscope.capture.flops import FlopCalculator
from layerscope.events.names import MEMCPY_PREFIX, MEMSET_PREFIX
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


#: Host-side calls into an accelerator's runtime or driver API (cudaLaunchKernel, cuLaunchKernelEx,
# hipMemcpyAsync): what an activity-less reader calls a runtime event.
RUNTIME_CALL = re.compile(r"(cuda|cu|hip)[A-Z]")
# What torch names the Python functions a with_stack capture records ("x.py(12): f", "<built-in
# method …>", "nn.Module: Linear_0").
_PYTHON_FUNCTION = re.compile(r"[^\n]*\(\d+\): |<built-in |nn\.Module: ")


def guess_activities(
    names: Sequence[str],
    on_device: Sequence[bool],
    annotation: Sequence[bool] | None = None,
    device_index: Sequence[int] | None = None,
) -> list[str]:
    """Kineto activity names for events read without them (torch's bindings name an event's activity
    only from 2.12 on; before that a reader has the name, the device type, whether it is a user
    annotation and the device index).

    Device work named ``Memcpy …``/``Memset …`` is a copy/set; a device-side user annotation
    (``ProfilerStep#N``, ``record_function`` ranges: counted as kernels they would count their
    kernels twice) is one, and without that flag so is a device span that shares a host span's name;
    other device work is a kernel. On the host, runtime API calls are runtime events (they launch,
    they are not ops), Python functions of a ``with_stack`` capture are named ``file.py(line): name``
    (and the like), events of no device (index -1) are the profiler's own overhead, and the rest are
    ops or user annotations.
    """
    if annotation is None:  # no flag: a device span with a host span's name is an annotation's copy
        host_names = {n for n, d in zip(names, on_device, strict=True) if not d}
        annotation = [d and n in host_names for n, d in zip(names, on_device, strict=True)]
    index = device_index if device_index is not None else [0] * len(names)
    found: list[str] = []
    for name, device, marked, where in zip(names, on_device, annotation, index, strict=True):
        if device:
            if name.startswith(MEMCPY_PREFIX):
                found.append("gpu_memcpy")
            elif name.startswith(MEMSET_PREFIX):
                found.append("gpu_memset")
            else:
                found.append("gpu_user_annotation" if marked else "kernel")
        elif marked:
            found.append("user_annotation")
        elif RUNTIME_CALL.match(name):
            found.append("cuda_runtime")
        elif _PYTHON_FUNCTION.match(name):
            found.append("python_function")
        else:
            found.append("overhead" if where < 0 else "cpu_op")
    return found


#: What an event whose name torch cannot decode is called (both readers).
UNDECODABLE_NAME = "(undecodable name)"


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


def flop_candidates(table: EventTable, name_ids: Any, flops: FlopCalculator) -> list[int]:
    """Span positions whose op has a FLOP formula (only those need concrete inputs read)."""
    wanted = [i for i in name_ids if flops.needs(table.names[i])]
    if not wanted:
        return []
    return np.flatnonzero(np.isin(table.array("span_name"), wanted)).tolist()


def count_flops(
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
    name_ids = table.array("span_name")[picked].tolist()
    rows = zip(picked, name_ids, shapes_raw, concrete_keys, concrete, strict=True)
    for j, name_id, shapes_json, key_bytes, inputs in rows:
        key = (name_id, shapes_json, key_bytes)
        found = cache.get(key)
        if found is None:
            values = orjson.loads(inputs) if isinstance(inputs, bytes) else inputs
            found = cache[key] = flops.count(table.names[key[0]], orjson.loads(shapes_json), values)
        span_flops[j] = found


def count_flops_by_call(
    table: EventTable,
    flops: FlopCalculator,
    span_flops: np.ndarray,
    picked: list[int],
    call_of: np.ndarray,
    call_inputs: Callable[[int], Any],
) -> None:
    """:func:`count_flops` where the reader has numbered each picked span's call: ``call_of[k]`` is
    the number of ``picked[k]``'s distinct (op, shapes, scalar arguments), and ``call_inputs(k)``
    gives the shapes (JSON) and scalar arguments (JSON text, or torch's values) of ``picked[k]``.
    Each distinct call is counted once, from its first span, in order of first appearance, as
    :func:`count_flops` counts them, and placed at ``picked`` in ``span_flops`` (an int64 column)
    a column at a time: no Python runs per span."""
    if not picked:
        return
    _, first, inverse = np.unique(call_of, return_index=True, return_inverse=True)
    counted = [0] * first.size
    names = table.names
    name_ids = table.array("span_name")
    for call in np.argsort(first, kind="stable").tolist():
        k = int(first[call])
        shapes_json, inputs = call_inputs(k)
        values = orjson.loads(inputs) if isinstance(inputs, bytes) else inputs
        counted[call] = flops.count(names[int(name_ids[picked[k]])], orjson.loads(shapes_json), values)
    span_flops[picked] = np.asarray(counted, dtype=np.int64)[inverse.reshape(-1)]


def set_flop_dtypes(table: EventTable, picked: list[int], dtypes: list[str]) -> None:
    """Record the dtype (torch's spelling: ``float``, ``c10::BFloat16``...) of the FLOP-counted spans
    at ``picked`` as name ids in ``table.span_dtype`` (-1 elsewhere)."""
    column = np.full(table.span_count, -1, dtype=np.int64)
    ids = {d: table.intern(d) for d in dict.fromkeys(dtypes) if d}
    for j, dtype in zip(picked, dtypes, strict=True):
        if dtype:
            column[j] = ids[dtype]
    table.span_dtype = column
