"""The module catalog: which modules exist, how they nest, and how their ranges are named in traces."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: Prefix of the record_function ranges layerscope opens around every module call.
MODULE_RANGE_PREFIX = "ls:"


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


def module_range_name(path: str, type_name: str) -> str:
    """The range name for a module call: ``ls:<path>:<Type>`` (type names never contain ':')."""
    return f"{MODULE_RANGE_PREFIX}{path}:{type_name}"


def parse_module_range(name: str) -> tuple[str, str] | None:
    """``(path, type_name)`` of a layerscope module range name, or None for any other name."""
    if not name.startswith(MODULE_RANGE_PREFIX):
        return None
    body, sep, type_name = name[len(MODULE_RANGE_PREFIX) :].rpartition(":")
    if not sep or not type_name:
        return None
    return body, type_name


def parent_path(path: str) -> str:
    """The qualified path of the parent (``"a.b"`` -> ``"a"``, ``"a"`` -> ``""``)."""
    return path.rpartition(".")[0]


def catalog_from_ranges(found: Iterable[tuple[str, str]]) -> list[ModuleInfo]:
    """A catalog for a trace without one: modules named by their ranges, nested by their paths.

    Missing intermediate paths become placeholder modules of type ``?`` so the tree stays connected;
    a missing root becomes a synthetic ``(root)``.
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
    ordered = sorted(types)
    return [ModuleInfo(path=p, type_name=types[p], parent=None if not p else parent_path(p)) for p in ordered]
