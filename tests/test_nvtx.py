"""NVTX ranges by module (``nvtx=True``), forward and backward.

On a CPU-only torch the NVTX calls are recorded by a stand-in (and ``nvtx=True`` itself is refused);
on a CUDA build (``.venv-compat`` here: torch 2.14.1+cu130, no GPU needed, NVTX calls are no-ops
without a tool attached) they are recorded *and* passed through to torch's real NVTX calls.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.capture import options as options_module
from layerscope.capture.nvtx_ranges import NvtxApi

CUDA_BUILD = torch.version.cuda is not None


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Block()
        self.b = Block()
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(self.a(x)))


class Boom(Exception):
    pass


class Raising(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fc(x)
        raise Boom("inside forward")


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every NVTX call as (kind, name or handle); passed through to torch on a CUDA build."""
    recorded: list[tuple[str, Any]] = []
    counter = iter(range(1, 10**6))
    names: dict[int, str] = {}

    def push(self: NvtxApi, name: str) -> None:
        recorded.append(("push", name))
        if CUDA_BUILD:
            torch.cuda.nvtx.range_push(name)

    def pop(self: NvtxApi) -> None:
        recorded.append(("pop", None))
        if CUDA_BUILD:
            torch.cuda.nvtx.range_pop()

    def start(self: NvtxApi, name: str) -> int:
        handle = next(counter)
        if CUDA_BUILD:
            torch.cuda.nvtx.range_end(torch.cuda.nvtx.range_start(name))
        names[handle] = name
        recorded.append(("start", name))
        return handle

    def end(self: NvtxApi, handle: int) -> None:
        recorded.append(("end", names.pop(handle)))

    monkeypatch.setattr(NvtxApi, "push", push)
    monkeypatch.setattr(NvtxApi, "pop", pop)
    monkeypatch.setattr(NvtxApi, "start", start)
    monkeypatch.setattr(NvtxApi, "end", end)
    if not CUDA_BUILD:
        monkeypatch.setattr(options_module, "check_nvtx_available", lambda: None)
    return recorded


def forward_names(events: list[tuple[str, Any]]) -> list[str]:
    """Pushed names, checking that pushes and pops balance like a stack."""
    depth = 0
    pushed = []
    for kind, name in events:
        if kind == "push":
            depth += 1
            pushed.append(name)
        elif kind == "pop":
            depth -= 1
            assert depth >= 0
    assert depth == 0
    return pushed


def tree_names(model: nn.Module) -> list[str]:
    return [path or type(model).__name__ for path, _ in model.named_modules()]


def test_forward_and_backward_ranges_follow_the_module_tree(events: list[tuple[str, Any]]) -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 8)
    with ls.profile(model, nvtx=True):
        model(x).sum().backward()
    assert forward_names(events) == tree_names(model)
    started = [name for kind, name in events if kind == "start"]
    ended = [name for kind, name in events if kind == "end"]
    assert sorted(started) == sorted(f"{n} (backward)" for n in tree_names(model))
    assert sorted(ended) == sorted(started)  # every backward range ends, once
    order = [name for kind, name in events if kind == "end"]
    # a module's backward ends after its children's (its last node is one of theirs or later)
    for parent, child in (("Net", "a"), ("Net", "head"), ("a", "a.fc1"), ("b", "b.fc2")):
        assert order.index(f"{parent} (backward)") > order.index(f"{child} (backward)")
    # backward runs the modules in reverse: head's range starts before a's
    assert started.index("head (backward)") < started.index("a.fc1 (backward)")


def test_nvtx_changes_no_result(events: list[tuple[str, Any]]) -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 8)
    expected = model(x)
    expected.sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    with ls.profile(model, nvtx=True):
        got = model(x)
        got.sum().backward()
    assert torch.equal(got, expected)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))


def test_ranges_balance_when_the_block_raises(events: list[tuple[str, Any]]) -> None:
    model, x = Raising(), torch.randn(2, 8)
    with pytest.raises(Boom), ls.profile(model, nvtx=True):
        model(x)
    assert forward_names(events) == ["Raising", "fc"]
    events.clear()
    with pytest.raises(Boom):  # the hooks are gone: no more NVTX calls
        model(x)
    assert events == []


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Linear(8, 8)
        self.right = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.left(x), self.right(x)


def ranges_balanced(events: list[tuple[str, Any]]) -> list[str]:
    starts = [n for k, n in events if k == "start"]
    assert sorted(starts) == sorted(n for k, n in events if k == "end")
    return starts


def test_nodes_that_never_run_end_with_the_backward_pass(events: list[tuple[str, Any]]) -> None:
    """Only the left output's gradient is asked for: the right head's nodes never run, and the
    root's range (which owns them too) ends with the backward pass, not at its last node."""
    model, x = TwoHeads(), torch.randn(2, 8)
    with ls.profile(model, nvtx=True):
        left, _ = model(x)
        left.sum().backward()
        assert ("start", "TwoHeads (backward)") in events
        assert ("end", "TwoHeads (backward)") in events  # by the engine's end-of-pass callback
    starts = ranges_balanced(events)
    assert "right (backward)" not in starts and "left (backward)" in starts


def test_keyword_inputs_bound_a_module_s_backward(events: list[tuple[str, Any]]) -> None:
    """A block called with a keyword tensor owns only its own nodes, not everything upstream."""

    class KeywordBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, *, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = nn.Linear(8, 8)
            self.block = KeywordBlock()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(x=self.pre(x))

    model, x = Chain(), torch.randn(2, 8)
    with ls.profile(model, nvtx=True):
        model(x).sum().backward()
    kinds = [(k, n) for k, n in events if k in ("start", "end")]
    # the block's backward ends before the upstream layer's starts: it does not own it
    assert kinds.index(("end", "block (backward)")) < kinds.index(("start", "pre (backward)"))
    ranges_balanced(events)


def test_a_failing_backward_leaves_no_range_open(events: list[tuple[str, Any]]) -> None:
    class Fails(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            raise Boom("in backward")

    class Breaks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return Fails.apply(self.fc(x))

    model, x = Breaks(), torch.randn(2, 8)
    session = ls.profile(model, nvtx=True)
    with session:
        with pytest.raises(Boom):
            model(x).sum().backward()
        model.fc(x).sum().backward()  # a later backward still opens and ends its ranges
    # the failed pass reached only the root's own node; its range ended all the same
    assert ranges_balanced(events) == ["Breaks (backward)", "fc (backward)"]


def test_a_retained_graph_gets_a_range_per_backward(events: list[tuple[str, Any]]) -> None:
    model, x = nn.Linear(8, 8), torch.randn(2, 8)
    with ls.profile(model, nvtx=True):
        loss = model(x).sum()
        loss.backward(retain_graph=True)
        loss.backward()
    assert ranges_balanced(events) == ["Linear (backward)", "Linear (backward)"]


def test_global_mode_names_modules_by_class(events: list[tuple[str, Any]]) -> None:
    model, x = Net(), torch.randn(4, 8)
    with ls.profile(None, nvtx=True):
        model(x).sum().backward()
    names = forward_names(events)
    assert names[:3] == ["Net", "Net.a", "Net.a.fc1"]
    assert "Net.head (backward)" in [n for k, n in events if k == "start"]


@pytest.mark.skipif(CUDA_BUILD, reason="a CUDA build of torch can emit NVTX")
def test_cpu_only_torch_refuses_nvtx_with_one_line() -> None:
    with pytest.raises(ls.UsageError, match="needs a CUDA build of torch") as info:
        ls.profile(nn.Linear(2, 2), nvtx=True)
    assert "\n" not in str(info.value)
