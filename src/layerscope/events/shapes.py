"""The display form of recorded input shapes, shared by the live and the trace-file readers."""

from __future__ import annotations

from typing import Any

import orjson


def shapes_key(dims: Any) -> str:
    """``[[5, 3, 224, 224], [64, 3, 7, 7], []]`` (the form torch's tables print)."""
    return str(dims)


def shapes_key_from_json(raw: bytes) -> str:
    """:func:`shapes_key` of shapes serialised as JSON bytes."""
    return shapes_key(orjson.loads(raw))


def dtypes_key(types: Any) -> str | None:
    """``["float","float",""]``: every input's dtype as torch spells it ("" for non-tensors), as
    JSON; None when no input has one."""
    if not isinstance(types, list) or not any(isinstance(t, str) and t for t in types):
        return None
    return orjson.dumps([t if isinstance(t, str) else "" for t in types]).decode()


def dtypes_key_from_json(raw: bytes) -> str | None:
    """:func:`dtypes_key` of dtypes serialised as JSON bytes."""
    return dtypes_key(orjson.loads(raw))


def first_input_dtype(types: Any) -> str | None:
    """The first non-empty entry of a trace op's ``Input type`` list (``float``, ``c10::BFloat16``...)."""
    if not isinstance(types, list):
        return None
    return next((t for t in types if isinstance(t, str) and t), None)
