"""One zoo case, run every way the checks need, once: unprofiled, profiled, under torch's
``FlopCounterMode``, and profiled with memory.

Eager models run unprofiled first (the reference, which also warms the model up), then profiled from
the same RNG state and weights (gradients reset to None in between). A compiled model is compiled
once, inside the profiled block, as a user would; the unprofiled run follows with the same compiled
code and must compile nothing more. Then FlopCounterMode, and last a ``memory=True`` capture, with
the CPU storages live at its entry found first (one pass over the GC's objects); what the test keeps
of the earlier runs is bytes, no tensor.
"""

from __future__ import annotations

import contextlib
import gc
import pickle
import random
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils.flop_counter import FlopCounterMode

import layerscope as ls
from tests.realmodels.models import Case

STEP_SEED = 1234  # the RNG state every step starts from (dropout draws from it)
INPUT_SEED = 1


@dataclass
class StepResult:
    """What one training step produced, as bytes: the loss, the logits, every gradient and the RNG
    states after it (torch's, NumPy's: Wav2Vec2's masks draw from it, Python's). Bytes, not tensor
    copies: equal bytes is bit-identical, and copies would be tensors alive at the next capture."""

    values: dict[str, bytes | None]
    #: forward calls of the case's counted module type (None: nothing counted)
    counted_calls: int | None
    #: Dynamo frames compiled during the step
    compiled_frames: int


def _bits(tensor: torch.Tensor | None) -> bytes | None:
    if tensor is None:
        return None
    flat = tensor.detach().reshape(-1).contiguous()
    return repr((tensor.dtype, tuple(tensor.shape))).encode() + flat.view(torch.uint8).numpy().tobytes()


def _snapshot(out: Any, model: nn.Module) -> dict[str, bytes | None]:
    values: dict[str, bytes | None] = {"loss": _bits(out.loss), "logits": _bits(getattr(out, "logits", None))}
    values.update({f"grad {name}": _bits(p.grad) for name, p in model.named_parameters()})
    values["torch RNG"] = _bits(torch.get_rng_state())
    values["NumPy RNG"] = pickle.dumps(np.random.get_state())
    values["Python RNG"] = repr(random.getstate()).encode()
    return values


@dataclass
class ZooRun:
    """Everything the checks read about one case. A step that raised keeps its traceback instead."""

    case: Case
    model: nn.Module | None = None
    reference: StepResult | None = None
    profiled: StepResult | None = None
    session: Any = None  # ls.profile of the default capture
    flop_counter_total: int | None = None
    memory_session: Any = None  # ls.profile(memory=True)
    #: CPU storages live when the memory capture began, address to bytes
    alive_at_entry: dict[int, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def release(self) -> None:
        """Drops the model and the captures: pytest keeps the last failure's traceback (and with it
        this run) alive, and a model alive at the next case's capture is memory it finds live."""
        self.model = self.session = self.memory_session = None
        self.alive_at_entry = {}

    @property
    def profile(self) -> ls.Profile | None:
        """The default capture's profile (None when it raised)."""
        return None if self.session is None else self.session.profile

    @property
    def memory_profile(self) -> ls.Profile | None:
        """The memory capture's profile (None when it raised)."""
        return None if self.memory_session is None else self.memory_session.profile


@contextlib.contextmanager
def _counting(model: nn.Module, type_name: str | None) -> Iterator[list[int]]:
    """Counts forward calls of every submodule of class ``type_name`` with a forward hook on each:
    hooks on an inner module leave its layer's code (and transformers' checkpointing) as it is."""
    calls = [0]
    handles = []
    if type_name is not None:
        for module in model.modules():
            if type(module).__name__ == type_name:
                handles.append(module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1)))
        assert handles, f"no {type_name} in the model"
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def _frames() -> int:
    return int(counters["stats"]["unique_graphs"])


def _seed_everything() -> None:
    torch.manual_seed(STEP_SEED)
    np.random.seed(STEP_SEED)
    random.seed(STEP_SEED)


def train_step(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    case: Case,
    around: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> tuple[StepResult, Any]:
    """One step from the zoo's RNG state, ``loss = model(**inputs).loss; loss.backward()``, inside
    ``around()`` (a profiler, FlopCounterMode, or nothing); returns what it produced, copied out
    after the block as bytes, and what ``around()`` gave. The gradients are then reset to None."""
    _seed_everything()
    frames = _frames()
    with _counting(model, case.counted) as calls, around() as session:
        out = model(**inputs)
        loss = out.loss
        loss.backward()
    result = StepResult(_snapshot(out, model), calls[0] if case.counted else None, _frames() - frames)
    model.zero_grad(set_to_none=True)
    return result, session


def _attempt(run: ZooRun, what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        run.errors[what] = traceback.format_exc(limit=-6)
        return None


def _profiled(run: ZooRun, model: nn.Module, inputs: dict[str, torch.Tensor]) -> None:
    done = _attempt(
        run, "profiled run", lambda: train_step(model, inputs, run.case, lambda: ls.profile(model))
    )
    if done is not None:
        run.profiled, run.session = done


def _unprofiled(run: ZooRun, model: nn.Module, inputs: dict[str, torch.Tensor]) -> None:
    done = _attempt(run, "unprofiled run", lambda: train_step(model, inputs, run.case))
    if done is not None:
        run.reference = done[0]


def _flop_count(model: nn.Module, inputs: dict[str, torch.Tensor], case: Case) -> int:
    # A compiled model is counted on the eager module it wraps (same weights): a dispatch mode
    # around compiled code would make Dynamo compile again.
    eager = getattr(model, "_orig_mod", model)
    _, counter = train_step(eager, inputs, case, lambda: FlopCounterMode(display=False))
    return int(counter.get_total_flops())


def cpu_storages_alive() -> dict[int, int]:
    """Every CPU tensor storage reachable from Python now, address to bytes (one pass over the GC's
    objects): what a capture starting now finds live."""
    gc.collect()  # garbage of earlier cases would count as live, and be freed inside the block
    found: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on deprecated aliases (torch.distributed.reduce_op)
        warnings.simplefilter("ignore")
        objects = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in objects:
        # fake and functional tensors (Dynamo keeps some after compiling) have no memory behind them
        if isinstance(obj, FakeTensor | FunctionalTensor) or obj.device.type != "cpu" or obj.is_meta:
            continue
        if obj.layout == torch.strided and obj.untyped_storage().nbytes():
            found[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
    return found


def _memory(run: ZooRun, model: nn.Module, inputs: dict[str, torch.Tensor]) -> None:
    def capture() -> Any:
        run.alive_at_entry = cpu_storages_alive()
        return ls.profile(model, memory=True)

    done = _attempt(run, "memory run", lambda: train_step(model, inputs, run.case, capture))
    if done is not None:
        run.memory_session = done[1]


def run_case(case: Case) -> ZooRun:
    """Builds the case's model and runs it every way the checks read."""
    run = ZooRun(case)
    inputs = case.inputs(torch.Generator().manual_seed(INPUT_SEED))
    torch.manual_seed(0)
    if case.compiled:
        torch._dynamo.reset()
        counters.clear()
    model = run.model = case.build()
    model.train()
    if case.compiled:  # compiled inside the profiled block, as a user would
        _profiled(run, model, inputs)
        _unprofiled(run, model, inputs)
    else:  # the unprofiled run also warms the model up
        _unprofiled(run, model, inputs)
        _profiled(run, model, inputs)
    run.flop_counter_total = _attempt(run, "FlopCounterMode run", lambda: _flop_count(model, inputs, case))
    _memory(run, model, inputs)
    return run
