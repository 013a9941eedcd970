"""Device work (kernels, memcpy, memset) goes where its launching CPU op went.

Two routes to the launcher: the runtime call with the same correlation id (then the op around it),
else the op with the same external id. Older Kineto versions write the runtime call's correlation
into kernels' ``External id``, so the external-id route alone would leave most of their kernels
without a launcher (see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from layerscope.events.table import DEVICE_WORK_KINDS, EventKind, EventTable


@dataclass(frozen=True)
class DeviceWork:
    """Device spans and where their time goes."""

    spans: np.ndarray  # every device span, in table order (int64: a list would hold an int per span)
    self_ns: np.ndarray  # per span (table index): device time of the work this CPU span launched
    unlinked: list[int]  # device spans no CPU op launched

    def total_ns(self, table: EventTable) -> int:
        """All device time in the table."""
        return int(table.array("span_dur")[self.spans].sum())


def link_device_work(
    table: EventTable, order: np.ndarray, parent: list[int] | np.ndarray, not_ops: Collection[int] = ()
) -> DeviceWork:
    """Find each device span's launching op and add the span's time to that op's device time.
    Spans whose name id is in ``not_ops`` (``ProfilerStep#N`` ranges) launch nothing themselves."""
    kind_arr = table.array("span_kind")
    device = np.flatnonzero(np.isin(kind_arr, [int(k) for k in DEVICE_WORK_KINDS]))
    owner = device_launchers(table, order, np.asarray(parent, dtype=np.int64), device, set(not_ops))
    self_ns = np.zeros(table.span_count, dtype=np.int64)
    linked = owner >= 0
    np.add.at(self_ns, owner[linked], table.array("span_dur")[device[linked]])
    return DeviceWork(device, self_ns, device[~linked].tolist())


def device_launchers(
    table: EventTable, order: np.ndarray, parent: np.ndarray, device: np.ndarray, not_ops: set[int]
) -> np.ndarray:
    """For each device span, the CPU op that launched it (-1 if none): through the runtime call
    with the same correlation id (then its nearest enclosing non-runtime span), else the op with
    the same external id (the last in time order holding an id wins). A span named in ``not_ops``
    is no op: a launch right inside it is the runtime call's, as a launch outside any op is."""
    owner = np.full(device.size, -1, dtype=np.int64)
    if not device.size:
        return owner
    kinds, names = table.array("span_kind"), table.array("span_name")
    corr, ext = table.array("span_corr"), table.array("span_ext")
    is_runtime = kinds[order] == int(EventKind.RUNTIME)
    not_op = np.zeros(len(table.names) + 1, dtype=bool)
    not_op[list(not_ops)] = True
    runtime = _last_by_key(order[is_runtime & (corr[order] > 0)], corr, corr[device])
    found = runtime >= 0
    op = parent[runtime[found]]
    while True:  # up through nested runtime calls
        again = np.flatnonzero(op >= 0)
        again = again[kinds[op[again]] == int(EventKind.RUNTIME)]
        if not again.size:
            break
        op[again] = parent[op[again]]
    # A launch outside any op: the runtime call itself is the owner.
    outside = (op < 0) | not_op[names[np.maximum(op, 0)]]
    owner[found] = np.where(outside, runtime[found], op)
    ops = order[~is_runtime & (ext[order] > 0) & ~not_op[names[order]]]
    by_ext = _last_by_key(ops, ext, ext[device[~found]])
    owner[~found] = by_ext
    return owner


def _last_by_key(spans: np.ndarray, key: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each of ``wanted`` (keys; 0 and below never match), the last of ``spans`` (in their
    order) whose ``key`` is it, else -1."""
    out = np.full(wanted.size, -1, dtype=np.int64)
    if not spans.size or not wanted.size:
        return out
    keys = key[spans]
    by_key = np.lexsort((np.arange(spans.size), keys))  # each key's spans in order: the last wins
    sorted_keys = keys[by_key]
    last = np.r_[sorted_keys[1:] != sorted_keys[:-1], True]
    unique_keys, winner = sorted_keys[last], spans[by_key[last]]
    at = np.minimum(np.searchsorted(unique_keys, wanted), unique_keys.size - 1)
    hit = (unique_keys[at] == wanted) & (wanted > 0)
    out[hit] = winner[at[hit]]
    return out
