"""Where each module's backward ran: runs of consecutive backward nodes one module owns (the
"modules (backward)" track of exported traces)."""

from __future__ import annotations

from layerscope.attribution.buckets import Buckets, name_roles
from layerscope.attribution.nesting import sweep, time_order
from layerscope.events.table import EventTable


def backward_ranges(table: EventTable) -> list[tuple[str, int, int, int]]:
    """``(module path, tid, start ns, end ns)`` for every run of consecutive backward nodes that one
    module owns: where each layer's backward ran (for trace views)."""
    named = name_roles(table.names, None)
    catalog = named.catalog
    buckets = Buckets(len(catalog))
    swept = sweep(table, time_order(table), named.roles, named.role_module, buckets)
    ranges: list[tuple[str, int, int, int]] = []
    nodes = swept.backward_windows
    for i, b in zip(nodes, swept.bucket[nodes].tolist(), strict=True):
        if not buckets.is_backward(b):
            continue
        path, tid = catalog[buckets.module_of(b)].path, table.span_tid[i]
        start, end = table.span_ts[i], table.span_ts[i] + table.span_dur[i]
        last = ranges[-1] if ranges else None
        if last is not None and last[0] == path and last[1] == tid:
            ranges[-1] = (path, tid, last[2], max(last[3], end))
        else:
            ranges.append((path, tid, start, end))
    return ranges
