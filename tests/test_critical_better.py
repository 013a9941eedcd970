"""Where our critical path departs from Holistic Trace Analysis's by default, and only there
(``hta_compatible=True`` gives HTA's figures: ``test_critical_path.py``). docs/compared.md has the
argument, trace by trace.

- A blocking call with no ``cuda_sync`` event waited for the device work it returned right after
  (``critical_waits.py``): the path runs through that work, not through the call's own time.
- Every kernel of a CUDA graph launch is on its stream (HTA keeps the last).
- Device work still running from before the window counts from the window's start (HTA drops it,
  and calls the time the window's first kernel waited behind it "launch overhead").
- ``idle``: the time on the path in no op and no device work (HTA leaves it out of the length), so
  ``by_type`` sums to ``length_us``, the time from the path's first node to its last.

The small traces are ``tests/critical_synthetic.py``; HTA's figures on them are in
``fixtures/critical_path/hta_reference.json`` under ``synthetic`` (``make_hta_reference.py
--synthetic``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from layerscope.analysis.critical_edges import SYNC
from layerscope.analysis.critical_graph import Window, build_graph
from layerscope.analysis.critical_path import CriticalPath, critical_path, longest_path, select_window
from layerscope.events.chrome import table_from_trace
from layerscope.events.table import EventTable
from tests.critical_synthetic import TRACES, blocking_copy, span
from tests.test_critical_path import CASES, HERE, REAL, REFERENCE, hta_top, read, read_path

SYNTHETIC = REFERENCE["synthetic"]


def synthetic(
    name: str, hta_compatible: bool = False, document: dict[str, Any] | None = None
) -> CriticalPath:
    """The path of one synthetic trace, in HTA's window for it."""
    make, annotation, instance = TRACES[name]
    table = table_from_trace(document or make())
    return critical_path(table, annotation=annotation, instance=instance, hta_compatible=hta_compatible)


def shares(path: CriticalPath) -> list[tuple[str, float]]:
    """The path's ops and kernels, (name, µs)."""
    return [(s.name, s.us) for s in path.top]


@pytest.mark.parametrize("name", sorted(TRACES))
def test_hta_compatible_is_htas_on_the_synthetic_traces(name: str) -> None:
    """``hta_compatible``: HTA's own figures on each synthetic trace, to the microsecond."""
    case = SYNTHETIC[name]
    path = synthetic(name, hta_compatible=True)
    assert path.length_us == case["length_us"] and path.nodes == case["nodes"]
    assert path.by_type == {k: v for k, v in case["by_type"].items() if v > 0}
    assert shares(path) == hta_top(case)


def test_blocking_copy_waits_for_the_gpu() -> None:
    """HTA: 235 µs, all ``cpu_bound``, 198 of them ``cudaMemcpyAsync`` waiting for the GPU (its
    runtime-lock edge keeps the call's whole time; no sync event links the copy). Ours: the call
    returned 8 µs after its copy ended, so it waited for it: ``aten::mm``'s 5 µs to the launch, the
    launch delay (5 to 15), ``gemm`` (200) and the copy (5) behind it, the wake-up (220 to 228,
    idle), the rest of ``_local_scalar_dense`` (2), the gap to ``aten::add`` (5, idle), its 10."""
    path = synthetic("blocking_copy")
    assert path.by_type == {
        "cpu_bound": 17,
        "gpu_compute_bound": 205,
        "gpu_kernel_launch_overhead": 10,
        "idle": 13,
    }
    assert path.length_us == 245 == sum(path.by_type.values())
    assert shares(path) == [
        ("gemm", 200),
        ("aten::add", 10),
        ("Memcpy DtoH (Device -> Pageable)", 5),
        ("aten::mm", 5),
        ("aten::_local_scalar_dense", 2),
    ]


def with_copy_call(ts: int, dur: int) -> dict[str, Any]:
    """``blocking_copy`` with its ``cudaMemcpyAsync`` call at ``ts`` for ``dur``, its op ending 2
    µs after it, ``aten::add`` 5 µs after that."""
    document = blocking_copy()
    moved = {
        "cudaMemcpyAsync": (ts, dur),
        "aten::_local_scalar_dense": (25, ts + dur + 2 - 25),
        "aten::add": (ts + dur + 7, 10),
        "ProfilerStep#1": (0, ts + dur + 20),
    }
    for event in document["traceEvents"]:
        if event["name"] in moved:
            event["ts"], event["dur"] = moved[event["name"]]
    return document


@pytest.mark.parametrize(
    ("ts", "dur", "why"),
    [
        (30, 10, "returns before its copy ends: asynchronous"),
        (30, 245, "returns 55 µs after: CPU work after"),
    ],
)
def test_no_wait_without_overlap(ts: int, dur: int, why: str) -> None:
    """Where the call did not end right after its copy, no wait is read: the path is HTA's, plus
    its idle time."""
    document = with_copy_call(ts, dur)
    hta = synthetic("blocking_copy", hta_compatible=True, document=document)
    ours = synthetic("blocking_copy", document=document)
    assert {k: v for k, v in ours.by_type.items() if k != "idle"} == hta.by_type, why
    assert shares(ours) == shares(hta) and ours.length_us == hta.length_us + ours.by_type.get("idle", 0)


def test_cuda_graph_keeps_every_kernel() -> None:
    """HTA keeps ``k2`` alone (the graph launch's correlation id maps to one kernel) and charges the
    130 µs from ``fill``'s end to ``k2``'s start as kernel-kernel overhead. Ours: ``aten::fill_``'s 2
    µs, its launch (5) and 3 more, the gap to ``CUDAGraph::replay`` (2, idle) and its 3 µs to the
    graph launch, whose first kernel found the stream idle: launch delay 15 to 40, then ``k0``,
    ``k1``, ``k2`` with their 2 µs gaps, the synchronisation's wake-up (194 to 200) and the gap to
    ``aten::add`` (5): idle 13; ``aten::add``'s 10."""
    hta = synthetic("cuda_graph", hta_compatible=True)
    assert [s.name for s in hta.top if s.name.startswith("k")] == ["k2"]
    path = synthetic("cuda_graph")
    assert path.by_type == {
        "cpu_bound": 23,
        "gpu_compute_bound": 150,
        "gpu_kernel_kernel_overhead": 4,
        "gpu_kernel_launch_overhead": 25,
        "idle": 13,
    }
    assert path.length_us == 215 == sum(path.by_type.values())
    assert shares(path)[:4] == [("k0", 50), ("k1", 50), ("k2", 50), ("aten::add", 10)]


def test_lagging_gpu_is_kept() -> None:
    """Step 2 begins (100) while step 1's ``big`` runs until 250. HTA drops ``big`` and calls the
    143 µs ``small`` waited behind it launch overhead. Ours: ``big`` from the window's start (150),
    ``small`` (50), the wake-up and the gap to ``aten::add`` (10, idle), its 10: 220, 100 to 320."""
    hta = synthetic("lagging_gpu", hta_compatible=True)
    assert hta.by_type["gpu_kernel_launch_overhead"] == 143
    path = synthetic("lagging_gpu")
    assert path.window_us == (100, 330)
    assert path.by_type == {"cpu_bound": 10, "gpu_compute_bound": 200, "idle": 10}
    assert path.length_us == 220 and shares(path) == [("big", 150), ("small", 50), ("aten::add", 10)]


def extent_us(table: EventTable, window: tuple[int, int], data_load: tuple[str, ...]) -> float:
    """The time from the default path's first node to its last."""
    graph = build_graph(table, Window(*window, data_load))
    edges = longest_path(graph)
    return float(graph.node_ts[graph.dst[edges[-1]]] - graph.node_ts[graph.src[edges[0]]]) / 1000


def both(table: EventTable, case: dict[str, Any]) -> tuple[CriticalPath, CriticalPath, float]:
    """HTA's path and ours of one case, and our path's extent."""
    window = {"annotation": case["annotation"], "instance": case["instance_id"] or 0}
    data_load = tuple(case.get("data_load_events") or ())
    hta = critical_path(table, **window, data_load=data_load, top=1000, hta_compatible=True)
    ours = critical_path(table, **window, data_load=data_load, top=1000)
    return hta, ours, extent_us(table, select_window(table, **window), data_load)


#: HTA's cases where the default adds idle time and changes nothing else: no blocking call without
#: a sync event waited, no work ran from before the window, no CUDA graph
ONLY_IDLE = ("simple_add", "alexnet", "cuda_event_sync_multi_stream", "end_to_end_simple_add")


@pytest.mark.parametrize("name", ONLY_IDLE)
def test_only_idle_differs(name: str) -> None:
    """The same path (nodes, categories, top ops); its length adds the idle time and is the path's
    extent."""
    hta, ours, extent = both(read(CASES[name]["fixture"]), CASES[name])
    assert hta.length_us == CASES[name]["length_us"]
    assert ours.nodes == hta.nodes and ours.top == hta.top
    assert {k: v for k, v in ours.by_type.items() if k != "idle"} == hta.by_type
    assert ours.length_us == pytest.approx(hta.length_us + ours.by_type["idle"]) == extent


@pytest.mark.parametrize(
    ("name", "call", "copy"),
    [
        ("cuda_event_sync", "cudaMemcpyAsync", "Memcpy DtoH (Device -> Pageable)"),
        ("amd", "hipMemcpyWithStream", "Memcpy HtoD (Host -> Device)"),
    ],
)
def test_copies_without_sync_events_wait(name: str, call: str, copy: str) -> None:
    """HTA counts a blocking copy's call as CPU time (cuda_event_sync: 29 µs of ``cudaMemcpyAsync``,
    which returned 9 µs after its 2 µs copy; amd: 36 µs of ``hipMemcpyWithStream``, 7 µs after its
    16 µs copy). Ours: the call's time is off the path, the copy on it."""
    hta, ours, extent = both(read(CASES[name]["fixture"]), CASES[name])
    hta_names, our_names = {s.name for s in hta.top}, {s.name for s in ours.top}
    assert call in hta_names and copy not in hta_names
    assert call not in our_names and copy in our_names
    assert ours.by_type["cpu_bound"] < hta.by_type["cpu_bound"]
    assert ours.length_us == pytest.approx(sum(ours.by_type.values())) == pytest.approx(extent)


def test_lagging_gpu_on_ns_resolution() -> None:
    """``ns_resolution``'s step 1 (72 ms) starts while the GPU still runs step 0's kernels, and its
    own run until 162 ms after its start. HTA's path: 97 ms of weight, from 0.9 ms to 162 ms,
    leaving ~64 ms in no category. Ours starts with step 0's kernels at the window's start and is
    device work, back to back, from there to the end: GPU bound, all of it."""
    case = CASES["ns_resolution"]
    hta, ours, extent = both(read(case["fixture"]), case)
    assert hta.length_us == pytest.approx(case["length_us"], rel=0.01)
    assert set(ours.by_type) == {"gpu_compute_bound", "gpu_kernel_kernel_overhead"}
    assert ours.length_us == pytest.approx(extent) and extent > hta.length_us + 60_000


@pytest.mark.parametrize("name", sorted(CASES))
def test_by_type_sums_to_length(name: str) -> None:
    """By default the categories, idle included, add up to the length, the path's extent."""
    _, ours, extent = both(read(CASES[name]["fixture"]), CASES[name])
    assert sum(ours.by_type.values()) == pytest.approx(ours.length_us) == pytest.approx(extent)


@pytest.mark.parametrize("name", ["two_ranks_rank0", "cuda_nccl_distributed"])
def test_real_traces_waits(name: str, real_traces: Path) -> None:
    """The shared real traces with blocking copies and no sync events: the copies' calls leave the
    path's CPU time, the rest of it is HTA's."""
    case = REAL[name]
    hta, ours, extent = both(read_path(real_traces / case["trace"]), case)
    assert ours.by_type["cpu_bound"] < hta.by_type["cpu_bound"]
    assert abs(ours.by_type["cpu_bound"] - hta.by_type["cpu_bound"]) < 0.001 * hta.length_us
    assert ours.length_us == pytest.approx(extent)


def test_cli_default_and_hta_compatible(tmp_path: Path) -> None:
    """``analyze --critical-path --json``: ours (with ``idle``); ``--hta-compatible``: HTA's."""
    from layerscope.cli import main

    case = CASES["cuda_event_sync"]
    argv = ["analyze", str(HERE / case["fixture"]), "--step", "100", "--json"]
    assert main([*argv, str(tmp_path / "ours.json")]) == 0
    assert main([*argv, str(tmp_path / "hta.json"), "--hta-compatible"]) == 0
    ours, hta = (json.loads((tmp_path / f).read_text())["critical_path"] for f in ("ours.json", "hta.json"))
    assert hta["length_us"] == case["length_us"] and hta["by_type"] == case["by_type"]
    assert "idle" in ours["by_type"] and sum(ours["by_type"].values()) == pytest.approx(ours["length_us"])


def test_graph_kernels_from_two_streams() -> None:
    """A graph whose kernels run on two streams: each stream's first kernel of the launch gets the
    launch edge (the streams were idle), the rest follow on their streams; all are nodes."""
    events = [
        span("CUDAGraph::replay", "cpu_op", 0, 30),
        span("cudaGraphLaunch", "cuda_runtime", 5, 20, correlation=1),
        span("a0", "kernel", 30, 40, tid=7, pid=0, correlation=1, stream=7),
        span("a1", "kernel", 72, 40, tid=7, pid=0, correlation=1, stream=7),
        span("b0", "kernel", 31, 100, tid=8, pid=0, correlation=1, stream=8),
    ]
    path = critical_path(table_from_trace({"traceEvents": events}))
    # the longer chain: the launch delay to b0 (5 to 31) and b0 itself
    assert shares(path)[0] == ("b0", 100) and path.by_type["gpu_kernel_launch_overhead"] == 26
    hta = critical_path(table_from_trace({"traceEvents": events}), hta_compatible=True)
    assert np.isin(["a0", "b0"], [s.name for s in hta.top]).sum() == 0


def test_random_traces() -> None:
    """On forty random traces (``test_critical_path_fast.py``'s: overlapping spans, several threads
    and streams, every kind of synchronisation), whole and step 0: the default adds no cycle (it
    refuses exactly the traces HTA's model refuses: work starting before its launch, then waited
    for) and its categories always sum to its length."""
    from tests.test_critical_path_fast import random_trace

    paths = 0
    for seed in range(40):
        table = random_trace(seed)
        for step in (None, 0):
            found = []
            for hta_compatible in (True, False):
                try:
                    found.append(critical_path(table, step=step, hta_compatible=hta_compatible))
                except ValueError as cycle:
                    assert "cycle" in str(cycle)
                    found.append(None)
            hta, ours = found
            assert (hta is None) == (ours is None), (seed, step)
            if ours is not None:
                paths += 1
                assert sum(ours.by_type.values()) == pytest.approx(ours.length_us)
    assert paths > 70


def test_a_synchronisation_waits_for_work_launched_before_it() -> None:
    """``cudaDeviceSynchronize`` (150-310, no sync event) on thread 1; thread 2 launches ``K2``
    (launch 200-205, kernel 250-305) while it waits. The synchronisation waited for ``K`` (ends
    300), launched before it began, not for ``K2``, which ended later but was launched after."""
    events = [
        span("A", "cpu_op", 0, 100),
        span("cudaLaunchKernel", "cuda_runtime", 10, 10, correlation=1),
        span("K", "kernel", 50, 250, tid=7, pid=0, correlation=1, stream=7),
        span("cudaDeviceSynchronize", "cuda_runtime", 150, 160, correlation=2),
        span("C", "cpu_op", 320, 10),
        span("D", "cpu_op", 195, 15, tid=2),
        span("cudaLaunchKernel", "cuda_runtime", 200, 5, tid=2, correlation=3),
        span("K2", "kernel", 250, 55, tid=8, pid=0, correlation=3, stream=8),
    ]
    table = table_from_trace({"traceEvents": events})
    graph = build_graph(table, Window(*select_window(table)))
    names = [table.names[n] for n in table.array("span_name")]
    sync, k = names.index("cudaDeviceSynchronize"), names.index("K")
    into = (graph.kind == SYNC) & (graph.dst == graph.end(sync))
    assert graph.src[into].tolist() == [graph.end(k)]
    path = critical_path(table)
    assert [s.name for s in path.top] == ["K", "A", "C"]
    assert path.length_us == 330 and path.by_type["idle"] == 20
