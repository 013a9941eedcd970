"""What the events tell a profile's meta: event count, recorded window, what the source said about
itself (:class:`~layerscope.model.meta.TraceInfo`), the memory timeline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

import numpy as np

from layerscope.attribution.buckets import Buckets
from layerscope.attribution.catalog import ModuleInfo
from layerscope.attribution.memory.timeline import memory_timeline
from layerscope.events.table import EventTable
from layerscope.model.meta import ProfileMeta, TraceInfo

#: Keys of a table's meta the capture owns (``ProfileMeta.capture``), not the trace's.
_CAPTURE_KEYS = ("reader", "undecodable_names")


def full_meta(
    table: EventTable,
    order: np.ndarray,
    owners: np.ndarray,
    bucket: np.ndarray,
    buckets: Buckets,
    catalog: list[ModuleInfo],
    meta: ProfileMeta,
) -> ProfileMeta:
    """The caller's meta plus what the table tells: event count, recorded window, trace metadata,
    and the memory timeline."""
    ts, dur = table.array("span_ts"), table.array("span_dur")
    timeline = None
    if table.memory_count:
        start = int(ts[order].min()) if order.size else int(table.array("mem_ts").min())
        timeline = memory_timeline(table, owners, bucket, buckets, catalog, start)
    return replace(
        meta,
        event_count=table.event_count,
        # the recorded window: first CPU event's start to the last one's end
        wall_us=float((ts + dur)[order].max() - ts[order].min()) / 1000.0 if order.size else None,
        trace=trace_info(table.meta),
        memory_timeline=timeline,
    )


def trace_info(table_meta: Mapping[str, Any]) -> TraceInfo:
    """A table's meta as a :class:`TraceInfo`: the fields it names, the rest (JSON data only) in
    ``other``."""
    names = {f.name for f in fields(TraceInfo)} - {"other"}
    kept = {k: v for k, v in table_meta.items() if _is_json_scalar_tree(v) and k not in _CAPTURE_KEYS}
    found: dict[str, Any] = {k: v for k, v in kept.items() if k in names and v is not None}
    for key in ("device_properties", "communication"):  # lists of objects, as the trace gave them
        rows = found.pop(key, [])
        found[key] = tuple(r for r in rows if isinstance(r, dict)) if isinstance(rows, list) else ()
    found["schema_version"] = kept.get("schema_version")
    # a field whose value is not of its type (another tool's header) stays, untyped, in ``other``
    odd = {k for k, v in found.items() if not _fits(k, v)}
    other = {k: v for k, v in kept.items() if k not in names or k in odd}
    return TraceInfo(**{k: v for k, v in found.items() if k not in odd}, other=other)


def _fits(key: str, value: Any) -> bool:
    """Whether a trace's value has the type its TraceInfo field needs."""
    if value is None:
        return key in ("schema_version", "distributed")
    kinds: dict[str, Any] = {
        "schema_version": (int, str),
        "distributed": dict,
        "skipped_events": int,
        "truncated": bool,
        "lost_bytes": int,
        "device_properties": tuple,
        "communication": tuple,
    }
    return isinstance(value, kinds.get(key, dict)) and not (isinstance(value, bool) and key != "truncated")


def _is_json_scalar_tree(value: Any) -> bool:
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list):
        return all(_is_json_scalar_tree(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json_scalar_tree(v) for k, v in value.items())
    return False
