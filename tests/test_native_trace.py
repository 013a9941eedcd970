"""The native trace-file reader (capture/native_trace.cpp + events/native_columns.py) against the
Python path (events/stream.py + events/chrome.py): identical EventTables on every real trace, every
fixture trace, the benchmark's synthetic trace and random events; the Python path wherever it
declines (and the same result then)."""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerscope.capture import native
from layerscope.errors import LayerscopeError, TraceFormatError
from layerscope.events import native_trace
from layerscope.events.table import EventTable
from layerscope.loading import _read
from layerscope.model.profile import Profile
from tests.test_reader_fuzz import events as random_events

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="module")
def reader() -> ModuleType:
    """The trace reader, built here when it is not (a few seconds; skipped without a compiler)."""
    if not native.enabled():
        pytest.skip("LAYERSCOPE_NATIVE=0")
    try:
        native.build_trace_reader()
    except LayerscopeError as exc:
        pytest.skip(f"cannot build the trace reader: {exc}")
    module = native.load_trace_reader()
    if module is None:
        pytest.skip("the trace reader does not load")
    return module


@pytest.fixture
def python_only() -> Iterator[None]:
    """LAYERSCOPE_NATIVE=0 for the block: the Python path reads."""
    before = os.environ.get("LAYERSCOPE_NATIVE")
    os.environ["LAYERSCOPE_NATIVE"] = "0"
    native.forget()
    try:
        yield
    finally:
        if before is None:
            del os.environ["LAYERSCOPE_NATIVE"]
        else:
            os.environ["LAYERSCOPE_NATIVE"] = before
        native.forget()


def read_python(path: Path) -> Any:
    before = os.environ.get("LAYERSCOPE_NATIVE")
    os.environ["LAYERSCOPE_NATIVE"] = "0"
    native.forget()
    try:
        return _read(path)
    finally:
        os.environ.pop("LAYERSCOPE_NATIVE")
        if before is not None:
            os.environ["LAYERSCOPE_NATIVE"] = before
        native.forget()


def differences(a: EventTable, b: EventTable) -> list[str]:
    """The fields in which two tables differ (arrays by value, call lines field by field)."""
    out = []
    for f in dataclasses.fields(EventTable):
        if f.name == "_arrays":
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "call_lines" and x is not None and y is not None:
            same = np.array_equal(x.handles, y.handles) and np.array_equal(x.stack_ids, y.stack_ids)
            if not same or x.stacks != y.stacks:
                out.append(f.name)
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if x is None or y is None or x.dtype != y.dtype or not np.array_equal(x, y):
                out.append(f.name)
        elif x != y or (isinstance(x, list) and {type(v) for v in x} != {type(v) for v in y}):
            out.append(f.name)  # [True] == [1]: the element types must match too
    # the arrays a table hands out must be its columns' (a stale cached array would be a bug)
    for column in b._arrays:
        if not np.array_equal(b._arrays[column], np.asarray(getattr(b, column))):
            out.append(f"_arrays[{column}]")
    return out


def assert_same(path: Path, declines: bool = False) -> None:
    """The native read of ``path`` equals the Python path's (and the reader accepted it, unless
    ``declines``)."""
    expected = read_python(path)
    found = _read(path)
    if declines:
        assert native_trace.last_decline is not None
    else:
        assert native_trace.last_decline is None, native_trace.last_decline
    if isinstance(expected, Profile):
        assert isinstance(found, Profile)
        return
    assert differences(expected, found) == []


def traces_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.json.gz"))


def test_every_real_trace_reads_identically(reader: ModuleType, real_traces: Path) -> None:
    found = traces_under(real_traces)
    assert found
    for path in found:
        assert_same(path)


@pytest.mark.parametrize(
    "path",
    traces_under(FIXTURES / "critical_path")
    + traces_under(FIXTURES / "gpu")
    + [FIXTURES / "stack_trace.json.gz"],
    ids=lambda p: p.name,
)
def test_fixture_traces_read_identically(reader: ModuleType, path: Path) -> None:
    assert_same(path, declines=path.name.endswith(".layerscope.json.gz"))  # saved profiles: Python path


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_analyze", ROOT / "benchmarks" / "analyze.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_analyze"] = module
    spec.loader.exec_module(module)
    return module


def test_synthetic_trace_in_small_blocks_and_gzip(
    reader: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benchmark's trace, fed in blocks of 997 bytes (units cut at every place), and gzipped as
    two members (gzip.open reads both)."""
    path = tmp_path / "synthetic.json"
    _generator().generate(path, 0.3)
    assert_same(path)
    monkeypatch.setattr(native_trace, "BLOCK_BYTES", 997)
    assert_same(path)
    raw = path.read_bytes()
    packed = tmp_path / "synthetic.json.gz"
    packed.write_bytes(gzip.compress(raw[: len(raw) // 2]) + gzip.compress(raw[len(raw) // 2 :]))
    assert_same(packed)


def write(tmp_path: Path, document: Any, name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document) if not isinstance(document, str) else document)
    return path


def test_header_escapes_threads_and_side_tables(reader: ModuleType, tmp_path: Path) -> None:
    """Everything besides the columns: top-level keys on both sides of traceEvents (call lines
    included), escaped and non-ASCII names, string and missing pids, memory, refused allocations,
    flows, syncs, copies, collectives, Python events of nn.Modules."""
    op = {"ph": "X", "cat": "cpu_op", "ts": 10.5, "dur": 3.25, "pid": 1, "tid": "main"}
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "GPU é"}],
        "traceEvents": [
            {**op, "name": 'a\\"b\u00e9\U0001f600', "args": {"Record function id": 7, "External id": 3}},
            {
                **op,
                "name": "aten::mm",
                "ts": 1.0000005,
                "args": {
                    "Input Dims": [[2, 3], [3, 4]],
                    "Input type": ["float", "float"],
                    "Concrete Inputs": ["", ""],
                    "Sequence number": 4,
                },
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "record_param_comms",
                "ts": 20,
                "dur": 5,
                "args": {"Collective name": "allreduce", "In msg nelems": 10, "dtype": "Float"},
            },
            {
                "ph": "X",
                "cat": "gpu_memcpy",
                "name": "Memcpy HtoD",
                "ts": 21,
                "dur": 1,
                "pid": 0,
                "tid": 7,
                "args": {"bytes": 64},
            },
            {
                "ph": "X",
                "cat": "cuda_sync",
                "name": "Event Sync",
                "ts": 22,
                "dur": 1,
                "args": {"wait_on_stream": 7},
            },
            {
                "ph": "X",
                "cat": "python_function",
                "name": "nn.Module: Linear_0",
                "ts": 9,
                "dur": 9,
                "args": {"Python id": 2, "Python parent id": 1},
            },
            {
                "ph": "X",
                "cat": "python_function",
                "name": "nn.Module: Net_0",
                "ts": 8,
                "dur": 20,
                "args": {"Python id": 1, "Python parent id": None},
            },
            {
                "ph": "i",
                "name": "[memory]",
                "ts": 11,
                "pid": 1,
                "args": {"Bytes": 512, "Total Allocated": 512, "Device Type": 1, "Addr": 99},
            },
            {"ph": "i", "name": "[memory]", "ts": 12, "pid": 1, "args": {"Bytes": -512, "Device Type": 0}},
            {
                "ph": "i",
                "name": "[OutOfMemory]",
                "ts": 13,
                "args": {"Bytes": 1 << 40, "Total Allocated": 5, "Device Type": 1},
            },
            {"ph": "s", "cat": "fwdbwd", "id": 5, "ts": 10.5, "pid": 1, "tid": "main"},
            {"ph": "f", "cat": "fwdbwd", "id": "5", "ts": 30},
            {"ph": "M", "name": "process_name", "args": {"name": [1, {"deep": [True, None, 1e-3]}]}},
            [1, 2],
            "not an event",
        ],
        "layerscope": {"call_lines": {"handles": [7], "stack_ids": [0], "stacks": [["f.py(1): g"]]}},
        "distributedInfo": {"rank": 3},
    }
    assert_same(write(tmp_path, trace))


@pytest.mark.parametrize(
    "event",
    [
        {"ph": "X", "cat": "cpu_op", "name": "a", "ts": "12"},  # a string time
        {"ph": "X", "cat": "cpu_op", "name": "a"},  # no time
        {"ph": "X", "cat": "cpu_op", "name": 5, "ts": 1},  # a number for a name
        {"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "args": {"External id": 1.5}},
        {"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "args": {"External id": 2**70}},
        {"ph": "i", "name": "[memory]", "ts": 1, "args": {"Bytes": None}},
        {"ph": "X", "cat": ["cpu_op"], "name": "a", "ts": 1},
        {"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "pid": "a\u0000b"},  # NUL in a thread key
    ],
)
def test_declines_what_the_python_path_reads_otherwise(
    reader: ModuleType, tmp_path: Path, event: Any
) -> None:
    good = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 5}
    path = write(tmp_path, {"traceEvents": [good, event]})
    with warnings.catch_warnings():  # the Python path's MalformedEventsWarning, where it finds one
        warnings.simplefilter("ignore")
        assert_same(path, declines=True)


@pytest.mark.parametrize(
    "text",
    [
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 01}]}',  # orjson refuses
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "args": {"x": [1,]}}]}',
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1}, {"ph": "X", "cat": "cpu_op"',
        '[{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1}]',  # a bare array
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a\\ud800", "ts": 1, "dur": 1}]}',
    ],
)
def test_invalid_or_cut_json_goes_to_the_python_path(reader: ModuleType, tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    _read_both_ways(path)
    assert native_trace.last_decline is not None


def _read_both_ways(path: Path) -> None:
    """Both paths give the same table, or the same error."""
    try:
        expected: Any = read_python(path)
    except TraceFormatError as exc:
        with pytest.raises(TraceFormatError) as raised:
            _read(path)
        assert str(raised.value) == str(exc)
        return
    found = _read(path)
    if isinstance(expected, EventTable):
        assert differences(expected, found) == []


def test_turned_off_reads_with_python(reader: ModuleType, python_only: None) -> None:
    assert native.load_trace_reader() is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(random_events, max_size=12))
def test_random_events_read_identically_or_decline(
    reader: ModuleType, tmp_path: Path, trace_events: list[Any]
) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": trace_events}, default=str))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _read_both_ways(path)


def test_reading_with_the_native_reader_does_not_import_torch(reader: ModuleType, tmp_path: Path) -> None:
    """The trace reader is its own module, linked against nothing of torch: a trace without shapes
    (no FLOP formulas) is analysed without importing torch."""
    import subprocess

    path = write(tmp_path, {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2}]})
    code = (
        "import sys; from layerscope.loading import analyze; from layerscope.events import native_trace; "
        f"analyze({str(path)!r}); print(native_trace.last_decline, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["None", "False"]


def test_progress_reaches_the_file_size(
    reader: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Progress as the Python path reports it: bytes read from disk, up to the file's size, from the
    reading thread (gzip inflates in another)."""
    import threading

    path = tmp_path / "synthetic.json"
    _generator().generate(path, 0.2)
    packed = tmp_path / "synthetic.json.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    monkeypatch.setattr(native_trace, "BLOCK_BYTES", 1 << 14)
    for trace in (path, packed):
        seen: list[tuple[int, int, threading.Thread]] = []
        _read(
            trace,
            progress=lambda done, size, seen=seen: seen.append((done, size, threading.current_thread())),
        )
        assert native_trace.last_decline is None
        size = trace.stat().st_size
        assert len(seen) > 1 and seen[-1][:2] == (size, size)
        assert [done for done, _, _ in seen] == sorted(done for done, _, _ in seen)
        assert {thread for _, _, thread in seen} == {threading.current_thread()}
