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
    start = table.array("span_ts")[work]
    end = start + table.array("span_dur")[work]
    # each piece of work with every window it overlaps (the windows are sorted and disjoint)
    first = np.searchsorted(hi, start, side="right")
    count = np.maximum(np.searchsorted(lo, end, side="left") - first, 0)
    piece = np.repeat(np.arange(work.size), count)
    window = np.repeat(first - np.cumsum(count) + count, count) + np.arange(piece.size)
    clipped = np.minimum(end[piece], hi[window]) - np.maximum(start[piece], lo[window])
    positive = clipped > 0
    np.add.at(result, window[positive], clipped[positive])
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
    window_of, counted = _spans_in_windows(ts[order], order, starts, ends)
    device_ns = device_in_windows(table, starts, ends)
    n_modules = buckets.module_count
    n_buckets = buckets.count
    key = window_of * n_buckets + bucket[counted]
    flat = np.bincount(key, weights=excl[counted], minlength=len(windows) * n_buckets)
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
    # lists, read one element at a time below (numpy scalars are slow)
    kept = [(m, info.path) for m, info in enumerate(catalog) if info.path in kept_paths]
    forward_rows, backward_rows, device = forward.tolist(), backward.tolist(), device_ns.tolist()
    labels = [label for label, _ in buckets.labels]
    rows, columns = np.nonzero(sums[:, buckets.module_bucket_count :])
    label_values = sums[rows, buckets.module_bucket_count + columns].tolist()
    row_starts = np.searchsorted(rows, np.arange(len(windows) + 1)).tolist()
    columns_list = columns.tolist()
    # each row summed as its own reduction would (pairwise along the contiguous row): the same bits
    cpu_rows = sums.sum(axis=1).tolist()
    result = []
    for row, window in enumerate(windows):
        f, b = forward_rows[row], backward_rows[row]
        unattributed: dict[str, float] = {}
        for at in range(row_starts[row], row_starts[row + 1]):  # the labels with time, in order
            label = labels[columns_list[at]]
            unattributed[label] = unattributed.get(label, 0.0) + label_values[at]
        result.append(
            StepStats(
                step=window.number,
                wall_us=window.wall_ns / 1000.0,
                device_us=device[row] / 1000.0,
                cpu_us=cpu_rows[row],
                modules={path: (f[m], b[m]) for m, path in kept},
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


def _spans_in_windows(
    span_start: np.ndarray, order: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The spans of ``order`` (starting at ``span_start``) that start inside a window: each one's
    window and span index. Only these are gathered later, not every span's bucket and time."""
    which = np.searchsorted(starts, span_start, side="right") - 1
    inside = (which >= 0) & (span_start < ends[np.maximum(which, 0)])
    return which[inside], order[inside]


def _module_work(step: StepStats) -> float:
    return sum(step.modules.get("", (0.0, 0.0)))
