"""The ``meta.memory`` report (:class:`MemoryReport`): per device class the absolute peak of live
memory and what was live at it by category and module (``story.py`` pairs the events and names
them), per-step figures,
tensors saved for backward per module that keeps them, and allocations refused (out of memory)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any

import numpy as np

from layerscope.attribution.buckets import Buckets
from layerscope.attribution.catalog import ModuleInfo
from layerscope.attribution.forward_ops import ForwardOps
from layerscope.attribution.memory.over_time import memory_over_time
from layerscope.attribution.memory.saved import saved_by_module
from layerscope.attribution.memory.story import MemoryStory, placement_of
from layerscope.attribution.memory.sums import innermost_spans, range_max
from layerscope.attribution.nesting import Sweep
from layerscope.events.memory_snapshots import CATEGORIES, Snapshot
from layerscope.events.steps import step_windows
from layerscope.events.table import EventTable
from layerscope.model.memory import ClassMemory, MemoryReport, MemoryRow, OutOfMemory, StepMemory
from layerscope.model.profile import StepStats

_PARAMETER = CATEGORIES.index("parameter")


def memory_classes(
    stories: list[MemoryStory], windows: list[tuple[int, int, int]], start_ns: int | None
) -> tuple[ClassMemory, ...]:
    """The ``meta.memory`` figures: per device class the baseline, the peak and what was live at
    it; per step the absolute peak, bytes allocated and the net change; memory over time by
    category (times since ``start_ns``)."""
    classes = []
    for story in stories:
        peak, k = story.peak()
        rows: dict[tuple[str, str, str], int] = defaultdict(int)
        for category, module, phase, nbytes in story.live_at(k, peak):
            rows[(category, module, phase)] += nbytes
        peak_where = _where_of(story, k)
        classes.append(
            ClassMemory(
                device=story.on_device,
                addressed=story.addressed,
                baseline_bytes=story.baseline.total,
                baseline_seen_bytes=story.baseline.seen,
                baseline_allocator_bytes=story.baseline.held,
                absolute_peak_bytes=peak,
                peak_ts_ns=int(story.ts[k]) if k >= 0 else None,
                where=peak_where,
                rows=tuple(
                    MemoryRow(c, m, p, b) for (c, m, p), b in sorted(rows.items(), key=lambda kv: -kv[1]) if b
                ),
                steps=_step_figures(story, windows),
                over_time=memory_over_time(story, start_ns if start_ns is not None else int(story.ts[0]))
                if story.ts.size
                else None,
            )
        )
    return tuple(classes)


def _where_of(story: MemoryStory, k: int) -> dict[str, str] | None:
    """The module, phase and op of the event that reached the peak (None: the peak is the start)."""
    if k < 0:
        return None
    where = story.place(int(story.owner[k]))
    return {"module": where.module, "phase": where.phase, "op": where.op}


def _step_figures(story: MemoryStory, windows: list[tuple[int, int, int]]) -> tuple[StepMemory, ...]:
    """Per step window (number, start, end): its absolute peak, bytes allocated and net change."""
    if not windows:
        return ()
    numbers, starts, ends = (np.asarray(column, dtype=np.int64) for column in zip(*windows, strict=True))
    running, nbytes = story.running, story.nbytes
    lo = np.searchsorted(story.ts, starts, side="left")
    hi = np.searchsorted(story.ts, ends, side="right")
    before = np.where(lo > 0, running[np.maximum(lo - 1, 0)] if running.size else 0, story.baseline.total)
    events = hi > lo
    peak = before.copy()
    if events.any():
        peak[events] = np.maximum(before[events], range_max(running, lo[events], hi[events]))
    # sums over each window's events, from running sums (exact, in int64)
    allocated = np.r_[0, np.cumsum(np.where(nbytes > 0, nbytes, 0))]
    net = np.r_[0, np.cumsum(nbytes)]
    hi = np.maximum(hi, lo)  # a window with no events changes nothing
    columns = (numbers, peak, allocated[hi] - allocated[lo], net[hi] - net[lo])
    return tuple(StepMemory(*row) for row in zip(*(c.tolist() for c in columns), strict=True))


def build_memory_report(
    table: EventTable,
    owners: np.ndarray,
    order: np.ndarray,
    bucket: np.ndarray,
    buckets: Buckets,
    catalog: list[ModuleInfo],
    snapshots: list[Snapshot] | None,
    swept: Sweep,
    parent: np.ndarray,
) -> MemoryReport:
    """``meta.memory``: baseline, peak and live-at-peak per device class, per-step peaks, and
    tensors saved for backward per keeping module (the last only with the watch's snapshots)."""
    snaps = snapshots or []
    ts = table.array("span_ts")
    place = placement_of(table, bucket, buckets, catalog)
    on_device = table.array("mem_on_device")
    stories = [
        MemoryStory(table, owners, device, snaps, place, bucket)
        for device in (False, True)
        if bool((on_device == device).any())
    ]
    windows = [(w.number, w.start, w.end) for w in step_windows(table)]
    # per bucket, the keeping module (-1: saved outside every module, a loss computed in the block;
    # the last entry: no bucket)
    module_of = np.array(
        [buckets.module_of(b) if buckets.is_module(b) else -1 for b in range(buckets.count)] + [-1]
    )

    def keepers(snapshot: Snapshot) -> np.ndarray:
        span = _forward_ops_of(swept.forward_op_of, snapshot.tid, snapshot.columns().seq)
        return module_of[np.where(span >= 0, bucket[span], -1)]

    parameter_addrs = [
        c.addr[c.category == _PARAMETER] for c in (s.columns() for s in snaps if s.kind == "start")
    ]
    start_ns = (
        int(ts[order].min())
        if order.size
        else int(table.array("mem_ts").min())
        if table.memory_count
        else None
    )
    return MemoryReport(
        classes=memory_classes(stories, windows, start_ns),
        saved=saved_by_module(
            snaps,
            keepers,
            [info.path for info in catalog],
            np.concatenate([np.zeros(0, np.int64), *parameter_addrs]),
        ),
        watched=bool(snaps),
        start_ns=start_ns,
        out_of_memory=_out_of_memory(table, order, parent, place, stories) if table.out_of_memory else (),
        addresses=bool(table.memory_count) and bool(table.array("mem_addr").any()),
    )


def _forward_ops_of(ops: ForwardOps, tid: int, seq: np.ndarray) -> np.ndarray:
    """The forward op of each sequence number on thread ``tid`` (-1: none); a snapshot whose thread
    is unknown (no marks) takes the first thread that has the number."""
    if tid >= 0:
        return ops.lookup(np.full(seq.size, tid, dtype=np.int64), seq)
    by_seq: dict[int, int] = {}
    for (_, number), span in ops.mapping().items():
        by_seq.setdefault(number, span)
    return np.asarray([by_seq.get(number, -1) for number in seq.tolist()], dtype=np.int64)


def with_step_memory(steps: tuple[StepStats, ...], memory: MemoryReport) -> tuple[StepStats, ...]:
    """The steps with their memory figures (the device's when it recorded any, else the CPU's)."""
    watched = memory.main_class()
    if watched is None or not steps:
        return steps
    figures = {s.step: s for s in watched.steps}
    return tuple(_with_figures(step, figures.get(step.step)) for step in steps)


def _with_figures(step: StepStats, found: StepMemory | None) -> StepStats:
    if found is None:
        return step
    return replace(
        step,
        absolute_peak_bytes=found.absolute_peak_bytes,
        alloc_bytes=found.alloc_bytes,
        net_bytes=found.net_bytes,
    )


def _out_of_memory(
    table: EventTable, order: np.ndarray, parent: np.ndarray, place: Any, stories: list[MemoryStory]
) -> tuple[OutOfMemory, ...]:
    """Each refused allocation: what it asked for, where (innermost op, its module and phase), and
    the memory live on its device class then (absolute, as the peak)."""
    ooms = table.out_of_memory
    owners = innermost_spans(
        table,
        order,
        parent,
        np.asarray([o.tid for o in ooms], dtype=np.int64),
        np.asarray([o.ts for o in ooms], dtype=np.int64),
    )
    found = []
    for oom, owner in zip(ooms, owners.tolist(), strict=True):
        where = place(owner)
        story = next((st for st in stories if st.on_device == oom.on_device), None)
        live = None
        if story is not None:
            k = int(np.searchsorted(story.ts, oom.ts, side="right")) - 1
            live = int(story.running[k]) if k >= 0 else story.baseline.total
        found.append(
            OutOfMemory(
                requested_bytes=oom.requested_bytes,
                device=oom.on_device,
                module=where.module,
                phase=where.phase,
                op=where.op,
                live_bytes=live,
                allocator_allocated_bytes=oom.allocated_bytes,
                ts_ns=oom.ts,
            )
        )
    return tuple(found)
