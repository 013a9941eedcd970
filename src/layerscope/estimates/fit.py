"""``ls.fit``: what to do when a step's predicted peak does not fit the device (docs/estimate.md).

The plan is activation checkpointing: candidates are the modules whose subtree saves activations
for backward, ranked by the bytes checkpointing would free (what the subtree saves, less the inputs
the checkpoint keeps) per forward FLOP it recomputes; they are taken greedily, never one inside or
around one already taken, and the step is estimated again with the plan applied (on fake tensors,
the model's own forward put back afterwards) until the predicted peak fits or the candidates run
out. Beside it, what bf16 and the largest batch that fits as is would give.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from layerscope.analysis.device_specs import DeviceSpec
from layerscope.errors import UsageError
from layerscope.estimates.api import estimate, search_batch
from layerscope.estimates.checkpointing import checkpointed
from layerscope.estimates.fake_step import LossFn
from layerscope.estimates.run import resolve_device, resolve_dtype
from layerscope.model.profile import Profile
from layerscope.units import fmt_bytes, fmt_time_us


@dataclass(frozen=True)
class FitOption:
    """One way to run the step and what it is predicted to give: ``name`` says which (``as is``,
    ``checkpoint 3 modules``, ``bfloat16``, ``batch 12``), then the absolute peak in bytes, the
    step's predicted time in µs (device time, or CPU time for ``device="cpu"``) and whether the
    peak fits the usable memory."""

    name: str
    peak_bytes: int
    step_us: float
    fits: bool


@dataclass(frozen=True)
class FitPlan:
    """What :func:`fit` proposes for ``batch`` on ``device``: the modules to checkpoint (empty when
    the step fits as is, or nothing helps), the step as is and with the plan, and instead of it,
    bf16 (None when the step already runs in a 16-bit dtype) and the largest batch that fits as is
    (``max_batch``, 0: not even 1; ``smaller_batch`` its figures, None when 0)."""

    device: str
    device_name: str
    batch: int
    usable_bytes: int
    checkpoint: tuple[str, ...]
    as_is: FitOption
    planned: FitOption
    bf16: FitOption | None
    max_batch: int
    smaller_batch: FitOption | None

    @property
    def fits(self) -> bool:
        """Whether the step fits with the plan applied."""
        return self.planned.fits

    @property
    def time_cost(self) -> float:
        """The plan's predicted step time over the step's as is, less one (0.25: 25% slower)."""
        return self.planned.step_us / self.as_is.step_us - 1 if self.as_is.step_us else 0.0

    def apply(self, model: nn.Module) -> AbstractContextManager[nn.Module]:
        """A context within which ``model``'s planned modules run under activation checkpointing
        (``torch.utils.checkpoint``); their ``forward`` is put back on exit."""
        return checkpointed(model, self.checkpoint)

    def lines(self) -> list[str]:
        """The plan in a few lines, as ``layerscope estimate --fit`` prints it."""

        def option(o: FitOption) -> str:
            verdict = "fits" if o.fits else "does not fit"
            return f"{o.name}: peak {fmt_bytes(o.peak_bytes)}, step {fmt_time_us(o.step_us)}, {verdict}"

        head = f"batch {self.batch} on {self.device_name}, {fmt_bytes(self.usable_bytes)} usable"
        out = [head, "  " + option(self.as_is)]
        if self.checkpoint:
            out.append(f"  {option(self.planned)} ({self.time_cost:+.0%} time)")
            out.append("    checkpoint: " + ", ".join(self.checkpoint))
        elif not self.as_is.fits:
            out.append("  checkpointing cannot bring the peak down: its activations are not what fills it")
        for other in (self.bf16, self.smaller_batch):
            if other is not None:
                out.append("  instead, " + option(other))
        if self.smaller_batch is None and not self.as_is.fits:
            out.append("  instead, no smaller batch fits as is")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _step_us(profile: Profile) -> float:
    info = profile.meta.estimate
    assert info is not None
    return float(getattr(profile.totals, info.time_field))


def _option(name: str, profile: Profile) -> FitOption:
    info = profile.meta.estimate
    assert info is not None
    return FitOption(name, info.peak_bytes, _step_us(profile), info.fits)


def _input_bytes(shapes: str | None, element_size: int) -> int:
    if not shapes:
        return 0
    total = 0
    for dims in json.loads(shapes):
        count = 1
        for d in dims:
            count *= int(d)
        total += count
    return total * element_size


def candidates(profile: Profile, element_size: int) -> list[tuple[str, int, int]]:
    """(module path, bytes freed, forward FLOPs recomputed) of every called module but the root
    whose checkpointing would free bytes: what its subtree saves for backward as activations, less its
    inputs (a checkpoint keeps them); best first by bytes freed per FLOP, modules that do no
    FLOPs (norms, activations, embeddings: their recomputation is memory-bound, not free) after
    those that do, by bytes freed."""
    saved = profile.memory_at_peak().saved
    found = []
    for node in profile.modules():
        if not node.path or not node.calls:  # the root; containers never called (ModuleList)
            continue
        prefix = node.path + "."
        kept = sum(
            figures.get("activation", 0)
            for path, figures in saved.items()
            if path == node.path or path.startswith(prefix)
        )
        freed = kept - _input_bytes(node.input_shapes, element_size)
        if freed > 0:
            found.append((node.path, freed, node.forward.flops))
    found.sort(key=lambda c: (c[2] == 0, -c[1] / max(c[2], 1), -c[1]))
    return found


def _inside(path: str, chosen: list[str]) -> bool:
    """Whether ``path`` is one of ``chosen`` or inside one (its checkpoint already covers it)."""
    return any(path == c or path.startswith(c + ".") for c in chosen)


def _held(path: str, chosen: list[str]) -> list[str]:
    """The chosen modules inside ``path``: checkpointing ``path`` covers them, so it replaces them."""
    return [c for c in chosen if c.startswith(path + ".")]


def _element_size(model: nn.Module, dtype: torch.dtype | None) -> int:
    if dtype is not None:
        return dtype.itemsize
    floating = next((p for p in model.parameters() if p.is_floating_point()), None)
    return floating.element_size() if floating is not None else 4


def plan_checkpoints(
    model: nn.Module, inputs: Any, as_is: Profile, element_size: int, rounds: int = 8, **options: Any
) -> tuple[tuple[str, ...], Profile]:
    """Greedy: take candidates until their bytes freed cover the excess over the usable memory,
    estimate again with them checkpointed, and go on until it fits, none is left, or ``rounds``
    estimates were made; a round that does not lower the peak, or fails, is dropped (its candidates
    too)."""
    info = as_is.meta.estimate
    assert info is not None
    ranked = candidates(as_is, element_size)
    freed_by = {path: freed for path, freed, _ in ranked}
    chosen: list[str] = []
    best, peak = as_is, info.peak_bytes
    for _ in range(rounds):
        if peak <= info.usable_bytes:
            break
        # a module holding chosen ones replaces them (fine-grained modules rank first by bytes per
        # FLOP, and must not keep the larger module around them out of the plan)
        trial_set, covered = list(chosen), 0
        for path, freed, _ in ranked:
            if covered >= peak - info.usable_bytes:
                break
            if not _inside(path, trial_set):
                held = _held(path, trial_set)
                trial_set = [c for c in trial_set if c not in held] + [path]
                covered += freed - sum(freed_by.get(c, 0) for c in held)
        added = [c for c in trial_set if c not in chosen]
        if not added:
            break
        ranked = [c for c in ranked if c[0] not in added]
        try:
            with checkpointed(model, trial_set, rebind=True):
                trial = estimate(model, inputs, **options)
        except UsageError:  # a forward checkpoint cannot wrap (non-tensor outputs it must replay)
            continue
        trial_peak = trial.meta.estimate.peak_bytes  # type: ignore[union-attr]
        if trial_peak < peak:
            chosen = trial_set
            best, peak = trial, trial_peak
    return tuple(chosen), best


def fit(
    model: nn.Module,
    make_inputs: Callable[[int], Any],
    *,
    batch: int,
    device: str | DeviceSpec = "h100-sxm",
    optimizer: str | None = "adamw",
    loss: LossFn | None = None,
    dtype: str | torch.dtype | None = None,
    reserve_bytes: int | None = None,
) -> FitPlan:
    """What to do when a training step of ``model`` at ``batch`` (``make_inputs(batch)`` gives its
    inputs) does not fit ``device``: the modules to checkpoint so that the predicted peak fits, the
    peak and step time with and without them, and what bf16 or the largest batch that fits would
    give instead. Nothing runs for real; the model is left as it was (see docs/estimate.md)."""
    if batch < 1:
        raise UsageError(f"batch must be >= 1, not {batch}")
    spec = resolve_device(device)
    cast = resolve_dtype(dtype)
    options: dict[str, Any] = {
        "train": True,
        "optimizer": optimizer,
        "loss": loss,
        "dtype": cast,
        "device": spec,
        "reserve_bytes": reserve_bytes,
    }
    inputs = make_inputs(batch)
    as_is = estimate(model, inputs, **options)
    info = as_is.meta.estimate
    assert info is not None
    chosen, planned = plan_checkpoints(model, inputs, as_is, _element_size(model, cast), **options)
    bf16 = None
    if cast not in (torch.bfloat16, torch.float16):
        bf16 = _option("bfloat16", estimate(model, inputs, **{**options, "dtype": torch.bfloat16}))
    max_batch, smaller = batch, None
    if not info.fits:
        max_batch = search_batch(model, make_inputs, limit=batch, **options).max_batch
        if max_batch:
            at_most = estimate(model, make_inputs(max_batch), **options)
            smaller = _option(f"batch {max_batch}", at_most)
    name = f"checkpoint {len(chosen)} module{'s' if len(chosen) != 1 else ''}"
    return FitPlan(
        device=spec.key,
        device_name=spec.name,
        batch=batch,
        usable_bytes=info.usable_bytes,
        checkpoint=chosen,
        as_is=_option("as is", as_is),
        planned=_option(name, planned) if chosen else _option("as is", as_is),
        bf16=bf16,
        max_batch=max_batch,
        smaller_batch=smaller,
    )
