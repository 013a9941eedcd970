"""Activation checkpointing of chosen modules, for a while: what ``ls.fit`` plans with and what a
user applies its plan with (``FitPlan.apply(model)``).

Each chosen module's ``forward`` is replaced, on the instance only and until the context exits, by
one that runs the original under ``torch.utils.checkpoint.checkpoint`` (non-reentrant, RNG state
preserved): the module's saved activations are dropped after its forward and recomputed in
backward. The recomputation calls the module itself, so its hooks (a profile's, an estimate's) see
the recomputed call as they see ``checkpoint(module, x)`` written in a model.

An estimate's step swaps the parameters for fake ones only while the forward runs
(``torch.func.functional_call``), and the recomputation runs later, in backward: the parameters the
forward used are kept and put back around the recomputation (``rebind=True``), else it would read the
model's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils.checkpoint import checkpoint

from layerscope.errors import UsageError


def _checkpointed_forward(module: nn.Module, rebind: bool) -> Callable[..., Any]:
    original = module.forward
    bypass = [False]  # the recomputation's own call runs the original forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if bypass[0]:
            return original(*args, **kwargs)
        state: dict[str, torch.Tensor] = {}
        if rebind:
            state.update(module.named_parameters(remove_duplicate=False))
            state.update(module.named_buffers(remove_duplicate=False))
        first = [True]

        def run(*inner: Any, **inner_kwargs: Any) -> Any:
            if first[0]:  # the forward: the module's hooks already fired around this call
                first[0] = False
                return original(*inner, **inner_kwargs)
            bound = _reparametrize_module(module, state) if state else nullcontext()
            bypass[0] = True
            try:
                with bound:
                    return module(*inner, **inner_kwargs)
            finally:
                bypass[0] = False

        return checkpoint(run, *args, use_reentrant=False, **kwargs)

    return forward


@contextmanager
def checkpointed(model: nn.Module, paths: Iterable[str], *, rebind: bool = False) -> Iterator[nn.Module]:
    """Within the context, the modules at ``paths`` (qualified names in ``model``) run under
    activation checkpointing; on exit their ``forward`` is what it was. ``rebind``: keep the
    parameters a forward used for its recomputation (an estimate's fake ones)."""
    modules = dict(model.named_modules())
    chosen = list(dict.fromkeys(paths))
    missing = [p for p in chosen if p not in modules]
    if missing:
        raise UsageError(f"no module named {', '.join(map(repr, missing))} in {type(model).__name__}")
    with ExitStack() as stack:
        for path in chosen:
            module = modules[path]
            had = "forward" in module.__dict__
            previous = module.__dict__.get("forward")

            def restore(module: nn.Module = module, had: bool = had, previous: Any = previous) -> None:
                if had:
                    module.__dict__["forward"] = previous
                else:
                    module.__dict__.pop("forward", None)

            stack.callback(restore)
            module.__dict__["forward"] = _checkpointed_forward(module, rebind)
        yield model
