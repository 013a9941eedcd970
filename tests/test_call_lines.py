"""Call lines (``ls.profile(lines=True)``): the line of the user's code that called each op."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.analysis.lines import NO_LINE
from layerscope.capture import call_lines, native
from layerscope.errors import LayerscopeWarning

pytestmark = pytest.mark.skipif(
    not call_lines.supported(native.load()), reason="call lines need the native module on CPython 3.11-3.13"
)


def scale(t: torch.Tensor) -> torch.Tensor:
    return t * 2.0  # LINE: helper


class TwoMatmuls(nn.Module):
    """The same op on two lines of one forward, a submodule, and a helper function."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(16, 16))
        self.w2 = nn.Parameter(torch.randn(16, 16))
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.mm(x, self.w1)  # LINE: first mm
        b = torch.mm(a.relu(), self.w2)  # LINE: second mm
        return scale(self.fc(b))  # LINE: fc


def line_of(marker: str) -> int:
    """The line number of the line of this file marked ``# LINE: marker``."""
    lines, first = inspect.getsourcelines(sys.modules[__name__])
    for k, text in enumerate(lines):
        if text.rstrip().endswith(f"# LINE: {marker}"):
            return first + k if first else k + 1
    raise AssertionError(marker)


HERE = str(Path(__file__).resolve())


@pytest.fixture(scope="module")
def trained() -> ls.Profile:
    torch.manual_seed(0)
    model, x = TwoMatmuls(), torch.randn(8, 16)
    with ls.profile(model, lines=True) as prof:
        model(x).sum().backward()  # LINE: step
    profile = prof.profile
    profile.validate()
    return profile


def rows_by_line(profile: ls.Profile) -> dict[int | None, object]:
    return {r.line: r for r in profile.lines() if r.file in (HERE, NO_LINE)}


def test_each_call_line_is_its_own_row_forward_and_backward(trained: ls.Profile) -> None:
    rows = rows_by_line(trained)
    first, second, fc, helper = (line_of(m) for m in ("first mm", "second mm", "fc", "helper"))
    mm_flops = 2 * 8 * 16 * 16
    # forward: one mm on each line; backward: dW1 only on the first (x needs no gradient), dA and dW2
    # on the second.
    assert rows[first].forward.self_flops == mm_flops
    assert rows[first].backward.self_flops == mm_flops
    assert rows[second].forward.self_flops == mm_flops
    assert rows[second].backward.self_flops == 2 * mm_flops
    assert rows[fc].forward.self_flops == mm_flops  # the Linear's addmm ran under the fc line
    assert rows[fc].backward.self_flops == 2 * mm_flops
    assert rows[fc].modules[0] == "fc"
    assert rows[first].modules == ("",)  # the root module's own code
    assert rows[helper].function == "scale" and rows[helper].forward.self_cpu_us > 0
    assert rows[line_of("step")].function == "trained"  # sum, backward seed, gradient accumulation
    for line in (first, second, fc):
        assert rows[line].backward.self_cpu_us > 0, line


def test_line_totals_equal_the_op_table_and_the_tree(trained: ls.Profile) -> None:
    lines = trained.lines()
    assert sum(r.flops for r in lines) == trained.totals.flops
    op_cpu = sum(r.metrics.self_cpu_us for r in trained.op_rows)
    assert sum(r.cpu_us for r in lines) == pytest.approx(op_cpu)
    assert trained.meta.call_lines.ops > 0


def test_ops_grouped_by_stack_use_call_lines(trained: ls.Profile) -> None:
    rows = trained.ops(group_by=("name", "stack"), stack_depth=1, phase="forward")
    mm_lines = sorted(r.stack[0] for r in rows if r.name == "aten::mm")
    assert mm_lines == sorted(
        [f"{HERE}({line_of('first mm')}): forward", f"{HERE}({line_of('second mm')}): forward"]
    )


def test_exported_traces_carry_call_lines(tmp_path: Path) -> None:
    """An exported Chrome trace saves the lines in its layerscope header; `analyze`/`ls.load` match
    them to ops again by "Record function id": the same rows as the live profile."""
    torch.manual_seed(0)
    model, x = TwoMatmuls(), torch.randn(8, 16)
    with ls.profile(model, lines=True) as prof:
        model(x).sum().backward()
    trace = prof.export_chrome_trace(tmp_path / "run.json")
    loaded = ls.load(trace)
    loaded.validate()

    def figures(profile: ls.Profile) -> list[tuple[object, ...]]:
        rows = profile.lines()
        return sorted((r.location, r.forward.self_flops, r.backward.self_flops, r.calls) for r in rows)

    assert figures(loaded) == figures(prof.profile)
    assert loaded.meta.call_lines == prof.profile.meta.call_lines is not None
    assert rows_by_line(loaded)[line_of("second mm")].backward.self_flops == 2 * (2 * 8 * 16 * 16)

    assert "call_lines" not in loaded.meta.trace.other.get("layerscope", {})  # not copied into the meta

    # A damaged header, or one whose ops are not in the trace, loses the lines, not the trace; a
    # malformed id loses that op's line, not the event.
    original = json.loads(trace.read_text())
    saved = original["layerscope"]["call_lines"]
    ids = [
        e["args"].get("Record function id", 0) for e in original["traceEvents"] if e.get("cat") == "cpu_op"
    ]
    for name, change in {
        "stack_ids": lambda data: data["layerscope"]["call_lines"].update(
            stack_ids=[10**6] * len(saved["handles"])
        ),
        "stacks": lambda data: data["layerscope"]["call_lines"].update(
            stacks=["a string"] * len(saved["stacks"])
        ),
        "foreign": lambda data: data["layerscope"]["call_lines"].update(
            handles=[max(ids) + 1 + k for k in saved["handles"]]
        ),
    }.items():
        data = json.loads(trace.read_text())
        change(data)
        damaged = tmp_path / f"{name}.json"
        damaged.write_text(json.dumps(data))
        without = ls.load(damaged, strict=True)
        without.validate()
        assert without.meta.call_lines is None, name
        assert without.totals.flops == loaded.totals.flops
    data = json.loads(trace.read_text())
    for event in data["traceEvents"]:
        if event.get("cat") == "cpu_op" and event["args"].get("Record function id") == saved["handles"][0]:
            event["args"]["Record function id"] = "not a number"
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(data))
    partly = ls.load(odd, strict=True)
    partly.validate()
    assert partly.meta.call_lines is not None and not partly.meta.trace.malformed_events
    assert partly.totals.flops == loaded.totals.flops


def test_each_cycle_trace_carries_its_own_lines(tmp_path: Path) -> None:
    model, x = TwoMatmuls(), torch.randn(8, 16)
    exported: list[tuple[Path, list[tuple[object, ...]]]] = []

    def keep(cycle: ls.Cycle) -> None:
        path = cycle.export_chrome_trace(tmp_path / f"cycle{cycle.index}.json")
        exported.append((path, sorted((r.location, r.calls, r.flops) for r in cycle.profile.lines())))

    cycles = ls.schedule(wait=1, warmup=1, active=1, repeat=2)
    with ls.profile(model, lines=True, schedule=cycles, on_trace_ready=keep) as prof:
        for _ in range(6):
            model(x).sum().backward()
            prof.step()
    assert len(exported) == 2
    for path, live in exported:
        loaded = ls.load(path)
        loaded.validate()
        assert sorted((r.location, r.calls, r.flops) for r in loaded.lines()) == live
        assert len(json.loads(path.read_text())["layerscope"]["call_lines"]["handles"]) < 100  # one step's


def test_lines_survive_save_and_load(trained: ls.Profile, tmp_path: Path) -> None:
    loaded = ls.load(trained.save(tmp_path / "p.json"))
    assert [(r.location, r.flops) for r in loaded.lines()] == [(r.location, r.flops) for r in trained.lines()]
    frame = loaded.to_pandas("lines")
    assert set(frame["line"].dropna().astype(int)) >= {line_of("first mm"), line_of("second mm")}


def test_outputs_and_rng_unchanged_and_callback_removed_on_error() -> None:
    torch.manual_seed(1)
    model, x = TwoMatmuls(), torch.randn(8, 16)
    expected = model(x)
    state = torch.get_rng_state()
    with ls.profile(model, lines=True):
        got = model(x)
    assert torch.equal(got, expected) and torch.equal(torch.get_rng_state(), state)
    with pytest.raises(RuntimeError, match="boom"), ls.profile(model, lines=True):
        model(x)
        raise RuntimeError("boom")
    # A callback left behind would make the next start fail ("already being recorded").
    with ls.profile(model, lines=True) as prof:
        model(x)
    assert prof.profile.meta.call_lines.ops > 0


def test_threads_and_no_grad() -> None:
    model, x = TwoMatmuls(), torch.randn(8, 16)

    def worker() -> None:
        with torch.no_grad():
            model(x)  # LINE: thread

    with ls.profile(model, lines=True) as prof:
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    rows = rows_by_line(prof.profile)
    assert rows[line_of("first mm")].forward.self_flops == 2 * 8 * 16 * 16
    assert rows[line_of("first mm")].backward.self_cpu_us == 0  # no_grad: no backward
    stacks = {r.stack for r in prof.profile.ops(group_by="stack", stack_depth=None)}
    assert any(f"{HERE}({line_of('thread')}): worker" in s for s in stacks)


@torch.jit.script
def _scripted(x: torch.Tensor) -> torch.Tensor:
    return torch.mm(x, x)


@torch.jit.script
def _parallel(x: torch.Tensor) -> torch.Tensor:
    first = torch.jit.fork(_scripted, x)
    second = torch.jit.fork(_scripted, x)
    return torch.jit.wait(first) + torch.jit.wait(second)


def test_ops_without_a_python_frame_get_the_no_line_row() -> None:
    """Forked TorchScript runs its ops on the inter-op pool's C++ threads, where no Python frame is:
    they land in the no-line row, never under a wrong line. What the scripted function runs on the
    caller's thread gets the calling line; after `wait` it resumes on the caller's thread or, when a
    fork had not finished, on the pool's (both happen), so only the forked matmuls are certain."""
    x = torch.randn(64, 64)
    _parallel(x)  # compiled once before the block
    with ls.profile(nn.Identity(), lines=True) as prof:
        _parallel(x)  # LINE: scripted
    mm = [r for r in prof.profile.op_rows if r.name == "aten::mm"]
    assert sum(r.calls for r in mm) == 2
    assert all(not r.stack for r in mm)
    rows = {r.line: r for r in prof.profile.lines()}
    assert rows[None].location == NO_LINE and rows[None].calls >= 2
    assert rows[None].forward.self_flops == 2 * (2 * 64**3)  # both forked matmuls
    if line_of("scripted") in rows:  # the addition, when it ran on the caller's thread
        assert rows[line_of("scripted")].forward.self_flops == 0


def test_lines_without_the_native_module_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "load", lambda: None)
    model, x = TwoMatmuls(), torch.randn(8, 16)
    expected = pytest.warns(LayerscopeWarning, match="call lines are not recorded")
    with expected, ls.profile(model, lines=True) as prof:
        model(x)
    assert prof.profile.meta.call_lines is None


def test_show_by_line_cli(trained: ls.Profile, tmp_path: Path) -> None:
    saved = trained.save(tmp_path / "p.json")
    done = subprocess.run(
        [sys.executable, "-m", "layerscope", "show", str(saved), "--by", "line", "--ascii"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Source call lines" in done.stdout
    assert f"test_call_lines.py:{line_of('first mm')} " in done.stdout


def test_each_scheduled_cycle_gets_its_own_lines() -> None:
    model, x = TwoMatmuls(), torch.randn(8, 16)
    cycles: list[ls.Profile] = []
    schedule = ls.schedule(wait=1, warmup=0, active=1, repeat=2)
    with ls.profile(
        model, lines=True, schedule=schedule, on_trace_ready=lambda c: cycles.append(c.profile)
    ) as prof:
        for _ in range(4):
            model(x).sum().backward()
            prof.step()
    assert len(cycles) == 2
    for profile in cycles:
        profile.validate()
        rows = rows_by_line(profile)
        assert rows[line_of("first mm")].forward.self_flops == 2 * 8 * 16 * 16  # one step's
        assert profile.meta.call_lines.ops > 0


def test_compiled_code_keeps_its_graph_and_gets_the_calling_line() -> None:
    """The callback is invisible to Dynamo: no graph break, no recompile; ops inside compiled code
    get the line that called the compiled model."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # global: graph breaks counted by earlier tests (integrations) stay in it
    model, x = TwoMatmuls(), torch.randn(8, 16)
    compiled = torch.compile(model, backend="eager")
    compiled(x)
    graphs = counters["stats"]["unique_graphs"]
    with ls.profile(compiled, lines=True) as prof:
        compiled(x)  # LINE: compiled call
    assert counters["stats"]["unique_graphs"] == graphs and not counters["graph_break"]
    profile = prof.profile
    profile.validate()
    mm = [r for r in profile.op_rows if r.name == "aten::mm"]
    caller = (
        f"{HERE}({line_of('compiled call')}): test_compiled_code_keeps_its_graph_and_gets_the_calling_line"
    )
    assert mm and all(r.stack[0] == caller for r in mm)


def test_source_flame_graph_uses_call_lines(trained: ls.Profile) -> None:
    from layerscope.render.exports import stack_values

    stacks = stack_values(trained, "cpu_us", frames_of="source")
    frames = {frame for stack in stacks for frame in stack}
    assert f"{HERE}({line_of('first mm')}): forward" in frames
    assert f"{HERE}({line_of('second mm')}): forward" in frames
    backward = [s for s in stacks if s[0] == "[backward]"]
    assert any(f"{HERE}({line_of('second mm')}): forward" in s for s in backward)


@pytest.mark.parametrize("scopes", ["ranges", "hooks"])
def test_module_ranges_are_not_mistaken_for_ops(scopes: str) -> None:
    """With profiler ranges around modules (``ls:...`` RecordFunctions), the ops inside a module are
    still the top-level ones: each gets its own line, not the line that called the model."""
    model, x = TwoMatmuls(), torch.randn(8, 16)
    with ls.profile(model, lines=True, module_scopes=scopes) as prof:
        model(x).sum().backward()
    profile = prof.profile
    profile.validate()
    rows = rows_by_line(profile)
    assert rows[line_of("first mm")].forward.self_flops == 2 * 8 * 16 * 16
    assert rows[line_of("second mm")].backward.self_flops == 2 * 2 * 8 * 16 * 16
