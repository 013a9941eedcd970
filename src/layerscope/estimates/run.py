"""One step on fake tensors under the recorder, and what an estimate's arguments resolve to.

The step runs on the CPU on fake tensors (``FakeTensorMode``) whatever the
model's size or device (a model built under ``torch.device("meta")`` works); a dispatch mode sees
every aten op (``recorder.py``), module hooks and the autograd graph say where each runs
(``scopes.py``), and the storages the fake tensors would hold are counted (``storages.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from layerscope.analysis.device_specs import DeviceSpec, device_spec
from layerscope.errors import UsageError
from layerscope.estimates.cpu_spec import cpu_spec
from layerscope.estimates.fake_step import (
    StepSpec,
    adopt_state,
    as_call,
    fake_inputs,
    fake_state,
    make_optimizer,
    run_step,
    training_flags,
    warm_up,
)
from layerscope.estimates.op_costs import OpCoster
from layerscope.estimates.recorder import StepRecorder
from layerscope.estimates.scopes import BACKWARD, FORWARD, ScopeTracker
from layerscope.estimates.storages import ACTIVATION, GRADIENT, INPUT, PARAMETER, StorageLedger

#: Memory kept back from a device's total before a peak is said to fit: 5% plus 512 MiB (the
#: CUDA context and kernels' workspaces, the caching allocator's fragmentation).
RESERVE_FRACTION = 0.05
RESERVE_BYTES = 512 * 2**20


def usable_bytes(spec: DeviceSpec, reserve_bytes: int | None = None) -> int:
    """What a predicted peak may reach on ``spec``: its memory less the reserve (given, or the
    documented default: :data:`RESERVE_FRACTION` of it plus :data:`RESERVE_BYTES`)."""
    reserve = (
        reserve_bytes
        if reserve_bytes is not None
        else int(spec.memory_bytes * RESERVE_FRACTION) + RESERVE_BYTES
    )
    return max(0, spec.memory_bytes - reserve)


def resolve_device(device: str | DeviceSpec) -> DeviceSpec:
    """``"cpu"`` (this machine, measured once and cached), a key of the spec table, or a spec."""
    if isinstance(device, str) and device.lower() == "cpu":
        return cpu_spec()
    try:
        return device_spec(device)
    except UsageError as exc:
        raise UsageError(str(exc).replace("choose from ", "choose from cpu, ", 1)) from None


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"bfloat16"``, ``"bf16"``, ``torch.bfloat16`` -> the dtype; None stays None."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    short = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "fp64": "float64"}
    found = getattr(torch, short.get(str(dtype).lower(), str(dtype).lower()), None)
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise UsageError(f"unknown dtype {dtype!r}; use a floating dtype such as bfloat16, float16, float32")
    return found


@dataclass
class FakeRun:
    """What one fake step left: the recorder (ops and sums), scopes, storages, bytes saved."""

    recorder: StepRecorder
    ledger: StorageLedger
    scopes: ScopeTracker
    saved: dict[str, dict[str, int]]
    #: bytes per category live when the step ended (its temporaries freed)
    end_bytes: dict[str, int]


def _saved_hook(
    scopes: ScopeTracker, ledger: StorageLedger, saved: dict[str, dict[str, int]]
) -> Callable[[torch.Tensor], Any]:
    seen: dict[str, set[int]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        category = ledger.category_of(tensor)
        if not scopes.stack or category is None:
            return tensor
        path = scopes.stack[-1].path
        ref_key = ledger.key_of(tensor)
        if ref_key is None or ref_key in seen.setdefault(path, set()):
            return tensor
        seen[path].add(ref_key)
        kind = category if category in (PARAMETER, INPUT) else ACTIVATION
        nbytes = ledger.mark(tensor, ACTIVATION) if kind == ACTIVATION else ledger.nbytes_of(tensor)
        figures = saved.setdefault(path, {ACTIVATION: 0, PARAMETER: 0, INPUT: 0})
        figures[kind] += nbytes
        return tensor

    return pack


def _failed(exc: Exception) -> UsageError:
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return UsageError(f"the step failed on fake tensors: {type(exc).__name__}: {first_line}")


def fake_run(model: nn.Module, example_inputs: Any, step: StepSpec, coster: OpCoster) -> FakeRun:
    """Run one step on fake tensors under the recorder (after an unrecorded warm-up step that
    makes the optimizer's state, as a training loop's first step does)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    state, trained = fake_state(model, mode, step)
    inputs = fake_inputs(as_call(example_inputs), mode, step.dtype)
    optimizer = make_optimizer(step, trained)
    ledger = StorageLedger()
    scopes = ScopeTracker(ledger)
    recorder = StepRecorder(coster, ledger, scopes)
    saved: dict[str, dict[str, int]] = {}

    def keep_grad(param: torch.Tensor) -> None:
        if param.grad is not None:
            ledger.mark(param.grad, GRADIENT, keep=True)

    with ExitStack() as stack:
        training_flags(model, step.train, stack)
        stack.enter_context(_quiet_meta_failures())
        try:
            if optimizer is not None:
                warm_up(model, state, inputs, optimizer, step, mode)
            adopt_state(ledger, state, optimizer, inputs)
            for param in trained:
                param.register_post_accumulate_grad_hook(keep_grad)  # type: ignore[no-untyped-call]
            scopes.hooks(dict(model.named_modules()), stack)
            pack = _saved_hook(scopes, ledger, saved)
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
            with mode, recorder:
                run_step(model, state, inputs, optimizer, step)
        except UsageError:
            raise
        except Exception as exc:
            raise _failed(exc) from exc
        ledger.sweep()
        end = ledger.live_by_category()
    overhead = coster.spec.module_overhead_us
    recorder.record.charge_module_calls(scopes.calls, FORWARD, overhead)
    recorder.record.charge_module_calls(scopes.recompute_calls, BACKWARD, overhead)
    return FakeRun(recorder, ledger, scopes, saved, end)


@contextmanager
def _quiet_meta_failures() -> Iterator[None]:
    """FakeTensorMode logs a traceback at ERROR level when an op's meta kernel raises, before the
    exception propagates; the estimate reports that exception in one line (``_failed``), so the
    log record is dropped while the step runs."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")

    def drop(record: logging.LogRecord) -> bool:
        return False

    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)
