"""The native reader (capture/native_reader.cpp): built here, it must give the very table torch's
Python bindings give, and every way it can be missing or fail must leave profiling working."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import layerscope as ls
from layerscope.capture import native
from layerscope.capture.bindings_reader import table_from_bindings
from layerscope.capture.event_columns import UNDECODABLE_NAME, decode_names
from layerscope.capture.flops import FlopCalculator
from layerscope.capture.kineto import table_from_kineto
from layerscope.capture.native_table import table_from_native
from layerscope.cli import main
from layerscope.errors import LayerscopeError, LayerscopeWarning
from layerscope.events.table import CLOCK_ANCHOR_NAME, MEMORY_COLUMNS, SPAN_COLUMNS, EventTable

COLUMNS = ("names", *SPAN_COLUMNS, *MEMORY_COLUMNS)


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The reader compiled afresh for this torch into a private cache (so the build itself is tested,
    not a binary left from an earlier run)."""
    cache = tmp_path_factory.mktemp("native-cache")
    before = os.environ.get("LAYERSCOPE_CACHE")
    os.environ["LAYERSCOPE_CACHE"] = str(cache)
    native.forget()
    try:
        try:
            path, seconds = native.build(force=True)
        except LayerscopeError as exc:
            pytest.skip(f"the native reader cannot be built here: {exc}")
        assert path.parent == cache / "native" and path.exists() and seconds > 0
        # Nothing but the binaries (this one and the trace reader) is left behind (the scratch files
        # were renamed, not copied).
        built = sorted(p.name for p in path.parent.iterdir())
        assert built == sorted([path.name, native.trace_binary_path().name])
        umask = os.umask(0o022)
        os.umask(umask)
        # The mode the compiler gives under the umask: others of a shared cache can read it.
        assert stat.S_IMODE(path.stat().st_mode) == 0o777 & ~umask
        module = native.load()
        assert module is not None, native.status().reason
        yield module
    finally:
        if before is None:
            os.environ.pop("LAYERSCOPE_CACHE", None)
        else:
            os.environ["LAYERSCOPE_CACHE"] = before
        native.forget()


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cache folder with no native module in it, looked up afresh before and after the test."""
    monkeypatch.setenv("LAYERSCOPE_CACHE", str(tmp_path))
    native.forget()
    yield tmp_path
    native.forget()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.up = nn.Linear(32, 64)
        self.act = nn.GELU(approximate="tanh")  # a string argument among the concrete inputs
        self.down = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


def _workload() -> None:
    model = nn.Sequential(Block(), Block())
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
    x = torch.randn(4, 32)
    for _ in range(2):
        model(x).sum().backward()
        conv(torch.randn(1, 3, 9, 9)).relu().sum().backward()
        torch.nn.functional.dropout(x, p=0.25, training=True)  # a float concrete input
        x.to(torch.float64).clamp(min=-1.5, max=2.0)  # an optional float
    with torch.no_grad():
        torch.addmm(torch.zeros(2, 3), torch.randn(2, 4), torch.randn(4, 3), beta=0.5, alpha=2.0)


def _capture(with_stack: bool = False, memory: bool = True, shapes: bool = True) -> Any:
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=shapes,
        profile_memory=memory,
        with_stack=with_stack,
    ) as prof:
        _workload()
        # Another thread's ops: thread ids (and with_stack's "unknown thread") must match too.
        worker = threading.Thread(target=lambda: torch.randn(8, 8) @ torch.randn(8, 8))
        worker.start()
        worker.join()
    return prof.profiler.kineto_results


def _assert_same(a: EventTable, b: EventTable) -> None:
    for column in COLUMNS:
        assert getattr(a, column) == getattr(b, column), column
        if column != "names":  # the arrays handed over with the columns hold the same numbers
            assert b.array(column).tolist() == list(getattr(a, column)), column
    assert a.meta.get("undecodable_names") == b.meta.get("undecodable_names")


def _anchored_capture(reader: ModuleType) -> Any:
    """The workload between two clock anchors (the first and the last of torch's events)."""
    reader.marks_start()
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
            reader.clock_anchor()
            _workload()
            reader.clock_anchor()
    finally:
        reader.marks_stop()
    return prof.profiler.kineto_results


def test_clock_anchors_are_left_out_of_the_spans_their_stamps_handed_over(reader: ModuleType) -> None:
    """The clock anchors' ranges (``clock_anchors.py``) are no spans of the native table: their
    stamps come beside it, as the bindings table holds them, and the rest is the bindings table less
    those rows (what ``drop_clock_anchors`` leaves of it), name ids included."""
    results = _anchored_capture(reader)
    expected = table_from_bindings(results, FlopCalculator(), shapes=True, cpu_only=True)
    found = table_from_native(reader, results, FlopCalculator(), shapes=True, cpu_only=True)
    anchor = expected.name_id(CLOCK_ANCHOR_NAME)
    rows = [i for i, name in enumerate(expected.span_name) if name == anchor]
    assert len(rows) == 2 and expected.clock_stamps is None
    ts, dur, tid = expected.span_ts, expected.span_dur, expected.span_tid
    assert found.clock_stamps == [(tid[i], ts[i], ts[i] + dur[i]) for i in rows]
    assert found.name_id(CLOCK_ANCHOR_NAME) == anchor  # interned where first seen all the same
    expected.drop_clock_anchors()
    _assert_same(expected, found)


@pytest.mark.parametrize("threads", [0, 2, 3, 7])
def test_stretches_read_on_threads_give_the_columns_one_pass_gives(reader: ModuleType, threads: int) -> None:
    """read_columns splits torch's list into stretches read on threads of their own and joins them:
    names, shapes and dtypes interned in the same first-seen order, device rows and clock anchors
    (one in the first stretch, one in the last) where one pass puts them, memory events in order."""
    results = _anchored_capture(reader)
    one = reader.read_columns(results, True, 1)
    assert len(one["anchor_ts"]) == 2 * 8 and len(one["mem_bytes"]) > 0 and len(one["names"]) > 20
    assert reader.read_columns(results, True, threads) == one
    # the same again without shapes (the no-shapes ids), and on a trace with Python-function events
    assert reader.read_columns(results, False, threads) == reader.read_columns(results, False, 1)
    stacked = _capture(with_stack=True)
    assert reader.read_columns(stacked, True, threads) == reader.read_columns(stacked, True, 1)


def test_concrete_inputs_read_in_the_pass_are_the_ones_read_apart(reader: ModuleType) -> None:
    """read_columns(wanted=...) reads the FLOP formulas' scalar inputs in its own pass
    (``span_concrete``): per wanted op the text ``concrete_inputs`` gives reading them apart, each
    distinct text once, the same on one thread and on several; -2 for every other span; no column
    when none is wanted."""
    results = _anchored_capture(reader)
    wanted = FlopCalculator().op_names()
    one = reader.read_columns(results, True, 1, wanted)
    names = [name.decode() for name in one["names"]]
    span_name = np.frombuffer(one["span_name"], np.int64)
    concrete = np.frombuffer(one["span_concrete"], np.int64)
    picked = np.flatnonzero(np.isin(span_name, [i for i, name in enumerate(names) if name in wanted]))
    assert picked.size >= 8 and (concrete[picked] >= 0).all()  # the workload's mm, addmm, convolution
    assert (np.delete(concrete, picked) == -2).all()
    indices = np.frombuffer(one["span_index"], np.int64)[picked]
    assert [one["concrete"][i] for i in concrete[picked]] == reader.concrete_inputs(
        results, indices.tobytes()
    )
    assert len(set(one["concrete"])) == len(one["concrete"]) >= 3  # each distinct text once
    for threads in (2, 3):
        assert reader.read_columns(results, True, threads, wanted) == one
    assert len(reader.read_columns(results, True, 1)["span_concrete"]) == 0


@pytest.mark.parametrize(
    ("with_stack", "memory", "shapes", "cpu_only"),
    [
        (False, True, True, True),  # the common live capture
        (False, True, True, False),  # kinds from torch's activity names
        (True, True, True, False),  # Python-function events
        (False, False, False, True),  # no shapes, no memory
    ],
)
def test_native_table_equals_the_bindings_table(
    reader: ModuleType, with_stack: bool, memory: bool, shapes: bool, cpu_only: bool
) -> None:
    results = _capture(with_stack=with_stack, memory=memory, shapes=shapes)
    expected = table_from_bindings(results, FlopCalculator(), shapes=shapes, cpu_only=cpu_only)
    found = table_from_native(reader, results, FlopCalculator(), shapes=shapes, cpu_only=cpu_only)
    _assert_same(expected, found)
    # The comparison has teeth: spans, allocations, shapes and counted FLOPs are all there.
    assert expected.span_count > 200
    assert (sum(expected.span_flops) > 0) == shapes  # FLOPs need recorded shapes
    assert bool(expected.mem_ts) == memory
    assert any(s >= 0 for s in expected.span_shapes) == shapes
    if with_stack:
        assert any(expected.names[n].startswith("nn.Module:") for n in expected.span_name)


def test_concrete_inputs_written_in_cpp_read_back_as_torch_gives_them(reader: ModuleType) -> None:
    results = _capture()
    events = results.events()
    indices = list(range(len(events)))
    import numpy as np

    written = reader.concrete_inputs(results, np.asarray(indices, dtype=np.int64).tobytes())
    kinds: set[str] = set()
    for event, text in zip(events, written, strict=True):
        expected = event.concrete_inputs()
        if text is None:
            continue  # a kind left to torch's bindings
        found = orjson.loads(text)
        assert found == expected, event.name()
        assert [type(v) for v in found] == [type(v) for v in expected], event.name()
        kinds.update(type(v).__name__ for v in found)
    # Ints, floats, bools, None and lists (of ints, of bools) all went through the C++ writer.
    assert {"int", "float", "bool", "NoneType", "list"} <= kinds
    assert any(
        v and all(isinstance(b, bool) for b in v)
        for e in events
        for v in e.concrete_inputs()
        if isinstance(v, list)
    )


def test_flops_fall_back_to_the_bindings_for_inputs_cpp_does_not_write(reader: ModuleType) -> None:
    class NoConcrete:
        """The reader, but every event's concrete inputs left to torch's bindings."""

        read_columns = reader.read_columns
        event_at = reader.event_at

        @staticmethod
        def concrete_inputs(results: Any, packed: bytes) -> list[None]:
            return [None] * (len(packed) // 8)

    results = _capture()
    expected = table_from_bindings(results, FlopCalculator(), shapes=True, cpu_only=True)
    found = table_from_native(NoConcrete(), results, FlopCalculator(), shapes=True, cpu_only=True)
    assert found.span_flops == expected.span_flops and sum(found.span_flops) > 0


def test_inputs_the_pass_leaves_to_torch_are_marked_and_counted(reader: ModuleType) -> None:
    """A FLOP-counted op whose scalar input the C++ writer does not write (a non-finite double) is
    marked -1 in ``span_concrete`` on any number of threads, and its FLOPs still come (torch's
    bindings read that input): the table equals the bindings one."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            torch.addmm(torch.zeros(2, 3), torch.randn(2, 4), torch.randn(4, 3), beta=float("inf"))
            torch.randn(3, 5) @ torch.randn(5, 2)  # a known one beside it
    results = prof.profiler.kineto_results
    wanted = FlopCalculator().op_names()
    for threads in (1, 2, 3):
        cols = reader.read_columns(results, True, threads, wanted)
        names = [name.decode() for name in cols["names"]]
        marks = np.frombuffer(cols["span_concrete"], np.int64)
        span_name = np.frombuffer(cols["span_name"], np.int64)
        assert set(marks[span_name == names.index("aten::addmm")].tolist()) == {-1}
        assert (marks[span_name == names.index("aten::mm")] >= 0).all()
    expected = table_from_bindings(results, FlopCalculator(), shapes=True, cpu_only=True)
    found = table_from_native(reader, results, FlopCalculator(), shapes=True, cpu_only=True)
    assert found.span_flops == expected.span_flops and sum(found.span_flops) > 0


@pytest.mark.parametrize("column", ["not asked", "short"])
def test_flops_come_from_a_pass_of_their_own_when_the_column_cannot_say(
    reader: ModuleType, column: str
) -> None:
    """Where ``span_concrete`` does not cover the FLOP-counted spans (-2: the pass was not asked for
    that op; a column of another length), their inputs are read event by event (``concrete_inputs``)."""

    class Partial:
        """The reader, its concrete-inputs column spoiled."""

        concrete_inputs = reader.concrete_inputs
        event_at = reader.event_at
        first_dtypes = reader.first_dtypes

        @staticmethod
        def read_columns(results: Any, with_shapes: bool, threads: int = 0, wanted: Any = ()) -> Any:
            cols = reader.read_columns(results, with_shapes, threads, wanted)
            count = len(cols["span_name"]) // 8
            spoiled = np.full(count if column == "not asked" else count - 1, -2, dtype=np.int64)
            return {**cols, "span_concrete": spoiled.tobytes()}

    results = _capture()
    expected = table_from_bindings(results, FlopCalculator(), shapes=True, cpu_only=True)
    found = table_from_native(Partial(), results, FlopCalculator(), shapes=True, cpu_only=True)
    assert found.span_flops == expected.span_flops and sum(found.span_flops) > 0


def test_undecodable_names_become_the_placeholder() -> None:
    names, bad = decode_names([b"aten::mm", b"\xff\xfe broken", "nn.Module: Ü".encode()])
    assert names == ["aten::mm", UNDECODABLE_NAME, "nn.Module: Ü"]
    assert bad == [1]


def test_profiles_use_the_native_reader_and_equal_the_bindings_ones(
    reader: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = nn.Sequential(Block(), Block())
    x = torch.randn(4, 32)

    def profiled() -> ls.Profile:
        with ls.profile(model, memory=True, shapes=True) as prof:
            model(x).sum().backward()
        return prof.profile

    monkeypatch.setattr(native, "load", lambda: reader)
    fast = profiled()
    monkeypatch.setenv("LAYERSCOPE_NATIVE", "0")
    monkeypatch.setattr(native, "load", lambda: None)
    slow = profiled()
    for p in (fast, slow):
        p.validate()
    assert fast.meta.capture.reader == "native" and slow.meta.capture.reader == "python"
    assert [n.path for n in fast.root.walk()] == [n.path for n in slow.root.walk()]
    assert fast.root.total.flops == slow.root.total.flops > 0
    assert [n.calls for n in fast.root.walk()] == [n.calls for n in slow.root.walk()]


def test_a_failing_native_reader_warns_once_and_the_profile_is_still_made(
    reader: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken:
        @staticmethod
        def read_columns(results: Any, with_shapes: bool, threads: int = 0, wanted: Any = ()) -> Any:
            raise RuntimeError("boom")

    monkeypatch.setattr(native, "_loaded", Broken())
    monkeypatch.setattr(native, "_looked", True)
    model = Block()
    try:
        with pytest.warns(LayerscopeWarning, match="native reader failed .*boom.*Python reader"):
            with ls.profile(model, module_scopes="ranges") as prof:  # the stand-in only reads
                model(torch.randn(2, 32))
            profile = prof.profile
        profile.validate()
        assert profile.meta.capture.reader == "python"
        assert native.status().reason == "raised RuntimeError: boom"  # not tried again
    finally:
        native.forget()


def test_without_a_built_reader_profiling_reads_through_the_bindings(empty_cache: Path) -> None:
    state = native.status()
    assert not state.built and state.reason is not None and "not built" in state.reason
    model = Block()
    with ls.profile(model) as prof:
        model(torch.randn(2, 32))
    assert prof.profile.meta.capture.reader == "python"
    with pytest.raises(LayerscopeError, match="native reader unavailable: not built"):
        table_from_kineto(object(), None, shapes=False, use_native=True)


def test_a_failed_build_says_so_in_one_line_and_leaves_no_file(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CXX", "false")
    assert main(["native", "build"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "layerscope: error: compiling the native module failed (false exited 1)"
    assert list((empty_cache / "native").iterdir()) == []
    assert main(["native", "status"]) == 1
    assert "in use   no: not built" in capsys.readouterr().out


def test_native_off_by_environment(
    reader: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LAYERSCOPE_NATIVE", "0")
    assert native.load() is None
    assert main(["native", "status"]) == 1
    assert "in use   no: turned off by LAYERSCOPE_NATIVE=0" in capsys.readouterr().out


def test_a_broken_binary_is_reported_and_profiling_goes_on(empty_cache: Path) -> None:
    target = native.binary_path()
    target.parent.mkdir(parents=True)
    target.write_bytes(b"not a shared object")
    state = native.status()
    assert state.built and state.reason is not None and state.reason.startswith("failed to load:")
    model = Block()
    with ls.profile(model) as prof:
        model(torch.randn(2, 32))
    prof.profile.validate()
    assert prof.profile.meta.capture.reader == "python"


def test_the_reader_refuses_what_is_not_torchs_results(reader: ModuleType) -> None:
    """A wrong argument is a Python exception (the fallback can catch it), never a crash."""
    for wrong in (object(), None, [1, 2]):
        with pytest.raises((TypeError, RuntimeError)):
            reader.read_columns(wrong, True)
    results = _capture(memory=False)
    with pytest.raises(IndexError):
        reader.event_at(results, 10**9)
    with pytest.raises(IndexError):
        reader.concrete_inputs(results, (10**9).to_bytes(8, "little"))
