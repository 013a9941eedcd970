"""Class-level forward wrappers (the fast module scopes): every guarantee hooks gave, kept."""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.capture.scope_plan import forward_owner
from tests.fixtures.models import Exploding, TinyMLP

LINEAR_FORWARD = nn.Linear.__dict__["forward"]
RELU_FORWARD = nn.ReLU.__dict__["forward"]


def assert_classes_restored() -> None:
    assert nn.Linear.__dict__["forward"] is LINEAR_FORWARD
    assert nn.ReLU.__dict__["forward"] is RELU_FORWARD
    assert "forward" not in TinyMLP.__dict__ or TinyMLP.__dict__["forward"].__name__ == "forward"
    assert not hasattr(TinyMLP.__dict__["forward"], "__wrapped__")


def run(model: nn.Module, x: torch.Tensor) -> ls.Profile:
    with ls.profile(model) as prof:
        model(x).sum().backward()
    p = prof.profile
    p.validate()
    return p


def test_classes_are_patched_only_inside_the_block() -> None:
    model = TinyMLP()
    with ls.profile(model):
        assert nn.Linear.__dict__["forward"] is not LINEAR_FORWARD
        assert nn.Linear.__dict__["forward"].__wrapped__ is LINEAR_FORWARD
        model(torch.randn(2, 8))
    assert_classes_restored()
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_classes_restored_after_exceptions(exc: type[BaseException]) -> None:
    model = Exploding(exc)
    with pytest.raises(exc), ls.profile(model) as prof:
        model(torch.randn(2, 8))
    assert_classes_restored()
    prof.profile.validate()
    assert prof.profile.find("ok").calls == 1


def test_signature_of_forward_is_unchanged_in_the_block() -> None:
    model = TinyMLP()
    outside = inspect.signature(model.fc1.forward)
    with ls.profile(model):
        assert inspect.signature(model.fc1.forward) == outside
        assert inspect.signature(model.forward) == inspect.signature(TinyMLP().forward)


def test_a_copy_made_in_the_block_runs_its_own_parameters() -> None:
    """deepcopy (and DataParallel's replicate) copy __dict__: an instance wrapper would call the original."""
    model = TinyMLP()
    x = torch.randn(2, 8)
    with ls.profile(model) as prof, torch.no_grad():
        clone = copy.deepcopy(model)
        clone.fc1.weight.zero_()
        clone.fc1.bias.zero_()
        inside = clone(x)
        model(x)
    with torch.no_grad():
        assert torch.equal(inside, clone(x))
        assert not torch.equal(inside, model(x))
    assert prof.profile.find("fc1").calls == 1  # the copy is not the profiled model


def test_super_forward_into_a_patched_class_opens_one_range() -> None:
    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    model = nn.Sequential(Scaled(4, 4), nn.Linear(4, 4))
    p = run(model, torch.randn(3, 4))
    assert p.find("0").calls == 1 and p.find("0").type_name == "Scaled"
    assert p.find("1").calls == 1
    assert [c.path for c in p.root.children] == ["0", "1"]
    assert_classes_restored()


def test_an_instance_forward_set_by_others_gets_hooks_and_is_kept() -> None:
    """accelerate's add_hook_to_module sets module.forward = partial(new_forward, module)."""
    model = TinyMLP()
    old_forward = model.fc2.forward
    calls: list[int] = []

    def new_forward(module: nn.Module, *args: Any) -> Any:
        calls.append(1)
        return old_forward(*args)

    patched = functools.partial(new_forward, model.fc2)
    model.fc2.forward = patched  # type: ignore[method-assign]
    assert forward_owner(model.fc2)[0] is None
    p = run(model, torch.randn(2, 8))
    assert p.find("fc2").calls == 1 and calls == [1]
    assert model.fc2.__dict__["forward"] is patched
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0
    assert_classes_restored()


def test_a_class_patched_on_top_of_ours_stays_and_ours_passes_through() -> None:
    model = TinyMLP()
    x = torch.randn(2, 8)
    expected = model(x)
    with ls.profile(model):
        ours = nn.Linear.__dict__["forward"]
        nn.Linear.forward = lambda self, x: ours(self, x)  # type: ignore[method-assign]
        model(x)
    try:
        assert nn.Linear.__dict__["forward"] is not ours
        assert torch.equal(model(x), expected)
        with torch.profiler.profile() as tp:
            model(x)
        assert not [e for e in tp.events() if e.name.startswith("ls:")]  # ours opens no range now
    finally:
        nn.Linear.forward = LINEAR_FORWARD  # type: ignore[method-assign]


def test_other_instances_of_a_patched_class_are_not_in_the_tree() -> None:
    model = TinyMLP()
    stranger = nn.Linear(8, 8)
    x = torch.randn(2, 8)
    expected = stranger(x)
    with ls.profile(model) as prof:
        got = stranger(x)
        model(x)
    assert torch.equal(got, expected)
    p = prof.profile
    p.validate()
    assert {n.path for n in p.modules()} == {"", "fc1", "act", "fc2"}


def forward_once(model: nn.Module, x: torch.Tensor) -> ls.Profile:
    """One profiled forward whose output must equal the unprofiled one; the validated Profile."""
    expected = model(x)
    with ls.profile(model) as prof:
        got = model(x)
    assert torch.equal(got, expected)
    p = prof.profile
    p.validate()
    return p


def test_scripted_submodules_fold_into_their_parent() -> None:
    """TorchScript runs no Python hooks and takes no patches: its work is the parent's self time."""
    model = nn.Sequential(torch.jit.script(nn.Linear(4, 4)), nn.ReLU())
    assert forward_owner(model[0])[0] is None
    p = forward_once(model, torch.randn(2, 4))
    assert p.find("1").calls == 1
    assert [c.path for c in p.root.children] == ["1"]
    assert p.root.forward.self_flops > 0  # the scripted Linear's addmm, counted at the root
    assert_classes_restored()


def test_a_scripted_model_profiles_without_a_tree() -> None:
    """A scripted root takes no hooks (torch refuses them): the ops are there, unattributed."""
    p = forward_once(torch.jit.script(TinyMLP()), torch.randn(2, 8))
    assert not p.root.children and p.root.calls == 0
    assert any(r.name == "aten::linear" for r in p.op_rows)


def test_module_calling_a_child_forward_directly() -> None:
    class Direct(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc.forward(x)  # no __call__, no hooks: the class wrapper still names it

    p = run(Direct(), torch.randn(2, 4))
    assert p.find("fc").calls == 1
    assert p.find("fc").forward.self_flops == 2 * 4 * 4 * 2
