"""Compiled modules in a model: which modules run compiled code, and where a scope can still run.

Three shapes of compiled module reach a profile:

- a ``torch.compile(module)`` wrapper (``OptimizedModule``): the model itself, or a submodule
  (``self.encoder = torch.compile(...)``). Its own hooks run outside the compiled region, its
  ``_orig_mod`` inside. The tree shows the wrapper under its path with the inner module's type and
  children (``encoder.0``, never ``encoder._orig_mod.0``);
- ``module.compile()``: the module's compiled call (``_compiled_call_impl``) runs its hooks inside;
- methods compiled on the instance (Lightning's ``from_compiled``: ``forward`` and ``training_step``
  replaced by Dynamo-wrapped functions): nothing of the module runs outside compiled code.

A model may also run through a wrapper made elsewhere (the Hugging Face Trainer compiles the model it
hands its callbacks): :func:`compiled_wrapper_of` finds it, so that the integration profiles the
wrapper rather than patching modules inside compiled code (which would make Dynamo recompile). It is
not done for every profile: a wrapper may exist while the eager model is what runs.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import NamedTuple

from torch import nn

_WRAPPER_TYPE = "OptimizedModule"
_WRAPPED_ATTRIBUTE = "_orig_mod"


def is_compiled_wrapper(module: object) -> bool:
    """Whether ``module`` is a ``torch.compile(module)`` wrapper."""
    return type(module).__name__ == _WRAPPER_TYPE and isinstance(
        getattr(module, _WRAPPED_ATTRIBUTE, None), nn.Module
    )


def unwrap_compiled(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile(model)`` wrapper compiles (through wrappers of wrappers), else
    ``model``."""
    while is_compiled_wrapper(model):
        model = getattr(model, _WRAPPED_ATTRIBUTE)
    return model


def has_compiled_methods(module: nn.Module) -> bool:
    """Whether the instance's own ``forward`` is a Dynamo-compiled function (Lightning's
    ``from_compiled`` compiles ``forward`` and the step methods this way)."""
    forward = module.__dict__.get("forward")
    return forward is not None and hasattr(forward, "_torchdynamo_orig_callable")


def is_compiled(model: nn.Module | None) -> bool:
    """Whether ``model`` is, or contains, a compiled module of any of the three shapes."""
    if model is None:
        return False
    return any(
        is_compiled_wrapper(m)
        or getattr(m, "_compiled_call_impl", None) is not None
        or has_compiled_methods(m)
        for m in model.modules()
    )


class ModuleEntry(NamedTuple):
    """One module of a model as the tree shows it: ``scoped`` is where a scope is installed (the
    wrapper, for a compiled wrapper), ``inner`` the module whose parameters and type it has."""

    path: str
    scoped: nn.Module
    inner: nn.Module
    is_wrapper: bool


def model_modules(model: nn.Module) -> Iterator[ModuleEntry]:
    """Every module of ``model`` once, parents first, as ``named_modules()`` gives them, with each
    compiled wrapper standing for the module it wraps (its path without ``._orig_mod``)."""
    yield from _visit_modules(model, "", set())


def global_mode_paths(
    module: nn.Module,
    parent_path: str | None,
    taken: Callable[[str], bool],
    known: Callable[[nn.Module], bool],
) -> tuple[str, list[tuple[ModuleEntry, str]]]:
    """Global mode's rule for a module called for the first time: called with no scope open it is a
    top-level module named by its class; called inside another module's call (not as a registered
    child of it), ``<parent path>.<Class>``; ``_1``, ``_2``... where the name is ``taken``. Returns the
    name and, for the module and each module under it not yet ``known``, its entry and path."""
    kind = type(unwrap_compiled(module)).__name__
    base = kind if parent_path is None else f"{parent_path}.{kind}"
    name, k = base, 1
    while taken(name):
        name, k = f"{base}_{k}", k + 1
    found = [
        (entry, f"{name}.{entry.path}" if entry.path else name)
        for entry in model_modules(module)
        if not known(entry.scoped)
    ]
    return name, found


def _visit_modules(module: nn.Module, path: str, seen: set[int]) -> Iterator[ModuleEntry]:
    # Module level, not a recursive closure (one would be a reference cycle holding the modules).
    if id(module) in seen:
        return
    seen.add(id(module))
    inner = unwrap_compiled(module)
    if inner is not module:
        seen.add(id(inner))
    yield ModuleEntry(path, module, inner, inner is not module)
    for name, child in inner.named_children():
        if child is not None:
            yield from _visit_modules(child, f"{path}.{name}" if path else name, seen)


def compiled_wrapper_of(model: nn.Module) -> nn.Module | None:
    """The ``torch.compile`` wrapper of ``model`` made elsewhere in the process, if one exists (a pass
    over the garbage collector's objects: call it once per profile, and only when ``torch._dynamo``
    is in use)."""
    for candidate in gc.get_objects():
        if is_compiled_wrapper(candidate) and getattr(candidate, _WRAPPED_ATTRIBUTE) is model:
            return candidate  # type: ignore[no-any-return]
    return None
