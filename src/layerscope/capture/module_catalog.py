"""The module catalog of a live capture: paths, types, parameters, first-call shapes, sources."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from layerscope.attribution.catalog import GLOBAL_ROOT_TYPE, ModuleInfo

#: Tensor shapes as taken on a module's first call; formatted only when the catalog is made.
RawShapes = list[torch.Size] | None


def shapes_of(value: Any) -> RawShapes:
    """Shapes of the tensors in a call's args/output (None when no tensor). Kept raw: formatting them
    is most of the cost, and it can wait until the block has ended (:func:`format_shapes`)."""
    found: list[torch.Size] = []
    _collect_shapes(value, 0, found)
    return found or None


def _collect_shapes(value: Any, depth: int, found: list[torch.Size]) -> None:
    # A module-level function, not a recursive closure: a closure that calls itself is a reference
    # cycle, garbage that only the cyclic GC frees.
    if isinstance(value, torch.Tensor):
        found.append(value.shape)
    elif depth < 3 and isinstance(value, list | tuple):
        for item in value:
            _collect_shapes(item, depth + 1, found)
    elif depth < 3 and isinstance(value, dict):
        for item in value.values():
            _collect_shapes(item, depth + 1, found)


def format_shapes(shapes: RawShapes) -> str | None:
    """The compact string of :func:`shapes_of`'s result: ``[[2, 3], [4]]``."""
    return str([list(s) for s in shapes]) if shapes else None


def model_catalog(
    modules: dict[str, nn.Module],
    first_shapes: dict[str, tuple[RawShapes, RawShapes]],
) -> list[ModuleInfo]:
    """The catalog of a given model's kept modules (``modules``: path -> the module its parameters
    are read from, root first); a module's own parameters are those no kept descendant counts."""
    kept = list(modules)
    parent_of = {p: _nearest_kept_parent(p, modules) for p in kept}
    counts = param_counts(modules.values())
    totals = {p: counts[id(modules[p])][1] for p in kept}
    sources = _Sources()
    children_total: dict[str, int] = {}
    for c in kept:
        if c:
            children_total[parent_of[c]] = children_total.get(parent_of[c], 0) + totals[c]
    infos: list[ModuleInfo] = []
    for p in kept:
        shapes = first_shapes.get(p, (None, None))
        infos.append(
            ModuleInfo(
                path=p,
                type_name=type(modules[p]).__name__,
                parent=None if p == "" else parent_of[p],
                params=max(totals[p] - children_total.get(p, 0), 0),
                params_total=totals[p],
                input_shapes=format_shapes(shapes[0]),
                output_shapes=format_shapes(shapes[1]),
                source=sources.of(modules[p]),
            )
        )
    return infos


def global_catalog(
    called: dict[str, nn.Module], roots: set[str], first_shapes: dict[str, tuple[RawShapes, RawShapes]]
) -> list[ModuleInfo]:
    """The catalog of global mode: a synthetic root ``""`` holds the top-level modules called."""
    counts = param_counts(called.values())
    totals = {p: counts[id(m)][1] for p, m in called.items()}
    sources = _Sources()
    root_total = sum(totals[r] for r in roots if r in totals)
    infos = [ModuleInfo(path="", type_name=GLOBAL_ROOT_TYPE, parent=None, params=0, params_total=root_total)]
    for p, m in called.items():
        shapes = first_shapes.get(p, (None, None))
        infos.append(
            ModuleInfo(
                path=p,
                type_name=type(m).__name__,
                parent=_nearest_kept_parent(p, called) if p not in roots else "",
                params=counts[id(m)][0],
                params_total=totals[p],
                input_shapes=format_shapes(shapes[0]),
                output_shapes=format_shapes(shapes[1]),
                source=sources.of(m),
            )
        )
    return infos


def forward_source(module: nn.Module) -> str | None:
    """Where ``module``'s class defines ``forward``: ``path/file.py:LINE``, the path relative to
    the sys.path entry it was imported from (as torch's tracer writes frames); None when unknown."""
    owner_forward = getattr(type(module), "forward", None)
    if owner_forward is None:
        return None
    # inside the block the class may carry layerscope's wrapper, which names the original
    code = getattr(inspect.unwrap(owner_forward), "__code__", None)
    if code is None:
        return None
    return f"{_short_path(code.co_filename)}:{code.co_firstlineno}"


def _short_path(filename: str) -> str:
    best = ""
    for entry in sys.path:
        root = os.path.join(os.path.abspath(entry or "."), "")
        if filename.startswith(root) and len(root) > len(best):
            best = root
    return filename[len(best) :] if best else filename


def _nearest_kept_parent(path: str, kept: dict[str, Any]) -> str:
    p = path
    while p:
        p = p.rpartition(".")[0]
        if p in kept:
            return p
    return ""


def param_counts(roots: Iterable[nn.Module]) -> dict[int, tuple[int, int]]:
    """``id(module)`` -> (own, total) parameter elements of every module under ``roots``, each
    shared tensor once in a total (as ``module.parameters()`` counts), in one walk: asking every
    module for its subtree's parameters would walk the tree once per module."""
    subtrees: dict[int, dict[int, int]] = {}  # id(module) -> id(parameter) -> elements
    counts: dict[int, tuple[int, int]] = {}
    for root in roots:
        _count_params(root, subtrees, counts)
    return counts


def _count_params(
    module: nn.Module, subtrees: dict[int, dict[int, int]], counts: dict[int, tuple[int, int]]
) -> dict[int, int]:
    # A module-level function, not a recursive closure (a reference cycle: see _collect_shapes).
    found = subtrees.get(id(module))
    if found is not None:  # a module registered twice, or a root under another root
        return found
    # the registries ``parameters()`` reads, without its generators' cost per module
    own = {id(p): p.numel() for p in module._parameters.values() if p is not None}
    found = dict(own)
    for child in module._modules.values():
        if child is not None:
            found.update(_count_params(child, subtrees, counts))
    subtrees[id(module)] = found
    counts[id(module)] = (sum(own.values()), sum(found.values()))
    return found


class _Sources:
    """:func:`forward_source` once per class (a model repeats a few classes many times)."""

    def __init__(self) -> None:
        self._by_class: dict[type, str | None] = {}

    def of(self, module: nn.Module) -> str | None:
        cls = type(module)
        if cls not in self._by_class:
            self._by_class[cls] = forward_source(module)
        return self._by_class[cls]
