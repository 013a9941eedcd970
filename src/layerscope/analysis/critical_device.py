"""The critical path's device edges (HTA's launch, kernel-kernel and sync edges), vectorised.

HTA walks the device work in start order, synchronisations at their end, keeping each stream's
latest work. Here that walk is a sort: each work span's previous work on its stream is its
predecessor in the sorted order within the stream, and the few synchronisations look their streams'
latest work up by position. The edges come out in the walk's order (position, then rank within).
"""

from __future__ import annotations

import numpy as np

from layerscope.analysis.critical_edges import KERNEL_KERNEL, LAUNCH, OPERATOR, SYNC, Edges, ordered
from layerscope.analysis.critical_sync import EVENT_SYNC, STREAM_SYNC, STREAM_WAIT, SyncLinks, queue_lengths
from layerscope.events.table import EventTable

#: Gaps between work on a stream longer than this are no kernel-kernel edge (HTA's 1.5 ms).
KERNEL_GAP_NS = 1_500_000


def device_edges(
    table: EventTable,
    nodes: tuple[np.ndarray, np.ndarray, np.ndarray],
    work: np.ndarray,
    launcher: np.ndarray,
    syncs: SyncLinks,
    zero_weight_launch_edges: bool,
    hta_compatible: bool = False,
) -> tuple[Edges, np.ndarray]:
    """Per work span in start order (synchronisations at their end): its own edge, a sync edge from
    the work a stream wait holds it behind, a launch edge when it found its stream empty, else a
    kernel-kernel edge from the stream's previous work, and a weightless launch edge if asked.
    ``nodes``: the graph's spans with nodes, their node times, and each table span's slot. Also
    the work's nodes stream by stream, in walk order. Unless ``hta_compatible``, work one call
    launched with others (a CUDA graph's kernels) is launched when it is the call's first on its
    stream and that stream was idle at the launch; work whose launch call has no node (it ran from
    before the window) gets no launch edge."""
    node_span, node_ts, slot = nodes
    ts, dur, tid = table.array("span_ts"), table.array("span_dur"), table.array("span_tid")
    work_rows = np.flatnonzero(work)
    rows = np.concatenate([work_rows, syncs.rows])
    order = np.lexsort((rows, np.concatenate([ts[work_rows], ts[syncs.rows] + dur[syncs.rows]])))
    position = np.full(table.span_count, -1, dtype=np.int64)
    position[rows[order]] = np.arange(rows.size)
    at = np.sort(position[work_rows])  # the work's positions, in walk order
    r = rows[order][at]
    stream, start = tid[r], 2 * slot[r]
    by_stream = np.argsort(stream, kind="stable")
    prev = np.full(r.size, -1, dtype=np.int64)  # end node of the stream's previous work
    same = stream[by_stream[1:]] == stream[by_stream[:-1]]
    prev[by_stream[1:][same]] = start[by_stream[:-1][same]] + 1
    waited = _waited(syncs, position, slot, r)
    runtime = launcher[r]
    call = 2 * slot[runtime]
    at_launch, at_start = queue_lengths(table, launcher)
    launch_ts = ts[runtime]
    prev_ts = node_ts[np.maximum(prev, 0)]
    waited_ts = node_ts[np.maximum(waited, 0)]
    alone = (at_launch[r] == 1) & (at_start[r] == 0)
    if not hta_compatible:
        alone |= _first_of_graph(runtime, stream)
    has_call = slot[runtime] >= 0
    launched = (
        alone & has_call & ((prev < 0) | (prev_ts < launch_ts)) & ((waited < 0) | (waited_ts < launch_ts))
    )
    chained = (
        ~launched
        & (prev >= 0)
        & (node_ts[start] - prev_ts < KERNEL_GAP_NS)
        & ((waited < 0) | (waited_ts < prev_ts))
    )

    def part(mask: np.ndarray, rank: int, edges: Edges) -> tuple[np.ndarray, np.ndarray, Edges]:
        return at[mask], np.full(int(mask.sum()), rank), edges.take(mask)

    every = np.ones(r.size, dtype=bool)
    parts = [
        part(every, 0, Edges.of(start, start + 1, OPERATOR, r)),
        part(waited >= 0, 1, Edges.of(waited, start, SYNC)),
        part(launched, 2, Edges.of(call, start, LAUNCH)),
        part(chained, 2, Edges.of(prev, start, KERNEL_KERNEL, node_span[np.maximum(prev, 0) // 2])),
    ]
    if zero_weight_launch_edges:
        parts.append(part(~launched & has_call, 3, Edges.of(call, start, LAUNCH, -1, True)))
    parts.append(_cpu_waits(syncs, launcher, slot, position, at, stream, start))
    lanes = np.stack([start[by_stream], start[by_stream] + 1], axis=1).reshape(-1)
    return ordered(parts), lanes


def _first_of_graph(runtime: np.ndarray, stream: np.ndarray) -> np.ndarray:
    """Per work span (walk order): whether its call launched several (a CUDA graph) and it is the
    call's first on its stream."""
    first = np.zeros(runtime.size, dtype=bool)
    counts = np.bincount(np.maximum(runtime, 0))
    many = np.flatnonzero((runtime >= 0) & (counts[np.maximum(runtime, 0)] > 1))
    if many.size:
        pairs = np.stack([runtime[many], stream[many]], axis=1)
        _, at = np.unique(pairs, axis=0, return_index=True)
        first[many[at]] = True
    return first


def _waited(syncs: SyncLinks, position: np.ndarray, slot: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Per work span (in walk order), the end node of the work a stream wait before it in the walk
    holds it behind (the last such wait wins), -1 none."""
    held: dict[int, int] = {}
    for r in syncs.rows.tolist():
        if syncs.kind[r] != STREAM_WAIT:
            continue
        src, dest = syncs.wait_src.get(r, -1), syncs.wait_dest.get(r, -1)
        if src < 0 or dest < 0 or not position[r] < position[dest]:
            continue
        if dest not in held or position[held[dest]] < position[r]:
            held[dest] = r
    waited = np.full(work.size, -1, dtype=np.int64)
    if held:
        dests = np.fromiter(held, dtype=np.int64, count=len(held))
        recorded = np.asarray([syncs.wait_src[held[d]] for d in dests.tolist()], dtype=np.int64)
        found = np.searchsorted(position[work], position[dests])
        waited[found] = np.where(slot[recorded] >= 0, 2 * slot[recorded] + 1, -1)
    return waited


def _cpu_waits(
    syncs: SyncLinks,
    launcher: np.ndarray,
    slot: np.ndarray,
    position: np.ndarray,
    at: np.ndarray,
    stream: np.ndarray,
    start: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, Edges]:
    """Sync edges into the end of each CPU wait's runtime call: from the work an event sync waited
    on, or the latest work (by then, in the walk) on the stream a stream sync waited on, or on every
    stream for a device sync (in the order the streams first had work)."""
    streams, first = np.unique(stream, return_index=True)
    streams = streams[np.argsort(first, kind="stable")]
    walked = {int(x): at[stream == x] for x in streams.tolist()}
    ends = {int(x): start[stream == x] + 1 for x in streams.tolist()}

    def latest(x: int, q: int) -> int:
        k = int(np.searchsorted(walked[x], q)) - 1 if x in walked else -1
        return int(ends[x][k]) if k >= 0 else -1

    src: list[int] = []
    dst: list[int] = []
    key: list[int] = []
    for r in syncs.rows.tolist():
        kind, runtime = syncs.kind[r], int(launcher[r])
        if kind == STREAM_WAIT or runtime < 0 or slot[runtime] < 0:
            continue
        q = int(position[r])
        if kind == EVENT_SYNC:
            w = syncs.wait_src.get(r, -1)
            waited = [2 * int(slot[w]) + 1 if w >= 0 and slot[w] >= 0 else -1]
        elif kind == STREAM_SYNC:
            waited = [latest(syncs.stream[r], q)]
        else:
            waited = [latest(x, q) for x in streams.tolist()]
        for u in waited:
            if u >= 0:
                src.append(u)
                dst.append(2 * int(slot[runtime]) + 1)
                key.append(q)
    rank = np.arange(len(src))
    return np.asarray(key, dtype=np.int64), rank, Edges.of(src, dst, SYNC)
