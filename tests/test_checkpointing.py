"""Activation checkpointing: the recomputation is backward work, and FLOPs are the ones that ran.

FlopCounterMode is the reference: it counts at the dispatcher below autograd, so an op that
non-reentrant checkpointing stopped in before its kernel ran is not counted there, and must not be
here (attribution/recompute.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

import layerscope as ls


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.b = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.act(self.a(x)))


class Checkpointed(nn.Module):
    def __init__(self, use_reentrant: bool) -> None:
        super().__init__()
        self.use_reentrant = use_reentrant
        self.blocks = nn.ModuleList([Block() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.use_reentrant)
        return x


def reference_flops(model: nn.Module, x: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def profiled(model: nn.Module, x: torch.Tensor, **options: object) -> ls.Profile:
    with ls.profile(model, **options) as prof:  # type: ignore[arg-type]
        model(x).sum().backward()
    p = prof.profile
    p.validate()
    return p


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non-reentrant"])
@pytest.mark.parametrize("module_scopes", ["auto", "hooks"])
def test_flops_match_flop_counter_and_recomputation_is_backward(
    use_reentrant: bool, module_scopes: str
) -> None:
    model = Checkpointed(use_reentrant)
    x = torch.randn(8, 16, requires_grad=True)
    theirs = reference_flops(model, x)
    p = profiled(model, x, module_scopes=module_scopes)
    assert p.totals.flops == theirs
    block = p.find("blocks.0")
    assert (block.calls, block.recompute_calls) == (1, 1)
    linear = p.find("blocks.0.a")
    assert (linear.calls, linear.recompute_calls) == (1, 1)
    # the forward holds one forward's FLOPs; the recomputation's are in the backward
    assert linear.forward.flops == 2 * 8 * 16 * 32
    assert linear.backward.flops == 2 * 2 * 8 * 16 * 32 + linear.forward.flops
    stopped = p.find("blocks.0.b")  # the op the early stop hit never computed
    assert stopped.backward.flops == 2 * 2 * 8 * 32 * 16 + (use_reentrant and stopped.forward.flops)


def test_without_early_stop_the_whole_recomputation_counts() -> None:
    model = Checkpointed(use_reentrant=False)
    x = torch.randn(8, 16, requires_grad=True)
    with set_checkpoint_early_stop(False):
        theirs = reference_flops(model, x)
        p = profiled(model, x)
    assert p.meta.environment.checkpoint_early_stop is False
    assert p.totals.flops == theirs


def test_recompute_calls_survive_save_and_load(tmp_path: Path) -> None:
    model = Checkpointed(use_reentrant=False)
    p = profiled(model, torch.randn(4, 16, requires_grad=True))
    path = p.save(tmp_path / "p.json.gz")
    loaded = ls.load(path)
    assert [n.recompute_calls for n in loaded.root.walk()] == [n.recompute_calls for n in p.root.walk()]
    assert loaded.find("blocks.1.act").recompute_calls == 1


def biased() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))


def square_bias_free(frozen: bool) -> Callable[[], nn.Module]:
    """The backward's own mm has the forward mm's name and shapes here (LoRA-like projections)."""

    def make() -> nn.Module:
        model = nn.Sequential(nn.Linear(16, 16, bias=False), nn.Tanh(), nn.Linear(16, 16, bias=False))
        return model.requires_grad_(not frozen)

    return make


@pytest.mark.parametrize(
    "make", [biased, square_bias_free(False), square_bias_free(True)], ids=["biased", "square", "frozen"]
)
def test_a_double_backward_keeps_its_flops(make: Callable[[], nn.Module]) -> None:
    """A gradient penalty runs autograd-recorded ops inside backward nodes: no recomputation there."""
    model = make()
    leaf = torch.randn(16, 16, requires_grad=True)

    def step() -> None:
        x = leaf * 1.0  # not a leaf: FlopCounterMode's module tracker refuses leaves in autograd.grad
        (grad,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)
        grad.pow(2).sum().backward()

    with FlopCounterMode(display=False) as counter:
        step()
    with ls.profile(model) as prof:
        step()
    p = prof.profile
    p.validate()
    assert p.totals.flops == counter.get_total_flops()
    assert all(n.recompute_calls == 0 for n in p.root.walk())


#: FlopCounterMode has no formula for the CPU flash-attention kernels torch's SDPA runs on CPU; we
#: count them (``capture/flops.py``). Everything else must agree exactly.
NOT_IN_FLOP_COUNTER = (
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
)


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_transformers_llama_under_checkpointing_counts_what_ran(use_reentrant: bool) -> None:
    pytest.importorskip("transformers")
    from tests.test_program_unchanged import llama_step, tiny_llama

    model = tiny_llama(use_reentrant)
    with FlopCounterMode(display=False) as counter:
        llama_step(model)
    with ls.profile(model) as prof:
        llama_step(model)
    p = prof.profile
    p.validate()
    extra = sum(r.metrics.self_flops for r in p.ops(limit=None) if r.name in NOT_IN_FLOP_COUNTER)
    # (none where this torch's SDPA takes the math path on the CPU, as 2.11 did)
    assert p.totals.flops - extra == counter.get_total_flops()
    attention = p.find("model.layers.1.self_attn")
    assert (attention.calls, attention.recompute_calls) == (1, 1)


def test_validate_catches_impossible_recompute_counts() -> None:
    from dataclasses import replace

    from layerscope.errors import ValidationError

    model = Block()
    with ls.profile(model) as prof:  # forward only: no module has backward time
        model(torch.randn(4, 16))
    p = prof.profile
    p.validate()

    def with_first_child(**changes: int) -> ls.Profile:
        first = replace(p.root.children[0], **changes)
        return replace(p, root=replace(p.root, children=(first, *p.root.children[1:])))

    with pytest.raises(ValidationError, match="negative calls"):
        with_first_child(recompute_calls=-1).validate()
    # a recomputation with no backward time is not an error: a zero-length call (a clock tick
    # shorter than the module) reruns in no time (tests/test_properties.py has the case)
    with_first_child(recompute_calls=1).validate()
