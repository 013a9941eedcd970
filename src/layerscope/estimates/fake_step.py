"""One training (or inference) step of a model on fake tensors: nothing of the model's size is made.

The model's parameters and buffers are replaced, for the step only, by fake tensors of the same
shapes (``torch.func.functional_call``: tied weights stay tied, the user's tensors are untouched and
come back when the step ends), on the CPU whatever device or ``meta`` they live on, cast to
``dtype`` when one is given (as ``model.to(dtype)`` would: floating tensors only). The step is the
steady state of a training loop: the optimizer's state exists (one warm-up step on zero gradients
made it, before anything is recorded), gradients are None when the forward begins; then forward,
loss (``loss(output)``, default the sum of the first tensor the model returns), backward and the
optimizer's step.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_leaves, tree_map

from layerscope.errors import UsageError
from layerscope.estimates.storages import INPUT, OPTIMIZER_STATE, PARAMETER, StorageLedger

#: The optimizers an estimate can run by name.
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "adam": torch.optim.Adam,
    "sgd": lambda params, **kw: torch.optim.SGD(params, lr=0.01, **kw),
    "sgd-momentum": lambda params, **kw: torch.optim.SGD(params, lr=0.01, momentum=0.9, **kw),
}

LossFn = Callable[[Any], torch.Tensor]


@dataclass(frozen=True)
class StepSpec:
    """What step to run: training or not, the optimizer's name (None: no optimizer step), the loss
    (None: sum of the first output tensor), the dtype to cast to (None: the model's own), and
    whether the optimizer uses its ``foreach`` kernels (None: torch's default for CPU tensors)."""

    train: bool = True
    optimizer: str | None = "adamw"
    loss: LossFn | None = None
    dtype: torch.dtype | None = None
    foreach: bool | None = None


def first_tensor(out: Any) -> torch.Tensor:
    """The tensor a default loss sums: the output itself, ``logits``, else the first tensor in it."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    found = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    if not found:
        raise UsageError(f"the model returned {type(out).__name__}: no tensor for the default loss to sum")
    return found[0]


def _fake_like(
    mode: FakeTensorMode, tensor: torch.Tensor, dtype: torch.dtype | None, grad: bool | None
) -> torch.Tensor:
    cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    stride = tensor.stride() if tensor.layout == torch.strided else None
    with mode:
        if stride is not None:
            fake = torch.empty_strided(tensor.shape, stride, dtype=cast, device="cpu")
        else:
            fake = torch.empty(tensor.shape, dtype=cast, device="cpu")
    return nn.Parameter(fake, requires_grad=grad) if grad is not None else fake


def fake_state(
    model: nn.Module, mode: FakeTensorMode, spec: StepSpec
) -> tuple[dict[str, torch.Tensor], list[nn.Parameter]]:
    """Fake parameters and buffers by name (one fake per tensor, so tied names share it), and the
    fake parameters that take gradients, in the model's order."""
    made: dict[int, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    trained: list[nn.Parameter] = []
    for name, param in model.named_parameters(remove_duplicate=False):
        fake = made.get(id(param))
        if fake is None:
            grad = spec.train and param.requires_grad
            fake = made[id(param)] = _fake_like(mode, param, spec.dtype, grad)
            if grad:
                trained.append(fake)  # type: ignore[arg-type]
        state[name] = fake
    for name, buffer in model.named_buffers(remove_duplicate=False):
        fake = made.get(id(buffer))
        if fake is None:
            fake = made[id(buffer)] = _fake_like(mode, buffer, spec.dtype, None)
        state[name] = fake
    return state, trained


def fake_inputs(example: Any, mode: FakeTensorMode, dtype: torch.dtype | None) -> Any:
    """The example inputs with every tensor replaced by a fake one of its shape (contiguous)."""

    def fake(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        cast = dtype if dtype is not None and value.is_floating_point() else value.dtype
        with mode:
            return torch.empty(value.shape, dtype=cast, device="cpu")

    return tree_map(fake, example)


def make_optimizer(spec: StepSpec, params: list[nn.Parameter]) -> torch.optim.Optimizer | None:
    """The step's optimizer over the fake parameters (None: no optimizer step)."""
    if not spec.train or spec.optimizer in (None, "none") or not params:
        return None
    factory = OPTIMIZERS.get(str(spec.optimizer).lower())
    if factory is None:
        raise UsageError(f"unknown optimizer {spec.optimizer!r}; choose from {', '.join(OPTIMIZERS)}, none")
    return factory(params, foreach=spec.foreach)


def warm_up(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    inputs: Any,
    optimizer: torch.optim.Optimizer,
    spec: StepSpec,
    mode: FakeTensorMode,
) -> None:
    """One unrecorded step, so that the optimizer's state exists as in a training loop's later
    steps (parameters that get no gradient get no state), then gradients set to None."""
    with mode:
        run_step(model, state, inputs, optimizer, spec)
        optimizer.zero_grad(set_to_none=True)


def adopt_state(
    ledger: StorageLedger,
    state: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer | None,
    inputs: Any,
) -> None:
    """What the step starts with: the model's state, the optimizer's, the inputs."""
    for tensor in state.values():
        ledger.adopt(tensor, PARAMETER)
    if optimizer is not None:
        for per_param in optimizer.state.values():
            for value in per_param.values():
                if isinstance(value, torch.Tensor):
                    ledger.adopt(value, OPTIMIZER_STATE)
    for tensor in tree_leaves(inputs):
        if isinstance(tensor, torch.Tensor):
            ledger.adopt(tensor, INPUT)


def run_step(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    inputs: Any,
    optimizer: torch.optim.Optimizer | None,
    spec: StepSpec,
) -> None:
    """Forward, loss, backward and optimizer step, as a training loop runs them (grads set to None
    first); forward under ``no_grad`` when not training. Run inside the fake and recording modes."""
    args, kwargs = (inputs, {}) if isinstance(inputs, tuple) else ((), inputs)
    if spec.train:
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        out = torch.func.functional_call(model, state, args, kwargs, tie_weights=True, strict=False)
        loss = spec.loss(out) if spec.loss is not None else first_tensor(out).sum()
        del out  # a training loop keeps only the loss
        loss.backward()  # type: ignore[no-untyped-call]
        del loss
        if optimizer is not None:
            optimizer.step()
    else:
        with torch.no_grad():
            torch.func.functional_call(model, state, args, kwargs, tie_weights=True, strict=False)


def as_call(example_inputs: Any) -> tuple[Any, ...] | dict[str, Any]:
    """Example inputs as a call's positional arguments (a tuple) or keyword arguments (a dict)."""
    if isinstance(example_inputs, dict):
        return dict(example_inputs)
    if isinstance(example_inputs, list | tuple):
        return tuple(example_inputs)
    return (example_inputs,)


def training_flags(model: nn.Module, train: bool, stack: ExitStack) -> None:
    """Put the model in training (or eval) mode for the step; ``stack`` restores every module's flag."""
    flags = [(m, m.training) for m in model.modules()]
    model.train(train)

    def restore() -> None:
        for module, flag in flags:
            module.training = flag

    stack.callback(restore)
