"""The module catalog: which modules exist and how they nest."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: The type of global mode's synthetic root, which holds the top-level modules called.
GLOBAL_ROOT_TYPE = "(all modules)"


@dataclass(frozen=True, slots=True)
class ModuleInfo:
    """Static facts about one module: its place in the tree, its parameters, its first call's shapes."""

    path: str
    type_name: str
    parent: str | None  # None only for the root
    params: int = 0
    params_total: int = 0
    input_shapes: str | None = None
    output_shapes: str | None = None
    source: str | None = None  # where the class's forward is defined, "path/file.py:LINE"


def parent_path(path: str) -> str:
    """The qualified path of the parent (``"a.b"`` -> ``"a"``, ``"a"`` -> ``""``)."""
    return path.rpartition(".")[0]


def catalog_from_ranges(
    found: Iterable[tuple[str, str]], model_order: Sequence[str] = ()
) -> list[ModuleInfo]:
    """A catalog for a trace without one: modules named by their ranges, nested by their paths.

    Missing intermediate paths become placeholder modules of type ``?`` so the tree stays connected;
    a missing root becomes a synthetic ``(root)``. Paths in ``model_order`` (a module list layerscope
    saved with the trace, in the model's order) come first, in that order, so that children that
    never ran a range of their own (inside compiled code) keep the order a live profile gives them;
    the rest follow sorted by path.
    """
    types: dict[str, str] = {}
    for path, type_name in found:
        types.setdefault(path, type_name)
    for path in list(types):
        p = path
        while p:
            p = parent_path(p)
            types.setdefault(p, "(root)" if not p else "?")
    types.setdefault("", "(root)")
    rank = {path: k for k, path in enumerate(dict.fromkeys(model_order))}
    ordered = sorted(types, key=lambda p: (rank.get(p, len(rank)), p))
    return [ModuleInfo(path=p, type_name=types[p], parent=None if not p else parent_path(p)) for p in ordered]


def saved_modules(saved: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, type) of the modules layerscope saved with a trace (modules without ranges of their own,
    such as those inside compiled regions)."""
    modules = saved.get("modules")
    if not isinstance(modules, list):
        return []
    return [(str(m[0]), str(m[1])) for m in modules if isinstance(m, list | tuple) and len(m) == 2]
