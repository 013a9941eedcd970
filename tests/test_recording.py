"""One recording per cycle: every exported trace reads back to the tree its profile has, and the scope
plan says how each module was scoped, and why."""

from __future__ import annotations

import gzip
import warnings
from pathlib import Path

import orjson
import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.capture.options import ModuleSelection
from layerscope.capture.scope_plan import (
    CLASS_WRAPPER,
    COMPILED_CALL,
    GLOBAL_HOOKS,
    HOOKS,
    MARKS,
    NO_SCOPE,
    RANGES,
    ScopePlan,
    plan_scopes,
)
from layerscope.cli import main
from layerscope.render.chrome import BACKWARD_TRACK
from tests.fixtures.models import TinyMLP
from tests.test_run import write_script


def assert_same_tree(live: ls.Profile, from_trace: ls.Profile) -> None:
    """The trace's tree is the live one: modules, calls, FLOPs and times of both passes."""
    live.validate()
    from_trace.validate()
    assert [n.path for n in from_trace.modules()] == [n.path for n in live.modules()]
    for node in live.modules():
        other = from_trace.find(node.path)
        assert other.calls == node.calls, node.path
        assert other.forward.flops == node.forward.flops, node.path
        assert other.backward.flops == node.backward.flops, node.path
        assert other.forward.cpu_us == pytest.approx(node.forward.cpu_us, rel=1e-3, abs=0.01), node.path
        assert other.backward.cpu_us == pytest.approx(node.backward.cpu_us, rel=1e-3, abs=0.01), node.path
    assert live.root.backward.cpu_us > 0  # the comparison covered a backward pass


def trace_events(path: Path) -> list[dict[str, object]]:
    raw = path.read_bytes()
    data = orjson.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)
    events: list[dict[str, object]] = data["traceEvents"]
    return events


def backward_track_modules(path: Path) -> set[object]:
    return {e["name"] for e in trace_events(path) if e.get("tid") == BACKWARD_TRACK and e.get("ph") == "X"}


def test_save_to_traces_read_back_to_each_cycles_tree(tmp_path: Path) -> None:
    model = TinyMLP()
    handler = ls.save_to(tmp_path, trace=True)
    with ls.profile(
        model, schedule=ls.schedule(wait=1, warmup=1, active=2, repeat=2), on_trace_ready=handler
    ) as prof:
        for _ in range(8):
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
    assert len(prof.cycles) == 2
    for cycle in prof.cycles:
        profile_path = next(p for p in handler.written if p.name.endswith(f"_c{cycle.index}.json.gz"))  # type: ignore[attr-defined]
        trace_path = profile_path.with_name(profile_path.name.replace(".json.gz", ".pt.trace.json.gz"))
        assert_same_tree(ls.load(profile_path), ls.load(trace_path))
        assert {"fc1", "fc2"} <= backward_track_modules(trace_path)


def test_run_trace_reads_back_to_the_saved_tree(tmp_path: Path) -> None:
    script = write_script(tmp_path)
    out = tmp_path / "runs"
    assert main(["run", "-q", "--steps", "2", "--trace", "-o", str(out), str(script), "4"]) == 0
    (trace,) = sorted(out.glob("*.pt.trace.json.gz"))
    profile_path = trace.with_name(trace.name.replace(".pt.trace.json.gz", ".json.gz"))
    live = ls.load(profile_path)
    assert_same_tree(live, ls.load(trace))
    assert {"Net.encoder.0", "Net.head"} <= backward_track_modules(trace)


COMPILED_SCRIPT = """
import torch
from torch import nn
model = torch.compile(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    opt.zero_grad()
    model(torch.randn(16, 8)).sum().backward()
    opt.step()
"""


def test_run_trace_of_a_compiled_model_reads_back_to_the_saved_tree(tmp_path: Path) -> None:
    """Whether `run` watched the compile depends on the process (it watches only once Inductor is
    loaded: issue 23), but either way the trace it writes reads back to the profile it saved."""
    script = tmp_path / "train_compiled.py"
    script.write_text(COMPILED_SCRIPT)
    out = tmp_path / "runs"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ls.CompileInfoWarning)
        assert main(["run", "-q", "--steps", "2", "--trace", "-o", str(out), str(script)]) == 0
    (trace,) = sorted(out.glob("*.pt.trace.json.gz"))
    live = ls.load(trace.with_name(trace.name.replace(".pt.trace.json.gz", ".json.gz")))
    assert_same_tree(live, ls.load(trace))
    assert live.meta.compiled.graph_calls > 0
    assert backward_track_modules(trace)  # cycle traces had no backward track before the Recording


def test_block_trace_with_marks_reads_back_and_can_be_written_twice(tmp_path: Path) -> None:
    model = TinyMLP()
    with ls.profile(model) as prof:
        model(torch.randn(4, 8)).sum().backward()
    first = prof.export_chrome_trace(tmp_path / "a.json")
    second = prof.export_chrome_trace(tmp_path / "b.json.gz")
    assert_same_tree(prof.profile, ls.load(first))
    assert_same_tree(prof.profile, ls.load(second))


# ----- the scope plan ---------------------------------------------------------------------------------
class EveryMechanism(nn.Module):
    """One model mixing every mechanism a model can get (global hooks need model=None)."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = nn.Linear(4, 4)
        self.patched = nn.Linear(4, 4)
        own_forward = self.patched.forward
        self.patched.forward = lambda x: own_forward(x)  # type: ignore[method-assign]
        self.items = nn.ModuleList([nn.ReLU()])
        self.scripted = torch.jit.script(nn.Linear(4, 4))
        self.deep = nn.Sequential(nn.Sequential(nn.Linear(4, 4)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.deep(self.scripted(self.items[0](self.patched(self.plain(x)))))


def planned(plan: ScopePlan) -> dict[str, tuple[str, str | None, str]]:
    return {m.scope.path: (m.scope.mechanism, m.scope.clock, m.scope.reason) for m in plan}


def test_scope_plan_of_an_eager_model_names_each_mechanism_and_why() -> None:
    plan = planned(plan_scopes(EveryMechanism(), ModuleSelection(depth=2), "auto", None))
    assert plan[""] == (CLASS_WRAPPER, MARKS, "the native module's marks")
    assert plan["plain"][:2] == (CLASS_WRAPPER, MARKS)
    assert plan["patched"] == (
        HOOKS,
        RANGES,
        "the instance carries its own forward (a class wrapper would not run)",
    )
    assert plan["items"] == (HOOKS, RANGES, "no forward of its own (a container: never called)")
    assert plan["items.0"][:2] == (CLASS_WRAPPER, MARKS)
    assert plan["scripted"] == (NO_SCOPE, None, "TorchScript runs no Python hooks")
    assert plan["deep.0"][:2] == (CLASS_WRAPPER, MARKS)
    assert plan["deep.0.0"] == (NO_SCOPE, None, "folded into its ancestor (deeper than depth=2)")
    blocked = planned(plan_scopes(EveryMechanism(), ModuleSelection(), "ranges", "module_scopes='ranges'"))
    assert blocked["plain"] == (CLASS_WRAPPER, RANGES, "module_scopes='ranges'")
    hooked = planned(plan_scopes(EveryMechanism(), ModuleSelection(), "hooks", "module_scopes='hooks'"))
    assert hooked["plain"] == (HOOKS, RANGES, "module_scopes='hooks'")


def test_scope_plan_of_compiled_parts() -> None:
    model = EveryMechanism()
    model.deep.compile()  # nothing compiles until the first call: planning stays cheap
    plan = planned(plan_scopes(model, ModuleSelection(), "auto", None))
    assert plan["deep"][:2] == (COMPILED_CALL, RANGES)
    assert plan["deep.0"][0] == plan["deep.0.0"][0] == NO_SCOPE
    assert plan["deep.0"][2].startswith("inside compiled code")
    assert plan["plain"] == (
        HOOKS,
        RANGES,
        "the model has compiled parts (a patched class would make them recompile)",
    )
    whole = planned(plan_scopes(torch.compile(TinyMLP()), ModuleSelection(), "auto", None))
    assert whole[""][:2] == (HOOKS, RANGES) and whole["fc1"][0] == NO_SCOPE


def test_scope_plan_is_kept_in_meta_and_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = EveryMechanism()
    with ls.profile(model, module_scopes="ranges") as prof:
        model(torch.randn(2, 4)).sum().backward()
    assert prof.profile.meta.capture.scope_plan.kinds == "ranges"
    path = prof.profile.save(tmp_path / "run.json")
    assert main(["show", str(path), "--scopes", "--ascii"]) == 0
    out = capsys.readouterr().out
    assert "module_scopes='ranges'" in out and "TorchScript runs no Python hooks" in out
    rows = [line for line in out.splitlines() if line.lstrip("| ").startswith("patched ")]
    assert len(rows) == 1 and "hooks" in rows[0]
    mlp = nn.Sequential(nn.Linear(4, 4))
    with ls.profile() as prof:
        mlp(torch.randn(2, 4))
    assert prof.profile.meta.capture is not None
    global_plan = prof.profile.meta.capture.scope_plan
    assert (global_plan.reasons[0].mechanism, global_plan.reasons[0].clock) == (GLOBAL_HOOKS, RANGES)
    assert [m[0] for m in global_plan.modules] == ["Sequential", "Sequential.0"]


def test_show_scopes_of_a_trace_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model = TinyMLP()
    with ls.profile(model) as prof:
        model(torch.randn(2, 8))
    trace = prof.export_chrome_trace(tmp_path / "t.json")
    assert main(["show", str(trace), "--scopes"]) != 0
    err = capsys.readouterr().err.strip()
    assert "no scope plan" in err and len(err.splitlines()) == 1


def test_module_scopes_default_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERSCOPE_MODULE_SCOPES", "hooks")
    assert ls.profile(TinyMLP()).options.module_scopes == "hooks"
    monkeypatch.setenv("LAYERSCOPE_MODULE_SCOPES", "sideways")
    with pytest.raises(ls.UsageError, match=r"\$LAYERSCOPE_MODULE_SCOPES must be one of"):
        ls.profile(TinyMLP())


def test_start_and_stop_outside_a_with_block() -> None:
    model = TinyMLP()
    session = ls.profile(model)
    assert not session.is_running
    session.start()
    try:
        assert session.is_running
        model(torch.randn(2, 8))
    finally:
        session.stop()
    assert not session.is_running
    assert session.profile.find("fc1").calls == 1
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    with pytest.raises(ls.CaptureError, match="not running"):
        session.stop()
    with pytest.raises(ls.CaptureError, match="already used"):
        session.start()


def test_stop_inside_the_block_then_leaving_it_is_fine() -> None:
    model = TinyMLP()
    with ls.profile(model) as prof:
        model(torch.randn(2, 8))
        prof.stop()
        assert not prof.is_running
    assert prof.profile.find("fc1").calls == 1


def test_a_failing_clean_up_step_keeps_the_blocks_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The block's exception is chained to the clean-up error, not lost; the rest is still undone."""
    from layerscope.capture.scopes import ModuleScopes

    real_remove = ModuleScopes.remove

    def failing_remove(self: ModuleScopes) -> None:
        real_remove(self)
        raise RuntimeError("clean-up failed")

    monkeypatch.setattr(ModuleScopes, "remove", failing_remove)
    model = TinyMLP()
    with pytest.raises(RuntimeError, match="clean-up failed") as caught, ls.profile(model) as prof:
        raise ValueError("the user's error")
    assert isinstance(caught.value.__context__, ValueError)
    assert not prof.is_running and not torch._C._autograd._profiler_enabled()
    assert prof.profile.root.calls == 0  # what was recorded is still readable


def test_the_old_marks_switch_still_means_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERSCOPE_MODULE_MARKS", "0")
    monkeypatch.delenv("LAYERSCOPE_MODULE_SCOPES", raising=False)
    with pytest.warns(DeprecationWarning, match="LAYERSCOPE_MODULE_SCOPES=ranges"):
        assert ls.profile(TinyMLP()).options.module_scopes == "ranges"


def test_an_instance_forward_on_a_bare_module_counts_as_a_range() -> None:
    """A hooked module whose class has no forward but whose instance has one does run its hooks."""
    bare = nn.Module()
    bare.forward = lambda x: x * 2  # type: ignore[method-assign]
    model = nn.Sequential(nn.Linear(4, 4), bare)
    plan = plan_scopes(model, ModuleSelection(), "auto", None)
    assert plan.kinds() == "marks and ranges"
