"""Module marks aligned with torch's events through clock anchors (``capture/clock_anchors.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import layerscope as ls
from layerscope.capture import instruments, native
from layerscope.capture.clock_anchors import ANCHOR_NAME, Anchor, Stamped, alignment
from layerscope.events.table import EventKind, EventTable
from tests.fixtures.models import TinyMLP


def test_anchors_inside_our_brackets_move_nothing() -> None:
    anchors = [Anchor(1, 1_000, 2_000), Anchor(1, 9_000, 9_800)]
    stamped = [Stamped(1, 1_300, 1_700), Stamped(1, 9_100, 9_500)]
    assert alignment(anchors, stamped) is None
    assert alignment(anchors, []) is None  # torch recorded none of them


def test_one_offset_that_fits_every_anchor_shifts_the_whole_session() -> None:
    # ours read ~1,500 ns late: torch's stamps lie before both brackets; a loose first bracket agrees
    anchors = [Anchor(1, 0, 20_000), Anchor(1, 30_000, 30_400), Anchor(1, 90_000, 90_400)]
    stamped = [Stamped(1, 9_000, 9_100), Stamped(1, 28_600, 28_700), Stamped(1, 88_500, 88_650)]
    found = alignment(anchors, stamped)
    assert found is not None
    # d fits each when 30,000 + d <= 28,600 and 28,700 <= 30,400 + d (-1,700..-1,400), and
    # -1,750..-1,500 for the third: the nearest zero of both is -1,500, everywhere in time
    shifted = found.apply(np.array([0, 30_200, 60_000, 200_000], dtype=np.int64))
    assert shifted.tolist() == [-1_500, 28_700, 58_500, 198_500]


def test_anchors_no_one_offset_fits_are_shifted_each_and_interpolated() -> None:
    # ours read 2,000 ns late at the start (torch's stamps lie before our bracket), right at the end
    anchors = [Anchor(1, 3_000, 4_000), Anchor(1, 103_000, 104_000)]
    stamped = [Stamped(1, 1_200, 1_800), Stamped(1, 103_100, 103_900), Stamped(2, 3_100, 3_200)]
    found = alignment(anchors, stamped)
    assert found is not None
    assert found.shift.tolist() == [-1_800.0, 0.0]  # before + d <= 1,200: d = -1,800; 4,000 - 1,800 >= 1,800
    shifted = found.apply(np.array([3_500, 53_500, 103_500, 200_000], dtype=np.int64))
    assert shifted.tolist() == [1_700, 53_500 - 900, 103_500, 200_000]


def test_an_anchor_on_another_thread_or_far_away_is_not_taken() -> None:
    anchors = [Anchor(1, 3_000, 4_000)]
    assert alignment(anchors, [Stamped(2, 100, 200)]) is None
    assert alignment(anchors, [Stamped(1, 10_000_000, 10_000_100)]) is None


def test_dropping_spans_keeps_every_per_span_index_in_step() -> None:
    table = EventTable()
    for k in range(5):
        table.add_span(f"op{k}", EventKind.CPU_OP, 1, 100 * k, 10)
    table.op_handles = np.arange(5, dtype=np.int64) + 10
    table.sync_waits = {1: (7, 3), 4: (8, -1)}
    table.drop_spans(np.array([0, 2]))
    table.check()
    assert [table.names[i] for i in table.span_name] == ["op1", "op3", "op4"]
    assert table.span_ts == [100, 300, 400]
    assert table.op_handles.tolist() == [11, 13, 14]
    assert table.sync_waits == {0: (7, 3), 2: (8, -1)}


needs_native = pytest.mark.skipif(native.load() is None, reason="the native module is not built")


class _ShiftedMarks:
    """The native module with our converter made to disagree with torch's by ``shift_ns``."""

    def __init__(self, module: Any, shift_ns: int) -> None:
        self._module, self._shift = module, shift_ns

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def marks_stop(self) -> list[tuple[int, int, bytes, bytes]]:
        out = []
        for tid, os_tid, times, codes in self._module.marks_stop():
            moved = np.frombuffer(times, dtype=np.int64) + self._shift
            out.append((tid, os_tid, moved.tobytes(), codes))
        return out


def _forward_flops(
    monkeypatch: pytest.MonkeyPatch, shift_ns: int, tmp_path: Path
) -> tuple[dict[str, int], Any]:
    real = native.load()
    monkeypatch.setattr(instruments.native, "load", lambda: _ShiftedMarks(real, shift_ns))
    torch.manual_seed(0)
    model, x = TinyMLP(), torch.randn(8, 8)
    model(x)
    with ls.profile(model) as prof, torch.no_grad():
        model(x)
    profile = prof.profile
    profile.validate()
    trace = json.loads(prof.export_chrome_trace(tmp_path / f"t{shift_ns}.json").read_text())
    return {node.path: node.forward.flops for node in profile.modules() if node.path}, (profile, trace)


@needs_native
@pytest.mark.parametrize("shift_ns", [0, 40_000, -40_000])
def test_marks_off_torchs_clock_still_nest_every_op(
    monkeypatch: pytest.MonkeyPatch, shift_ns: int, tmp_path: Path
) -> None:
    """Our converter 40 µs off torch's (more than any op of TinyMLP lasts from a mark): the anchors
    put the module calls back around their ops, in the tree and in the exported trace."""
    flops, (profile, trace) = _forward_flops(monkeypatch, shift_ns, tmp_path)
    torch.manual_seed(0)
    model, x = TinyMLP(), torch.randn(8, 8)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    counts = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    assert flops == {path: counts.get(f"TinyMLP.{path}", 0) for path in flops}
    assert all(flops[p] > 0 for p in ("fc1", "fc2"))
    assert ANCHOR_NAME not in {row.name for row in profile.ops()}
    names = [e.get("name") for e in trace["traceEvents"]]
    assert ANCHOR_NAME not in names
    fc2 = next(e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ls:fc2:"))
    addmm = [e for e in trace["traceEvents"] if e.get("name") == "aten::addmm" and e.get("tid") == fc2["tid"]]
    inside = [e for e in addmm if fc2["ts"] <= e["ts"] and e["ts"] + e["dur"] <= fc2["ts"] + fc2["dur"]]
    assert len(inside) == 1


@needs_native
def test_a_trace_torch_wrote_itself_loses_the_anchors_when_analysed(tmp_path: Path) -> None:
    """A block's anchors are in torch's own export (prof.torch_profiler); analyze drops them there too."""
    model, x = TinyMLP(), torch.randn(8, 8)
    with ls.profile(model) as prof:
        model(x)
    raw = tmp_path / "torch.json"
    prof.torch_profiler.export_chrome_trace(str(raw))
    assert ANCHOR_NAME in raw.read_text()
    for reader in ("1", "0"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("LAYERSCOPE_NATIVE", reader)
            analysed = ls.load(raw)
        analysed.validate()
        assert ANCHOR_NAME not in {row.name for row in analysed.ops()}
