"""Communication across ranks in ``merge``: kernel time, overlap, and the rank late to collectives."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import layerscope as ls
from layerscope.analysis.collectives import CollectiveKernel, late_collectives
from layerscope.cli import main


def kernel(
    start: float, end: float, step: int | None = 1, name: str = "ncclKernel_AllReduce"
) -> CollectiveKernel:
    return CollectiveKernel(name, start, end, step)


def test_the_rank_that_starts_last_is_late() -> None:
    """Three collectives end together on both ranks; rank 1 joins the second one 400 µs late. Rank
    0's trace starts earlier (an extra kernel no other rank has): matching is by end, not order."""
    send = "ncclKernel_SendRecv"
    rank0 = [kernel(0, 90), kernel(100, 200), kernel(300, 900, 2, send), kernel(1000, 1100, 2)]
    rank1 = [kernel(110, 200), kernel(700, 900, 2, send), kernel(1010, 1100, 2)]
    late = late_collectives([0, 1], [rank0, rank1])
    assert late is not None
    assert (late.rank, late.matched) == (1, 3)
    assert late.late_us == pytest.approx(10 + 400 + 10)
    assert (late.worst_us, late.worst_name, late.worst_step) == (400, send, 2)


def test_a_kernel_joins_one_collective_at_most() -> None:
    """Rank 1's one kernel ends near both of rank 0's: it is one collective, counted once."""
    late = late_collectives([0, 1], [[kernel(0, 100), kernel(100, 140)], [kernel(60, 120)]])
    assert late is not None and late.matched == 1 and late.late_us == pytest.approx(60)


def test_collectives_between_any_ranks_are_found() -> None:
    """Ranks 1 and 2 exchange; rank 0, with the most kernels, takes no part."""
    rank0 = [kernel(0, 10), kernel(20, 30), kernel(40, 50)]
    late = late_collectives([0, 1, 2], [rank0, [kernel(1000, 2000)], [kernel(1500, 2000)]])
    assert late is not None and (late.rank, late.late_us) == (2, 500)


def test_nothing_late_or_nothing_matched_names_no_rank() -> None:
    assert late_collectives([0, 1], [[kernel(0, 10)], []]) is None
    assert late_collectives([0, 1], [[kernel(0, 10)], [kernel(0, 5000)]]) is None  # ends 4990 µs apart
    assert late_collectives([0, 1], [[kernel(0, 10)], [kernel(0, 10)]]) is None  # in step
    other = kernel(5, 10, name="ncclKernel_Broadcast")
    assert late_collectives([0, 1], [[kernel(0, 10)], [other]]) is None  # not the same collective


def test_merge_two_ranks_counts_communication_kernels(real_traces: Path, tmp_path: Path) -> None:
    merged = ls.merge(real_traces / "two_ranks")
    by_rank = {s.rank: s for s in merged.summaries}
    assert {s.comm_source for s in merged.summaries} == {"kernels"}
    for rank in (0, 1):
        device = ls.load(real_traces / f"two_ranks/rank-{rank}.json.gz").meta.device
        assert device is not None
        steps = len(device.steps)
        assert by_rank[rank].communication_us == pytest.approx(device.by_kind["communication"] / steps)
        assert by_rank[rank].comm_overlap == pytest.approx(device.comm_compute_overlap)
    straggler = merged.straggler
    assert straggler is not None and straggler.late is not None
    assert straggler.module is not None and "nccl" not in straggler.module  # waiting is no work
    assert (straggler.late.rank, straggler.late.worst_step) == (1, 552)
    assert straggler.late.worst_name.startswith("ncclKernel_SendRecv")
    out = tmp_path / "merge.json"
    assert main(["merge", str(real_traces / "two_ranks"), "-o", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["straggler"]["late_collectives"]["rank"] == 1
    assert saved["summaries"][0]["communication_source"] == "kernels"
    page = tmp_path / "ranks.html"
    assert main(["merge", str(real_traces / "two_ranks"), "-o", str(page)]) == 0
    text = page.read_text()
    assert "Late to collectives: rank 1" in text and "<th>Comm kernels</th>" in text
    assert text.count("% overlapped)") == 2


def test_one_unit_for_communication_across_ranks(real_traces: Path) -> None:
    """A rank without a device report (a profile saved before reports were kept) puts every rank
    back on CPU time in collective ops: no table mixes kernel time with waiting time."""
    profiles = [ls.load(real_traces / f"two_ranks/rank-{rank}.json.gz") for rank in (0, 1)]
    profiles[1] = replace(profiles[1], meta=replace(profiles[1].meta, device=None))
    merged = ls.merge(profiles)
    assert {s.comm_source for s in merged.summaries} == {"ops"}
    assert all(s.comm_overlap is None for s in merged.summaries)
