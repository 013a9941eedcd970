"""How layerscope names the ranges it opens around module calls: ``ls:<path>:<Type>``.

These names are the contract between capture (which opens the ranges), the trace readers (which
recognise them, or make them from ``with_stack`` module events) and attribution (which parses them),
so they live here, on the floor all three stand on.
"""

from __future__ import annotations

#: Prefix of the record_function ranges layerscope opens around every module call.
MODULE_RANGE_PREFIX = "ls:"


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
