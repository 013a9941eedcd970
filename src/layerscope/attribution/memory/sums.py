"""Memory: each allocation to the innermost CPU span open at its time, sums per bucket and per span
(allocated, net), and relative peaks per module call.

Peaks are inclusive only (a peak is not additive, so a "self peak" would add up to nothing): the
peak of a window (a module call, a backward node) is the highest running total of net allocations
inside it minus the running total just before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.attribution import nest_native
from layerscope.attribution.nesting import inclusive
from layerscope.events.table import EventTable


@dataclass(frozen=True)
class BucketMemory:
    """Per bucket: bytes allocated on the CPU, on devices, and the net change (allocs minus frees)."""

    cpu_alloc: np.ndarray
    device_alloc: np.ndarray
    net: np.ndarray


@dataclass(frozen=True)
class SpanMemory:
    """Per span (table index): its own allocations (``self_*``) and those of everything nested in it."""

    self_cpu_alloc: np.ndarray
    cpu_alloc: np.ndarray
    self_device_alloc: np.ndarray
    device_alloc: np.ndarray
    self_net: np.ndarray
    net: np.ndarray


@dataclass(frozen=True)
class MemoryTotals:
    """Whole-table sums, computed from the events alone (what ``validate`` reconciles against)."""

    cpu_alloc: int
    device_alloc: int
    net: int


def memory_totals(table: EventTable) -> MemoryTotals:
    """Bytes allocated (CPU, device) and the net change over every memory event of the table."""
    if not table.memory_count:
        return MemoryTotals(0, 0, 0)
    mem_bytes = table.array("mem_bytes")
    mem_dev = table.array("mem_on_device")
    return MemoryTotals(
        cpu_alloc=int(np.where(mem_dev, 0, np.maximum(mem_bytes, 0)).sum()),
        device_alloc=int(np.where(mem_dev, np.maximum(mem_bytes, 0), 0).sum()),
        net=int(mem_bytes.sum()),
    )


def bucket_memory(
    table: EventTable, owners: np.ndarray, bucket: np.ndarray, outside_bucket: int, bucket_count: int
) -> BucketMemory:
    """Sum every memory event into its owner span's bucket (``outside_bucket`` when no span owns it)."""
    n_mem = table.memory_count
    if not n_mem:
        zero = np.zeros(bucket_count)
        return BucketMemory(zero, zero, zero)
    mem_bytes = table.array("mem_bytes")
    mem_dev = table.array("mem_on_device")
    mem_bucket = np.full(n_mem, outside_bucket, dtype=np.int64)
    inside_op = owners >= 0
    mem_bucket[inside_op] = bucket[owners[inside_op]]
    positive = np.where(mem_bytes > 0, mem_bytes, 0)
    return BucketMemory(
        cpu_alloc=np.bincount(mem_bucket, weights=np.where(mem_dev, 0, positive), minlength=bucket_count),
        device_alloc=np.bincount(mem_bucket, weights=np.where(mem_dev, positive, 0), minlength=bucket_count),
        net=np.bincount(mem_bucket, weights=mem_bytes, minlength=bucket_count),
    )


def span_memory(
    table: EventTable, owners: np.ndarray, parent: np.ndarray, levels: list[np.ndarray]
) -> SpanMemory:
    """Per-span allocations, own and inclusive (bottom-up, one numpy step per nesting level)."""
    n_spans = table.span_count
    self_cpu_alloc: np.ndarray = np.zeros(n_spans)
    self_dev_alloc: np.ndarray = np.zeros(n_spans)
    self_net: np.ndarray = np.zeros(n_spans)
    if table.memory_count:
        mem_bytes = table.array("mem_bytes")
        mem_dev = table.array("mem_on_device")
        owned = owners >= 0
        span = owners[owned]
        owned_bytes = mem_bytes[owned]
        owned_dev = mem_dev[owned]
        pos = np.maximum(owned_bytes, 0)
        self_cpu_alloc = np.bincount(span, weights=np.where(owned_dev, 0, pos), minlength=n_spans)
        self_dev_alloc = np.bincount(span, weights=np.where(owned_dev, pos, 0), minlength=n_spans)
        self_net = np.bincount(span, weights=owned_bytes, minlength=n_spans)
    return SpanMemory(
        self_cpu_alloc=self_cpu_alloc,
        cpu_alloc=inclusive(self_cpu_alloc, parent, levels),
        self_device_alloc=self_dev_alloc,
        device_alloc=inclusive(self_dev_alloc, parent, levels),
        self_net=self_net,
        net=inclusive(self_net, parent, levels),
    )


def memory_owners(table: EventTable, order: np.ndarray, parent_arr: np.ndarray) -> np.ndarray:
    """For each memory event, the innermost CPU span on its thread containing its timestamp (-1 if
    none)."""
    return innermost_spans(table, order, parent_arr, table.array("mem_tid"), table.array("mem_ts"))


def innermost_spans(
    table: EventTable, order: np.ndarray, parent_arr: np.ndarray, tids: np.ndarray, times: np.ndarray
) -> np.ndarray:
    """For each (thread, time), the innermost CPU span of that thread containing the time (-1 if
    none): the last span starting at or before it, or the nearest ancestor still open then."""
    found = nest_native.innermost(table, order, parent_arr, tids, times)
    if found is not None:
        return found
    owners = np.full(times.size, -1, dtype=np.int64)
    ts, dur = table.array("span_ts"), table.array("span_dur")
    span_tid = table.array("span_tid")[order] if order.size else order
    end = ts + dur
    for tid in sorted(set(tids.tolist())):
        spans = order[span_tid == tid]
        sel = np.flatnonzero(tids == tid)
        if not spans.size:
            continue
        t = times[sel]
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
    return owners


def window_peaks(
    table: EventTable,
    win_tid: np.ndarray,
    win_start: np.ndarray,
    win_end: np.ndarray,
    win_bucket: np.ndarray,
    peaks: list[list[int]],
) -> None:
    """Peak net allocation within each window (a module call, a backward stretch, an unattributed
    entry's span), per device class: the highest running total inside the window minus the running
    total just before it, kept per bucket as the largest of its windows. Range maxima come from a
    sparse table, so all windows of a thread are answered in a few numpy steps."""
    mem_tid = table.array("mem_tid")
    mem_ts = table.array("mem_ts")
    mem_bytes = table.array("mem_bytes")
    on_dev = table.array("mem_on_device")
    classes = [0, 1] if on_dev.any() else [0]
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
            window_peak = range_max(cum, lo, hi) - base
            # Largest window per bucket: sort by (bucket, peak) and keep each bucket's last entry
            # (vectorised, where np.maximum.at is not).
            by = np.lexsort((window_peak, owners))
            last = np.flatnonzero(np.diff(owners[by], append=-1) != 0)
            for b, peak in zip(owners[by][last].tolist(), window_peak[by][last].tolist(), strict=True):
                if peak > peaks[b][cls]:
                    peaks[b][cls] = peak


def range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo[k]:hi[k]]) for every k (all ranges non-empty), with a sparse table."""
    found = nest_native.range_max(values, lo, hi)
    if found is not None:
        return found
    length = hi - lo
    longest = int(length.max()) if length.size else 0
    table = [values]
    span = 1
    while 2 * span <= longest:  # only the levels some range uses (windows are mostly short)
        prev = table[-1]
        table.append(np.maximum(prev[:-span], prev[span:]))
        span *= 2
    level = np.floor(np.log2(length)).astype(np.int64)
    result = np.empty(lo.size, dtype=values.dtype)
    for k in np.unique(level).tolist():
        pick = level == k
        rows = table[k]
        width = 1 << k
        result[pick] = np.maximum(rows[lo[pick]], rows[hi[pick] - width])
    return result
