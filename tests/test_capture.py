"""Live capture: the module tree for forward and backward, and the user's program left untouched."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.errors import CaptureError, UsageError
from tests.fixtures.models import (
    CalledTwice,
    Containers,
    CustomFunction,
    Exploding,
    Recursive,
    SharedChild,
    TinyMLP,
    tiny_resnet,
)


def train_step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    out.sum().backward()
    return out


def profile_step(model: nn.Module, x: torch.Tensor, **options: object) -> ls.Profile:
    with ls.profile(model, **options) as prof:  # type: ignore[arg-type]
        train_step(model, x)
    p = prof.profile
    p.validate()
    return p


def hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_mlp_tree_forward_and_backward() -> None:
    model = TinyMLP()
    p = profile_step(model, torch.randn(4, 8))
    assert p.root.path == "" and p.root.type_name == "TinyMLP"
    assert [c.path for c in p.root.children] == ["fc1", "act", "fc2"]  # execution order
    fc1 = p.find("fc1")
    assert fc1.type_name == "Linear" and fc1.calls == 1
    assert fc1.params == 8 * 16 + 16 and fc1.params_total == fc1.params
    assert p.root.params_total == sum(x.numel() for x in model.parameters())
    assert fc1.input_shapes == "[[4, 8]]" and fc1.output_shapes == "[[4, 16]]"
    for node in (fc1, p.find("fc2"), p.find("act")):
        assert node.forward.cpu_us > 0
        assert node.backward.cpu_us > 0, f"{node.path} has no backward time"
    # FLOPs: addmm forward, two mm backward per linear (fc1's input needs no grad: one mm).
    assert fc1.forward.flops == 2 * 4 * 8 * 16
    assert p.find("fc2").forward.flops == 2 * 4 * 16 * 4
    assert p.find("fc2").backward.flops == 2 * (2 * 4 * 16 * 4)
    assert fc1.backward.flops == 2 * 4 * 8 * 16  # only the weight gradient


def test_functional_ops_are_parent_self_time() -> None:
    p = profile_step(TinyMLP(), torch.randn(4, 8))
    root_ops = {r.name for r in p.op_rows if r.module == "" and r.phase is ls.Phase.FORWARD}
    assert {"aten::mul", "aten::add"} <= root_ops
    assert p.root.forward.self_cpu_us > 0
    # ... and their backward belongs to the root too.
    root_bwd = {r.name for r in p.op_rows if r.module == "" and r.phase is ls.Phase.BACKWARD}
    assert any("MulBackward0" in n or "AddBackward0" in n for n in root_bwd)


def test_loss_and_grad_accumulation_are_unattributed() -> None:
    p = profile_step(TinyMLP(), torch.randn(4, 8))
    labels = {(e.label, e.phase) for e in p.unattributed}
    assert ("aten::sum", ls.Phase.OTHER) in labels
    assert ("SumBackward0", ls.Phase.BACKWARD) in labels
    assert ("torch::autograd::AccumulateGrad", ls.Phase.BACKWARD) in labels


def test_module_called_twice_counts_two_calls() -> None:
    p = profile_step(CalledTwice(), torch.randn(2, 8))
    lin = p.find("lin")
    assert lin.calls == 2
    assert lin.forward.flops == 2 * (2 * 2 * 8 * 8)


def test_shared_instance_keeps_one_path() -> None:
    p = profile_step(SharedChild(), torch.randn(2, 8))
    paths = [n.path for n in p.modules()]
    assert "a.0" in paths and "b.0" not in paths
    assert p.find("a.0").calls == 2  # called through both parents, counted under its one path


def test_recursion_containers_custom_function_inplace() -> None:
    p = profile_step(Recursive(), torch.randn(2, 8))
    assert p.root.calls == 3 and p.find("lin").calls == 3
    p = profile_step(Containers(), torch.randn(2, 8))
    assert {"layers.0", "layers.2", "heads.left", "heads.right"} <= {n.path for n in p.modules()}
    p = profile_step(CustomFunction(), torch.randn(2, 8))
    root_bwd = {r.name for r in p.op_rows if r.module == "" and r.phase is ls.Phase.BACKWARD}
    assert any("_Cube" in n for n in root_bwd), root_bwd


def test_eval_no_grad_has_no_backward() -> None:
    model = TinyMLP().eval()
    with ls.profile(model) as prof, torch.no_grad():
        model(torch.randn(2, 8))
    p = prof.profile
    p.validate()
    assert p.root.backward.cpu_us == 0 and p.root.forward.cpu_us > 0
    assert model.training is False


def test_outputs_bit_identical_and_state_untouched() -> None:
    model = tiny_resnet()
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(1)
    expected = model(x)
    torch.manual_seed(1)
    rng_before = torch.get_rng_state()
    with ls.profile(model, memory=True):
        got = model(x)
    assert torch.equal(rng_before, torch.get_rng_state())
    assert torch.equal(expected, got)
    assert model.training is True
    assert hook_count(model) == 0


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_hooks_removed_and_profiler_stopped_after_exceptions(exc: type[BaseException]) -> None:
    model = Exploding(exc)
    with pytest.raises(exc), ls.profile(model) as prof:
        model(torch.randn(2, 8))
    assert hook_count(model.ok) == 0 and hook_count(model) <= 1  # only the model's own boom hook
    assert prof.profile.find("ok").calls == 1  # what ran before the error is there
    prof.profile.validate()
    # The profiler is stopped: a new session (and torch's own profiler) can start.
    again = TinyMLP()
    profile_step(again, torch.randn(2, 8))
    with torch.profiler.profile():
        pass


def test_profiling_the_same_model_again_works() -> None:
    model = TinyMLP()
    first = profile_step(model, torch.randn(2, 8))
    second = profile_step(model, torch.randn(2, 8))
    assert [n.path for n in first.modules()] == [n.path for n in second.modules()]
    assert hook_count(model) == 0


def test_nesting_gives_a_clear_error() -> None:
    model = TinyMLP()
    with ls.profile(model), pytest.raises(CaptureError, match="nested"), ls.profile(model):
        pass
    assert hook_count(model) == 0
    profile_step(model, torch.randn(2, 8))  # state not corrupted


def test_running_torch_profiler_gives_a_clear_error() -> None:
    model = TinyMLP()
    with torch.profiler.profile() as outer:
        with pytest.raises(CaptureError, match="already running"), ls.profile(model):
            pass
        model(torch.randn(2, 8))
    assert hook_count(model) == 0
    assert any(e.name == "aten::addmm" for e in outer.events())  # the outer session was not disturbed


def test_profile_object_is_single_use_and_result_waits_for_exit() -> None:
    model = TinyMLP()
    session = ls.profile(model)
    with pytest.raises(CaptureError):
        _ = session.profile
    with session:
        model(torch.randn(2, 8))
    with pytest.raises(CaptureError, match="already used"), session:
        pass


def test_two_threads_running_the_model() -> None:
    if not ls.profile(None).options.all_threads:
        pytest.skip(f"torch {torch.__version__} cannot record every thread (no profile_all_threads)")
    model = TinyMLP()
    x = torch.randn(4, 8)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                train_step(model, x)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with ls.profile(model) as prof:
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    p = prof.profile
    p.validate()
    assert p.meta.capture.options.all_threads is True
    assert p.find("fc1").calls == 6  # both worker threads were recorded
    assert p.find("fc1").backward.cpu_us > 0
    assert hook_count(model) == 0


def test_global_mode_names_roots_by_class() -> None:
    model = TinyMLP()
    loss_fn = nn.MSELoss()
    x, target = torch.randn(4, 8), torch.randn(4, 4)
    with ls.profile() as prof:
        loss_fn(model(x), target).backward()
    p = prof.profile
    p.validate()
    top = [c.path for c in p.root.children]
    assert top == ["TinyMLP", "MSELoss"]
    assert p.find("TinyMLP.fc1").type_name == "Linear"
    assert p.find("MSELoss").backward.cpu_us > 0  # the loss's backward is the loss module's
    assert p.find("TinyMLP.fc2").backward.cpu_us > 0
    # global hooks are gone: a later forward records nothing of ours
    assert not torch.nn.modules.module._global_forward_hooks


def test_depth_and_paths_fold_modules() -> None:
    model = tiny_resnet()
    x = torch.randn(2, 3, 32, 32)
    p = profile_step(model, x, depth=1)
    assert max(n.path.count(".") for n in p.modules() if n.path) == 0
    assert p.find("layer1").forward.self_flops > 0  # convolutions folded into their ancestor
    p = profile_step(model, x, paths=["layer2.0"])
    paths = {n.path for n in p.modules()}
    assert {"", "layer2", "layer2.0", "layer2.0.conv1"} <= paths
    assert "layer1" not in paths and "fc" not in paths


def test_memory_metrics() -> None:
    model = TinyMLP(width=256)
    p = profile_step(model, torch.randn(64, 8), memory=True)
    fc1 = p.find("fc1")
    assert fc1.forward.cpu_alloc_bytes >= 64 * 256 * 4  # the output activation
    assert fc1.forward.cpu_relative_peak_bytes >= 64 * 256 * 4
    assert fc1.forward.net_bytes > 0  # the activation lives on for backward
    assert p.root.forward.cpu_relative_peak_bytes >= fc1.forward.cpu_relative_peak_bytes
    assert p.totals.cpu_alloc_bytes >= p.root.forward.cpu_alloc_bytes


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"activities": ["gpu"]}, "unknown activity 'gpu'; choose from"),
        ({"depth": -1}, "depth must be"),
        ({"paths": "layer1"}, "paths must be a list"),
        ({"profiler_kwargs": {"record_shapes": True}}, "through layerscope's own options"),
        ({"profiler_kwargs": {"schedule": object()}}, "pass schedule to layerscope.profile itself"),
        ({"schedule": 3}, "schedule must be"),
    ],
)
def test_invalid_options_fail_at_once(options: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ls.profile(TinyMLP(), **options)  # type: ignore[arg-type]


def test_model_must_be_a_module() -> None:
    with pytest.raises(UsageError, match=r"torch\.nn\.Module"):
        ls.profile("resnet")  # type: ignore[arg-type]


def test_torch_profiler_is_exposed() -> None:
    """With module_scopes="ranges", torch's own tools see the module ranges too."""
    model = TinyMLP()
    with ls.profile(model, module_scopes="ranges") as prof:
        model(torch.randn(2, 8))
    assert isinstance(prof.torch_profiler, torch.profiler.profile)
    names = {e.key for e in prof.torch_profiler.key_averages()}
    assert "ls:fc1:Linear" in names
    assert prof.profile.meta.capture.scope_plan.kinds == "ranges"


def test_module_scopes_must_be_a_known_kind() -> None:
    with pytest.raises(UsageError, match="module_scopes must be one of auto, ranges, hooks"):
        ls.profile(TinyMLP(), module_scopes="marks")


def test_all_threads_with_memory_is_refused() -> None:
    with pytest.raises(UsageError, match="cannot be combined"):
        ls.profile(TinyMLP(), memory=True, all_threads=True)


def test_memory_profiles_record_the_entering_thread() -> None:
    model = TinyMLP()
    with ls.profile(model, memory=True) as prof:
        train_step(model, torch.randn(2, 8))
    assert prof.profile.meta.capture.options.all_threads is False
    assert prof.profile.totals.cpu_alloc_bytes > 0


class _FakeKinetoEvent:
    """Just the accessors a CPU-only read without shapes asks for; one name is not valid UTF-8."""

    def __init__(self, name: str | None, ts: int) -> None:
        self._name, self._ts = name, ts

    def nbytes(self) -> int:
        return 0

    def name(self) -> str:
        if self._name is None:
            raise UnicodeDecodeError("utf-8", b"\xc3(", 0, 1, "invalid continuation byte")
        return self._name

    def start_ns(self) -> int:
        return self._ts

    def duration_ns(self) -> int:
        return 10

    def start_thread_id(self) -> int:
        return 1

    def sequence_nr(self) -> int:
        return -1

    def fwd_thread_id(self) -> int:
        return 0


class _FakeResults:
    def __init__(self, events: list[_FakeKinetoEvent]) -> None:
        self._events = events

    def events(self) -> list[_FakeKinetoEvent]:
        return self._events


def test_an_undecodable_name_gets_a_placeholder_and_a_count() -> None:
    from layerscope.attribution import build_profile
    from layerscope.capture.bindings_reader import table_from_bindings
    from layerscope.capture.event_columns import UNDECODABLE_NAME

    events = [
        _FakeKinetoEvent("aten::mm", 0),
        _FakeKinetoEvent(None, 100),
        _FakeKinetoEvent("aten::add", 200),
    ]
    table = table_from_bindings(_FakeResults(events), None, shapes=False, cpu_only=True)
    assert [table.names[i] for i in table.span_name] == ["aten::mm", UNDECODABLE_NAME, "aten::add"]
    assert table.meta["undecodable_names"] == 1
    profile = build_profile(table)
    profile.validate()
    assert any(u.label == UNDECODABLE_NAME for u in profile.unattributed)


def test_with_stack_profiles_in_a_loop_never_fail_on_a_name() -> None:
    """The loop that crashed about once in 15 fresh processes (UnicodeDecodeError from name())."""

    class TwoMatmuls(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Parameter(torch.randn(64, 64))
            self.b = nn.Parameter(torch.randn(64, 64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x @ self.a) @ self.b

    model, x = TwoMatmuls(), torch.randn(32, 64)
    for _ in range(50):
        with ls.profile(model, with_stack=True) as prof:
            model(x).sum().backward()
        profile = prof.profile
        profile.validate()
        assert profile.root.forward.self_cpu_us > 0


def test_a_shape_error_in_the_block_costs_that_op_its_flops_not_the_profile() -> None:
    """The block raises (Linear(4, 4) on 3 features); torch recorded the failing addmm with shapes its
    FLOP formula asserts on: that call gets 0 FLOPs, counted in meta, and the profile builds."""
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(RuntimeError), ls.profile(model) as prof:
        model(torch.randn(2, 3))
    p = prof.profile
    p.validate()
    assert p.meta.capture.flop_formula_failures == {"aten::addmm": 1}
    assert p.find("0").calls == 1 and p.totals.flops == 0
