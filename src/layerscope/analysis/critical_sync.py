"""What the critical path's device edges need from the whole trace (HTA's definitions): each
stream's queue length at every launch and start, and the synchronisations a trace's ``cuda_sync``
events record: which work a CUDA event was recorded after (the last launch onto the recorded
stream before ``cudaEventRecord``) and which work a ``cudaStreamWaitEvent`` holds back (the next
launch from the same thread onto the waiting stream).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from layerscope.analysis.streams import LAUNCH_CALLS
from layerscope.events.table import EventKind, EventTable

#: Kinds of synchronisation (``cuda_sync`` event names).
STREAM_WAIT, EVENT_SYNC, STREAM_SYNC, CONTEXT_SYNC = range(4)
SYNC_NAMES = {
    "Stream Wait Event": STREAM_WAIT,
    "Event Sync": EVENT_SYNC,
    "Stream Sync": STREAM_SYNC,
    "Context Sync": CONTEXT_SYNC,
}
RECORD_CALLS = frozenset({"cudaEventRecord", "hipEventRecord"})
_WORK_KINDS = (int(EventKind.KERNEL), int(EventKind.MEMCPY), int(EventKind.MEMSET))


@dataclass
class SyncLinks:
    """The synchronisations a graph window holds, and what each waits on."""

    rows: np.ndarray  # their spans, table indices
    kind: dict[int, int] = field(default_factory=dict)  # span -> STREAM_WAIT, EVENT_SYNC, ...
    stream: dict[int, int] = field(default_factory=dict)  # span -> its stream (our tid)
    wait_src: dict[int, int] = field(default_factory=dict)  # span -> work the event was recorded after
    wait_dest: dict[int, int] = field(default_factory=dict)  # stream waits: the work held back


def launch_work(table: EventTable, launcher: np.ndarray) -> np.ndarray:
    """Device work launched by a call that queues it alone (:data:`LAUNCH_CALLS`), in launch order."""
    name_of = table.array("span_name")
    queues = np.asarray([n in LAUNCH_CALLS for n in table.names], dtype=bool)
    work = np.flatnonzero(np.isin(table.array("span_kind"), _WORK_KINDS) & (launcher >= 0))
    work = work[queues[name_of[launcher[work]]]]
    found: np.ndarray = work[np.argsort(table.array("span_ts")[launcher[work]], kind="stable")]
    return found


def queue_lengths(table: EventTable, launcher: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per work span, its stream's queue length just after its launch call and just after it
    started (launch +1, start -1, in time order over the whole trace); -1 for work not counted."""
    work = launch_work(table, launcher)
    at_launch = np.full(table.span_count, -1, dtype=np.int64)
    at_start = np.full(table.span_count, -1, dtype=np.int64)
    if not work.size:
        return at_launch, at_start
    ts = table.array("span_ts")
    stream = table.array("span_tid")[work]
    times = np.concatenate([ts[launcher[work]], ts[work]])
    steps = np.concatenate([np.ones(work.size, np.int64), -np.ones(work.size, np.int64)])
    keys = np.concatenate([stream, stream])
    order = np.lexsort((np.arange(times.size), times, keys))
    total = np.cumsum(steps[order])
    first = np.concatenate([[True], keys[order][1:] != keys[order][:-1]])
    base = np.maximum.accumulate(np.where(first, np.arange(order.size), 0))
    running = total - total[base] + steps[order][base]
    value = np.empty(times.size, dtype=np.int64)
    value[order] = running
    at_launch[work], at_start[work] = value[: work.size], value[work.size :]
    return at_launch, at_start


def sync_links(
    table: EventTable, launcher: np.ndarray, window: tuple[int, int], cpu: np.ndarray
) -> SyncLinks:
    """The synchronisations of ``window`` (ns; their runtime call among the window's CPU spans
    ``cpu``, or themselves starting in it; every stream wait, as HTA keeps them) and what each
    waits on."""
    ts, dur = table.array("span_ts"), table.array("span_dur")
    kinds, name_of = table.array("span_kind"), table.array("span_name")
    sync_of = np.asarray([SYNC_NAMES.get(n, -1) for n in table.names], dtype=np.int64)[name_of]
    is_sync = (kinds == EventKind.DEVICE_OTHER) & (sync_of >= 0)
    own = (ts >= window[0]) & (ts <= window[1]) & (dur > 0)
    called = (launcher >= 0) & cpu[np.maximum(launcher, 0)]
    rows = np.flatnonzero(is_sync & (own | called | (sync_of == STREAM_WAIT)))
    links = SyncLinks(rows)
    tid = table.array("span_tid")
    for r in rows.tolist():
        links.kind[r] = int(sync_of[r])
        links.stream[r] = int(tid[r])
    waits = [r for r in rows.tolist() if r in table.sync_waits]
    if waits:
        _event_waits(table, launcher, waits, links)
    return links


def _stream_key(table: EventTable, tid: int) -> tuple[str, str]:
    """(device, stream) of a device-side span's thread, as the trace names them."""
    device, stream = table.threads.get(tid, ("?", tid))
    return str(device), str(stream)


def _event_waits(table: EventTable, launcher: np.ndarray, waits: list[int], links: SyncLinks) -> None:
    """For each wait on a recorded CUDA event: the work launched onto the recorded stream last
    before ``cudaEventRecord``, and for a stream wait the next work launched from the waiting call's
    thread onto the waiting stream."""
    ts, tid = table.array("span_ts"), table.array("span_tid")
    work = launch_work(table, launcher)
    by_stream: dict[tuple[str, str], list[int]] = {}
    by_thread: dict[tuple[int, tuple[str, str]], list[int]] = {}
    for w in work.tolist():
        key = _stream_key(table, int(tid[w]))
        by_stream.setdefault(key, []).append(w)
        by_thread.setdefault((int(tid[launcher[w]]), key), []).append(w)
    names, name_of, corr = table.names, table.array("span_name"), table.array("span_corr")
    records = {
        int(corr[i]): i
        for i in np.flatnonzero(table.array("span_kind") == EventKind.RUNTIME).tolist()
        if names[name_of[i]] in RECORD_CALLS
    }
    for r in waits:
        stream, record_corr = table.sync_waits[r]
        record = records.get(record_corr, -1)
        if record < 0:
            continue
        device = _stream_key(table, int(tid[r]))[0]
        before = _nth(by_stream.get((device, str(stream)), []), ts, launcher, int(ts[record]), after=False)
        if before < 0:
            continue
        links.wait_src[r] = before
        caller = int(launcher[r])
        if links.kind[r] == STREAM_WAIT and caller >= 0:
            pool = by_thread.get((int(tid[caller]), _stream_key(table, int(tid[r]))), [])
            nxt = _nth(pool, ts, launcher, int(ts[caller]), after=True)
            if nxt >= 0:
                links.wait_dest[r] = nxt


def _nth(pool: list[int], ts: np.ndarray, launcher: np.ndarray, at: int, after: bool) -> int:
    """In ``pool`` (work in launch order), the last launched at or before ``at``, or the first
    launched at or after it; -1 none."""
    if not pool:
        return -1
    times = ts[launcher[np.asarray(pool, dtype=np.int64)]]
    if after:
        k = int(np.searchsorted(times, at, side="left"))
        return pool[k] if k < len(pool) else -1
    k = int(np.searchsorted(times, at, side="right")) - 1
    return pool[k] if k >= 0 else -1
