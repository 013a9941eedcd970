"""Device analysis on traces recorded on an H100 (tests/fixtures/gpu, written by
benchmarks/gpu_traces.py; torch 2.11+cu130), against Holistic Trace Analysis's figures.

HTA figures come from HTA 0.5.0 (pandas 2.3.3) in a throwaway venv:
``python fixture_figures.py tests/fixtures/gpu`` (described in docs/compared.md), per
stream: ``get_idle_time_breakdown``, ``get_queue_length_summary``, ``get_cuda_kernel_launch_stats``,
``get_memory_bw_summary``. HTA rounds every timestamp to whole microseconds (start up, end down), so
an idle gap can read up to 2 µs longer in HTA: gap sums are compared within 2 µs per gap. HTA
leaves out the last ProfilerStep of a trace with several; ``host_bound`` is compared with HTA's
figure on the same trace with its step ranges renamed (``Step#host``), which HTA reads whole.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from layerscope.analysis.device import DeviceReport
from layerscope.analysis.streams import IdleTime, StreamWork, overlap_share
from layerscope.analysis.verdict import device_gaps, step_verdict
from layerscope.loading import analyze

GPU = Path(__file__).parent / "fixtures" / "gpu"

#: per trace and stream: idle (host wait, kernel wait, other) µs, gaps, queue (mean, max),
#: launch delay (median, p95) µs — HTA 0.5.0, command in the module docstring
HTA = {
    "host_bound": {"7": ((35062, 0, 0), 59, (0.5, 1), None)},
    "queued_wait": {
        "7": ((0, 63, 103), 23, (11.042, 23), (127447.5, 234239.75)),
        "46": ((0, 121, 171598), 59, (30.0, 60), (170185.0, 255627.4)),
    },
    "copies": {"7": ((1112, 25, 0), 14, (0.567, 2), (0.0, 7.7))},
    "cuda_graph": {"7": ((0, 122, 0), 79, None, None)},
    "nccl_one_rank": {"7": ((0, 49, 0), 17, (8.056, 17), (10782.5, 20017.6))},
}


def report_of(name: str) -> DeviceReport:
    found = analyze(GPU / f"{name}.json.gz")
    found.profile.validate()
    assert found.device is not None
    return found.device


@pytest.mark.parametrize("name", sorted(HTA))
def test_streams_agree_with_hta(name: str) -> None:
    report = report_of(name)
    streams = {s.stream: s for s in report.streams}
    assert set(streams) == set(HTA[name])
    for stream, (idle, gaps, queue, delay) in HTA[name].items():
        ours = streams[stream]
        assert ours.work == gaps + 1
        hta_total = sum(idle)
        assert 0 <= hta_total - ours.idle.total_us <= 2 * gaps
        # the split at 30 µs can move a gap between kernel wait and other after rounding; host
        # wait is decided by launch order, which rounding keeps
        assert abs(ours.idle.host_wait_us - idle[0]) <= 2 * gaps
        if queue is None:
            assert ours.queue_mean is None
        else:
            assert ours.queue_mean == pytest.approx(queue[0], abs=1e-3) and ours.queue_max == queue[1]
        if delay is not None:
            assert ours.launch_delay_median_us == pytest.approx(delay[0], abs=2)
            assert ours.launch_delay_p95_us == pytest.approx(delay[1], abs=2)


def test_host_bound_steps_are_cpu_bound_and_idle_adds_up() -> None:
    report = report_of("host_bound")
    assert [s.step for s in report.steps] == [1, 2, 3]
    for step in report.steps:
        assert step.verdict == "CPU-bound"
        assert step.idle.dominant() == "host_wait"
        assert step.idle.total_us + step.device_busy_us == pytest.approx(step.wall_us, abs=0.01)


@pytest.mark.parametrize("name", ["host_bound", "queued_wait", "copies", "cuda_graph", "nccl_one_rank"])
def test_device_idle_is_window_minus_busy(name: str) -> None:
    report = report_of(name)  # one device: no stream busy = window minus busy
    assert report.idle.total_us == pytest.approx(report.idle_us, abs=0.01)


def test_queued_side_stream_waits_on_the_main_stream() -> None:
    """The side stream waits on an event behind the main stream's matmuls: its idle time is
    queued wait, not host wait; the device as a whole is never idle with work queued long."""
    report = report_of("queued_wait")
    side = next(s for s in report.streams if s.stream == "46")
    assert side.idle.dominant() == "other" and side.idle.other_us > 0.99 * side.idle.total_us
    assert report.streams[0].stream == "7"  # busiest first


def test_copy_bandwidth_per_kind() -> None:
    with gzip.open(GPU / "copies.json.gz", "rt") as fh:
        events = json.load(fh)["traceEvents"]
    by_name: dict[str, list[int]] = {}
    for e in events:
        if e.get("cat") == "gpu_memcpy":
            by_name.setdefault(e["name"], []).append(int(e["args"]["bytes"]))
    report = report_of("copies")
    copies = {c.kind: c for c in report.copies}
    assert set(copies) == {"memcpy H2D", "memcpy D2H", "memcpy D2D"}
    for kind, name in (
        ("memcpy H2D", "Memcpy HtoD"),
        ("memcpy D2H", "Memcpy DtoH"),
        ("memcpy D2D", "Memcpy DtoD"),
    ):
        found = [n for n in by_name if n.startswith(name)]
        assert copies[kind].bytes == sum(sum(by_name[n]) for n in found)
        assert copies[kind].count == sum(len(by_name[n]) for n in found)
    # HTA's per-copy bandwidth (GB/s, min..max): the total bytes over the total time lies between
    hta = {"memcpy H2D": (8.561, 54.946), "memcpy D2H": (13.728, 55.347), "memcpy D2D": (1482.086, 1514.155)}
    for kind, (low, high) in hta.items():
        bandwidth = copies[kind].gb_per_s
        assert bandwidth is not None and low <= bandwidth <= high
    assert copies["memcpy D2D"].gb_per_s == pytest.approx(1501.288, rel=0.01)  # HTA's mean, equal sizes


def test_graph_kernels_are_not_launch_bound() -> None:
    report = report_of("cuda_graph")
    assert report.launches == 80 and report.launch_bound == 0


def test_overlap_per_step_agrees_with_hta(real_traces: Path) -> None:
    """HTA's ``get_comm_comp_overlap`` leaves out the last ProfilerStep: on two_ranks it is our
    first step's figure, rank by rank (11.81%, 20.05%: /work/hta_ref/compute.py, HTA 0.5.0)."""
    for rank, hta in ((0, 0.1181), (1, 0.2005)):
        report = analyze(real_traces / f"two_ranks/rank-{rank}.json.gz").device
        assert report is not None
        first = report.steps[0]
        assert first.comm_overlap == pytest.approx(hta, abs=0.0005)
        assert report.comm_compute_overlap is not None and 0 < report.comm_compute_overlap < 1
        assert {s.verdict for s in report.steps} == {"waiting on dependencies"}


def test_overlap_share() -> None:
    def iv(*pairs: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray([p[0] for p in pairs]), np.asarray([p[1] for p in pairs])

    assert overlap_share(iv(), iv((0, 10))) is None
    assert overlap_share(iv((0, 10)), iv((5, 20))) == pytest.approx(0.5)
    assert overlap_share(iv((0, 10)), iv((10, 20))) == 0.0  # touching is no overlap
    # communication time is the union of communication kernels (HTA merges them); overlapped
    # time counts once however many kernels run
    assert overlap_share(iv((0, 10), (0, 10)), iv((0, 4), (2, 6))) == pytest.approx(6 / 10)
    assert overlap_share(iv((0, 10), (0, 10)), iv((0, 10))) == pytest.approx(1.0)


def test_device_gaps_split_at_the_first_launch() -> None:
    """Work A [0, 10), work B [100, 110) launched at 40: the gap [10, 100) is host wait until 40,
    then queued (other: 60 µs past the 30 µs launch-gap bound); before A and after B: host wait."""
    us = 1000
    work = StreamWork(
        start=np.asarray([0, 100 * us]),
        end=np.asarray([10 * us, 110 * us]),
        stream=np.asarray([0, 0]),
        keys=[("0", "7")],
        is_kernel=np.asarray([True, True]),
        launch_start=np.asarray([-1, 40 * us]),
        launch_end=np.asarray([-1, 45 * us]),
        queued=np.asarray([False, True]),
    )
    starts, ends, causes = device_gaps(work, -5 * us, 120 * us)
    got = sorted(zip((starts // us).tolist(), (ends // us).tolist(), causes.tolist(), strict=True))
    assert got == [(-5, 0, 0), (10, 40, 0), (40, 100, 2), (110, 120, 0)]


def test_step_verdict_rules() -> None:
    assert step_verdict(0.9, IdleTime()) == "device-bound"
    assert step_verdict(0.9, IdleTime(), exposed_comm_share=0.6) == "communication-bound"
    assert step_verdict(0.3, IdleTime(host_wait_us=70)) == "CPU-bound"
    assert step_verdict(0.3, IdleTime(host_wait_us=20, other_us=50)) == "waiting on dependencies"
    assert step_verdict(0.3, IdleTime(kernel_wait_us=60, host_wait_us=10)) == "launch-bound"
    assert step_verdict(0.6, IdleTime(host_wait_us=15, kernel_wait_us=15, other_us=10)) == "balanced"
    assert step_verdict(0.6, IdleTime(host_wait_us=35, other_us=5)) == "CPU-bound"
    assert step_verdict(0.6, IdleTime(host_wait_us=5, kernel_wait_us=90, other_us=5)) == "launch-bound"


def test_step_idle_adds_up_on_epoch_timestamps(real_traces: Path) -> None:
    """Wall-clock traces hold epoch nanoseconds (above 2**53): the gaps' split points stay exact."""
    for rank in (0, 1):
        report = analyze(real_traces / f"two_ranks/rank-{rank}.json.gz").device
        assert report is not None
        assert report.idle.total_us == pytest.approx(report.idle_us, abs=0.001)
        for step in report.steps:
            assert step.idle.total_us + step.device_busy_us == pytest.approx(step.wall_us, abs=0.001)


def test_two_devices_each_keep_their_own_timeline() -> None:
    """One step of 1000 µs; GPU 0 busy for its first half, GPU 1 for its second: each device is
    idle half the step (not a device-bound step), and a collective on GPU 1 is not hidden by
    computation on GPU 0."""
    from layerscope.analysis.device import device_report
    from layerscope.events import EventKind, EventTable

    us = 1000
    t = EventTable()
    t.threads = {1: (100, 100), 2: (0, 7), 3: (1, 7)}
    t.add_span("ProfilerStep#1", EventKind.USER_ANNOTATION, 1, 0, 1000 * us)
    t.add_span("cudaLaunchKernel", EventKind.RUNTIME, 1, 0, 5 * us, corr=1)
    t.add_span("volta_sgemm_128x64_nn", EventKind.KERNEL, 2, 0, 500 * us, corr=1)
    t.add_span("cudaLaunchKernel", EventKind.RUNTIME, 1, 10 * us, 5 * us, corr=2)
    t.add_span("ncclKernel_AllReduce_RING_LL_Sum_float", EventKind.KERNEL, 3, 500 * us, 500 * us, corr=2)
    report = device_report(t)
    assert report is not None
    (step,) = report.steps
    assert step.devices == 2 and step.device_busy_us == 1000 and step.utilisation == pytest.approx(0.5)
    assert step.idle.total_us == pytest.approx(1000) and step.verdict != "device-bound"
    assert report.idle.total_us == pytest.approx(report.idle_us)
    assert report.comm_compute_overlap == 0.0 and step.comm_overlap == 0.0


def test_device_report_in_profile_frames_and_html(tmp_path: Path) -> None:
    """The device report travels with the profile (meta.device): saved, framed, in the report."""
    pytest.importorskip("pandas")
    import layerscope as ls
    from layerscope.render.html import html_report

    profile = ls.load(GPU / "queued_wait.json.gz")
    saved = ls.load(profile.save(tmp_path / "p.json.gz"))
    streams = saved.to_pandas("streams")
    assert list(streams["stream"]) == ["7", "46"]
    assert streams.loc[1, "other_us"] == pytest.approx(171596.83, abs=0.01)
    assert streams.loc[1, "queue_max"] == 60
    steps = ls.load(GPU / "host_bound.json.gz").to_pandas("device_steps")
    assert list(steps["verdict"]) == ["CPU-bound"] * 3
    copies = ls.load(GPU / "copies.json.gz").to_pandas("copies")
    assert set(copies["kind"]) == {"memcpy H2D", "memcpy D2H", "memcpy D2D"}
    page = html_report(saved)
    assert '<section id="device">' in page and "171.60ms" in page
    with pytest.raises(ls.UsageError, match="no device report"):
        ls.load(Path(__file__).parent / "fixtures" / "gpu" / "memory_block.layerscope.json.gz").to_pandas(
            "streams"
        )


def test_time_at_a_full_launch_queue() -> None:
    """1100 launches 1 µs apart, the first kernel starting after all of them and each running
    1 µs: the queue stands at 1024 or more from the 1024th launch until enough kernels ran."""
    from layerscope.analysis.streams import MAX_QUEUE, stream_stats

    us = 1000
    n = 1100
    launch = np.arange(n) * us
    start = (n + np.arange(n)) * us
    work = StreamWork(
        start=start,
        end=start + us,
        stream=np.zeros(n, np.int64),
        keys=[("0", "7")],
        is_kernel=np.ones(n, bool),
        launch_start=launch,
        launch_end=launch + us // 2,
        queued=np.ones(n, bool),
    )
    (stats,) = stream_stats(work)
    assert stats.queue_max == n
    # full from launch 1024 (t=1023 µs) until the queue drops under 1024: kernel 77 starts
    assert stats.full_queue_us == pytest.approx((n + (n - MAX_QUEUE)) - (MAX_QUEUE - 1))
    assert report_of("queued_wait").streams[0].full_queue_us == 0.0
