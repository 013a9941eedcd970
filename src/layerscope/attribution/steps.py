"""Per-step statistics: each step window (``events/steps.py``) with its CPU time split by module and label."""

from __future__ import annotations

import numpy as np

from layerscope.attribution.buckets import Buckets
from layerscope.attribution.catalog import ModuleInfo
from layerscope.events.steps import StepWindow
from layerscope.events.table import DEVICE_WORK_KINDS, EventTable
from layerscope.model.profile import StepStats


def device_in_windows(table: EventTable, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window ``[lo, hi)`` (ns): the device time of every kernel, copy and set run in it, each
    clipped to the window, from any stream and whatever thread launched it. Overlapping work counts
    each (device time, as everywhere in a Profile; the verdicts' busy time counts overlaps once)."""
    kinds = table.array("span_kind")
    work = np.flatnonzero(np.isin(kinds, [int(k) for k in DEVICE_WORK_KINDS]))
    result = np.zeros(lo.size, dtype=np.int64)
    if not work.size:
        return result
    ts = table.array("span_ts")[work]
    by_start = np.argsort(ts, kind="stable")
    starts = ts[by_start]
    ends = starts + table.array("span_dur")[work][by_start]
    # Work that starts before a window can still run into it: from the first span whose running
    # maximum end passes the window's start, every later span is a candidate.
    reach = np.maximum.accumulate(ends)
    first = np.searchsorted(reach, lo, side="right")
    last = np.searchsorted(starts, hi, side="left")
    for w in range(lo.size):
        a, b = int(first[w]), int(last[w])
        if a < b:
            clipped = np.minimum(ends[a:b], hi[w]) - np.maximum(starts[a:b], lo[w])
            result[w] = int(clipped[clipped > 0].sum())
    return result


def step_stats(
    table: EventTable,
    windows: list[StepWindow],
    order: np.ndarray,
    bucket: np.ndarray,
    excl: np.ndarray,
    catalog: list[ModuleInfo],
    buckets: Buckets,
    kept_paths: set[str],
    drop_idle_last: bool = True,
) -> tuple[StepStats, ...]:
    """One StepStats per step window (``step_windows``, in time order), in step order.

    A CPU span belongs to the step whose window contains its start, whatever its thread (the
    backward of a GPU run executes on autograd's own thread, outside the step's nesting). Device
    time is the device work run inside the window (``device_in_windows``): the kernels of backward
    threads count, and a step is charged for what its device did, as the step verdicts of
    ``analysis/device.py`` measure it, not for work it queued that ran in the next step.
    ``bucket`` holds each span's bucket, numbered by ``buckets``.
    """
    if not windows:
        return ()
    ts = table.array("span_ts")
    starts = np.asarray([w.start for w in windows], dtype=np.int64)
    # windows never overlap: a span or a kernel is counted in one step at most
    ends = np.asarray([w.end for w in windows], dtype=np.int64)
    span_start = ts[order]
    which = np.searchsorted(starts, span_start, side="right") - 1
    inside = (which >= 0) & (span_start < ends[np.maximum(which, 0)])
    device_ns = device_in_windows(table, starts, ends)
    n_modules = buckets.module_count
    n_buckets = buckets.count
    key = which[inside] * n_buckets + bucket[order][inside]
    flat = np.bincount(key, weights=excl[order][inside], minlength=len(windows) * n_buckets)
    sums: np.ndarray = flat.reshape(len(windows), n_buckets) / 1000.0
    forward = sums[:, buckets.forward_slice].copy()  # per step, per module (catalog order)
    backward = sums[:, buckets.backward_slice].copy()
    # Inclusive times: children into parents, deepest first (the catalog lists parents first).
    index = {info.path: m for m, info in enumerate(catalog)}
    for m in range(n_modules - 1, -1, -1):
        parent = catalog[m].parent
        if parent is not None:
            forward[:, index[parent]] += forward[:, m]
            backward[:, index[parent]] += backward[:, m]
    result = []
    for row, window in enumerate(windows):
        modules = {
            info.path: (float(forward[row, m]), float(backward[row, m]))
            for m, info in enumerate(catalog)
            if info.path in kept_paths
        }
        unattributed: dict[str, float] = {}
        for k, (label, _) in enumerate(buckets.labels):
            value = float(sums[row, buckets.label_bucket(k)])
            if value:
                unattributed[label] = unattributed.get(label, 0.0) + value
        result.append(
            StepStats(
                step=window.number,
                wall_us=window.wall_ns / 1000.0,
                device_us=int(device_ns[row]) / 1000.0,
                cpu_us=float(sums[row].sum()),
                modules=modules,
                unattributed=unattributed,
            )
        )
    result.sort(key=lambda s: s.step)
    # `for batch in data: train(batch); prof.step()` leaves a last step that the final step() opened
    # and the block's end closed, with no training in it: not a step worth a row.
    # (Only where modules are real: regions standing in for them say nothing about training.)
    idle_last = _module_work(result[-1]) == 0 and any(_module_work(s) > 0 for s in result[:-1])
    if drop_idle_last and len(result) > 1 and idle_last:
        result.pop()
    return tuple(result)


def _module_work(step: StepStats) -> float:
    return sum(step.modules.get("", (0.0, 0.0)))
