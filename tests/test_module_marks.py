"""Module scopes as marks on torch's clock (capture/module_marks.py): the same profile as with
profiler ranges, every guarantee kept (exceptions, interrupts, threads), and ranges wherever marks
cannot serve."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.capture import native
from layerscope.capture.module_marks import ModuleMarks
from layerscope.capture.scopes import ModuleScopes
from layerscope.errors import LayerscopeError
from tests.fixtures.models import TinyMLP
from tests.test_torch_agreement import MODELS  # the four models torch's numbers are compared on


@pytest.fixture(scope="module", autouse=True)
def native_module() -> Any:
    """The native module for the installed torch (built here when `make` has not built it)."""
    native.forget()
    if native.load() is None:
        try:
            native.build()
        except LayerscopeError as exc:
            pytest.skip(f"the native module cannot be built here: {exc}")
    module = native.load()
    if module is None:
        pytest.skip(f"native module not in use: {native.status().reason}")
    return module


def _profile(model: nn.Module, x: torch.Tensor, module_scopes: str, **options: Any) -> ls.Profile:
    # Garbage of earlier tests collected inside the block would be the root's self time (the time
    # test below bounds it): collect it first.
    gc.collect()
    with ls.profile(model, module_scopes=module_scopes, **options) as prof:
        for _ in range(2):
            model(x).float().sum().backward()
    profile = prof.profile
    profile.validate()
    return profile


@pytest.mark.parametrize("name", sorted(MODELS))
def test_marks_give_the_profile_ranges_give(name: str) -> None:
    factory, make_input = MODELS[name]
    model, x = factory(), make_input()
    model(x).float().sum().backward()  # warm-up
    marked = _profile(model, x, "auto", memory=True)
    ranged = _profile(model, x, "ranges", memory=True)
    assert (
        marked.meta.capture.scope_plan.kinds == "marks" and ranged.meta.capture.scope_plan.kinds == "ranges"
    )
    assert [n.path for n in marked.modules()] == [n.path for n in ranged.modules()]
    for node in ranged.modules():
        other = marked.find(node.path)
        assert other.calls == node.calls, node.path
        assert (other.forward.flops, other.backward.flops) == (node.forward.flops, node.backward.flops)
        assert other.forward.cpu_alloc_bytes == node.forward.cpu_alloc_bytes, node.path

    # Every op lands in the same module and phase, as often.
    def rows(p: ls.Profile) -> dict[tuple[str, str, str, str], int]:
        found: dict[tuple[str, str, str, str], int] = {}
        for row in p.op_rows:
            if not row.name.startswith("ProfilerStep"):
                key = (row.name, str(row.phase), str(row.module), row.scope)
                found[key] = found.get(key, 0) + row.calls
        return found

    assert rows(marked) == rows(ranged)
    # Time nests the same way: most of the root's forward time is in its children's spans and ops
    # (spans that failed to nest would leave it all as self time). Two separate runs are not compared
    # in time: their durations vary several-fold here, and a busy machine preempting the root's own
    # Python between child calls inflates its self time, hence the loose bound.
    for p in (marked, ranged):
        assert p.root.forward.self_cpu_us < 0.8 * p.root.forward.cpu_us


def test_an_exception_inside_a_forward_closes_its_marks() -> None:
    class Fails(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    model = nn.Sequential(nn.Linear(4, 4), Fails())
    original = nn.Linear.forward
    with ls.profile(model) as prof:
        model[0](torch.randn(1, 4))
        with pytest.raises(ValueError, match="boom"):
            model(torch.randn(1, 4))
    assert nn.Linear.forward is original
    p = prof.profile
    p.validate()
    assert p.meta.capture.scope_plan.kinds == "marks"
    assert p.find("1").calls == 1 and p.find("0").calls == 2 and p.root.calls == 1
    marks = prof.recording.context.marks
    assert marks is not None and marks.unmatched == 0


def test_keyboard_interrupt_mid_forward_restores_and_profiles() -> None:
    class Interrupts(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise KeyboardInterrupt

    model = nn.Sequential(nn.Linear(4, 4), Interrupts())
    originals = (nn.Sequential.forward, nn.Linear.forward, Interrupts.forward)
    with pytest.raises(KeyboardInterrupt), ls.profile(model) as prof:
        model(torch.randn(1, 4))
    assert (nn.Sequential.forward, nn.Linear.forward, Interrupts.forward) == originals
    p = prof.profile
    p.validate()
    assert p.root.calls == 1 and p.find("0").calls == 1 and p.find("1").calls == 1


def test_two_threads_each_get_their_own_module_calls() -> None:
    model = TinyMLP()
    x = torch.randn(8, 8)
    with ls.profile(model, all_threads=True) as prof:
        worker = threading.Thread(target=lambda: model(x).sum().backward())
        worker.start()
        model(x).sum().backward()
        worker.join()
    p = prof.profile
    p.validate()
    assert p.meta.capture.scope_plan.kinds == "marks"
    assert p.root.calls == 2 and p.find("fc1").calls == 2
    # Both threads' matmuls are inside fc1 / fc2, none left at the root.
    fc = sum(r.calls for r in p.op_rows if r.name == "aten::addmm" and str(r.module).startswith("fc"))
    assert fc == sum(r.calls for r in p.op_rows if r.name == "aten::addmm") == 4
    marks = prof.recording.context.marks
    threads = set(marks.span_tid) if marks else set()
    assert len(threads) == 2


def test_where_marks_cannot_serve_ranges_do() -> None:
    model = TinyMLP()
    x = torch.randn(8, 8)
    with ls.profile(model, schedule=ls.schedule(wait=0, warmup=0, active=1)) as prof:
        model(x).sum()
        prof.step()
    assert prof.profile.meta.capture.scope_plan.kinds == "ranges"
    with ls.profile() as prof:  # global mode: hooks, hence ranges
        model(x).sum()
    assert prof.profile.meta.capture.scope_plan.kinds == "ranges"


class _RecordingNative:
    """A stand-in for the native module that records marks in Python."""

    def __init__(self) -> None:
        self.marks: list[int] = []

    def mark(self, code: int) -> None:
        self.marks.append(code)

    def marks_start(self) -> None:
        self.marks.clear()

    def marks_stop(self) -> list[Any]:
        return []


def test_a_wrapper_left_in_someone_elses_chain_marks_nothing_more() -> None:
    fake = _RecordingNative()
    marks = ModuleMarks(fake)
    model = nn.Sequential(nn.Linear(4, 4))
    scopes = ModuleScopes.for_model(model, "auto", marks)
    scopes.install()
    ours = nn.Linear.forward

    def theirs(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:  # patched on top during the block
        return ours(self, x)

    nn.Linear.forward = theirs  # type: ignore[method-assign]
    try:
        model(torch.randn(1, 4))
        model(torch.randn(1, 4))
        seen = list(fake.marks)
        assert seen[:2] == [1, 2] and seen[-2:] == [-2, -1] and len(seen) == 8  # Sequential, Linear
        scopes.remove()
        model(torch.randn(1, 4))
        assert fake.marks == seen  # pass-through now: no marks after the block
    finally:
        scopes.remove()
        nn.Linear.forward = ours.__wrapped__  # type: ignore[attr-defined,method-assign]
    assert not hasattr(nn.Linear.forward, "__wrapped__")


def test_marks_and_ranges_mix_in_one_tree() -> None:
    """A module whose instance carries its own forward (as accelerate's hooks do) keeps a hook and a
    profiler range; its class-wrapped neighbours get marks; the spans nest into one tree."""
    model = TinyMLP()
    x = torch.randn(8, 8)
    plain_forward = model.fc2.forward
    model.fc2.forward = lambda inp: plain_forward(inp)  # type: ignore[method-assign]
    mixed = _profile(model, x, "auto")
    ranged = _profile(model, x, "ranges")
    assert mixed.meta.capture.scope_plan.kinds == "marks and ranges"
    for node in ranged.modules():
        other = mixed.find(node.path)
        assert other.calls == node.calls and other.forward.flops == node.forward.flops, node.path
    assert mixed.find("fc2").forward.flops > 0 and mixed.find("fc1").forward.flops > 0


@pytest.mark.parametrize("module_scopes", ["auto", "ranges"])
def test_threads_torch_does_not_record_get_no_module_calls(module_scopes: str) -> None:
    """memory=True records only the entering thread: a module call on another thread is not in the
    profile, whether its scope is a range (torch drops it) or marks (layerscope drops them)."""
    model = TinyMLP()
    x = torch.randn(8, 8)
    with ls.profile(model, memory=True, module_scopes=module_scopes) as prof:
        worker = threading.Thread(target=lambda: model(x))
        worker.start()
        worker.join()
        model(x).sum().backward()
    p = prof.profile
    p.validate()
    assert p.root.calls == 1 and p.find("fc1").calls == 1
