"""The trace reader on hostile input: it raises TraceFormatError and nothing else."""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import warnings
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import layerscope as ls
from layerscope.errors import TraceFormatError

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=8)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
KEYS = ["ph", "cat", "name", "ts", "dur", "pid", "tid", "args", "id", "s", "bp"]
ARG_KEYS = [
    "External id",
    "correlation",
    "Sequence number",
    "Fwd thread id",
    "Input Dims",
    "Concrete Inputs",
    "Bytes",
    "Device Type",
    "flops",
]
events = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.one_of(st.sampled_from(["X", "i", "s", "f", "M", "b", "e"]), values),
        "cat": st.one_of(
            st.sampled_from(
                [
                    "cpu_op",
                    "kernel",
                    "user_annotation",
                    "cuda_runtime",
                    "fwdbwd",
                    "gpu_memcpy",
                    "cpu_instant_event",
                    "python_function",
                ]
            ),
            values,
        ),
        "name": st.one_of(
            st.sampled_from(
                [
                    "aten::mm",
                    "[memory]",
                    "ls::Net",
                    "ls:a:Linear",
                    "ProfilerStep#x",
                    "autograd::engine::evaluate_function: MmBackward0",
                ]
            ),
            values,
        ),
        "ts": st.one_of(st.floats(-1e6, 1e6, allow_nan=False), values),
        "dur": st.one_of(st.floats(-10, 1e4, allow_nan=False), values),
        "pid": values,
        "tid": values,
        "id": values,
        "args": st.one_of(st.dictionaries(st.sampled_from(ARG_KEYS), values, max_size=5), values),
    },
)


def check(path: Path) -> None:
    try:
        profile = ls.load(path)
    except TraceFormatError:
        return
    profile.validate()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.lists(events, max_size=12), values))
def test_random_events_raise_only_trace_format_errors(tmp_path: Path, trace_events: object) -> None:
    path = tmp_path / "t.json"
    document = {"traceEvents": trace_events} if isinstance(trace_events, list) else trace_events
    # the standard library writes what orjson refuses (huge ints, NaN): the reader must cope
    path.write_text(json.dumps(document, default=str))
    check(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300), st.booleans())
def test_random_bytes_raise_only_trace_format_errors(tmp_path: Path, blob: bytes, compress: bool) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(gzip.compress(blob) if compress else blob)
    check(path)


def test_truncated_real_trace(real_traces: Path, tmp_path: Path) -> None:
    raw = gzip.decompress((real_traces / "amd_mi250_train.json.gz").read_bytes())
    for cut in (len(raw) // 3, len(raw) - 10):
        path = tmp_path / "cut.json"
        path.write_bytes(raw[:cut])
        check(path)
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gzip.compress(raw)[:-20])  # a gzip stream that ends early
    check(path)


def test_out_of_range_integers_are_malformed_events_not_crashes(tmp_path: Path) -> None:
    """Found by the fuzz above: a timestamp that fits Python's int but not int64 crashed in numpy
    (OverflowError) instead of being reported as a malformed event; byte counts and ids alike.
    Strict reading fails on the event; by default it is skipped and counted, the rest is read."""
    import warnings

    import pytest

    from layerscope.loading import MalformedEventsWarning

    good = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 5}
    cases = [
        {"ph": "X", "cat": "cpu_op", "name": "a", "ts": 9223372036854776.0},
        {"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1, "args": {"External id": 2**70}},
        {"ph": "i", "name": "[memory]", "ts": 1, "args": {"Bytes": 2**70}},
    ]
    for k, event in enumerate(cases):
        path = tmp_path / f"t{k}.json"
        path.write_text(json.dumps({"traceEvents": [good, event]}))
        with pytest.raises(TraceFormatError, match="out of range"):
            ls.load(path, strict=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            profile = ls.load(path)
        profile.validate()
        assert profile.totals.cpu_us == pytest.approx(5.0)  # the good event (5 µs) is there
        (reason, count), *_ = profile.meta.trace.malformed_events.items()
        assert count == 1 and "OverflowError" in reason
        assert [w.category for w in caught] == [MalformedEventsWarning]


_REAL: dict[str, Any] = {}
_MUTATIONS: list[Any] = ["<removed>", None, "", "x", [], -1, 1e300, 2**70]
_FIELDS = ["ts", "dur", "name", "cat", "ph", "pid", "tid", "args", "External id", "Sequence number", "Bytes"]


def _real_trace(real_traces: Path) -> dict[str, Any]:
    if "rank0" not in _REAL:
        _REAL["rank0"] = orjson.loads(
            gzip.decompress((real_traces / "two_ranks" / "rank-0.json.gz").read_bytes())
        )
    return _REAL["rank0"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 10**9), st.sampled_from(_FIELDS), st.sampled_from(_MUTATIONS))
def test_field_mutations_of_a_real_trace_bend_or_fail_cleanly(
    real_traces: Path, tmp_path: Path, which: int, field: str, value: Any
) -> None:
    """One field of one event of a real trace removed or replaced (null, "", a string, a list, -1,
    1e300, 2**70): by default the trace still loads and validates (the event skipped and counted, or
    read as it is); with strict=True it loads or fails with a TraceFormatError, nothing else."""
    trace = copy.deepcopy(_real_trace(real_traces))
    events = trace["traceEvents"]
    event = events[which % len(events)]
    holder = (
        event.setdefault("args", {}) if field[0].isupper() and isinstance(event.get("args"), dict) else event
    )
    if value == "<removed>":
        holder.pop(field, None)
    else:
        holder[field] = value
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))  # the standard library writes what orjson refuses (2**70)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile = ls.load(path)
    profile.validate()
    with contextlib.suppress(TraceFormatError):
        ls.load(path, strict=True).validate()
