"""Where Holistic Trace Analysis's critical path is wrong, and what ours does instead (the default;
``hta_compatible=True`` keeps HTA's graph):

- Traces without ``cuda_sync`` events (most): a blocking copy or synchronisation has no edge from
  the work it waited for, so the CPU's wait reads as CPU time (``cudaMemcpyAsync`` takes the runtime
  lock, whose edge keeps its whole time) and the GPU work falls off the path. The wait is read from
  overlap instead: the call returned right after that work ended. An edge from the work's end to
  the call's end, and the call's own time weighs nothing (it waited), so the path runs through the
  GPU.
- CUDA graphs: Kineto gives every kernel of a graph launch the launch's correlation id; HTA links
  the launch to one of them (the last) and drops the rest. We keep them all (the device edges
  order them on their streams; the first of a launch on each stream gets the launch edge).

The other two departures live where their data is: device work still running from before the
window (``critical_graph.build_graph``: kept, from the window's start) and ``idle``, the path's time
on weightless edges (``critical_path._idle``). docs/compared.md has the argument, trace by trace.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from layerscope.analysis.critical_edges import OPERATOR, SYNC, Edges
from layerscope.analysis.critical_sync import STREAM_WAIT, SyncLinks
from layerscope.analysis.sync_points import SYNCHRONIZE_CALLS
from layerscope.events.table import EventKind, EventTable

#: Runtime calls that may block the CPU until device work ends: copies (to pageable memory they
#: return once their own copy ends) and synchronisations.
COPY_CALLS = frozenset(
    {"cudaMemcpy", "cudaMemcpyAsync", "hipMemcpy", "hipMemcpyAsync", "hipMemcpyWithStream"}
)
WAITING_CALLS = COPY_CALLS | frozenset(SYNCHRONIZE_CALLS)
#: A blocking call that returns at most this long after device work ends waited for that work (the
#: CPU's wake-up: 3-22 µs on the traces we have); one that returns later did CPU work after it.
WAKE_NS = 50_000


def inferred_waits(
    table: EventTable, launcher: np.ndarray, calls: np.ndarray, work: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For traces without ``cuda_sync`` events: which of the blocking runtime ``calls``
    (:data:`WAITING_CALLS`) waited for which device ``work``, read from overlap. A copy waited for
    its own copy when that ends inside the call, within :data:`WAKE_NS` of its end (an asynchronous
    copy returns before its copy ends); a synchronisation for the work that ended last inside it,
    launched before it began, within :data:`WAKE_NS` of its end. Returns (calls, work), paired."""
    names, name_of = table.names, table.array("span_name")
    ts = table.array("span_ts")
    end = ts + table.array("span_dur")
    copy = np.asarray([n in COPY_CALLS for n in names], dtype=bool)[name_of[calls]]
    own = np.full(table.span_count, -1, dtype=np.int64)
    linked = work[launcher[work] >= 0]
    own[launcher[linked]] = linked
    waited = np.where(copy, own[calls], -1)
    # synchronisations: the work ending last at or before the call's end, among that launched before it
    by_end = work[np.argsort(end[work], kind="stable")]
    ends = end[by_end]
    sync = np.flatnonzero(~copy)
    latest = np.searchsorted(ends, end[calls[sync]], side="right") - 1
    for k, c, i in zip(sync.tolist(), calls[sync].tolist(), latest.tolist(), strict=True):
        # mostly the first looked at; earlier ones only while it was launched after the call began
        while i >= 0 and end[c] - ends[i] <= WAKE_NS:
            row = int(by_end[i])
            if launcher[row] < 0 or ts[launcher[row]] <= ts[c]:
                waited[k] = row
                break
            i -= 1
    found = waited >= 0
    w = np.maximum(waited, 0)
    found &= (end[w] > ts[calls]) & (end[w] <= end[calls]) & (end[calls] - end[w] <= WAKE_NS)
    return calls[found], waited[found]


def hidden_graph_work(table: EventTable, launcher: np.ndarray, work: np.ndarray) -> np.ndarray:
    """The device work HTA leaves out: of the several spans one call launched (a CUDA graph's
    kernels), all but the last to start (HTA's correlation map keeps the last)."""
    rows = np.flatnonzero(work)
    calls = launcher[rows]
    order = np.lexsort((table.array("span_ts")[rows], calls))
    later = np.zeros(rows.size, dtype=bool)
    later[:-1] = calls[order][1:] == calls[order][:-1]
    hidden: np.ndarray = rows[order][later]
    return hidden


def waits_from_overlap(
    table: EventTable,
    launcher: np.ndarray,
    syncs: SyncLinks,
    nodes: tuple[np.ndarray, np.ndarray, np.ndarray],
    work: np.ndarray,
    edges: Edges,
) -> Edges:
    """``edges`` and a sync edge from the end of the work each blocking call without a
    ``cuda_sync`` event waited for (:func:`inferred_waits`) to the call's end; the own time of
    every call with a wait edge into its end weighs nothing."""
    spans, _, slot = nodes
    names, name_of = table.names, table.array("span_name")
    kinds = table.array("span_kind")
    waiting = np.asarray([n in WAITING_CALLS for n in names], dtype=bool)[name_of[spans]]
    calls = spans[waiting & (kinds[spans] == EventKind.RUNTIME)]
    cpu_syncs = [r for r in syncs.rows.tolist() if syncs.kind[r] != STREAM_WAIT and launcher[r] >= 0]
    synced = launcher[np.asarray(cpu_syncs, dtype=np.int64)]
    calls = calls[~np.isin(calls, synced)]
    call, waited = inferred_waits(table, launcher, calls, np.flatnonzero(work))
    added = Edges.of(2 * slot[waited] + 1, 2 * slot[call] + 1, SYNC)
    joined = Edges.join([edges, added])
    held = np.zeros(table.span_count, dtype=bool)
    held[call] = True
    held[synced[slot[synced] >= 0]] = True
    if not held.any():
        return joined
    owner = np.maximum(joined.owner, 0)
    own = (joined.kind == OPERATOR) & (joined.owner >= 0) & held[owner] & (joined.dst == 2 * slot[owner] + 1)
    return dataclasses.replace(joined, zero=joined.zero | own)
