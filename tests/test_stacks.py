"""Python call stacks (with_stack): ops by source location, stack flame graphs, torch-written traces."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import layerscope as ls
from layerscope.attribution.stacks import frame_label, is_internal_frame, user_frames
from layerscope.cli import main
from layerscope.errors import UsageError
from layerscope.model.serialize import profile_to_dict
from layerscope.render.exports import collapsed_stacks
from tests.fixtures.stack_models import ConvTwoSites, TwoCallSites

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TRACE = FIXTURES / "stack_trace.json.gz"


def line_of(function: object) -> int:
    return inspect.getsourcelines(function)[1]  # type: ignore[arg-type]


def frame_of(function: object, name: str) -> str:
    """How torch's tracer spells a function's frame: file relative to its sys.path root, def line."""
    return f"stack_models.py({line_of(function)}): {name}"


@pytest.fixture(scope="module")
def two_sites() -> ls.Profile:
    model = TwoCallSites()
    x = torch.randn(8, 8, requires_grad=True)
    with ls.profile(model, with_stack=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
    p = prof.profile
    p.validate()
    return p


def test_the_same_op_from_two_lines_is_two_rows(two_sites: ls.Profile) -> None:
    rows = [r for r in two_sites.ops(group_by=("name", "stack"), phase="forward") if r.name == "aten::mm"]
    assert len(rows) == 2
    innermost = sorted(r.stack[0] for r in rows)
    # the exact lines of the fixture file (left is defined on line 21, right on line 24)
    assert line_of(TwoCallSites.left) == 21 and line_of(TwoCallSites.right) == 24
    assert innermost[0].endswith("stack_models.py(21): left")
    assert innermost[1].endswith("stack_models.py(24): right")
    assert all(r.calls == 2 for r in rows)  # two steps, one call per site each
    assert all(r.stack[1].endswith(frame_of(TwoCallSites.forward, "forward")) for r in rows)
    # grouping keeps totals: the two rows add up to the one by name
    by_name = next(r for r in two_sites.ops(group_by=("name",), phase="forward") if r.name == "aten::mm")
    assert sum(r.calls for r in rows) == by_name.calls
    assert sum(r.metrics.self_cpu_us for r in rows) == pytest.approx(by_name.metrics.self_cpu_us)
    assert sum(r.metrics.flops for r in rows) == by_name.metrics.flops == 2 * 2 * (2 * 8 * 8 * 8)


def test_stack_depth_and_internal_frames(two_sites: ls.Profile) -> None:
    one = [
        r
        for r in two_sites.ops(group_by=("name", "stack"), stack_depth=1, phase="forward")
        if r.name == "aten::mm"
    ]
    assert sorted(len(r.stack) for r in one) == [1, 1]
    deep = [
        r
        for r in two_sites.ops(group_by=("name", "stack"), stack_depth=None, phase="forward")
        if r.name == "aten::mm"
    ]
    assert all(len(r.stack) >= 3 for r in deep)  # left/right, forward, the test function...
    assert not any(is_internal_frame(f) for r in deep for f in r.stack)
    everything = [
        r
        for r in two_sites.ops(
            group_by=("name", "stack"), stack_depth=None, internal_frames=True, phase="forward"
        )
        if r.name == "aten::mm"
    ]
    frames = {f for r in everything for f in r.stack}
    assert "<built-in method mm of type object>" in frames  # addresses removed
    assert any(f.startswith("torch/nn/modules/module.py(") for f in frames)
    assert any(f.startswith("layerscope/") for f in frames)
    with pytest.raises(UsageError, match="stack_depth"):
        two_sites.ops(group_by=("name", "stack"), stack_depth=0)


def test_stacks_mix_with_other_keys_and_survive_saving(two_sites: ls.Profile, tmp_path: Path) -> None:
    rows = two_sites.ops(group_by=("module", "stack"), stack_depth=2, phase="forward")
    root_stacks = {r.stack for r in rows if r.module == ""}
    assert {s[0].rsplit("stack_models.py", 1)[-1] for s in root_stacks if s} >= {"(21): left", "(24): right"}
    assert sum(r.calls for r in rows) == sum(r.calls for r in two_sites.ops(phase="forward"))
    saved = ls.load(two_sites.save(tmp_path / "p.json.gz"))
    assert [r.stack for r in saved.op_rows] == [r.stack for r in two_sites.op_rows]
    assert any(r.stack for r in saved.op_rows)
    saved.validate()


def test_without_with_stack_rows_have_no_stack() -> None:
    model = TwoCallSites()
    with ls.profile(model) as prof:
        model(torch.randn(4, 4))
    p = prof.profile
    assert not any(r.stack for r in p.op_rows)
    assert "stacks" not in profile_to_dict(p)
    rows = p.ops(group_by=("name", "stack"))
    assert {r.name for r in rows} == {r.name for r in p.ops()}


def test_collapsed_source_stacks_carry_the_frames(two_sites: ls.Profile) -> None:
    text = collapsed_stacks(two_sites, frames_of="source")
    mm = [line for line in text.splitlines() if line.split(" ")[0].endswith("aten::mm")]
    lines = [line for line in mm if not line.startswith("[backward];")]
    assert len(lines) == 2 and len(mm) == 3  # the backward's mm sits under [backward]
    for line in lines:
        frames = line.rsplit(" ", 1)[0].split(";")
        assert frames[-1] == "aten::mm"
        assert frames[-2].endswith(("stack_models.py(21):_left", "stack_models.py(24):_right"))
        assert frames[-3].endswith("stack_models.py(18):_forward")
    total = sum(int(line.rsplit(" ", 1)[1]) for line in text.splitlines())
    ops_self = sum(r.metrics.self_cpu_us for r in two_sites.op_rows)
    assert abs(total - ops_self) <= len(text.splitlines())  # each line rounds to whole µs


def test_frame_helpers() -> None:
    assert (
        frame_label("<built-in method t of Tensor object at 0x7f00aa>")
        == "<built-in method t of Tensor object>"
    )
    assert is_internal_frame("torch/nn/modules/module.py(1782): _call_impl")
    assert is_internal_frame("/usr/lib/python3/site-packages/torch/nn/functional.py(10): linear")
    assert is_internal_frame("nn.Module: Linear_0")
    assert not is_internal_frame("train.py(12): step")
    assert not is_internal_frame("/home/me/torchy/train.py(12): step")
    stack = ("<built-in method mm>", "a.py(3): f", "torch/x.py(1): g", "b.py(9): main")
    assert user_frames(stack) == ("a.py(3): f", "b.py(9): main")
    assert user_frames(stack, depth=1) == ("a.py(3): f",)
    assert user_frames(stack, internal_frames=True, depth=2) == stack[:2]


def test_a_torch_written_trace_groups_convs_by_call_site() -> None:
    """tests/fixtures/stack_trace.json.gz comes from make_stack_trace.py (plain torch.profiler)."""
    assert line_of(ConvTwoSites.stem) == 39 and line_of(ConvTwoSites.head) == 42
    p = ls.load(TRACE)
    p.validate()
    convs = [r for r in p.ops(group_by=("name", "stack"), stack_depth=1) if r.name == "aten::conv2d"]
    assert sorted(r.stack for r in convs) == [
        ("tests/fixtures/stack_models.py(39): stem",),
        ("tests/fixtures/stack_models.py(42): head",),
    ]
    assert all(r.calls == 2 for r in convs)  # two steps


def test_cli_show_analyze_report_on_a_torch_stack_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", str(TRACE), "--group-by", "stack", "--stack-depth", "2", "--top", "40"]) == 0
    out = capsys.readouterr().out
    assert "Source location" in out
    assert "tests/fixtures/stack_models.py(42): head" in out
    assert "tests/fixtures/stack_models.py(39): stem" in out
    saved = tmp_path / "run.json"
    assert main(["analyze", str(TRACE), "-o", str(saved)]) == 0
    assert any(r.stack for r in ls.load(saved).op_rows)
    collapsed = tmp_path / "src.collapsed"
    assert main(["report", str(saved), "-o", str(collapsed), "--frames", "source"]) == 0
    text = collapsed.read_text()
    assert "stack_models.py(39):_stem;aten::conv2d" in text
    assert "stack_models.py(42):_head;aten::conv2d" in text
    svg = tmp_path / "src.svg"
    assert main(["report", str(TRACE), "-o", str(svg), "--frames", "source"]) == 0
    assert "stack_models.py(42): head" in svg.read_text()


def test_source_frames_without_stacks_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = TwoCallSites()
    with ls.profile(model) as prof:
        model(torch.randn(4, 4))
    saved = prof.profile.save(tmp_path / "p.json")
    assert main(["report", str(saved), "-o", str(tmp_path / "x.collapsed"), "--frames", "source"]) == 2
    assert "--with-stack" in capsys.readouterr().err
    assert not (tmp_path / "x.collapsed").exists()


def test_with_stack_while_another_python_thread_runs() -> None:
    """torch reports thread id 2**64-1 for frames of threads running before the profile started;
    that crashed the build (int64 overflow) before thread ids were read as signed."""
    import threading
    import time

    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(range(100))
            time.sleep(0.0005)

    worker = threading.Thread(target=busy, daemon=True)
    worker.start()
    try:
        model = TwoCallSites()
        with ls.profile(model, with_stack=True) as prof:
            model(torch.randn(8, 8))
        p = prof.profile
    finally:
        stop.set()
        worker.join()
    p.validate()
    assert p.root.calls == 1
    assert any(r.stack for r in p.op_rows)
