"""The device report on columns (analysis/device_columns.py, sync_points.py, segments.py, the step
verdicts for all windows at once) gives the very report the loops over events gave
(tests/device_reference.py), figure for figure and float bit for bit: on random traces made to hit
the odd cases (repeated correlation ids, overlapping sync calls, steps that overlap or nest, windows
with hundreds of gaps, several devices and streams) and on the real traces."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from layerscope import loading
from layerscope.analysis.device import device_report, kernel_function_name
from layerscope.analysis.device_columns import first_seen, launch_calls
from layerscope.analysis.segments import covered_in_windows, segment_sums, window_pieces
from layerscope.analysis.sync_points import enclosing_ops
from layerscope.events.intervals import union_length
from layerscope.events.table import EventKind, EventTable
from tests import device_reference

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"

KERNELS = (
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "void at::native::vectorized_elementwise_kernel<4>(int, at::native::FillFunctor<float>)",
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32",
    "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(Params)",
    "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)",
)
COPIES = (
    "Memcpy HtoD (Pageable -> Device)",
    "Memcpy DtoH (Device -> Pinned)",
    "Memcpy DtoD (Device -> Device)",
)
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaMemcpyAsync", "cudaGraphLaunch", "cudaLaunchKernelExC")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaEventSynchronize")


def random_trace(
    seed: int, steps: int = 6, per_step: int = 40, device_tids: tuple[int, ...] = (10, 11, 12, 13, 14)
) -> EventTable:
    """CPU ops (nested, and some not), step ranges (one nested, one overlapping), launches and sync
    calls, and device work on two devices (one named 1 and "1": one device to the streams, two to
    the busy time) and five streams, one thread unnamed."""
    rng = np.random.default_rng(seed)
    t = EventTable()
    t.threads = {1: (900, 1), 2: (900, 2), 10: (0, 7), 11: (0, 13), 12: (1, 7), 13: ("1", 20)}
    us = 1000
    clock = 1_700_000_000_000_000_000
    corr = 0
    for step in range(steps):
        step_start = clock
        ops = []
        for _ in range(per_step):
            tid = int(rng.choice([1, 1, 1, 2]))
            op_start = clock + int(rng.integers(0, 5 * us))
            op_dur = int(rng.integers(2 * us, 60 * us))
            t.add_span(f"aten::op{int(rng.integers(0, 6))}", EventKind.CPU_OP, tid, op_start, op_dur)
            ops.append((tid, op_start, op_dur))
            corr += 1 if rng.random() > 0.05 else 0  # a repeated id now and then
            call = str(rng.choice(SYNCS)) if rng.random() < 0.08 else str(rng.choice(LAUNCHES))
            call_start = op_start + int(rng.integers(0, op_dur // 2))
            call_dur = int(rng.integers(1, op_dur)) if rng.random() > 0.1 else op_dur * 2  # some stick out
            t.add_span(
                call, EventKind.RUNTIME, tid, call_start, call_dur, corr=corr if rng.random() > 0.05 else 0
            )
            if call in SYNCS:
                continue
            kind = EventKind.KERNEL if rng.random() > 0.2 else EventKind(int(rng.choice([5, 5, 6])))
            name = str(
                rng.choice(KERNELS if kind == EventKind.KERNEL else COPIES if kind == 5 else ("Memset",))
            )
            start = call_start + int(rng.integers(-2 * us, 80 * us))
            dur = int(rng.integers(1, 40 * us)) if rng.random() > 0.01 else 0
            link = corr if rng.random() > 0.03 else corr + 10**6
            t.add_span(name, kind, int(rng.choice(device_tids)), start, dur, corr=link)
            clock = op_start + int(rng.integers(0, op_dur))
        clock += int(rng.integers(0, 300 * us))
        t.add_span(f"ProfilerStep#{step}", EventKind.USER_ANNOTATION, 1, step_start, clock - step_start)
        if step == 2:  # the same step again, inside: no step of its own
            t.add_span(f"ProfilerStep#{step}", EventKind.USER_ANNOTATION, 2, step_start + us, us)
        if step == 4:  # starts inside the last one and ends after it: cuts it
            t.add_span("ProfilerStep#99", EventKind.USER_ANNOTATION, 1, clock - 50 * us, 100 * us)
    t.meta["copy_bytes"] = {name: 1 << (10 + k) for k, name in enumerate(COPIES[:2])}
    return t


@pytest.mark.parametrize("seed", range(12))
def test_random_traces_report_as_the_loops_did(seed: int) -> None:
    table = random_trace(seed)
    found, expected = device_report(table), device_reference.device_report(table)
    assert found is not None and found.steps and found.syncs and found.collectives
    assert repr(found) == repr(expected)


def test_live_capture_threads_report_as_the_loops_did() -> None:
    """A live capture's table: threads by the OS's large ids, no (pid, tid) names."""
    table = random_trace(3, device_tids=(10, 11, 12))
    big = 140_000_000_000
    table.span_tid = [tid + big for tid in table.span_tid]
    table.threads = {}
    found = device_report(table)
    assert found is not None and {s.device for s in found.streams} == {"?"} and len(found.streams) == 3
    assert repr(found) == repr(device_reference.device_report(table))


def test_windows_with_hundreds_of_gaps_sum_as_numpy() -> None:
    """Over 128 gaps of one cause in one window: numpy's pairwise halves, not the eight lanes."""
    table = random_trace(7, steps=2, per_step=800, device_tids=(10,))
    found = device_report(table)
    assert found is not None and found.steps
    assert repr(found) == repr(device_reference.device_report(table))


def traces() -> list[Path]:
    shared = sorted(SHARED.glob("*.json.gz")) + sorted(SHARED.glob("*/*.json.gz"))
    return sorted(FIXTURES.glob("*[a-z].json.gz")) + shared


@pytest.mark.parametrize("path", traces(), ids=lambda p: p.name)
def test_real_traces_report_as_the_loops_did(path: Path) -> None:
    table = loading._read(path, None, False)
    if not isinstance(table, EventTable):
        pytest.skip("a saved profile: no events")
    assert repr(device_report(table)) == repr(device_reference.device_report(table))


def test_sync_calls_inside_an_earlier_one_sweep_every_op() -> None:
    """A sync call that starts after another on its thread and ends before it: the sweep pops, for
    the first, an op the second lies in (the reference's answer, kept), so every op is swept."""
    t = EventTable()
    ms = 1_000_000
    t.add_span("outer", EventKind.CPU_OP, 1, 0, 100 * ms)
    t.add_span("cudaStreamSynchronize", EventKind.RUNTIME, 1, 10 * ms, 50 * ms)
    t.add_span("inner", EventKind.CPU_OP, 1, 5 * ms, 15 * ms)
    t.add_span("cudaDeviceSynchronize", EventKind.RUNTIME, 1, 12 * ms, 2 * ms)
    t.add_span("other thread", EventKind.CPU_OP, 2, 0, 100 * ms)
    t.add_span("cudaStreamSynchronize", EventKind.RUNTIME, 2, 30 * ms, 1 * ms)
    wanted = np.asarray([1, 3, 5])
    found = enclosing_ops(t, wanted)
    assert found == device_reference._enclosing_ops(t, wanted.tolist())
    assert found == {1: 0, 3: 0, 5: 4}  # "inner" popped by the first call


def test_launch_calls_take_the_last_call_of_a_repeated_id() -> None:
    t = EventTable()
    for k, c in enumerate([5, 3, 5, 0, 9]):
        t.add_span("cudaLaunchKernel", EventKind.RUNTIME, 1, k, 1, corr=c)
    for c in (5, 3, 0, 9, 7):
        t.add_span("k", EventKind.KERNEL, 2, 10, 1, corr=c)
    assert launch_calls(t, np.arange(5, 10)).tolist() == [2, 1, -1, 4, -1]


def test_segment_sums_are_numpy_sums() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 2000))
        values = rng.integers(1, 10**9, n) / 1000.0
        bounds = np.concatenate([[0], np.sort(rng.integers(0, n + 1, int(rng.integers(0, 40)))), [n]])
        expected = [values[a:b].sum() for a, b in itertools.pairwise(bounds)]
        assert segment_sums(values, bounds).tolist() == expected
    values = rng.integers(1, 10**9, 60_000) / 1000.0  # more segments than one grid holds
    bounds = np.concatenate([[0], np.sort(rng.integers(0, values.size, 9000)), [values.size]])
    expected = [values[a:b].sum() for a, b in itertools.pairwise(bounds)]
    assert segment_sums(values, bounds).tolist() == expected


def test_covered_and_pieces_per_window_are_the_clipped_union() -> None:
    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(0, 300))
        start = np.sort(rng.integers(0, 10_000, n))
        end = start + rng.integers(0, 500, n)
        lo = rng.integers(-100, 10_000, 30)
        hi = lo + rng.integers(-10, 3000, 30)  # overlapping windows, some empty or reversed
        covered = covered_in_windows(start, end, lo, hi)
        reach = np.maximum.accumulate(end) if n else end
        pieces = {}
        for cut in window_pieces(start, end, reach, lo, hi):
            for k in range(cut.bounds.size - 1):
                a, b = cut.bounds[k], cut.bounds[k + 1]
                pieces[cut.first + k] = (cut.start[a:b], cut.end[a:b], cut.rows[a:b])
        for k in range(lo.size):
            s, e = np.clip(start, lo[k], hi[k]), np.clip(end, lo[k], hi[k])
            keep = np.flatnonzero(e > s)
            assert covered[k] == union_length(s[keep], e[keep])
            assert [p.tolist() for p in pieces[k]] == [s[keep].tolist(), e[keep].tolist(), keep.tolist()]


def test_kernel_function_names_as_the_character_loop_found_them() -> None:
    rng = np.random.default_rng(2)
    alphabet = np.asarray([*"<>(), a:_", "(anonymous namespace)", "void "])
    names = ["".join(rng.choice(alphabet, int(rng.integers(0, 30)))) for _ in range(3000)]
    for name in [*names, *KERNELS, "(anonymous namespace)::f(int)", "a>>(b)"]:
        assert kernel_function_name(name) == device_reference.kernel_function_name(name)


@pytest.mark.parametrize("scale", [1, 10**15, -1])  # counted (small ids), sorted (large, negative)
def test_first_seen_is_dict_order(scale: int) -> None:
    keys = np.random.default_rng(3).integers(0, 40, 5000) * scale
    index: dict[int, int] = {}
    expected = [index.setdefault(k, len(index)) for k in keys.tolist()]
    distinct, group = first_seen(keys)
    assert distinct.tolist() == list(index) and group.tolist() == expected
