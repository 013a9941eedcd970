"""Property tests: any well-nested trace builds a profile whose numbers add up."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import layerscope as ls
from layerscope.analysis.ops import GROUP_KEYS, op_table
from layerscope.attribution import build_profile, module_range_name
from layerscope.events import EventKind, EventTable
from layerscope.model.meta import ProfileMeta
from layerscope.model.metrics import ADDITIVE_PAIRS

NAMES = [
    module_range_name("", "Net"),
    module_range_name("a", "Block"),
    module_range_name("a.x", "Linear"),
    module_range_name("b", "ReLU"),
    "aten::mm",
    "aten::add",
    "ProfilerStep#1",
    "autograd::engine::evaluate_function: MmBackward0",
    "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
]


@dataclass
class Node:
    name: str
    gap: int
    length: int
    children: list[Node] = field(default_factory=list)


nodes = st.recursive(
    st.builds(Node, st.sampled_from(NAMES), st.integers(0, 5), st.integers(0, 20)),
    lambda kids: st.builds(
        Node, st.sampled_from(NAMES), st.integers(0, 5), st.integers(0, 20), st.lists(kids, max_size=4)
    ),
    max_leaves=25,
)


def lay_out(table: EventTable, node: Node, tid: int, start: int, seq: list[int], ext: list[int]) -> int:
    """Place ``node`` at ``start`` (ns); children inside it; returns its end."""
    cursor = start + node.gap
    child_spans: list[tuple[Node, int]] = []
    for child in node.children:
        child_start = cursor
        cursor = lay_out(table, child, tid, child_start, seq, ext) + 1
        child_spans.append((child, child_start))
    end = cursor + node.length
    is_backward = node.name.startswith("autograd::engine::evaluate_function: Mm")
    sequence = seq[0] if is_backward and seq else -1
    if node.name == "aten::mm":
        seq.append(len(seq) + 1)
        sequence = seq[-1]
    ext.append(len(ext) + 1)
    table.add_span(
        node.name,
        EventKind.CPU_OP,
        tid,
        start,
        end - start,
        seq=sequence,
        fwd_tid=tid if is_backward else 0,
        ext=ext[-1],
        flops=7 if node.name == "aten::mm" else 0,
        shapes="[[2, 2]]" if node.name.startswith("aten") else None,
    )
    return end


@st.composite
def tables(draw: st.DrawFn) -> EventTable:
    table = EventTable()
    seq: list[int] = []
    ext: list[int] = []
    for tid in (1, 2):
        cursor = 0
        for root in draw(st.lists(nodes, min_size=0, max_size=3)):
            cursor = lay_out(table, root, tid, cursor, seq, ext) + draw(st.integers(1, 10))
    end = max([ts + d for ts, d in zip(table.span_ts, table.span_dur, strict=True)] + [1])
    for _ in range(draw(st.integers(0, 12))):
        table.add_memory(
            draw(st.sampled_from([1, 2, 3])),
            draw(st.integers(0, end)),
            draw(st.integers(-512, 512)),
            on_device=draw(st.booleans()),
        )
    for _ in range(draw(st.integers(0, 5))):
        table.add_span(
            "kernel",
            EventKind.KERNEL,
            50,
            draw(st.integers(0, end)),
            draw(st.integers(0, 9)),
            ext=draw(st.integers(0, len(ext) + 2)),
        )
    return table


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(tables())
def test_any_nested_trace_validates(table: EventTable) -> None:
    profile = build_profile(table, None)
    profile.validate()
    assert (
        profile.totals.device_us
        == sum(d for d, k in zip(table.span_dur, table.span_kind, strict=True) if k == EventKind.KERNEL)
        / 1000
    )


@SETTINGS
@given(tables(), st.lists(st.sampled_from(GROUP_KEYS), min_size=1, max_size=4, unique=True))
def test_grouping_keeps_totals(table: EventTable, group_by: list[str]) -> None:
    profile = build_profile(table, None)
    grouped = op_table(profile, group_by=group_by)
    for _, total in ADDITIVE_PAIRS:
        expected = sum(getattr(r.metrics, total) for r in profile.op_rows)
        got = sum(getattr(r.metrics, total) for r in grouped)
        assert abs(got - expected) <= 1e-6 * max(1.0, abs(expected))
    assert sum(r.calls for r in grouped) == sum(r.calls for r in profile.op_rows)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tables(), st.sampled_from(["p.json", "p.json.gz"]))
def test_save_load_round_trip(tmp_path: Path, table: EventTable, name: str) -> None:
    profile = build_profile(table, None, ProfileMeta(extra={"note": "round trip"}))
    path = profile.save(tmp_path / name)
    assert ls.load(path) == profile


def test_a_zero_length_module_rerun_in_backward_validates() -> None:
    """Found by hypothesis: a module range of zero length that starts where a backward node does
    counts as recomputed, with no backward time; zero time is right there (validate used to refuse
    a recomputed module without backward time)."""
    table = EventTable()
    table.add_span("ls::Net", EventKind.CPU_OP, 2, 0, 0, ext=1)
    table.add_span(
        "autograd::engine::evaluate_function: MmBackward0", EventKind.CPU_OP, 2, 0, 1, fwd_tid=2, ext=2
    )
    profile = build_profile(table, None)
    profile.validate()
    assert profile.root.forward.cpu_us == 0
    # also when the module's other calls take time (the second case hypothesis found)
    busy = EventTable()
    for tid, ts, dur in ((1, 0, 0), (1, 1, 1), (2, 0, 0), (2, 1, 0)):
        busy.add_span("ls::Net", EventKind.CPU_OP, tid, ts, dur, ext=len(busy.span_ts) + 1)
    busy.add_span(
        "autograd::engine::evaluate_function: MmBackward0", EventKind.CPU_OP, 2, 1, 1, fwd_tid=2, ext=5
    )
    recomputed = build_profile(busy, None)
    recomputed.validate()
    assert recomputed.root.recompute_calls >= 1 and recomputed.root.forward.cpu_us > 0


def test_memory_that_is_never_live_validates() -> None:
    """Found by hypothesis: one memory event of 0 bytes and nothing else: memory over time has no
    category, and its totals are zeros (validate compared them with the peak)."""
    table = EventTable()
    table.add_memory(1, 0, 0, on_device=False)
    profile = build_profile(table, None)
    profile.validate()
    report = profile.meta.memory
    assert report is not None and report.classes[0].over_time is not None
    assert report.classes[0].over_time.totals() == [0] * len(report.classes[0].over_time.t_us)
