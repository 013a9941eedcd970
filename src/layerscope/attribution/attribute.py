"""``build_profile``: every piece of work in an EventTable goes to exactly one bucket, then the Profile.

The recipe, one module per step: name roles and buckets (``buckets``) → nesting, exclusive time and
ownership in one sweep (``nesting``) → device work to its launching op (``devices``) → memory to its
owner span, per-call peaks (``memory``) → op rows (``op_rows``) → assemble the tree, the unattributed
entries, the totals and the steps. Totals are computed from the events directly, not by summing
buckets, so that ``Profile.validate()`` can reconcile the two.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.attribution.buckets import (
    LABEL_MEMORY_OUTSIDE_OPS,
    LABEL_UNLINKED_DEVICE,
    Buckets,
    name_roles,
)
from layerscope.attribution.catalog import ModuleInfo
from layerscope.attribution.compiled import attribute_compiled_kernels, graphs_from_meta
from layerscope.attribution.devices import link_device_work
from layerscope.attribution.memory import (
    bucket_memory,
    memory_owners,
    memory_timeline,
    memory_totals,
    span_memory,
    window_peaks,
)
from layerscope.attribution.nesting import depths, inclusive, levels, outermost_flops, sweep, time_order
from layerscope.attribution.op_rows import SpanFigures, op_rows
from layerscope.attribution.stacks import op_stacks
from layerscope.attribution.steps import step_stats
from layerscope.attribution.tree import assemble_tree
from layerscope.events.table import EventKind, EventTable
from layerscope.model.metrics import Metrics, own_metrics
from layerscope.model.profile import Phase, Profile, UnattributedEntry


def build_profile(
    table: EventTable,
    catalog: list[ModuleInfo] | None = None,
    meta: dict[str, Any] | None = None,
    compiled_graphs: list[Any] | None = None,
) -> Profile:
    """Attribute every event of ``table`` and return the Profile.

    ``catalog`` lists the modules (from a live capture); without one, modules are discovered from
    the layerscope ranges found in the trace. ``compiled_graphs`` (capture's record of which module
    each kernel of a compiled graph comes from) places the kernels run inside compiled regions; a
    trace saved by layerscope carries its own.
    """
    table.check()
    catalog_given = catalog is not None
    found = table.meta.get("layerscope")
    saved: dict[str, Any] = found if isinstance(found, dict) else {}
    graph_entries = compiled_graphs if compiled_graphs is not None else saved.get("compiled_graphs")
    named = name_roles(
        table.names, catalog, _saved_modules(saved), _annotation_names(table) if catalog is None else None
    )
    catalog = named.catalog
    buckets = Buckets(len(catalog))

    # ---- nest: parents, exclusive time, buckets, FLOPs that count ------------------------------------
    order = time_order(table)
    # a live capture always knows its modules; a trace does when it has module ranges (or saved ones)
    modules_known = catalog_given or (bool(named.module_ranges) and not named.regions)
    swept = sweep(
        table, order, named.roles, named.role_module, buckets, recorded_ops_are_forward=not modules_known
    )
    compiled = attribute_compiled_kernels(
        table,
        order,
        swept.parent,
        swept.bucket,
        swept.compiled_graph_spans,
        graphs_from_meta(graph_entries),
        catalog,
        buckets,
        swept.module_calls,
    )
    parent = np.asarray(swept.parent, dtype=np.int64)
    bucket_arr = np.asarray(swept.bucket, dtype=np.int64)
    by_level = levels(order, depths(parent))
    # Ops run while compiling work on fake tensors: their FLOPs are no work done.
    compiling = bucket_arr == swept.compiling_bucket if swept.compiling_bucket >= 0 else None
    counted_flops = outermost_flops(table.span_flops, parent, by_level, compiling)

    # ---- link devices: kernels to their launching op ------------------------------------------------
    device = link_device_work(table, order, swept.parent)

    # ---- memory: each event to the innermost CPU span containing it ---------------------------------
    owners = memory_owners(table, order, parent) if table.mem_ts else np.zeros(0, dtype=np.int64)
    outside = int((owners == -1).sum())
    # Label buckets are numbered in order of first use: memory outside ops, then unlinked device work.
    outside_bucket = buckets.unattributed(LABEL_MEMORY_OUTSIDE_OPS, Phase.OTHER, outside) if outside else -1
    unlinked_bucket = (
        buckets.unattributed(LABEL_UNLINKED_DEVICE, Phase.OTHER, len(device.unlinked))
        if device.unlinked
        else -1
    )

    # ---- sums per bucket ---------------------------------------------------------------------------
    nb = buckets.count
    bucket = bucket_arr
    excl = np.asarray(swept.excl, dtype=np.int64)
    b_order = bucket[order]
    self_cpu_ns = np.bincount(b_order, weights=excl[order], minlength=nb)
    self_dev_ns = np.bincount(b_order, weights=device.self_ns[order], minlength=nb)
    for k in device.unlinked:
        self_dev_ns[unlinked_bucket] += table.span_dur[k]
    self_flops = [0] * nb
    for i in np.flatnonzero(counted_flops).tolist():
        self_flops[swept.bucket[i]] += int(counted_flops[i])
    mem = bucket_memory(table, owners, bucket, outside_bucket, nb)
    peaks = [[0, 0] for _ in range(nb)]  # per bucket: [cpu, device]
    if table.mem_ts:
        window_peaks(table, swept.module_windows + swept.backward_windows, swept.bucket, peaks)

    per_bucket = {
        "cpu_us": self_cpu_ns / 1000.0,
        "device_us": self_dev_ns / 1000.0,
        "flops": self_flops,
        "cpu_alloc_bytes": mem.cpu_alloc,
        "device_alloc_bytes": mem.device_alloc,
        "retained_bytes": mem.retained,
        "cpu_peak_bytes": [cpu for cpu, _ in peaks],
        "device_peak_bytes": [dev for _, dev in peaks],
    }

    def bucket_metrics(b: int) -> Metrics:
        return own_metrics(per_bucket, b)

    # ---- op rows ---------------------------------------------------------------------------------------
    device_total = inclusive(device.self_ns.astype(np.float64), parent, by_level)
    figures = SpanFigures(
        excl=excl,
        device_self=device.self_ns,
        device_total=device_total,
        flops=counted_flops,
        memory=span_memory(table, owners, parent, by_level),
    )
    # A region (a user annotation standing in for a module) can launch device work itself: it stays
    # an op row, where a layerscope module range never is one.
    range_names = {} if named.regions else named.module_ranges
    stacks = op_stacks(table)  # Python call stacks (with_stack); None when none were recorded
    rows = op_rows(
        table, order, parent, bucket, buckets, catalog, range_names, figures, device.unlinked, stacks
    )

    # ---- assemble ------------------------------------------------------------------------------------
    own = [
        (bucket_metrics(buckets.forward(m)), bucket_metrics(buckets.backward(m))) for m in range(len(catalog))
    ]
    first_call: dict[int, int] = {}
    for i in swept.module_windows:
        first_call.setdefault(named.role_module[table.span_name[i]], len(first_call))
    root = assemble_tree(catalog, own, swept.module_calls, first_call)
    unattributed = tuple(
        UnattributedEntry(
            label=label,
            phase=phase,
            calls=buckets.occurrences[k],
            metrics=bucket_metrics(buckets.label_bucket(k)),
        )
        for k, (label, phase) in enumerate(buckets.labels)
    )
    mem_totals = memory_totals(table)
    totals = own_metrics(
        {
            "cpu_us": swept.top_level_ns / 1000.0,
            "device_us": device.total_ns(table) / 1000.0,
            "flops": int(counted_flops.sum()),
            "cpu_alloc_bytes": mem_totals.cpu_alloc,
            "device_alloc_bytes": mem_totals.device_alloc,
            "retained_bytes": mem_totals.net,
            "cpu_peak_bytes": root.total.cpu_peak_bytes,
            "device_peak_bytes": root.total.device_peak_bytes,
        }
    )
    steps = step_stats(
        table,
        swept.step_spans,
        order,
        bucket,
        excl,
        device_total,
        catalog,
        buckets,
        {node.path for node in root.walk()},
        drop_idle_last=not named.regions,
    )
    full_meta = _full_meta(table, order, owners, swept.bucket, buckets, catalog, meta)
    if not modules_known:
        # what the tree is made of when the trace named no module (the CLI says so in one line)
        full_meta["module_source"] = "record_function regions" if named.regions else "none"
    if compiled.graph_calls:
        full_meta["compiled"] = {
            "graph_calls": compiled.graph_calls,
            "mapped_graph_calls": compiled.matched_calls,
            "kernels_placed": compiled.moved,
        }
    return Profile(
        meta=full_meta,
        root=root,
        op_rows=rows,
        unattributed=unattributed,
        totals=totals,
        steps=steps,
    )


def backward_ranges(table: EventTable) -> list[tuple[str, int, int, int]]:
    """``(module path, tid, start ns, end ns)`` for every run of consecutive backward nodes that one
    module owns: where each layer's backward ran (for trace views)."""
    named = name_roles(table.names, None)
    catalog = named.catalog
    buckets = Buckets(len(catalog))
    swept = sweep(table, time_order(table), named.roles, named.role_module, buckets)
    ranges: list[tuple[str, int, int, int]] = []
    for i in swept.backward_windows:
        b = swept.bucket[i]
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


def _annotation_names(table: EventTable) -> set[int]:
    """Name ids of user annotations (``record_function`` ranges) in the table."""
    kinds = table.array("span_kind")
    names = table.array("span_name")
    return set(np.unique(names[kinds == int(EventKind.USER_ANNOTATION)]).tolist())


def _saved_modules(saved: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, type) of the modules layerscope saved with a trace (modules without ranges of their own,
    such as those inside compiled regions)."""
    modules = saved.get("modules")
    if not isinstance(modules, list):
        return []
    return [(str(m[0]), str(m[1])) for m in modules if isinstance(m, list | tuple) and len(m) == 2]


def _full_meta(
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
