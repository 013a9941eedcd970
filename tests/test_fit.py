"""``ls.fit`` / ``layerscope estimate --fit`` (issue 37, item 6): the plan is checked by applying it
for real on the CPU and measuring the step's peak."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.analysis.device_specs import DeviceSpec, device_spec
from layerscope.cli import main
from layerscope.estimates import checkpointed
from layerscope.estimates.fit import candidates
from layerscope.models import TinyGPT


def _stack() -> nn.Module:
    """An MLP stack whose activations, not its weights, fill the peak at a large batch."""
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(6)]
    )


def _cpu_with(memory_bytes: int) -> DeviceSpec:
    # key "cpu": the optimizer runs its per-parameter loop, as torch does on the CPU
    return DeviceSpec("cpu", "a small CPU", (), memory_bytes, 20e9, {"fp32": 0.1, "bf16": 0.1})


def _state(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[object], list[bool]]:
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        [m.__dict__.get("forward") for m in model.modules()],
        [m.training for m in model.modules()],
    )


def _measured_peak(model: nn.Module, x: torch.Tensor) -> int:
    """A measured steady-state step: optimizer state exists, grads None before the forward."""
    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        model(x).sum().backward()
        opt.step()

    step()
    opt.zero_grad(set_to_none=True)
    with ls.profile(model, memory=True) as prof:
        step()
    opt.zero_grad(set_to_none=True)
    return prof.profile.memory_at_peak("cpu").absolute_peak_bytes


def test_the_plan_applied_for_real_peaks_where_predicted() -> None:
    torch.manual_seed(0)
    model, make = _stack(), lambda b: torch.randn(b, 64)
    as_is = ls.estimate(model, make(2048), device=_cpu_with(2**40), reserve_bytes=0)
    device = _cpu_with(int(as_is.meta.estimate.peak_bytes * 0.7))  # type: ignore[union-attr]
    before = _state(model)
    plan = ls.fit(model, make, batch=2048, device=device, reserve_bytes=0)
    # the user's model is as it was: weights, forward methods, flags, no hooks, no gradients
    after = _state(model)
    assert all(torch.equal(before[0][k], v) for k, v in after[0].items())
    assert after[1] == before[1] == [None] * len(before[1]) and after[2] == before[2]
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(p.grad is None for p in model.parameters())
    del before, after  # a measured absolute peak counts every live tensor, these clones too

    assert not plan.as_is.fits and plan.fits and plan.checkpoint
    assert plan.planned.peak_bytes < plan.as_is.peak_bytes == as_is.meta.estimate.peak_bytes  # type: ignore[union-attr]
    assert plan.planned.step_us > plan.as_is.step_us and plan.time_cost > 0  # recomputation costs
    assert set(plan.checkpoint) <= {str(k) for k in range(6)}  # whole blocks: no module inside another
    x = make(2048)
    with plan.apply(model):
        measured = _measured_peak(model, x)
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert abs(measured / plan.planned.peak_bytes - 1) < 0.05, (measured, plan.planned.peak_bytes)
    assert _measured_peak(model, x) > plan.usable_bytes  # as is, the measured step does not fit


def test_checkpointing_keeps_outputs_and_gradients() -> None:
    torch.manual_seed(0)
    model, x = _stack(), torch.randn(8, 64)
    model(x).sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad(set_to_none=True)
    with checkpointed(model, ["1", "3.0"]) as same:
        assert same is model
        out = model(x)
        out.sum().backward()
    assert torch.equal(out, model(x))
    assert all(torch.equal(a, p.grad) for a, p in zip(plain, model.parameters(), strict=True))
    with pytest.raises(ls.UsageError, match="no module named 'nope'"), checkpointed(model, ["nope"]):
        pass


def test_alternatives_and_a_step_that_fits_as_is() -> None:
    model, make = _stack(), lambda b: torch.randn(b, 64)
    peak = ls.estimate(model, make(512), device=_cpu_with(2**40), reserve_bytes=0).meta.estimate.peak_bytes  # type: ignore[union-attr]
    tight = ls.fit(model, make, batch=512, device=_cpu_with(peak * 3 // 4), reserve_bytes=0)
    assert tight.bf16 is not None and tight.bf16.peak_bytes < tight.as_is.peak_bytes
    assert tight.smaller_batch is not None and tight.smaller_batch.fits and 0 < tight.max_batch < 512
    assert tight.smaller_batch.name == f"batch {tight.max_batch}"
    roomy = ls.fit(model, make, batch=512, device=_cpu_with(peak * 2), reserve_bytes=0, dtype="bfloat16")
    assert roomy.fits and roomy.checkpoint == () and roomy.planned == roomy.as_is
    assert roomy.bf16 is None and roomy.smaller_batch is None and roomy.max_batch == 512
    assert "checkpoint:" not in str(roomy) and "checkpoint:" in str(tight)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tight.batch = 1  # type: ignore[misc]
    with pytest.raises(ls.UsageError):
        ls.fit(model, make, batch=0, device=_cpu_with(peak))


def test_a_meta_model_is_planned_by_whole_blocks() -> None:
    with torch.device("meta"):
        model = TinyGPT()
    make = lambda b: torch.empty(b, 128, dtype=torch.long, device="meta")  # noqa: E731
    as_is = ls.estimate(model, make(64), device="l4")
    ranked = [c[0] for c in candidates(as_is, 4)]
    assert "blocks" not in ranked  # a ModuleList is never called: checkpointing it does nothing
    usable = as_is.meta.estimate.peak_bytes * 2 // 3  # type: ignore[union-attr]
    reserve = device_spec("l4").memory_bytes - usable
    plan = ls.fit(model, make, batch=64, device="l4", reserve_bytes=reserve)
    assert plan.fits and plan.checkpoint and all(p.startswith("blocks.") for p in plan.checkpoint)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_cli_fit(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "gpt", "--input", "128x128:int64", "--device", "l4", "--fit", "-q"]
    assert main([*args, "--reserve", "22.1"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("does not fit") and "what would make it fit:" in printed
    assert "checkpoint: blocks." in printed and "instead, bfloat16" in printed
    assert main([*args, "--reserve", "1"]) == 0
    assert "it fits as is:" in capsys.readouterr().out
    assert main([*args, "--eval"]) == 0
    assert "--fit plans a training step" in capsys.readouterr().out


class _Once(nn.Module):
    """A block that cannot run again in backward (as one whose forward has side effects)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch._C._current_autograd_node() is not None:
            raise RuntimeError("this block runs once per step")
        return self.body(x)


def test_a_round_that_fails_is_dropped() -> None:
    blocks = _stack()
    model = nn.Sequential(blocks[0], _Once(), blocks[1], blocks[2])
    make = lambda b: torch.randn(b, 64)  # noqa: E731
    peak = ls.estimate(model, make(1024), device=_cpu_with(2**40), reserve_bytes=0).meta.estimate.peak_bytes  # type: ignore[union-attr]
    ranked = [c[0] for c in candidates(ls.estimate(model, make(1024), device=_cpu_with(2**40)), 4)]
    assert ranked[0] == "1"  # the block that fails would be taken first
    plan = ls.fit(model, make, batch=1024, device=_cpu_with(peak * 3 // 4), reserve_bytes=0)
    assert plan.fits and plan.checkpoint and "1" not in plan.checkpoint
    assert all("forward" not in m.__dict__ for m in model.modules())
