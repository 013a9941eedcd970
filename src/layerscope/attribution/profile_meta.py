"""The meta a Profile built from events carries: the caller's, plus what the table tells (event
count, recorded window, trace metadata, the memory timeline)."""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.attribution.buckets import Buckets
from layerscope.attribution.catalog import ModuleInfo
from layerscope.attribution.memory.timeline import memory_timeline
from layerscope.events.table import EventTable


def full_meta(
    table: EventTable,
    order: np.ndarray,
    owners: np.ndarray,
    bucket: list[int],
    buckets: Buckets,
    catalog: list[ModuleInfo],
    meta: dict[str, Any] | None,
) -> dict[str, Any]:
    """The caller's meta plus what the table tells: event count, recorded window, trace metadata,
    and the memory timeline."""
    full_meta: dict[str, Any] = dict(meta or {})
    full_meta.setdefault("event_count", table.event_count)
    ts, dur = table.array("span_ts"), table.array("span_dur")
    if order.size:  # the recorded window: first CPU event's start to the last one's end
        full_meta.setdefault("wall_us", float((ts + dur)[order].max() - ts[order].min()) / 1000.0)
    full_meta.setdefault("trace", {k: v for k, v in table.meta.items() if _is_json_scalar_tree(v)})
    if table.mem_ts:
        start = int(ts[order].min()) if order.size else int(min(table.mem_ts))
        full_meta.setdefault(
            "memory_timeline", memory_timeline(table, owners.tolist(), bucket, buckets, catalog, start)
        )
    return full_meta


def _is_json_scalar_tree(value: Any) -> bool:
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list):
        return all(_is_json_scalar_tree(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json_scalar_tree(v) for k, v in value.items())
    return False
