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

    spans: list[int]  # every device span, in table order
    self_ns: np.ndarray  # per span (table index): device time of the work this CPU span launched
    unlinked: list[int]  # device spans no CPU op launched

    def total_ns(self, table: EventTable) -> int:
        """All device time in the table."""
        return sum(table.span_dur[k] for k in self.spans)


def link_device_work(
    table: EventTable, order: np.ndarray, parent: list[int], not_ops: Collection[int] = ()
) -> DeviceWork:
    """Find each device span's launching op and add the span's time to that op's device time.
    Spans whose name id is in ``not_ops`` (``ProfilerStep#N`` ranges) launch nothing themselves."""
    kind_arr = table.array("span_kind")
    device_spans = np.flatnonzero(np.isin(kind_arr, [int(k) for k in DEVICE_WORK_KINDS])).tolist()
    owner_of_device = _device_launchers(table, order, parent, device_spans, set(not_ops))
    self_ns = np.zeros(table.span_count, dtype=np.int64)
    unlinked: list[int] = []
    span_dur = table.span_dur
    for k, op in zip(device_spans, owner_of_device, strict=True):
        if op >= 0:
            self_ns[op] += span_dur[k]
        else:
            unlinked.append(k)
    return DeviceWork(device_spans, self_ns, unlinked)


def _device_launchers(
    table: EventTable, order: np.ndarray, parent: list[int], device_spans: list[int], not_ops: set[int]
) -> list[int]:
    """For each device span, the CPU op that launched it (-1 if none): through the runtime call
    with the same correlation id (then its nearest enclosing non-runtime span), else the op with
    the same external id. A span named in ``not_ops`` is no op: a launch right inside it is the
    runtime call's, as a launch outside any op is."""
    if not device_spans:
        return []
    kinds = table.span_kind
    runtime_by_corr: dict[int, int] = {}
    op_by_ext: dict[int, int] = {}
    for i in order.tolist():
        if kinds[i] == EventKind.RUNTIME:
            if table.span_corr[i] > 0:
                runtime_by_corr[table.span_corr[i]] = i
        elif table.span_ext[i] > 0 and table.span_name[i] not in not_ops:
            op_by_ext[table.span_ext[i]] = i
    owners: list[int] = []
    for k in device_spans:
        runtime = runtime_by_corr.get(table.span_corr[k], -1) if table.span_corr[k] > 0 else -1
        if runtime >= 0:
            op = parent[runtime]
            while op >= 0 and kinds[op] == EventKind.RUNTIME:
                op = parent[op]
            # A launch outside any op: the runtime call itself is the owner.
            owners.append(op if op >= 0 and table.span_name[op] not in not_ops else runtime)
        else:
            owners.append(op_by_ext.get(table.span_ext[k], -1) if table.span_ext[k] > 0 else -1)
    return owners
