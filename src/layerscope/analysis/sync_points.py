"""Host-device synchronisation in a trace: the runtime calls that block the host until the device
catches up, grouped by call and by the op that made them (the device report's sync points)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.analysis.device_columns import name_flags
from layerscope.events.table import EventKind, EventTable

#: The runtime's synchronisations: each blocks the host until device work has ended.
SYNCHRONIZE_CALLS = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "hipDeviceSynchronize",
    "hipStreamSynchronize",
    "hipEventSynchronize",
)
#: Name prefixes of the calls :func:`is_sync_call` counts: the synchronisations and blocking copies.
SYNC_CALLS = (*SYNCHRONIZE_CALLS, "cudaMemcpy", "hipMemcpy")


def is_sync_call(name: str) -> bool:
    """Runtime calls that block the host until the device catches up (async copies and device-side
    waits do not)."""
    return name.startswith(SYNC_CALLS) and "Async" not in name


@dataclass(frozen=True, slots=True)
class SyncPoint:
    """A host-device synchronisation call, with the op that made it."""

    call: str
    op: str
    count: int
    total_us: float


def _stack_owners(table: EventTable, cpu: np.ndarray, targets: np.ndarray) -> dict[int, int]:
    """The innermost of the spans ``cpu`` around each of ``targets`` (start order) on its thread, by
    one sweep keeping a stack of open spans per thread."""
    ts, dur = table.array("span_ts"), table.array("span_dur")
    cpu = cpu[np.lexsort((-dur[cpu], ts[cpu]))]
    # positions 0..len(cpu)-1 are the spans, then the targets
    local = np.concatenate([cpu, targets])
    start, end = ts[local].tolist(), (ts[local] + dur[local]).tolist()
    tid = table.array("span_tid")[local].tolist()
    found: list[int] = []
    stacks: dict[int, list[int]] = {}
    j, count = 0, cpu.size
    for i in range(count, len(local)):
        t = start[i]
        while j < count and start[j] <= t:
            stack = stacks.setdefault(tid[j], [])
            while stack and end[stack[-1]] < end[j]:
                stack.pop()
            stack.append(j)
            j += 1
        stack = stacks.get(tid[i], [])
        while stack and end[stack[-1]] < end[i]:
            stack.pop()
        found.append(int(cpu[stack[-1]]) if stack else -1)
    return dict(zip(targets.tolist(), found, strict=True))


def _candidates(table: EventTable, cpu: np.ndarray, targets: np.ndarray) -> np.ndarray | None:
    """The spans of ``cpu`` that hold one of ``targets`` (start order), or None where a target's
    thread has a target inside an earlier one's end.

    The sweep of :func:`_stack_owners` answers for each target the last span (in its start order)
    that began by the target's start and ends at or after its end, provided no earlier target on
    the thread popped that span: which takes a target that ends after a later one (None: sweep
    all). Without that, only spans around some target matter, and a span is around one when the
    first target on its thread starting at or after it ends before it does (targets on a thread end
    in start order)."""
    ts, tid = table.array("span_ts"), table.array("span_tid")
    ends = ts + table.array("span_dur")
    found = []
    target_tid = tid[targets]
    for thread in np.unique(target_tid).tolist():
        mine = targets[target_tid == thread]
        mine_end = ends[mine]
        if mine.size > 1 and bool((np.maximum.accumulate(mine_end)[:-1] > mine_end[1:]).any()):
            return None
        ops = cpu[tid[cpu] == thread]
        first = np.searchsorted(ts[mine], ts[ops], side="left")
        inside = first < mine.size
        ops, first = ops[inside], first[inside]
        found.append(ops[mine_end[first] <= ends[ops]])
    return np.sort(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def enclosing_ops(table: EventTable, wanted: np.ndarray) -> dict[int, int]:
    """For each span in ``wanted`` (ascending positions), the innermost CPU op or range around it on
    its thread (-1)."""
    if not wanted.size:
        return {}
    kinds, ts = table.array("span_kind"), table.array("span_ts")
    cpu = np.flatnonzero((kinds == EventKind.CPU_OP) | (kinds == EventKind.USER_ANNOTATION))
    targets = wanted[np.argsort(ts[wanted], kind="stable")]
    around = _candidates(table, cpu, targets)
    return _stack_owners(table, cpu if around is None else around, targets)


def sync_points(table: EventTable) -> tuple[SyncPoint, ...]:
    """Synchronising runtime calls grouped by call and the op around them, longest first."""
    names = table.names
    runtime = np.flatnonzero(table.array("span_kind") == EventKind.RUNTIME)
    calls = runtime[name_flags(table, runtime, is_sync_call)]
    owner = enclosing_ops(table, calls)
    name_of, dur = table.array("span_name"), table.array("span_dur")
    syncs: dict[tuple[str, str], list[int]] = {}
    for i in calls.tolist():
        p = owner.get(i, -1)
        op = names[int(name_of[p])] if p >= 0 else "(outside ops)"
        syncs.setdefault((names[int(name_of[i])], op), []).append(int(dur[i]))
    return tuple(
        sorted(
            (SyncPoint(c, o, len(d), sum(d) / 1000.0) for (c, o), d in syncs.items()),
            key=lambda s: -s.total_us,
        )
    )
