"""Attribution: every piece of work in an EventTable goes to exactly one bucket.

A *bucket* is a (module, phase) pair, or a labelled unattributed entry (work outside every module).
The rules (see docs/architecture.md):

* CPU spans nest per thread by time (torch's own rule: a child starts inside its parent and ends
  no later). A span's *exclusive* time is its duration minus its direct children's.
* Forward: a span inside a layerscope module range belongs to the innermost such range.
* Backward: an ``autograd::engine::evaluate_function: X`` span carries the sequence number and
  forward thread of the op that created its autograd node; it belongs to that op's module, in the
  backward phase. Its children inherit it. Nodes without a forward owner (gradient accumulation,
  the loss's backward) become unattributed backward entries named after the node.
* Device work (kernels, memcpy, memset) goes where its launching CPU op went (correlation id).
* Memory events go to the innermost CPU span on their thread that contains their timestamp.
* FLOPs: a span's FLOPs count only if no enclosing span already counted FLOPs (``aten::convolution``
  counts, the ``aten::_convolution`` inside it does not), which is what FlopCounterMode does.

The loops are written for speed (post-processing is a hot path): one Python sweep over CPU spans
for nesting and bucket assignment, then numpy ``bincount`` for all the sums.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from layerscope.build.catalog import ModuleInfo, catalog_from_ranges, parse_module_range
from layerscope.build.steps import STEP_PREFIX, step_stats
from layerscope.build.tree import assemble_tree
from layerscope.events.table import CPU_KINDS, DEVICE_WORK_KINDS, EventKind, EventTable
from layerscope.model.metrics import Metrics
from layerscope.model.profile import OpStats, Phase, Profile, UnattributedEntry

BACKWARD_NODE_PREFIX = "autograd::engine::evaluate_function: "
LABEL_STEP_GAPS = "(Python between ops)"
LABEL_MEMORY_OUTSIDE_OPS = "(memory outside ops)"
LABEL_UNLINKED_DEVICE = "(device work without a launching op)"

# Per-name roles, precomputed once per distinct name.
_ROLE_PLAIN, _ROLE_MODULE, _ROLE_BACKWARD_NODE, _ROLE_STEP = 0, 1, 2, 3


@dataclass
class _Buckets:
    """Bucket ids: module m has 2m (forward) and 2m+1 (backward); labels follow from 2M on.

    ``occurrences`` counts, per label, how often work started under it (a top-level op, a backward
    node, an allocation outside ops): the "calls" of an unattributed entry.
    """

    module_count: int
    labels: list[tuple[str, Phase]]
    ids: dict[tuple[str, Phase], int]
    occurrences: list[int]

    def unattributed(self, label: str, phase: Phase, count: int = 1) -> int:
        key = (label, phase)
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = 2 * self.module_count + len(self.labels)
            self.labels.append(key)
            self.occurrences.append(0)
        self.occurrences[found - 2 * self.module_count] += count
        return found

    @property
    def count(self) -> int:
        return 2 * self.module_count + len(self.labels)

    def phase_of(self, bucket: int) -> Phase:
        if bucket < 2 * self.module_count:
            return Phase.BACKWARD if bucket & 1 else Phase.FORWARD
        return self.labels[bucket - 2 * self.module_count][1]


def build_profile(
    table: EventTable, catalog: list[ModuleInfo] | None = None, meta: dict[str, Any] | None = None
) -> Profile:
    """Attribute every event of ``table`` and return the Profile.

    ``catalog`` lists the modules (from a live capture); without one, modules are discovered from
    the layerscope ranges found in the trace.
    """
    table.check()
    names = table.names
    n_spans = table.span_count

    catalog, found_ranges, roles, role_module = _roles(names, catalog)
    buckets = _Buckets(len(catalog), [], {}, [])

    # ---- the sweep: nesting, exclusive time, buckets, FLOPs ---------------------------------------
    ts_arr = table.array("span_ts")
    dur_arr = table.array("span_dur")
    kind_arr = table.array("span_kind")
    order_arr = _time_order(table)
    sweep = _sweep(table, order_arr, roles, role_module, buckets)
    parent, excl, bucket = sweep.parent, sweep.excl, sweep.bucket
    span_name, span_dur = table.span_name, table.span_dur
    two_m = 2 * len(catalog)
    parent_arr = np.asarray(parent, dtype=np.int64)
    levels = _levels(order_arr, _depths(parent_arr))
    counted_flops = _outermost_flops(table.span_flops, parent_arr, levels)

    # ---- device work: to the launching op -------------------------------------------------------------
    device_spans = np.flatnonzero(np.isin(kind_arr, [int(k) for k in DEVICE_WORK_KINDS])).tolist()
    owner_of_device = _device_launchers(table, order_arr, parent, device_spans)
    device_self_arr = np.zeros(n_spans, dtype=np.int64)
    unlinked_device: list[int] = []
    for k, op in zip(device_spans, owner_of_device, strict=True):
        if op >= 0:
            device_self_arr[op] += span_dur[k]
        else:
            unlinked_device.append(k)

    # ---- memory: to the innermost CPU span containing the event ----------------------------------------
    n_mem = len(table.mem_ts)
    mem_span = _memory_owners(table, order_arr, ts_arr, dur_arr, parent_arr) if n_mem else []

    outside = mem_span.count(-1)
    outside_bucket = buckets.unattributed(LABEL_MEMORY_OUTSIDE_OPS, Phase.OTHER, outside) if outside else -1
    unlinked_bucket = (
        buckets.unattributed(LABEL_UNLINKED_DEVICE, Phase.OTHER, len(unlinked_device))
        if unlinked_device
        else -1
    )

    # ---- sums per bucket (numpy) ------------------------------------------------------------------------
    nb = buckets.count
    bucket_arr = np.asarray(bucket, dtype=np.int64)
    excl_arr = np.asarray(excl, dtype=np.int64)
    b_order = bucket_arr[order_arr]
    self_cpu_ns = np.bincount(b_order, weights=excl_arr[order_arr], minlength=nb)
    self_dev_ns = np.bincount(b_order, weights=device_self_arr[order_arr], minlength=nb)
    for k in unlinked_device:
        self_dev_ns[unlinked_bucket] += span_dur[k]
    self_flops = [0] * nb
    for i in np.flatnonzero(counted_flops).tolist():
        self_flops[bucket[i]] += int(counted_flops[i])

    mem_bytes = table.array("mem_bytes")
    mem_dev = table.array("mem_on_device")
    mem_span_arr = np.asarray(mem_span, dtype=np.int64)
    cpu_alloc: np.ndarray
    dev_alloc: np.ndarray
    retained: np.ndarray
    if n_mem:
        mem_bucket = np.full(n_mem, outside_bucket, dtype=np.int64)
        inside_op = mem_span_arr >= 0
        mem_bucket[inside_op] = bucket_arr[mem_span_arr[inside_op]]
        positive = np.where(mem_bytes > 0, mem_bytes, 0)
        cpu_alloc = np.bincount(mem_bucket, weights=np.where(mem_dev, 0, positive), minlength=nb)
        dev_alloc = np.bincount(mem_bucket, weights=np.where(mem_dev, positive, 0), minlength=nb)
        retained = np.bincount(mem_bucket, weights=mem_bytes, minlength=nb)
    else:
        cpu_alloc = dev_alloc = retained = np.zeros(nb)

    # ---- per-span inclusive sums for op rows and steps (bottom-up, one numpy step per depth) ---------
    self_cpu_alloc_span: np.ndarray = np.zeros(n_spans)
    self_dev_alloc_span: np.ndarray = np.zeros(n_spans)
    self_net_span: np.ndarray = np.zeros(n_spans)
    if n_mem:
        owned = mem_span_arr >= 0
        owners = mem_span_arr[owned]
        owned_bytes = mem_bytes[owned]
        owned_dev = mem_dev[owned]
        pos = np.maximum(owned_bytes, 0)
        self_cpu_alloc_span = np.bincount(owners, weights=np.where(owned_dev, 0, pos), minlength=n_spans)
        self_dev_alloc_span = np.bincount(owners, weights=np.where(owned_dev, pos, 0), minlength=n_spans)
        self_net_span = np.bincount(owners, weights=owned_bytes, minlength=n_spans)
    span_cpu_alloc = _inclusive(self_cpu_alloc_span, parent_arr, levels)
    span_dev_alloc = _inclusive(self_dev_alloc_span, parent_arr, levels)
    span_net = _inclusive(self_net_span, parent_arr, levels)
    dev_total = _inclusive(device_self_arr.astype(np.float64), parent_arr, levels)

    # ---- peaks per module call / backward node ----------------------------------------------------------
    module_peaks = [[0, 0] for _ in range(nb)]  # per bucket: [cpu, device]
    if n_mem:
        _window_peaks(table, sweep.module_windows + sweep.backward_windows, bucket, module_peaks)

    # ---- op rows ------------------------------------------------------------------------------------------
    op_rows = _op_rows(
        table,
        order_arr,
        bucket_arr,
        buckets,
        found_ranges,
        excl_arr,
        device_self_arr,
        dev_total,
        counted_flops,
        self_cpu_alloc_span,
        span_cpu_alloc,
        self_dev_alloc_span,
        span_dev_alloc,
        self_net_span,
        span_net,
        unlinked_device,
        unlinked_bucket,
        catalog,
        parent_arr,
    )

    # ---- assemble ---------------------------------------------------------------------------------------
    def bucket_metrics(b: int) -> Metrics:
        return Metrics(
            self_cpu_us=float(self_cpu_ns[b]) / 1000.0,
            cpu_us=float(self_cpu_ns[b]) / 1000.0,
            self_device_us=float(self_dev_ns[b]) / 1000.0,
            device_us=float(self_dev_ns[b]) / 1000.0,
            self_flops=self_flops[b],
            flops=self_flops[b],
            self_cpu_alloc_bytes=int(cpu_alloc[b]),
            cpu_alloc_bytes=int(cpu_alloc[b]),
            self_device_alloc_bytes=int(dev_alloc[b]),
            device_alloc_bytes=int(dev_alloc[b]),
            self_retained_bytes=int(retained[b]),
            retained_bytes=int(retained[b]),
            cpu_peak_bytes=module_peaks[b][0],
            device_peak_bytes=module_peaks[b][1],
        )

    own = [(bucket_metrics(2 * m), bucket_metrics(2 * m + 1)) for m in range(len(catalog))]
    first_call: dict[int, int] = {}
    for i in sweep.module_windows:
        first_call.setdefault(role_module[span_name[i]], len(first_call))
    root = assemble_tree(catalog, own, sweep.module_calls, first_call)
    unattributed = tuple(
        UnattributedEntry(
            label=label, phase=phase, calls=buckets.occurrences[k], metrics=bucket_metrics(two_m + k)
        )
        for k, (label, phase) in enumerate(buckets.labels)
    )

    totals = Metrics(
        self_cpu_us=sweep.top_level_ns / 1000.0,
        cpu_us=sweep.top_level_ns / 1000.0,
        self_device_us=sum(span_dur[k] for k in device_spans) / 1000.0,
        device_us=sum(span_dur[k] for k in device_spans) / 1000.0,
        self_flops=int(counted_flops.sum()),
        flops=int(counted_flops.sum()),
        self_cpu_alloc_bytes=int(np.where(mem_dev, 0, np.maximum(mem_bytes, 0)).sum()) if n_mem else 0,
        cpu_alloc_bytes=int(np.where(mem_dev, 0, np.maximum(mem_bytes, 0)).sum()) if n_mem else 0,
        self_device_alloc_bytes=int(np.where(mem_dev, np.maximum(mem_bytes, 0), 0).sum()) if n_mem else 0,
        device_alloc_bytes=int(np.where(mem_dev, np.maximum(mem_bytes, 0), 0).sum()) if n_mem else 0,
        self_retained_bytes=int(mem_bytes.sum()) if n_mem else 0,
        retained_bytes=int(mem_bytes.sum()) if n_mem else 0,
        cpu_peak_bytes=root.total.cpu_peak_bytes,
        device_peak_bytes=root.total.device_peak_bytes,
    )

    steps = step_stats(
        table,
        sweep.step_spans,
        order_arr,
        bucket_arr,
        excl_arr,
        dev_total,
        catalog,
        [label for label, _ in buckets.labels],
        {node.path for node in root.walk()},
    )
    full_meta: dict[str, Any] = dict(meta or {})
    full_meta.setdefault("event_count", table.event_count)
    if order_arr.size:  # the recorded window: first CPU event's start to the last one's end
        full_meta.setdefault(
            "wall_us", float((ts_arr + dur_arr)[order_arr].max() - ts_arr[order_arr].min()) / 1000.0
        )
    full_meta.setdefault("trace", {k: v for k, v in table.meta.items() if _is_json_scalar_tree(v)})
    if n_mem:
        start = int(ts_arr[order_arr].min()) if order_arr.size else int(min(table.mem_ts))
        full_meta.setdefault(
            "memory_timeline", _memory_timeline(table, mem_span, bucket, buckets, catalog, start)
        )
    return Profile(
        meta=full_meta, root=root, op_rows=op_rows, unattributed=unattributed, totals=totals, steps=steps
    )


def _roles(
    names: list[str], catalog: list[ModuleInfo] | None
) -> tuple[list[ModuleInfo], dict[int, tuple[str, str]], list[int], list[int]]:
    """The module catalog (discovered from range names when not given) and each name's role."""
    found_ranges: dict[int, tuple[str, str]] = {}
    for name_id, name in enumerate(names):
        parsed = parse_module_range(name)
        if parsed is not None:
            found_ranges[name_id] = parsed
    if catalog is None:
        catalog = catalog_from_ranges(found_ranges.values())
    module_index = {info.path: i for i, info in enumerate(catalog)}
    extra = [pair for pair in found_ranges.values() if pair[0] not in module_index]
    if extra:  # ranges of modules the catalog does not know (e.g. a foreign root): add them
        catalog = _extend_catalog(catalog, extra)
        module_index = {info.path: i for i, info in enumerate(catalog)}
    roles = [_ROLE_PLAIN] * len(names)
    role_module = [-1] * len(names)
    for name_id, name in enumerate(names):
        if name_id in found_ranges:
            roles[name_id] = _ROLE_MODULE
            role_module[name_id] = module_index[found_ranges[name_id][0]]
        elif name.startswith(BACKWARD_NODE_PREFIX):
            roles[name_id] = _ROLE_BACKWARD_NODE
        elif name.startswith(STEP_PREFIX):
            roles[name_id] = _ROLE_STEP
    return catalog, found_ranges, roles, role_module


def _time_order(table: EventTable) -> np.ndarray:
    """CPU spans by start time, the longest first among equal starts (parents before children)."""
    ts_arr, dur_arr = table.array("span_ts"), table.array("span_dur")
    cpu_idx = np.flatnonzero(np.isin(table.array("span_kind"), [int(k) for k in CPU_KINDS]))
    return cpu_idx[np.lexsort((-dur_arr[cpu_idx], ts_arr[cpu_idx]))]


def backward_ranges(table: EventTable) -> list[tuple[str, int, int, int]]:
    """``(module path, tid, start ns, end ns)`` for every run of consecutive backward nodes that one
    module owns: where each layer's backward ran (for trace views)."""
    catalog, _, roles, role_module = _roles(table.names, None)
    buckets = _Buckets(len(catalog), [], {}, [])
    sweep = _sweep(table, _time_order(table), roles, role_module, buckets)
    ranges: list[tuple[str, int, int, int]] = []
    two_m = 2 * len(catalog)
    for i in sweep.backward_windows:
        b = sweep.bucket[i]
        if not (0 <= b < two_m and b & 1):
            continue
        path, tid = catalog[b // 2].path, table.span_tid[i]
        start, end = table.span_ts[i], table.span_ts[i] + table.span_dur[i]
        last = ranges[-1] if ranges else None
        if last is not None and last[0] == path and last[1] == tid:
            ranges[-1] = (path, tid, last[2], max(last[3], end))
        else:
            ranges.append((path, tid, start, end))
    return ranges


@dataclass
class _Sweep:
    """What the sweep over CPU spans finds: nesting, exclusive time, buckets, module calls."""

    parent: list[int]  # enclosing span, -1 at top level
    excl: list[int]  # duration minus direct children's, ns
    bucket: list[int]  # -1 for spans that are not CPU spans
    module_calls: list[int]
    module_windows: list[int]  # module-range spans, in time order
    backward_windows: list[int]  # backward-node spans
    step_spans: list[int]  # ProfilerStep#N spans
    top_level_ns: int  # total duration of top-level spans: the run's CPU total


def _sweep(
    table: EventTable, order: np.ndarray, roles: list[int], role_module: list[int], buckets: _Buckets
) -> _Sweep:
    """One pass over CPU spans in time order: nesting by torch's rule with a stack per thread,
    exclusive time, and each span's bucket (module range, backward node, inherited, or a label)."""
    span_name, span_tid, span_ts, span_dur = table.span_name, table.span_tid, table.span_ts, table.span_dur
    span_seq, span_fwd_tid = table.span_seq, table.span_fwd_tid
    n_spans = table.span_count
    parent = [-1] * n_spans
    excl = list(span_dur)
    bucket = [-1] * n_spans
    stacks: dict[int, tuple[list[int], list[int]]] = {}
    # Forward ops by (thread, sequence number). Sequence numbers never repeat on a thread, and a
    # backward node always starts after its forward op, so the sweep below finds the forward op's
    # bucket already set. Where several ops share a number (aten::linear and the aten::t inside),
    # the innermost, which ran last, wins; both sit in the same module.
    seq_arr = table.array("span_seq")
    is_forward_op = (seq_arr >= 0) & (table.array("span_fwd_tid") == 0)
    forward_ops = order[is_forward_op[order]]
    forward_op_of: dict[tuple[int, int], int] = dict(
        zip(
            zip(
                table.array("span_tid")[forward_ops].tolist(),
                seq_arr[forward_ops].tolist(),
                strict=True,
            ),
            forward_ops.tolist(),
            strict=True,
        )
    )
    module_calls = [0] * buckets.module_count
    module_windows: list[int] = []  # module-range spans (for peaks)
    backward_windows: list[int] = []  # backward-node spans (for peaks)
    step_spans: list[int] = []
    top_level_ns = 0
    two_m = 2 * buckets.module_count
    names = table.names
    current_tid = None
    open_idx: list[int] = []
    open_end: list[int] = []

    # The hot loop (one iteration per CPU span): keep it to list indexing and local names.
    for i in order.tolist():
        tid = span_tid[i]
        if tid != current_tid:
            frames = stacks.get(tid)
            if frames is None:
                frames = stacks[tid] = ([], [])
            open_idx, open_end = frames
            current_tid = tid
        start = span_ts[i]
        end = start + span_dur[i]
        while open_end:
            top = open_end[-1]
            if start < top and end <= top:
                break
            open_idx.pop()
            open_end.pop()
        if open_idx:
            p = open_idx[-1]
            parent[i] = p
            excl[p] -= span_dur[i]
        else:
            p = -1
            top_level_ns += span_dur[i]
        open_idx.append(i)
        open_end.append(end)

        name_id = span_name[i]
        role = roles[name_id]
        if role == _ROLE_PLAIN and p >= 0 and roles[span_name[p]] != _ROLE_STEP:
            b = bucket[p]
        elif role == _ROLE_MODULE:
            m = role_module[name_id]
            b = 2 * m
            module_calls[m] += 1
            module_windows.append(i)
        elif role == _ROLE_BACKWARD_NODE:
            owner = forward_op_of.get((span_fwd_tid[i], span_seq[i]), -1) if span_seq[i] >= 0 else -1
            fb = bucket[owner] if owner >= 0 else -1
            if 0 <= fb < two_m and not fb & 1:
                b = fb + 1
            else:
                b = buckets.unattributed(names[name_id][len(BACKWARD_NODE_PREFIX) :], Phase.BACKWARD)
            backward_windows.append(i)
        elif role == _ROLE_STEP:
            b = buckets.unattributed(LABEL_STEP_GAPS, Phase.OTHER)
            step_spans.append(i)
        else:
            b = buckets.unattributed(names[name_id], Phase.OTHER)
        bucket[i] = b

    return _Sweep(
        parent, excl, bucket, module_calls, module_windows, backward_windows, step_spans, top_level_ns
    )


def _extend_catalog(catalog: list[ModuleInfo], extra: list[tuple[str, str]]) -> list[ModuleInfo]:
    known = {info.path for info in catalog}
    added = [info for info in catalog_from_ranges(extra) if info.path not in known]
    return list(catalog) + added


def _window_peaks(table: EventTable, windows: list[int], bucket: list[int], peaks: list[list[int]]) -> None:
    """Peak net allocation within each window (module call / backward node), per device class:
    the highest running total inside the window minus the running total just before it. Range
    maxima come from a sparse table, so all windows of a thread are answered in a few numpy steps."""
    mem_tid = table.array("mem_tid")
    mem_ts = table.array("mem_ts")
    mem_bytes = table.array("mem_bytes")
    on_dev = table.array("mem_on_device")
    classes = [0, 1] if on_dev.any() else [0]
    win = np.asarray(windows, dtype=np.int64)
    win_tid = table.array("span_tid")[win]
    win_start = table.array("span_ts")[win]
    win_end = win_start + table.array("span_dur")[win]
    win_bucket = np.asarray(bucket, dtype=np.int64)[win]
    for tid in sorted(set(win_tid.tolist())):
        sel = np.flatnonzero(mem_tid == tid)
        if sel.size == 0:
            continue
        sel = sel[np.argsort(mem_ts[sel], kind="stable")]
        times = mem_ts[sel]
        here = win_tid == tid
        lo = np.searchsorted(times, win_start[here], side="left")
        hi = np.searchsorted(times, win_end[here], side="right")
        nonempty = hi > lo
        lo, hi, owners = lo[nonempty], hi[nonempty], win_bucket[here][nonempty]
        if not lo.size:
            continue
        for cls in classes:
            values = np.where(on_dev[sel] if cls else ~on_dev[sel], mem_bytes[sel], 0)
            cum = np.cumsum(values)
            base = np.where(lo > 0, cum[np.maximum(lo - 1, 0)], 0)
            window_peak = _range_max(cum, lo, hi) - base
            # Largest window per bucket: sort by (bucket, peak) and keep each bucket's last entry
            # (np.maximum.at is an order of magnitude slower).
            by = np.lexsort((window_peak, owners))
            last = np.flatnonzero(np.diff(owners[by], append=-1) != 0)
            for b, peak in zip(owners[by][last].tolist(), window_peak[by][last].tolist(), strict=True):
                if peak > peaks[b][cls]:
                    peaks[b][cls] = peak


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo[k]:hi[k]]) for every k (all ranges non-empty), with a sparse table."""
    table = [values]
    span = 1
    while 2 * span <= values.size:
        prev = table[-1]
        table.append(np.maximum(prev[:-span], prev[span:]))
        span *= 2
    length = hi - lo
    level = np.floor(np.log2(length)).astype(np.int64)
    result = np.empty(lo.size, dtype=values.dtype)
    for k in np.unique(level).tolist():
        pick = level == k
        rows = table[k]
        width = 1 << k
        result[pick] = np.maximum(rows[lo[pick]], rows[hi[pick] - width])
    return result


def _op_rows(
    table: EventTable,
    order: np.ndarray,
    bucket: np.ndarray,
    buckets: _Buckets,
    module_ranges: dict[int, tuple[str, str]],
    excl: np.ndarray,
    device_self: np.ndarray,
    dev_total: np.ndarray,
    flops: np.ndarray,
    self_cpu_alloc: np.ndarray,
    cpu_alloc: np.ndarray,
    self_dev_alloc: np.ndarray,
    dev_alloc: np.ndarray,
    self_net: np.ndarray,
    net: np.ndarray,
    unlinked_device: list[int],
    unlinked_bucket: int,
    catalog: list[ModuleInfo],
    parent: np.ndarray,
) -> tuple[OpStats, ...]:
    """One row per (name, bucket, input shapes), summed with numpy over the spans in each group.

    Like torch's tables, an op whose only child is an op of the same name (a dispatch to an
    overload) counts as one call: the child's self figures join the parent's.
    """
    names = table.names
    is_module_name = np.zeros(len(names) + 1, dtype=bool)
    is_module_name[list(module_ranges)] = True
    all_names = table.array("span_name")
    merged = _same_name_only_children(all_names, parent, order)
    if merged.size:
        target = parent[merged]
        while True:  # chains a -> a -> a fold into the outermost
            again = np.isin(target, merged)
            if not again.any():
                break
            target = np.where(again, parent[target], target)
        excl, device_self, self_cpu_alloc, self_dev_alloc, self_net = (
            _fold_into(values, merged, target)
            for values in (excl, device_self, self_cpu_alloc, self_dev_alloc, self_net)
        )
        flops = np.asarray(flops, dtype=np.int64).copy()
        np.add.at(flops, target, flops[merged])
        flops[merged] = 0
        keep = np.ones(parent.size, dtype=bool)
        keep[merged] = False
        order = order[keep[order]]
    idx = order[~is_module_name[all_names[order]]] if order.size else order
    if not idx.size and not unlinked_device:
        return ()
    name_col = all_names[idx]
    bucket_col = bucket[idx]
    shape_col = table.array("span_shapes")[idx] + 1
    nb, ns = buckets.count + 1, len(names) + 1
    keys = (name_col * nb + bucket_col) * ns + shape_col
    uniq, row_of = np.unique(keys, return_inverse=True)
    row_of = row_of.reshape(-1)
    rows = len(uniq)

    def summed(values: np.ndarray | list[int]) -> np.ndarray:
        return np.bincount(row_of, weights=np.asarray(values)[idx], minlength=rows)

    calls = np.bincount(row_of, minlength=rows)
    cols = {
        "self_cpu_us": summed(excl) / 1000.0,
        "cpu_us": summed(table.array("span_dur")) / 1000.0,
        "self_device_us": summed(device_self) / 1000.0,
        "device_us": summed(dev_total) / 1000.0,
        "flops": summed(flops),
        "self_cpu_alloc_bytes": summed(self_cpu_alloc),
        "cpu_alloc_bytes": summed(cpu_alloc),
        "self_device_alloc_bytes": summed(self_dev_alloc),
        "device_alloc_bytes": summed(dev_alloc),
        "self_retained_bytes": summed(self_net),
        "retained_bytes": summed(net),
    }
    # FLOPs can exceed 2**53 over a long run: sum them exactly, as Python ints.
    exact_flops = [0] * rows
    for j in np.flatnonzero(flops[idx]).tolist():
        exact_flops[int(row_of[j])] += int(flops[idx[j]])
    paths = [info.path for info in catalog]
    two_m = 2 * buckets.module_count
    result: list[OpStats] = []
    # Plain Python lists: indexing numpy arrays element by element is ~10x slower.
    col = {k: v.tolist() for k, v in cols.items()}
    calls_list = calls.tolist()
    phases = [buckets.phase_of(b) for b in range(buckets.count)]
    for r, key in enumerate(uniq.tolist()):
        shape_id = key % ns - 1
        rest = key // ns
        b = rest % nb
        name_id = rest // nb
        module = paths[b // 2] if b < two_m else None
        scope = "" if b < two_m else buckets.labels[b - two_m][0]
        fl = exact_flops[r]
        result.append(
            OpStats(
                name=names[name_id],
                phase=phases[b],
                module=module,
                input_shapes=names[shape_id] if shape_id >= 0 else None,
                calls=calls_list[r],
                metrics=Metrics(
                    col["self_cpu_us"][r],
                    col["cpu_us"][r],
                    col["self_device_us"][r],
                    col["device_us"][r],
                    fl,
                    fl,
                    int(col["self_cpu_alloc_bytes"][r]),
                    int(col["cpu_alloc_bytes"][r]),
                    int(col["self_device_alloc_bytes"][r]),
                    int(col["device_alloc_bytes"][r]),
                    int(col["self_retained_bytes"][r]),
                    int(col["retained_bytes"][r]),
                ),
                scope=scope,
            )
        )
    # Device work no CPU op launched gets rows of its own so device totals reconcile.
    unlinked: dict[int, list[int]] = {}
    for k in unlinked_device:
        unlinked.setdefault(table.span_name[k], []).append(table.span_dur[k])
    for name_id, durs in unlinked.items():
        us = sum(durs) / 1000.0
        result.append(
            OpStats(
                name=names[name_id],
                phase=Phase.OTHER,
                module=None,
                input_shapes=None,
                calls=len(durs),
                metrics=Metrics(self_device_us=us, device_us=us),
                scope=LABEL_UNLINKED_DEVICE,
            )
        )
    return tuple(result)


def _memory_timeline(
    table: EventTable,
    owners: list[int],
    bucket: list[int],
    buckets: _Buckets,
    catalog: list[ModuleInfo],
    start_ns: int,
    points: int = 800,
) -> dict[str, Any]:
    """Memory in use over time (bytes allocated since the window began; CPU and device), sampled to
    at most ``points`` points that keep every local maximum's bucket, and the peak with its owner."""
    ts = table.array("mem_ts")
    by_time = np.argsort(ts, kind="stable")
    nbytes = table.array("mem_bytes")[by_time]
    on_device = table.array("mem_on_device")[by_time]
    cpu = np.cumsum(np.where(on_device, 0, nbytes))
    device = np.cumsum(np.where(on_device, nbytes, 0))
    has_device = bool(on_device.any())
    watched = device if has_device else cpu
    peak = int(np.argmax(watched))
    # keep the highest point of each of `points` slices, so the plot never hides a peak
    edges = np.linspace(0, by_time.size, num=min(points, by_time.size) + 1).astype(np.int64)
    keep = sorted(
        {int(lo + np.argmax(watched[lo:hi])) for lo, hi in itertools.pairwise(edges) if hi > lo}
        | {0, by_time.size - 1, peak}
    )
    owner = owners[int(by_time[peak])]
    b = bucket[owner] if owner >= 0 else -1
    two_m = 2 * buckets.module_count
    where = "(outside ops)" if b < 0 else catalog[b // 2].path if b < two_m else buckets.labels[b - two_m][0]
    phase = None if b < 0 else str(buckets.phase_of(b))
    return {
        "t_us": [round((int(ts[by_time[k]]) - start_ns) / 1000.0, 3) for k in keep],
        "cpu_bytes": [int(cpu[k]) for k in keep],
        "device_bytes": [int(device[k]) for k in keep] if has_device else [],
        "peak": {
            "t_us": round((int(ts[by_time[peak]]) - start_ns) / 1000.0, 3),
            "bytes": int(watched[peak]),
            "device": has_device,
            "module": where,
            "phase": phase,
        },
    }


def _is_json_scalar_tree(value: Any) -> bool:
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list):
        return all(_is_json_scalar_tree(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json_scalar_tree(v) for k, v in value.items())
    return False


def _same_name_only_children(names: np.ndarray, parent: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Spans that are the only child of a span with the same name (torch folds them away)."""
    if not order.size:
        return order
    nested = order[parent[order] >= 0]
    child_count = np.bincount(parent[nested], minlength=parent.size)
    p = parent[nested]
    merged: np.ndarray = nested[(names[nested] == names[p]) & (child_count[p] == 1)]
    return merged


def _fold_into(values: np.ndarray, merged: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``values`` with each merged span's value added to its target and zeroed."""
    out = np.asarray(values, dtype=np.float64).copy()
    np.add.at(out, target, out[merged])
    out[merged] = 0
    return out


def _device_launchers(
    table: EventTable, order: np.ndarray, parent: list[int], device_spans: list[int]
) -> list[int]:
    """For each device span, the CPU op that launched it (-1 if none): through the runtime call
    with the same correlation id (then its nearest enclosing non-runtime span), else the op with
    the same external id."""
    if not device_spans:
        return []
    kinds = table.span_kind
    runtime_by_corr: dict[int, int] = {}
    op_by_ext: dict[int, int] = {}
    for i in order.tolist():
        if kinds[i] == EventKind.RUNTIME:
            if table.span_corr[i] > 0:
                runtime_by_corr[table.span_corr[i]] = i
        elif table.span_ext[i] > 0:
            op_by_ext[table.span_ext[i]] = i
    owners: list[int] = []
    for k in device_spans:
        runtime = runtime_by_corr.get(table.span_corr[k], -1) if table.span_corr[k] > 0 else -1
        if runtime >= 0:
            op = parent[runtime]
            while op >= 0 and kinds[op] == EventKind.RUNTIME:
                op = parent[op]
            # A launch outside any op: the runtime call itself is the owner.
            owners.append(op if op >= 0 else runtime)
        else:
            owners.append(op_by_ext.get(table.span_ext[k], -1) if table.span_ext[k] > 0 else -1)
    return owners


def _depths(parent: np.ndarray) -> np.ndarray:
    """Nesting depth of every span (0 = top level), one numpy step per level."""
    depth = np.zeros(parent.size, dtype=np.int64)
    up = parent.copy()
    while True:
        has = up >= 0
        if not has.any():
            return depth
        depth += has
        up = np.where(has, parent[np.maximum(up, 0)], -1)


def _levels(order: np.ndarray, depth: np.ndarray) -> list[np.ndarray]:
    """Span indices grouped by nesting depth (level 0 = top-level spans)."""
    if not order.size:
        return []
    d = depth[order]
    return [order[d == k] for k in range(int(d.max()) + 1)]


def _inclusive(own: np.ndarray, parent: np.ndarray, levels: list[np.ndarray]) -> np.ndarray:
    """Per-span totals including all nested spans: children added to parents, deepest level first."""
    total = np.asarray(own, dtype=np.float64).copy()
    if not total.any():
        return total
    for level in reversed(levels[1:]):
        total += np.bincount(parent[level], weights=total[level], minlength=total.size)
    return total


def _outermost_flops(flops: list[int], parent: np.ndarray, levels: list[np.ndarray]) -> np.ndarray:
    """FLOPs that count: a span's own FLOPs unless an enclosing span already counted FLOPs."""
    values = np.asarray(flops, dtype=np.int64)
    if not values.any():
        return values
    covered = np.zeros(values.size, dtype=bool)  # some ancestor has FLOPs
    for level in levels[1:]:
        p = parent[level]
        covered[level] = covered[p] | (values[p] > 0)
    return np.where(covered, 0, values)


def _memory_owners(
    table: EventTable, order: np.ndarray, ts: np.ndarray, dur: np.ndarray, parent_arr: np.ndarray
) -> list[int]:
    """For each memory event, the innermost CPU span on its thread containing its timestamp (-1 if
    none): the last span starting at or before it, or the nearest ancestor still open then."""
    mem_tid = table.array("mem_tid")
    mem_ts = table.array("mem_ts")
    owners = np.full(mem_ts.size, -1, dtype=np.int64)
    span_tid = table.array("span_tid")[order] if order.size else order
    end = ts + dur
    for tid in sorted(set(table.mem_tid)):
        spans = order[span_tid == tid]
        sel = np.flatnonzero(mem_tid == tid)
        if not spans.size:
            continue
        t = mem_ts[sel]
        k = np.searchsorted(ts[spans], t, side="right") - 1
        cand = np.where(k >= 0, spans[np.maximum(k, 0)], -1)
        # Events after their candidate ended belong to the nearest ancestor still open: walk up
        # the ones still outside, all at once, one nesting level per step.
        todo = np.flatnonzero((cand >= 0) & (end[np.maximum(cand, 0)] < t))
        while todo.size:
            cand[todo] = parent_arr[cand[todo]]
            c = cand[todo]
            todo = todo[(c >= 0) & (end[np.maximum(c, 0)] < t[todo])]
        owners[sel] = cand
    return owners.tolist()
