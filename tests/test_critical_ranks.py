"""The critical path through several ranks (``analysis/critical_ranks.py``, ``critical_clocks.py``):
a small two-rank trace checked by hand, and the invariants on the shared real two-rank traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from layerscope.analysis.critical_clocks import RankKernels, align_clocks, clock_offset
from layerscope.analysis.critical_path import critical_path
from layerscope.analysis.critical_ranks import RankTable, ranks_critical_path
from layerscope.events.chrome import table_from_trace

NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
#: rank 1's clock runs this far (µs) ahead of rank 0's
SKEW_US = 5000


def span(
    name: str, cat: str, ts: float, dur: float, tid: int = 1, pid: int = 1, **args: Any
) -> dict[str, Any]:
    """One complete trace event (µs)."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def launch(
    op: tuple[str, float, float], call: tuple[float, float], kernel: tuple[str, float, float, int], corr: int
) -> list[dict[str, Any]]:
    """A CPU op launching one kernel from a ``cudaLaunchKernel`` inside it."""
    name, a, b = op
    kname, ka, kb, stream = kernel
    return [
        span(name, "cpu_op", a, b - a),
        span("cudaLaunchKernel", "cuda_runtime", call[0], call[1] - call[0], correlation=corr),
        span(kname, "kernel", ka, kb - ka, tid=stream, pid=0, correlation=corr, stream=stream),
    ]


def synchronize(a: float, b: float, corr: int) -> list[dict[str, Any]]:
    """``cudaDeviceSynchronize`` from ``a`` to ``b`` with its ``Context Sync`` event (ending at ``b``)."""
    return [
        span("cudaDeviceSynchronize", "cuda_runtime", a, b - a, correlation=corr),
        span("Context Sync", "cuda_sync", b - 10, 10, tid=-1, pid=0, correlation=corr, stream=-1),
    ]


def rank0() -> list[dict[str, Any]]:
    """The fast rank: A0 (50 µs), an all-reduce it waits in until 700 (rank 1 joins at 550), B0
    (300 µs), a second all-reduce that rank 1 waits for (1050-1100), C0 (30 µs)."""
    return [
        *launch(("A0", 0, 50), (10, 20), ("k_small", 30, 80, 7), 1),
        *launch(("c10d::allreduce_", 60, 70), (62, 68), (NCCL, 100, 700, 8), 2),
        *synchronize(80, 710, 3),
        span("B0", "cpu_op", 720, 300),
        *launch(("c10d::allreduce_", 1030, 1040), (1032, 1038), (NCCL, 1050, 1100, 8), 4),
        *synchronize(1045, 1110, 5),
        span("C0", "cpu_op", 1120, 30),
    ]


def rank1() -> list[dict[str, Any]]:
    """The slow rank (its own clock): A1 (500 µs), the first all-reduce joined last (550-700), B1
    (50 µs), the second all-reduce joined first (800-1100)."""
    return [
        *launch(("A1", 0, 500), (10, 20), ("k_big", 30, 480, 7), 1),
        *launch(("c10d::allreduce_", 510, 520), (512, 518), (NCCL, 550, 700, 8), 2),
        *synchronize(525, 705, 3),
        span("B1", "cpu_op", 710, 50),
        *launch(("c10d::allreduce_", 770, 780), (772, 778), (NCCL, 800, 1100, 8), 4),
        *synchronize(785, 1110, 5),
    ]


def skewed(events: list[dict[str, Any]], by: float) -> list[dict[str, Any]]:
    """The events with every timestamp moved by ``by`` µs (another host's clock)."""
    return [e | {"ts": e["ts"] + by} for e in events]


def traces(skew: float = SKEW_US) -> list[dict[str, Any]]:
    """Both ranks' traces, each with its ``distributedInfo``."""
    return [
        {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}, "traceEvents": events}
        for rank, events in ((0, rank0()), (1, skewed(rank1(), skew)))
    ]


def two_ranks(skew: float = SKEW_US) -> list[RankTable]:
    """The two ranks' tables."""
    return [RankTable(k, table_from_trace(trace)) for k, trace in enumerate(traces(skew))]


def test_hand_checked_path_crosses_ranks() -> None:
    """Rank 1 is slow (A1, 500 µs) and joins the first all-reduce last (at 550, rank 0's clock):
    the path runs on rank 1 to that kernel's start (A1 490 + its launch call 10 + the all-reduce
    op 2 + the launch delay 38 = 540, and 10 idle from A1's end to the op), crosses to rank 0 at
    the collective's end (its last 150 µs), then stays on rank 0: B0 300, the second all-reduce's
    op 2 and launch delay 18, the kernel 50 (rank 0 is the last arriver there: rank 1's kernel
    waits 800-1050, off the path), C0 30, and 50 idle (waking from the two synchronisations,
    between top-level ops). 1,150 µs from 0 to C0's end, 1,090 of them work; rank 1's clock moved
    back 5 ms by the collectives' ends. HTA's model counts no idle time: 1,090."""
    path = ranks_critical_path(two_ranks())
    work = {"cpu_bound": 834, "gpu_communication_bound": 200, "gpu_kernel_launch_overhead": 56}
    assert path.length_us == 1150 and path.by_type == work | {"idle": 60}
    assert path.ranks == {0: 600, 1: 550}
    assert path.clock_offsets_us == {0: 0, 1: SKEW_US} and path.collectives == 2
    hops = [(s.rank, s.start_us, s.end_us, s.us) for s in path.segments]
    assert hops == [(1, 0, 550, 550), (0, 550, 1150, 600)]
    top = [(s.name, s.rank, s.us) for s in path.top]
    assert top[:4] == [("A1", 1, 490), ("B0", 0, 300), (NCCL, 0, 200), ("C0", 0, 30)]
    assert ("cudaLaunchKernel", 1, 10) in top and ("A0", 0, 10) not in top
    assert path.nodes == sum(s.nodes for s in path.segments) + 1
    written = path.to_json()
    assert written["ranks"] == {"0": 600, "1": 550}
    assert written["top"][0] == {"name": "A1", "us": 490, "rank": 1}
    assert [s["rank"] for s in written["segments"]] == [1, 0]
    hta = ranks_critical_path(two_ranks(), hta_compatible=True)
    assert (hta.length_us, hta.by_type, hta.ranks) == (1090, work, {0: 550, 1: 540})


def test_one_rank_alone_blames_the_collective() -> None:
    """Rank 0's own path has the same length but puts the 600 µs it waited in the all-reduce on
    the path as communication; across ranks that wait is rank 1's A1."""
    alone = critical_path(two_ranks()[0].table)
    assert alone.length_us == 1150 and alone.by_type["gpu_communication_bound"] == 650
    assert "A1" not in {s.name for s in alone.top}


def test_clock_skew_does_not_change_the_path() -> None:
    """The same job with rank 1's clock behind instead of ahead, or right: the same path."""
    base = ranks_critical_path(two_ranks())
    for skew in (-3_000_000, 0):
        moved = ranks_critical_path(two_ranks(skew))
        assert moved.clock_offsets_us == {0: 0, 1: skew}
        assert (moved.length_us, moved.by_type, moved.ranks) == (base.length_us, base.by_type, base.ranks)
        assert [s.us for s in moved.segments] == [s.us for s in base.segments]


def kernels(ends_us: list[float], name: str = "nccl") -> RankKernels:
    """Communication kernels ending at ``ends_us`` (10 µs each)."""
    end = np.asarray([int(e * 1000) for e in ends_us], dtype=np.int64)
    return RankKernels(np.arange(end.size), (name,) * end.size, end - 10_000, end)


def test_clock_offset_is_what_most_collectives_agree_on() -> None:
    """Three collectives end 2 ms later on rank 1's clock (within a few µs); rank 1 also has a
    kernel no collective of rank 0 matches. One matching pair is no evidence: offset 0, one vote."""
    ref = kernels([100, 400, 900, 1500])
    other = kernels([2100, 2403, 2898, 7000])
    assert clock_offset(ref, other) == (2_000_000, 3)
    assert clock_offset(kernels([100]), kernels([5100])) == (0, 1)
    assert clock_offset(ref, kernels([2100, 2403], name="other")) == (0, 0)


def test_clock_offset_of_many_collectives() -> None:
    """3,000 collectives at irregular times, rank 1's clock 2 s ahead with a few µs of jitter, and
    500 kernels of its own: the reference's kernels are sampled, the offset still found."""
    rng = np.random.default_rng(0)
    ends = np.cumsum(rng.uniform(100, 5000, 3000))
    jitter = rng.uniform(-3, 3, ends.size)
    extra = rng.uniform(0, ends[-1], 500)
    offset, votes = clock_offset(kernels(list(ends)), kernels([*(ends + 2e6 + jitter), *extra]))
    assert abs(offset - 2_000_000_000) < 3_000 and votes > 20


def test_subgroups_align_through_a_rank_in_both() -> None:
    """Ranks 0 and 1 share two collectives, ranks 1 and 2 two others, rank 3 none: rank 2's clock is
    aligned through rank 1's, rank 3 keeps its own."""
    clocks = align_clocks(
        [
            kernels([100, 700]),
            kernels([5100, 5700, 5900, 6600], name="nccl"),
            kernels([7900, 8600]),
            kernels([300, 900], name="other"),
        ]
    )
    assert clocks.offset_ns == (0, 5_000_000, 7_000_000, 0) and clocks.votes == (0, 2, 2, 0)


def test_real_two_ranks(real_traces: Path) -> None:
    """The shared two-rank job (HTA's traces): the path's time adds up by type and by rank, its
    stretches follow each other in time, each rank's part is the sum of its stretches, every top
    entry names its rank; the clocks agree within 100 µs (Kineto's wall clock on both hosts)."""
    import layerscope as ls

    path = ls.critical_path(real_traces / "two_ranks")
    assert path.ranks is not None and set(path.ranks) == {0, 1}
    assert sum(path.by_type.values()) == pytest.approx(path.length_us)
    assert sum(path.ranks.values()) == pytest.approx(path.length_us)
    for a, b in zip(path.segments, path.segments[1:], strict=False):
        assert a.rank != b.rank and b.start_us == pytest.approx(a.end_us)
    assert all(s.start_us <= s.end_us for s in path.segments)
    assert path.segments[0].start_us >= path.window_us[0] and path.segments[-1].end_us <= path.window_us[1]
    for rank, us in path.ranks.items():
        assert sum(s.us for s in path.segments if s.rank == rank) == pytest.approx(us)
    assert all(s.rank in (0, 1) for s in path.top)
    assert path.clock_offsets_us is not None and abs(path.clock_offsets_us[1]) < 100
    # the collectives joining the ranks are those the straggler report matches (rank 1 late to 5)
    late = ls.merge(real_traces / "two_ranks", critical_path=False).straggler
    assert late is not None and late.late is not None and path.collectives == late.late.matched == 5
    alone = [ls.critical_path(real_traces / f"two_ranks/rank-{r}.json.gz") for r in (0, 1)]
    # waiting in collectives is off the joined path: it is no longer than the longer rank's own
    assert path.length_us <= max(p.length_us for p in alone) + 1e-6


def test_analyze_folder_critical_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``layerscope analyze FOLDER --critical-path --json OUT`` on a folder of rank traces: one path
    through the ranks, printed with the ranks named, and in OUT with ``ranks`` and each entry's
    rank; ``layerscope.critical_path(FOLDER)`` is the same path."""
    import layerscope as ls
    from layerscope.cli import main

    folder = write_job(tmp_path / "job")
    out = tmp_path / "path.json"
    assert main(["analyze", str(folder), "--critical-path", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        "Through 2 ranks (2 collectives matched across them): rank 0 600.0µs (52.2%), rank 1 550.0µs (47.8%)."
        in printed
    )
    assert "Clocks aligned by the collectives' ends: rank 1 +5.00ms" in printed
    assert "Path: rank 1 (550.0µs) → rank 0 (600.0µs)" in printed
    written = json.loads(out.read_text(encoding="utf-8"))["critical_path"]
    assert written["length_us"] == 1150 and written["ranks"] == {"0": 600, "1": 550}
    assert all("rank" in entry for entry in written["top"])
    assert ls.critical_path(folder) == ranks_critical_path(two_ranks())
    assert ls.critical_path(sorted(folder.iterdir())[::-1]) == ls.critical_path(folder)  # ranks, not order


def write_job(folder: Path) -> Path:
    """The hand-checked job as a folder of rank traces."""
    folder.mkdir()
    for k, trace in enumerate(traces()):
        with gzip.open(folder / f"rank-{k}.json.gz", "wt") as f:
            json.dump(trace, f)
    return folder


def test_merge_names_the_rank_and_op_holding_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``layerscope merge`` of rank traces: one line with the rank holding most of the path and
    its heaviest op (no module ranges here), the path itself in ``-o merge.json``; the merge
    computes the path once, through the ranks (the same as ``critical_path(FOLDER)``). Saved
    profiles keep no events: no path, no line."""
    import layerscope as ls
    from layerscope.cli import main

    folder = write_job(tmp_path / "job")
    merged = ls.merge(folder)
    assert merged.critical_path == ranks_critical_path(two_ranks())
    out = tmp_path / "merge.json"
    assert main(["merge", str(folder), "-o", str(out)]) == 0
    line = "Critical path: 1.15ms through 2 ranks; rank 0 holds 600.0µs (52.2%); most in B0 (300.0µs"
    assert line in capsys.readouterr().out
    assert json.loads(out.read_text(encoding="utf-8"))["critical_path"]["ranks"] == {"0": 600, "1": 550}
    saved = []
    for k in (0, 1):
        saved.append(tmp_path / f"p{k}.json.gz")
        ls.load(folder / f"rank-{k}.json.gz").save(saved[-1])
    assert ls.merge(saved).critical_path is None


def test_merge_real_two_ranks_names_the_path(real_traces: Path) -> None:
    """On the shared two-rank job the path stays on rank 1, the straggler (the rank late to
    collectives), and its heaviest op is named."""
    import layerscope as ls
    from layerscope.render.ranks import critical_path_line

    merged = ls.merge(real_traces / "two_ranks")
    line = critical_path_line(merged)
    assert merged.critical_path is not None and line is not None
    assert merged.straggler is not None and merged.straggler.late is not None
    assert f"rank {merged.straggler.late.rank} holds" in line and "most in aten::_foreach_mul_" in line


def test_merge_leaves_the_path_out_of_big_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
) -> None:
    """Beyond ``PATH_MAX_BYTES`` of traces the merge warns and leaves the path out (one process
    would hold every rank's events); ``critical_path=True`` computes it anyway."""
    import layerscope as ls
    from layerscope import merging

    folder = write_job(tmp_path / "job")
    monkeypatch.setattr(merging, "PATH_MAX_BYTES", 100)
    assert ls.merge(folder).critical_path is None
    assert any("no critical path through the ranks" in str(w.message) for w in recwarn)
    assert ls.merge(folder, critical_path=True).critical_path == ranks_critical_path(two_ranks())
