"""One notion of a step (``events/steps.py``) and one owner of event names (``events/names.py``)."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

from layerscope.analysis.device import device_report
from layerscope.attribution import build_profile
from layerscope.events import EventKind, EventTable
from layerscope.events import names as event_names
from layerscope.events.steps import StepWindow, step_name_ids, step_windows
from layerscope.loading import analyze

US = 1000
GPU = Path(__file__).parent / "fixtures" / "gpu"
PACKAGE = Path(__file__).resolve().parents[1] / "src" / "layerscope"


def _spans(table: EventTable, *spans: tuple[str, int, int]) -> EventTable:
    for name, start_us, dur_us in spans:
        table.add_span(name, EventKind.USER_ANNOTATION, 1, start_us * US, dur_us * US)
    return table


def _windows(table: EventTable) -> list[tuple[int, int, int]]:
    return [(w.number, w.start // US, w.end // US) for w in step_windows(table)]


# ---- names ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "number"),
    [
        ("ProfilerStep#12", 12),
        ("ProfilerStep#x", event_names.UNKNOWN_STEP),
        ("step 3", 3),
        ("Step#4", 4),
        ("step_5", 5),
        ("STEP6", 6),
        ("step 3 of 5", None),
        ("train step 3", None),
        ("stepper 3", None),
        ("step", None),
        ("## step 3 ##", None),
        ("aten::add", None),
    ],
)
def test_is_step_range(name: str, number: int | None) -> None:
    assert event_names.is_step_range(name) == number


def test_name_helpers_round_trip() -> None:
    assert event_names.parse_module_range(event_names.module_range_name("a.b", "Linear")) == ("a.b", "Linear")
    assert event_names.parse_module_range("ls:nocolon") is None
    assert event_names.nn_module_event_label("nn.Module: Linear_0 ") == "Linear_0"
    assert event_names.backward_node_name(f"{event_names.BACKWARD_NODE_PREFIX}MmBackward0") == "MmBackward0"
    assert event_names.backward_node_name("aten::mm") is None
    assert event_names.is_compiling_range("dynamo") and event_names.is_compiling_range("x (dynamo_timed)")
    assert event_names.is_compiled_graph_call("## Call CompiledFxGraph fabc ##")


def test_step_name_ids_by_kind() -> None:
    names = ["step 1", "ProfilerStep#7", "aten::mm", "Step#2"]
    assert step_name_ids(names) == ({1: 7}, {0: 1, 3: 2})
    assert step_name_ids(["aten::mm"]) == ({}, {})


# ---- step_windows -----------------------------------------------------------------------------------


def test_torch_steps_in_time_order_cpu_side_only() -> None:
    t = _spans(EventTable(), ("ProfilerStep#2", 100, 40), ("ProfilerStep#1", 0, 90))
    # Kineto's copy of a step on the GPU timeline is no step of its own
    t.add_span("ProfilerStep#1", EventKind.DEVICE_OTHER, 2, 5 * US, 50 * US)
    assert _windows(t) == [(1, 0, 90), (2, 100, 140)]  # the gap between them is no step's
    (first, _) = step_windows(t)
    assert isinstance(first, StepWindow) and first.wall_ns == 90 * US and first.span == 1


def test_user_step_annotations_are_steps() -> None:
    t = _spans(EventTable(), ("step 0", 0, 50), ("data", 50, 10), ("step 1", 60, 50))
    assert _windows(t) == [(0, 0, 50), (1, 60, 110)]


def test_user_step_annotations_win_over_torch_steps() -> None:
    # ls.profile without a schedule: one ProfilerStep#0 around the block, the user's steps inside
    t = _spans(EventTable(), ("ProfilerStep#0", 0, 300), ("step 0", 10, 100), ("step 1", 120, 100))
    assert _windows(t) == [(0, 10, 110), (1, 120, 220)]
    # marked on the host only: a device-side copy of a user range is no step
    t = _spans(EventTable(), ("ProfilerStep#4", 0, 300))
    t.add_span("step 0", EventKind.DEVICE_OTHER, 2, 10 * US, 50 * US)
    assert _windows(t) == [(4, 0, 300)]


def test_repeated_numbers_are_numbered_in_time_order() -> None:
    epochs = [("step 0", 0, 10), ("step 1", 10, 10), ("step 0", 20, 10), ("step 1", 30, 10)]
    assert _windows(_spans(EventTable(), *epochs)) == [(0, 0, 10), (1, 10, 20), (2, 20, 30), (3, 30, 40)]


def test_nested_step_ranges_count_once() -> None:
    # the same step marked twice (a framework and the user, or two threads): the outer one holds it
    t = _spans(EventTable(), ("step 1", 0, 100), ("step 1", 0, 60), ("step 9", 20, 30), ("step 2", 100, 50))
    t.add_span("step 2", EventKind.USER_ANNOTATION, 2, 100 * US, 50 * US)  # same window, other thread
    assert _windows(t) == [(1, 0, 100), (2, 100, 150)]


def test_overlapping_step_ranges_cut_the_earlier_window() -> None:
    t = _spans(EventTable(), ("ProfilerStep#1", 0, 100), ("ProfilerStep#2", 80, 100))
    assert _windows(t) == [(1, 0, 80), (2, 80, 180)]


def test_no_steps() -> None:
    assert step_windows(EventTable()) == []
    assert step_windows(_spans(EventTable(), ("forward", 0, 10), ("stepper 1", 0, 5))) == []


# ---- the three users agree --------------------------------------------------------------------------


def _user_step_table() -> EventTable:
    """Two user-annotated steps, each an op launching a kernel and allocating; data loading between."""
    t = EventTable()
    t.threads = {1: (100, 100), 2: (0, 7)}
    for step in range(2):
        base = step * 200 * US
        t.add_span(f"step {step}", EventKind.USER_ANNOTATION, 1, base, 150 * US)
        t.add_span("aten::mm", EventKind.CPU_OP, 1, base + 10 * US, 100 * US, ext=step + 1)
        t.add_span("cudaLaunchKernel", EventKind.RUNTIME, 1, base + 20 * US, 5 * US, corr=10 + step)
        t.add_span("gemm", EventKind.KERNEL, 2, base + 30 * US, 60 * US, corr=10 + step, ext=step + 1)
        t.add_span("enumerate(DataLoader)#_next", EventKind.CPU_OP, 1, base + 160 * US, 30 * US)
        t.add_memory(1, base + 15 * US, 1000 * (step + 1), on_device=True, addr=step + 1)
    return t


def test_user_steps_end_to_end() -> None:
    t = _user_step_table()
    p = build_profile(t, None)
    p.validate()
    assert [(s.step, s.wall_us, s.device_us) for s in p.steps] == [(0, 150, 60), (1, 150, 60)]
    assert not any(event_names.is_step_range(r.name) is not None for r in p.op_rows)
    memory_steps = p.meta.memory.classes[0].steps
    assert [row.step for row in memory_steps] == [0, 1]
    assert [s.absolute_peak_bytes for s in p.steps] == [1000, 3000]
    report = device_report(t)
    assert report is not None
    assert [(v.step, v.wall_us, v.device_busy_us) for v in report.steps] == [(0, 150, 60), (1, 150, 60)]


def test_user_steps_in_a_live_capture() -> None:
    """ls.profile without a schedule opens one ProfilerStep#0 around the block: the user's steps win."""
    import torch

    import layerscope as ls
    from tests.fixtures.models import TinyMLP

    model = TinyMLP()
    with ls.profile(model) as prof:
        for i in range(3):
            with torch.profiler.record_function(f"step {i}"):
                model(torch.randn(4, 8)).sum().backward()
    p = prof.profile
    p.validate()
    assert [s.step for s in p.steps] == [0, 1, 2]
    assert all(s.modules["fc1"][0] > 0 and s.modules["fc1"][1] > 0 for s in p.steps)
    assert not any(event_names.is_step_range(r.name) is not None for r in p.op_rows)


@pytest.mark.parametrize("name", ["host_bound", "memory_block"])
def test_step_table_memory_and_verdicts_share_windows(name: str) -> None:
    found = analyze(GPU / f"{name}.json.gz")
    assert found.device is not None
    steps = found.profile.steps
    assert steps and [v.step for v in found.device.steps] == [s.step for s in steps]
    for step, verdict in zip(steps, found.device.steps, strict=True):
        assert verdict.wall_us == pytest.approx(step.wall_us, abs=1e-3)
    memory = found.profile.meta.memory
    if memory is not None:
        for figures in memory.classes:
            assert [s.step for s in figures.steps] == [s.step for s in steps]


# ---- one owner ---------------------------------------------------------------------------------------

#: Conventions only events/names.py may spell (docstrings and comments may name them).
OWNED = (
    "ProfilerStep#",
    "autograd::engine::evaluate_function",
    "## Call CompiledFxGraph",
    "nn.Module: ",
    "[OutOfMemory]",
    "enumerate(DataLoader)",
    "Optimizer.step#",
)
#: (file, literal): why it may stay.
ALLOWED = {
    ("model/profile.py", "ProfilerStep#"): "the deprecated STEP_PREFIX: the data model sits below events",
}


def _literals(tree: ast.Module) -> list[str]:
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_file_but_names_spells_an_event_name_convention() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "events/names.py":
            continue
        for literal in _literals(ast.parse(path.read_text())):
            found += [(rel, c) for c in OWNED if c in literal and (rel, c) not in ALLOWED]
    assert found == []


def test_module_range_prefix_is_not_spelled_elsewhere() -> None:
    # "ls:" is short: look for it only as a whole literal or a literal's start
    found = [
        path.relative_to(PACKAGE).as_posix()
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "names.py"
        and any(s.startswith("ls:") for s in _literals(ast.parse(path.read_text())))
    ]
    assert found == []


def test_the_deprecated_step_prefix_still_works() -> None:
    from layerscope.model import profile

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = profile.STEP_PREFIX
    assert value == event_names.PROFILER_STEP_PREFIX
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    with pytest.raises(AttributeError):
        profile.NOT_A_NAME  # noqa: B018


def test_buckets_and_compiled_import_one_way() -> None:
    buckets = ast.parse((PACKAGE / "attribution" / "buckets.py").read_text())
    imported = {n.module for n in ast.walk(buckets) if isinstance(n, ast.ImportFrom)}
    assert "layerscope.attribution.compiled" not in imported
