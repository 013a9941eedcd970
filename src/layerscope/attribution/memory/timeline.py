"""The memory timeline (``meta.memory_timeline``, the HTML report's plot): net bytes allocated since
the window began, CPU and device, sampled so that the plot never hides a peak."""

from __future__ import annotations

import numpy as np

from layerscope.attribution.buckets import Buckets
from layerscope.attribution.catalog import ModuleInfo
from layerscope.events.table import EventTable
from layerscope.model.memory import MemoryTimeline, TimelinePeak


def memory_timeline(
    table: EventTable,
    owners: np.ndarray,
    bucket: np.ndarray,
    buckets: Buckets,
    catalog: list[ModuleInfo],
    start_ns: int,
    points: int = 800,
) -> MemoryTimeline:
    """Memory in use over time (net bytes allocated since the window began; CPU and device), sampled to
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
    keep = sorted({*first_maxima(watched, edges).tolist(), 0, by_time.size - 1, peak})
    owner = int(owners[int(by_time[peak])])
    b = int(bucket[owner]) if owner >= 0 else -1
    where = "(outside ops)" if b < 0 else buckets.where(b, catalog)
    phase = None if b < 0 else str(buckets.phase_of(b))
    return MemoryTimeline(
        t_us=tuple(round((t - start_ns) / 1000.0, 3) for t in ts[by_time[keep]].tolist()),
        cpu_net_bytes=tuple(cpu[keep].tolist()),
        device_net_bytes=tuple(device[keep].tolist()) if has_device else (),
        peak=TimelinePeak(
            t_us=round((int(ts[by_time[peak]]) - start_ns) / 1000.0, 3),
            relative_peak_bytes=int(watched[peak]),
            device=has_device,
            module=where,
            phase=phase,
        ),
    )


def first_maxima(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per slice ``values[edges[i]:edges[i + 1]]`` that is not empty, the index of its first
    highest value (what ``argmax`` gives), all slices at once."""
    starts = edges[:-1][edges[1:] > edges[:-1]]  # the slices left cover [starts[0], edges[-1])
    if not starts.size:
        return starts
    highest = np.maximum.reduceat(values[: edges[-1]], starts)
    slice_of = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, edges[-1]]))
    hits = np.flatnonzero(values[: edges[-1]] == highest[slice_of])
    first = np.r_[True, slice_of[hits][1:] != slice_of[hits][:-1]]
    return hits[first]
