"""The vectorised critical path (``critical_graph.py``, ``critical_stack.py``, ``critical_device.py``,
``critical_longest.py``) gives what the first, loop-by-loop version gave (``critical_reference.py``):
the same edges in the same order, the same nesting, the same path, on HTA's test traces, the shared
real traces, and random traces made to be awkward (overlapping spans, several threads and streams,
work starting before its launch, every kind of synchronisation, whole-microsecond times so that
paths tie).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from layerscope.analysis import critical_longest
from layerscope.analysis.critical_graph import Graph, Window, build_graph
from layerscope.analysis.critical_path import critical_path, longest_path, select_window
from layerscope.events.chrome import table_from_trace
from layerscope.events.table import EventTable
from tests import critical_reference as reference
from tests.test_critical_path import CASES, REAL, read, read_path


def assert_same(table: EventTable, window: tuple[int, int], zero_weight_launch_edges: bool) -> bool:
    """The graph, edge for edge, and the path, edge for edge, as the reference makes them (or
    both refuse a cycle: False)."""
    old = reference.build_graph(table, reference.Window(*window), zero_weight_launch_edges)
    new = build_graph(table, Window(*window), zero_weight_launch_edges, hta_compatible=True)
    for name in ("src", "dst", "weight", "kind", "owner"):
        assert np.array_equal(np.asarray(getattr(old, name), dtype=np.int64), getattr(new, name)), name
    assert np.array_equal(old.parent, new.parent)
    try:
        expected = reference.longest_path(old)
    except ValueError:  # a cycle
        with pytest.raises(ValueError, match="cycle"):
            longest_path(new)
        return False
    assert longest_path(new) == expected
    new.lanes = np.random.default_rng(0).permutation(new.node_ts.size)  # runs only help
    assert longest_path(new) == expected
    return True


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("zero", [True, False])
def test_same_as_reference_on_hta_traces(name: str, zero: bool) -> None:
    case = CASES[name]
    table = read(case["fixture"])
    window = select_window(table, annotation=case["annotation"], instance=case["instance_id"] or 0)
    assert assert_same(table, window, zero)
    assert assert_same(table, select_window(table), zero)


@pytest.mark.parametrize("name", sorted(REAL))
def test_same_as_reference_on_real_traces(name: str, real_traces: Path) -> None:
    table = read_path(real_traces / REAL[name]["trace"])
    assert assert_same(table, select_window(table), True)
    if "ProfilerStep" in " ".join(table.names):
        assert assert_same(table, select_window(table, annotation="ProfilerStep"), False)


def span(name: str, cat: str, ts: int, dur: int, tid: int, pid: int = 1, **args: Any) -> dict[str, Any]:
    """One complete event (µs)."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def random_trace(seed: int) -> EventTable:
    """Three CPU threads of nested (and some overlapping) ops launching kernels and copies onto
    three streams, with stream waits, event, stream and device synchronisations."""
    rng = np.random.default_rng(seed)
    events: list[dict[str, Any]] = []
    corr = [0]
    gpu = {7: 0, 8: 0, 9: 0}
    records: list[tuple[int, int]] = []  # (correlation of cudaEventRecord, stream)

    def runtime(name: str, ts: int, tid: int, dur: int = 0) -> int:
        corr[0] += 1
        dur = dur or int(rng.integers(1, 4))
        events.append(span(name, "cuda_runtime", ts, dur, tid, correlation=corr[0]))
        return corr[0]

    def launch(ts: int, tid: int) -> None:
        kind = rng.choice(["kernel", "kernel", "gpu_memcpy"])
        c = runtime("cudaLaunchKernel" if kind == "kernel" else "cudaMemcpyAsync", ts, tid)
        stream = int(rng.choice(list(gpu)))
        start = max(gpu[stream], ts + int(rng.integers(-2, 6))) + int(rng.choice([0, 0, 1, 3, 2000]))
        dur = int(rng.integers(1, 20))
        name = f"k{rng.integers(4)}"
        events.append(span(name, kind, start, dur, stream, pid=0, correlation=c, stream=stream))
        gpu[stream] = start + dur

    def sync(ts: int, tid: int) -> int:
        """A synchronisation; returns when its call returns."""
        what = rng.integers(4)
        if what == 0:  # record an event, then make another stream wait for it
            stream = int(rng.choice(list(gpu)))
            records.append((runtime("cudaEventRecord", ts, tid), stream))
            c = runtime("cudaStreamWaitEvent", ts + 4, tid)
            waiting = int(rng.choice([s for s in gpu if s != stream]))
            args = {"wait_on_stream": stream, "wait_on_cuda_event_record_corr_id": records[-1][0]}
            wait = span("Stream Wait Event", "cuda_sync", ts + 5, 1, waiting, 0, correlation=c, **args)
            events.append(wait)
            return ts + 6
        name, call = [
            ("Event Sync", "cudaEventSynchronize"),
            ("Stream Sync", "cudaStreamSynchronize"),
            ("Context Sync", "cudaDeviceSynchronize"),
        ][int(what) - 1]
        end = max(gpu.values()) + 1  # the CPU waits for all the device's work, whatever it asked
        c = runtime(call, ts, tid, max(end - ts + 1, 1))
        stream = int(rng.choice(list(gpu))) if name == "Stream Sync" else -1
        args: dict[str, Any] = {"stream": stream}
        if name == "Event Sync" and records:
            recorded, on = records[int(rng.integers(len(records)))]
            args |= {"wait_on_stream": on, "wait_on_cuda_event_record_corr_id": recorded}
        events.append(span(name, "cuda_sync", max(end - 1, ts), 1, stream, 0, correlation=c, **args))
        return max(end, ts) + 2

    def op(ts: int, tid: int, depth: int) -> int:
        """An op and what it calls; returns its end."""
        at = ts + int(rng.integers(0, 3))
        for _ in range(int(rng.integers(0, 4)) if depth < 3 else 0):
            pick = rng.random()
            if pick < 0.4:
                launch(at, tid)
                at += 4
            elif pick < 0.5:
                at = sync(at, tid)
            else:
                at = op(at, tid, depth + 1)
            at += int(rng.integers(0, 3))
        end = at + int(rng.integers(0, 3)) + int(rng.choice([0, 0, 0, -2]))  # some overlap
        name = rng.choice(["aten::mm", "aten::add", {1: "forward", 2: "autograd::x", 3: "aten::cat"}[tid]])
        cat = "user_annotation" if rng.random() < 0.1 else "cpu_op"
        events.append(span(str(name), cat, ts, max(end - ts, 1), tid))
        return max(end, ts + 1)

    clock = {1: 0, 3: 2}
    for k in range(36):  # the thread furthest behind goes next, so the GPU state is now's
        if k == 18:  # the backward thread takes over from the forward one
            clock[2] = clock.pop(1)
        tid = min(clock, key=lambda t: clock[t])
        clock[tid] = op(clock[tid], tid, 0) + int(rng.integers(0, 4))
    events.append(span("ProfilerStep#0", "user_annotation", 0, 300, 1))
    return table_from_trace({"traceEvents": events})


def test_same_as_reference_on_random_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forty random traces, both launch-edge settings, whole trace and a step. Among them: the tie
    that needs Kahn's order (two tied path ends neither reaches) and the usual case; a few cycles
    (work starting before its launch, then waited for), refused by both."""
    calls: list[int] = []
    original = critical_longest.kahn_order
    monkeypatch.setattr(critical_longest, "kahn_order", lambda *a: calls.append(1) or original(*a))
    acyclic = 0
    for seed in range(40):
        table = random_trace(seed)
        for zero in (True, False):
            acyclic += assert_same(table, select_window(table), zero)
            acyclic += assert_same(table, select_window(table, step=0), zero)
    assert acyclic > 150
    assert 0 < len(calls) < acyclic


def test_cycles_are_refused() -> None:
    """A graph with a cycle (through a chain of single predecessors, or through merges) raises as
    Kahn's order does."""
    cycles = (([0, 1, 2], [1, 2, 0]), ([0, 1, 2, 3, 2], [1, 2, 1, 2, 3]), ([0], [0]), ([3, 0, 1], [0, 1, 3]))
    for src, dst in cycles:
        for lanes in (None, np.arange(4), np.asarray([3, 0, 1, 2]), np.asarray([2, 1, 0, 3])):
            with pytest.raises(ValueError, match="cycle"):
                weight = np.ones(len(src), np.int64)
                critical_longest.heaviest_path(4, np.asarray(src), np.asarray(dst), weight, lanes)


def test_edge_cases() -> None:
    """No edges, no path; a chain is its own path; of two equal paths the first in Kahn's order."""
    none = np.zeros(0, np.int64)
    assert longest_path(Graph(none, none, none, none)) == []
    heaviest = critical_longest.heaviest_path
    chain = heaviest(4, np.asarray([0, 1, 2]), np.asarray([1, 2, 3]), np.asarray([5, 0, 7]))
    assert chain.tolist() == [0, 1, 2]
    # 0 -> 1 and 2 -> 3, both of weight 4: node 1 comes first in Kahn's order (0 is popped first)
    tie = heaviest(4, np.asarray([0, 2]), np.asarray([1, 3]), np.asarray([4, 4]))
    assert tie.tolist() == [0]
    assert critical_path(random_trace(3)).length_us > 0
