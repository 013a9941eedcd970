"""A :class:`~layerscope.model.meta.ProfileMeta` to JSON and back: the one serializer of meta.

Schema v2 saves each record under its own key, its fields by name (:func:`meta_to_json`). Schema v1
saved one flat dict; :func:`meta_from_json` reads both, and :func:`meta_to_v1` gives the v1 form for
``meta["key"]`` reads during the deprecation release.
"""

from __future__ import annotations

import types
import typing
import warnings
from collections.abc import Mapping
from dataclasses import fields, is_dataclass, replace
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin

from layerscope.errors import TraceFormatError
from layerscope.model import meta as records
from layerscope.model.memory import MemoryReport, MemoryTimeline
from layerscope.model.meta import (
    LIVE,
    TRACE,
    BlockError,
    CaptureInfo,
    CompileReport,
    DeviceSummary,
    Environment,
    ProfileMeta,
    SavedOptions,
    ScopePlanRecord,
    TraceInfo,
)

R = TypeVar("R")
_TYPED_JSON = (MemoryReport, MemoryTimeline)  # records with their own to_json/from_json


def meta_to_json(meta: ProfileMeta) -> dict[str, Any]:
    """The v2 JSON form: each record by field name (the file's top level holds the version)."""
    out = to_json(meta)
    extra = out.pop("extra")  # keys a newer file held go back where they were: the top level
    return {**extra, **{k: v for k, v in out.items() if v is not None}}


def meta_from_json(data: Any, version: int) -> ProfileMeta:
    """The meta a saved profile of schema ``version`` (1 or 2) holds; TraceFormatError when it is
    not what that version writes."""
    if not isinstance(data, Mapping):
        raise TraceFormatError("profile meta is not an object")
    try:
        if version == 1:
            return meta_from_v1(data)
        known = {f.name for f in fields(ProfileMeta)}
        extra = {**data.get("extra", {}), **{k: v for k, v in data.items() if k not in known}}
        found = record_from_json(ProfileMeta, {k: v for k, v in data.items() if k in known})
        return replace(found, extra=extra)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise TraceFormatError(f"profile meta does not read as schema v{version}: {exc}") from None


def to_json(value: Any) -> Any:
    """A record (or what it holds) as JSON data."""
    if isinstance(value, _TYPED_JSON):
        return value.to_json()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    return value


def record_from_json(cls: type[R], data: Any) -> R:
    """``cls`` (a record of :mod:`layerscope.model.meta`) from its JSON form; keys it lacks are
    left out, fields missing take their defaults, as do fields that cannot be None but are null
    (a field without a default then fails: a TypeError)."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__} is not an object")
    hints = _hints(typing.cast(type, cls))
    given = {k: v for k, v in data.items() if k in hints and (v is not None or _takes_none(hints[k]))}
    return cls(**{k: _from_json(hints[k], v) for k, v in given.items()})


def _takes_none(tp: Any) -> bool:
    return tp is Any or type(None) in get_args(tp)


@cache
def _hints(cls: type) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in typing.get_type_hints(cls, vars(records)).items() if k in names}


def _from_json(tp: Any, value: Any) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if value is None:
        return None
    if origin in (Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        return _from_json(kinds[0], value) if len(kinds) == 1 else value
    if tp in _TYPED_JSON:
        return value if isinstance(value, tp) else tp.from_json(value)
    if isinstance(tp, type) and is_dataclass(tp):
        return record_from_json(tp, value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_json(args[0], v) for v in value)
        return tuple(_from_json(a, v) for a, v in zip(args, value, strict=True))
    if origin in (Mapping, dict):
        return {str(k): _from_json(args[1], v) for k, v in value.items()}
    if tp in (int, float, str, bool):
        return tp(value)
    return value


def as_profile_meta(meta: ProfileMeta | Mapping[str, Any]) -> ProfileMeta:
    """``meta`` as given to a Profile: a :class:`ProfileMeta`, or (deprecated) a v1 dict."""
    if isinstance(meta, ProfileMeta):
        return meta
    warnings.warn(
        "Profile(meta=dict): pass a ProfileMeta (the dict form goes in the next release)",
        DeprecationWarning,
        stacklevel=4,
    )
    return meta_from_v1(meta)


# ----- schema v1: one flat dict ---------------------------------------------------------------------
_ENVIRONMENT_KEYS = (
    "layerscope_version",
    "torch_version",
    "python_version",
    "created_at",
    "float32_matmul_precision",
    "cudnn_allow_tf32",
    "checkpoint_early_stop",
    "devices",
    "distributed",
)
_CAPTURE_KEYS = (
    "block_us",
    "reader",
    "cycle",
    "unmatched_module_marks",
    "undecodable_names",
    "flop_formula_failures",
    "block_error",
    "memory_watch_errors",
)
_TOP_KEYS = ("model", "trace_file", "event_count", "wall_us", "module_source", "memory", "memory_timeline")


def meta_from_v1(flat: Mapping[str, Any]) -> ProfileMeta:
    """The records of a v1 meta (what ``meta`` was before 0.2: one flat dict)."""
    rest = dict(flat)
    rest.pop("schema_version", None)
    source = str(rest.pop("source", LIVE))
    options = rest.pop("options", None)
    top = {k: rest.pop(k) for k in _TOP_KEYS if k in rest}
    environment = {k: rest.pop(k) for k in _ENVIRONMENT_KEYS if k in rest}
    capture = {k: rest.pop(k) for k in _CAPTURE_KEYS if k in rest}
    kinds, plan = rest.pop("module_scopes", None), rest.pop("scope_plan", None)
    if isinstance(plan, Mapping):
        reasons = [dict(zip(("mechanism", "clock", "reason"), r, strict=True)) for r in plan["reasons"]]
        capture["scope_plan"] = {"kinds": kinds or "ranges", "reasons": reasons, "modules": plan["modules"]}
    if source == LIVE and isinstance(options, Mapping) and "activities" in options:
        capture["options"] = options
    run_flops, per_module = rest.pop("flops_by_dtype", None), rest.pop("flops_by_dtype_per_module", None)
    flops = {"run": run_flops, "per_module": per_module or {}} if run_flops else None
    sections = {
        "environment": environment or None,
        "capture": capture if "options" in capture else None,
        "trace": _trace_v1(rest.pop("trace", None)),
        "compiled": rest.pop("compiled", None),
        "call_lines": rest.pop("call_lines", None),
        "flops_by_dtype": flops,
        "device": rest.pop("device", None),
    }
    found = record_from_json(ProfileMeta, {"source": source, **top, **sections})
    return replace(found, extra=rest)


def _trace_v1(trace: Any) -> dict[str, Any] | None:
    if not isinstance(trace, Mapping):
        return None
    names = {f.name for f in fields(TraceInfo)}
    other = {k: v for k, v in trace.items() if k not in names and k not in ("reader", "undecodable_names")}
    return {**{k: v for k, v in trace.items() if k in names}, "other": other}


def meta_to_v1(meta: ProfileMeta) -> dict[str, Any]:
    """The v1 flat form of ``meta`` (memory records kept typed, as 0.2 read them)."""
    out: dict[str, Any] = {"schema_version": 1, "source": meta.source, "model": meta.model}
    if meta.environment is not None:
        out.update(_flat(meta.environment))
    if meta.capture is not None:
        out.update(_capture_v1(meta.capture))
    elif meta.source == TRACE:
        out["options"] = {"memory": meta.memory_recorded}
    if meta.trace_file is not None:
        out["trace_file"] = meta.trace_file
    out["event_count"] = meta.event_count
    optional: dict[str, Any] = {"wall_us": meta.wall_us, "module_source": meta.module_source}
    optional |= {"memory": meta.memory, "memory_timeline": meta.memory_timeline}
    optional |= {"compiled": _compiled_v1(meta.compiled), "call_lines": _dict_or_none(meta.call_lines)}
    optional["device"] = _dict_or_none(meta.device)
    out.update({k: v for k, v in optional.items() if v is not None})
    trace = to_json(meta.trace)
    out["trace"] = {**trace.pop("other"), **trace}
    if meta.flops_by_dtype is not None:
        out["flops_by_dtype"] = dict(meta.flops_by_dtype.run)
        if meta.flops_by_dtype.per_module:
            out["flops_by_dtype_per_module"] = to_json(meta.flops_by_dtype.per_module)
    return {**meta.extra, **out}


def _flat(record: Environment | SavedOptions | BlockError) -> dict[str, Any]:
    return typing.cast(dict[str, Any], to_json(record))


def _dict_or_none(record: CompileReport | DeviceSummary | Any | None) -> dict[str, Any] | None:
    if record is None:
        return None
    found = to_json(record)
    return {k: v for k, v in found.items() if v is not None or k != "note"}  # v1 had no empty note


def _compiled_v1(compiled: CompileReport | None) -> dict[str, Any] | None:
    """v1 named the paths not in the tree only when there were some, and a note only when given."""
    found = _dict_or_none(compiled)
    if found is not None and not found["kernels_not_in_tree"]:
        del found["kernels_not_in_tree"], found["paths_not_in_tree"]
    return found


def _capture_v1(capture: CaptureInfo) -> dict[str, Any]:
    plan: ScopePlanRecord = capture.scope_plan
    out: dict[str, Any] = {
        "block_us": capture.block_us,
        "options": _flat(capture.options),
        "reader": capture.reader,
        "module_scopes": plan.kinds,
        "scope_plan": {
            "reasons": [[r.mechanism, r.clock, r.reason] for r in plan.reasons],
            "modules": to_json(plan.modules),
        },
    }
    optional = {
        "cycle": capture.cycle,
        "unmatched_module_marks": capture.unmatched_module_marks or None,
        "undecodable_names": capture.undecodable_names or None,
        "flop_formula_failures": dict(capture.flop_formula_failures) or None,
        "block_error": _flat(capture.block_error) if capture.block_error is not None else None,
        "memory_watch_errors": list(capture.memory_watch_errors) or None,
    }
    return out | {k: v for k, v in optional.items() if v is not None}


__all__ = [
    "as_profile_meta",
    "meta_from_json",
    "meta_from_v1",
    "meta_to_json",
    "meta_to_v1",
    "record_from_json",
    "to_json",
]
