"""Profiling never changes what the user's program does or can observe (docs/architecture.md).

Each test here failed before the rule was enforced: transformers' gradient checkpointing turned off
by a patched class, classes patched on steps a schedule does not record, and a profile keeping the
model alive through reference cycles until the cyclic GC ran.
"""

from __future__ import annotations

import functools
import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.capture.scope_plan import HOOKS
from tests.fixtures.compiled_models import tiny_llama as llama_fixture
from tests.fixtures.models import TinyMLP


def tiny_llama(checkpointing: bool | None) -> nn.Module:
    """The fixtures' two-layer Llama in training mode; ``checkpointing`` is ``use_reentrant``
    (None: off). Skips the test without transformers."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = llama_fixture().train()
    if checkpointing is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": checkpointing})
    return model


def attention_calls(model: nn.Module) -> list[int]:
    """Counts every attention forward (forward hooks on the instances: no class is touched)."""
    calls: list[int] = []
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(lambda *_: calls.append(1))
    return calls


def llama_step(model: nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
    ids = torch.arange(16).reshape(2, 8) % 128
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non-reentrant"])
@pytest.mark.parametrize("module_scopes", ["auto", "ranges"])
def test_gradient_checkpointing_still_recomputes(use_reentrant: bool, module_scopes: str) -> None:
    model = tiny_llama(use_reentrant)
    calls = attention_calls(model)
    plain_loss, plain_grads = llama_step(model)
    plain_calls = len(calls)
    assert plain_calls == 2 * len(model.model.layers)  # forward and the recomputation
    calls.clear()
    with ls.profile(model, module_scopes=module_scopes) as prof:
        loss, grads = llama_step(model)
    assert len(calls) == plain_calls
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))
    prof.profile.validate()
    layer = prof.scope_plan.modules[[m.scope.path for m in prof.scope_plan].index("model.layers.0")]
    # transformers >= 5.2x checkpoints a wrapped `forward` that checks it is its class's; earlier
    # releases checkpointed `__call__`, which a class wrapper does not disturb.
    if type(layer.module).forward.__code__.co_name == "forward_with_checkpointing":
        assert layer.scope.mechanism == HOOKS
        assert "checks which forward its class holds" in layer.scope.reason


class Watchful(nn.Module):
    """Takes another path when its class's forward is not its own (as transformers' layers do)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(self).forward is not Watchful.forward:
            return x  # a patched class would land here
        return self.fc(x)


def logged(function: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator that fails unless its wrapper is still the class's forward."""

    @functools.wraps(function)
    def wrapper(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if type(self).forward is not wrapper:
            raise AssertionError("the class's forward was replaced")
        return function(self, *args, **kwargs)

    return wrapper


class Decorated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @logged
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class SharedBase(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class Checked(SharedBase):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if type(self).forward is not SharedBase.forward:
            raise AssertionError("the inherited forward was replaced")
        return super().__call__(*args, **kwargs)


class Unchecked(SharedBase):
    pass


class Builtin(nn.Module):
    forward = torch.tanh  # not bound to self: a class wrapper (a function) would pass self to it


def watched_twice() -> nn.Module:
    return nn.Sequential(Unchecked(), Checked())  # both inherit SharedBase.forward


def builtin_forward() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), Builtin())


def lazy_fx_module() -> nn.Module:
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    with _use_lazy_graph_module(True):
        traced = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    return nn.Sequential(traced, nn.Linear(4, 4))


@pytest.mark.parametrize(
    ("make", "hooked"),
    [
        (lambda: nn.Sequential(Watchful(), nn.ReLU()), ["0"]),  # forward checks its class's forward
        (lambda: nn.Sequential(Decorated(), nn.ReLU()), ["0"]),  # ... through a decorator
        (watched_twice, ["0", "1"]),  # a watched forward is patched for no module sharing it
        (builtin_forward, ["1"]),  # a class wrapper would pass self to torch.tanh
        (lazy_fx_module, ["0"]),  # a lazy GraphModule compares its forward with its class's
    ],
    ids=["watchful", "decorated", "shared-owner", "builtin", "lazy-fx"],
)
def test_modules_a_class_wrapper_would_disturb_get_hooks(
    make: Callable[[], nn.Module], hooked: list[str]
) -> None:
    model = make()
    x = torch.randn(2, 4)
    expected = model(x)
    with ls.profile(model) as prof:
        out = model(x)
    assert torch.equal(out, expected)
    p = prof.profile
    p.validate()
    mechanisms = {m.scope.path: m.scope.mechanism for m in prof.scope_plan}
    assert [path for path in hooked if mechanisms[path] == HOOKS] == hooked
    assert all(p.find(path).calls == 1 for path in hooked)
    assert mechanisms.get("0.fc") in (None, "class wrapper")  # children keep their wrappers


def test_plain_modules_keep_class_wrappers() -> None:
    with ls.profile(TinyMLP()) as prof:
        pass
    assert all(m.scope.mechanism != HOOKS for m in prof.scope_plan if m.runs_scope)


def test_no_class_is_patched_on_steps_the_schedule_does_not_record() -> None:
    model = TinyMLP()
    original = nn.Linear.__dict__["forward"]
    patched_at: list[bool] = []
    schedule = ls.schedule(wait=2, warmup=1, active=2, repeat=1)
    with ls.profile(model, schedule=schedule) as prof:
        for _ in range(8):
            patched_at.append(nn.Linear.__dict__["forward"] is not original)
            model(torch.randn(2, 8)).sum().backward()
            prof.step()
    # wait, wait, warmup, active, active, then the schedule is done
    assert patched_at == [False, False, True, True, True, False, False, False]
    assert nn.Linear.__dict__["forward"] is original
    assert len(prof.cycles) == 1
    prof.cycles[0].profile.validate()
    assert prof.cycles[0].profile.find("fc1").calls == 2


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    # One block first: torch's first profiler start leaves import-time garbage of its own.
    with ls.profile(TinyMLP()):
        pass
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"module_scopes": "ranges"},
        {"module_scopes": "hooks"},
        {"memory": True},
        {"lines": True},
        {"schedule": ls.schedule(active=1, repeat=1)},
    ],
    ids=["auto", "ranges", "hooks", "memory", "lines", "schedule"],
)
def test_a_profile_holds_the_model_in_no_reference_cycle(options: dict[str, Any], no_cyclic_gc: None) -> None:
    model = TinyMLP()
    x = torch.randn(2, 8)
    with ls.profile(model, **options) as prof:
        model(x).sum().backward()
        if "schedule" in options:
            prof.step()
    profile = prof.profile
    profile.validate()
    torch_profiler = weakref.ref(prof.torch_profiler)
    alive = [weakref.ref(model), weakref.ref(model.fc1.weight), weakref.ref(prof)]
    del model, prof  # reference counting alone (the cyclic GC is off) must free all of them
    assert [ref() for ref in alive] == [None, None, None]
    assert torch_profiler() is None
    assert profile.find("fc1").calls == 1  # and the profile stays whole


def test_the_schedule_is_asked_only_by_torch() -> None:
    """A sampling schedule's RNG must not move: layerscope follows torch's own current action."""

    def steps_asked(session: Callable[[Callable[[int], Any]], Any]) -> list[int]:
        asked: list[int] = []
        inner = torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=1)

        def schedule(step: int) -> torch.profiler.ProfilerAction:
            asked.append(step)
            return inner(step)

        model = TinyMLP()
        with session(schedule) as prof:
            for _ in range(4):
                model(torch.randn(2, 8))
                prof.step()
        return asked

    theirs = steps_asked(lambda schedule: torch.profiler.profile(schedule=schedule))
    ours = steps_asked(lambda schedule: ls.profile(TinyMLP(), schedule=schedule))
    assert theirs and ours == theirs
