"""``ls.estimate`` and ``ls.max_batch_size``: answers before running (docs/estimate.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from layerscope.analysis.device_specs import DeviceSpec
from layerscope.capture.module_catalog import model_catalog
from layerscope.errors import UsageError
from layerscope.estimates.build import estimate_profile, memory_report
from layerscope.estimates.fake_step import LossFn, StepSpec
from layerscope.estimates.op_costs import OpCoster
from layerscope.estimates.run import FakeRun, fake_run, resolve_device, resolve_dtype, usable_bytes
from layerscope.model.meta import EstimateInfo
from layerscope.model.profile import Profile


def _step_spec(
    train: bool, optimizer: str | None, loss: LossFn | None, dtype: str | torch.dtype | None, spec: DeviceSpec
) -> StepSpec:
    # On an accelerator torch's optimizers default to their foreach kernels; on the CPU to a loop.
    foreach = None if spec.key == "cpu" else True
    return StepSpec(train, optimizer, loss, resolve_dtype(dtype), foreach)


def _module_bytes(run: FakeRun) -> dict[str, tuple[int, int]]:
    """Per module, the bytes its own ops moved, forward and backward."""
    out: dict[str, tuple[int, int]] = {}
    for (path, phase), sums in run.recorder.record.modules.items():
        forward, backward = out.get(path, (0, 0))
        out[path] = (
            (forward + sums.bytes, backward) if phase == "forward" else (forward, backward + sums.bytes)
        )
    return out


def estimate(
    model: nn.Module,
    example_inputs: Any,
    *,
    train: bool = True,
    optimizer: str | None = "adamw",
    loss: LossFn | None = None,
    dtype: str | torch.dtype | None = None,
    device: str | DeviceSpec = "h100-sxm",
    reserve_bytes: int | None = None,
) -> Profile:
    """Predict one step of ``model`` on ``device`` without running it: a :class:`Profile` whose
    ``meta.source`` is ``estimate`` and ``meta.estimate`` the device spec and step it assumed.

    ``example_inputs``: a tensor, a tuple of positional arguments or a dict of keyword arguments
    (tensors may be real, meta or fake: only shapes and dtypes are read). ``train``: forward,
    ``loss(output)`` (default: the sum of the first output tensor), backward and an ``optimizer``
    step (``adamw``, ``adam``, ``sgd``, ``sgd-momentum``, or None), in the steady state (optimizer
    state exists, gradients None before the forward); else a forward under ``no_grad``. ``dtype``
    casts floating parameters, buffers and inputs (None: as they are). ``device``: a key of the
    spec table (``h100-sxm``...), ``"cpu"`` (this machine, measured once and cached), or a
    :class:`DeviceSpec`. ``reserve_bytes``: memory kept back when saying whether the peak fits
    (default: 5% of the device's plus 512 MiB)."""
    started = time.perf_counter()
    spec = resolve_device(device)
    step = _step_spec(train, optimizer, loss, dtype, spec)
    accelerator = spec.key != "cpu"
    coster = OpCoster(
        spec,
        tf32=accelerator and torch.get_float32_matmul_precision() != "highest",
        tf32_conv=accelerator and bool(torch.backends.cudnn.allow_tf32),
    )
    run = fake_run(model, example_inputs, step, coster)
    device_class = spec.key != "cpu"
    report = memory_report(run.ledger, run.scopes, run.saved, device_class)
    catalog = model_catalog(dict(model.named_modules()), run.scopes.first_shapes)
    usable = usable_bytes(spec, reserve_bytes)
    peak = run.ledger.peak.live_bytes
    info = EstimateInfo(
        device=spec.key,
        device_name=spec.name,
        memory_bytes=spec.memory_bytes,
        bandwidth_bytes_per_s=spec.bandwidth_bytes_per_s,
        peak_tflops=dict(spec.peak_tflops),
        op_overhead_us=spec.op_overhead_us,
        view_overhead_us=spec.view_overhead_us,
        train=train,
        optimizer=step.optimizer if train else None,
        dtype=str(step.dtype).removeprefix("torch.") if step.dtype is not None else None,
        time_field="device_us" if device_class else "cpu_us",
        peak_bytes=peak,
        usable_bytes=usable,
        fits=peak <= usable,
        wall_s=time.perf_counter() - started,
        module_bytes=_module_bytes(run),
        state_bytes={
            k: v
            for k, v in run.end_bytes.items()
            if k in ("parameter", "gradient", "optimizer_state", "input")
        },
    )
    return estimate_profile(catalog, run.recorder.record, run.scopes, report, info, type(model).__name__)


@dataclass(frozen=True)
class BatchSearch:
    """What :func:`search_batch` found: the largest batch that fits (0: not even 1), its
    predicted peak, the memory a peak may use, and every batch tried with its predicted peak."""

    max_batch: int
    peak_bytes: int | None
    usable_bytes: int
    tried: dict[int, int] = field(default_factory=dict)
    #: True when the search stopped at ``limit`` with the batch still fitting
    at_limit: bool = False


def predicted_peak(model: nn.Module, inputs: Any, step: StepSpec, spec: DeviceSpec) -> int:
    """The predicted absolute peak of one step (no profile is built)."""
    return fake_run(model, inputs, step, OpCoster(spec)).ledger.peak.live_bytes


def search_batch(
    model: nn.Module,
    make_inputs: Callable[[int], Any],
    *,
    device: str | DeviceSpec = "h100-sxm",
    train: bool = True,
    optimizer: str | None = "adamw",
    loss: LossFn | None = None,
    dtype: str | torch.dtype | None = None,
    reserve_bytes: int | None = None,
    limit: int = 1 << 16,
) -> BatchSearch:
    """Doubling from 1 until the predicted peak no longer fits (or ``limit``), then bisection:
    the largest batch whose peak fits, assuming the peak grows with the batch."""
    if limit < 1:
        raise UsageError(f"limit must be >= 1, not {limit}")
    spec = resolve_device(device)
    step = _step_spec(train, optimizer, loss, dtype, spec)
    usable = usable_bytes(spec, reserve_bytes)
    tried: dict[int, int] = {}

    def fits(batch: int) -> bool:
        if batch not in tried:
            tried[batch] = predicted_peak(model, make_inputs(batch), step, spec)
        return tried[batch] <= usable

    good, bad = 0, None
    batch = 1
    while batch <= limit:
        if not fits(batch):
            bad = batch
            break
        good, batch = batch, batch * 2
    if bad is None and good < limit:
        if fits(limit):
            good = limit
        else:
            bad = limit
    if bad is not None:
        while bad - good > 1:
            middle = (good + bad) // 2
            good, bad = (middle, bad) if fits(middle) else (good, middle)
    return BatchSearch(good, tried.get(good), usable, tried, at_limit=good == limit)


def max_batch_size(
    model: nn.Module,
    make_inputs: Callable[[int], Any],
    *,
    device: str | DeviceSpec = "h100-sxm",
    train: bool = True,
    optimizer: str | None = "adamw",
    loss: LossFn | None = None,
    dtype: str | torch.dtype | None = None,
    reserve_bytes: int | None = None,
    limit: int = 1 << 16,
) -> int:
    """The largest batch (``make_inputs(batch)`` gives a step's inputs) whose predicted peak fits
    ``device``'s memory less the reserve (default 5% plus 512 MiB); 0 when batch 1 does not fit.
    Searched on fake tensors (:func:`search_batch` keeps every batch tried)."""
    return search_batch(
        model,
        make_inputs,
        device=device,
        train=train,
        optimizer=optimizer,
        loss=loss,
        dtype=dtype,
        reserve_bytes=reserve_bytes,
        limit=limit,
    ).max_batch
