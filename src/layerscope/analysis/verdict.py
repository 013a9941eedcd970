"""What bounds each step of a trace: device busy time in the step's window and, when the device
idles, what it waited on.

The verdict reads the device as a whole, not stream by stream: a gap is time when no stream runs
anything. Within a gap, the time before the first launch call of any later work is *host wait*
(nothing was queued: the CPU was late); the time after it is *queued*: work was launched but held
back (events, other streams, synchronisation) — *kernel wait* when that stretch is shorter than
:data:`~layerscope.analysis.streams.KERNEL_WAIT_US` (launch overhead), *other* beyond. Per-stream
figures (analysis/streams.py) keep HTA's definitions; summed over streams they count one idle
moment once per idle stream, which says nothing about what bounds the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from layerscope.analysis.streams import KERNEL_WAIT_US, IdleTime, StreamWork, idle_time, overlap_share
from layerscope.events.intervals import union_length
from layerscope.events.table import CPU_KINDS, EventTable

#: What bounds a step (StepVerdict.verdict), decided by :func:`step_verdict`.
VERDICTS = (
    "device-bound",
    "communication-bound",
    "balanced",
    "CPU-bound",
    "waiting on dependencies",
    "launch-bound",
)

Intervals = tuple[np.ndarray, np.ndarray]


def step_verdict(busy_share: float, idle: IdleTime, exposed_comm_share: float = 0.0) -> str:
    """What bounds a step: the device (busy 80% of the step or more; communication-bound when
    communication not hidden behind computation is half the busy time or more), else what the
    device's idle time waited on: the CPU (host wait: nothing was queued), dependencies (work was
    queued but held back: events, other streams, synchronisation) or launch gaps (back-to-back
    work separated by launch overhead). Busy 50-80% with no cause holding half the idle time is
    balanced."""
    if busy_share >= 0.8:
        return "communication-bound" if exposed_comm_share >= 0.5 else "device-bound"
    cause = idle.dominant()
    if cause is None:
        return "balanced" if busy_share >= 0.5 else "CPU-bound"
    if busy_share >= 0.5 and max(idle.host_wait_us, idle.other_us) < 0.5 * idle.total_us:
        return "balanced"
    return {"host_wait": "CPU-bound", "other": "waiting on dependencies", "kernel_wait": "launch-bound"}[
        cause
    ]


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """Device activity inside one step's window, what its idle time waited on, and what bounds it.
    ``idle`` is the device's idle time (no stream busy) by cause: it adds up to wall minus busy."""

    step: int
    wall_us: float
    device_busy_us: float
    verdict: str  # one of VERDICTS
    idle: IdleTime = field(default_factory=IdleTime)
    #: share of the step's communication-kernel time overlapped by computation (None: none ran)
    comm_overlap: float | None = None

    @property
    def utilisation(self) -> float:
        """Busy share of the step's wall time."""
        return self.device_busy_us / self.wall_us if self.wall_us > 0 else 0.0


def device_gaps(work: StreamWork, origin: int, horizon: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stretches of [origin, horizon) when no device work runs, split by cause: (start, end, cause)
    with cause 0 host wait, 1 kernel wait, 2 other (see the module docstring)."""
    if not work.start.size:
        return np.asarray([origin]), np.asarray([horizon]), np.zeros(1, np.int64)
    order = np.argsort(work.start, kind="stable")
    start, end = work.start[order], work.end[order]
    reach = np.maximum.accumulate(end)
    # a gap before work i when it starts after everything before it ended
    opens = np.flatnonzero(start[1:] > reach[:-1]) + 1
    gap_start = np.concatenate([[origin], reach[opens - 1], [reach[-1]]])
    gap_end = np.concatenate([[start[0]], start[opens], [horizon]])
    # earliest launch of any work that starts at or after each gap's end (none: horizon)
    launch = work.launch_start[order].astype(np.float64)
    launch[launch < 0] = np.inf
    later_launch = np.minimum.accumulate(launch[::-1])[::-1]
    first_after = np.searchsorted(start, gap_end, side="left")
    queued_from = np.full(gap_end.size, np.inf)
    inside = first_after < start.size
    queued_from[inside] = later_launch[first_after[inside]]
    split = np.clip(queued_from, gap_start, gap_end).astype(np.int64)
    held = gap_end - split
    held_cause = np.where(held < KERNEL_WAIT_US * 1000, 1, 2)
    starts = np.concatenate([gap_start, split])
    ends = np.concatenate([split, gap_end])
    causes = np.concatenate([np.zeros(gap_start.size, np.int64), held_cause])
    keep = ends > starts
    return starts[keep], ends[keep], causes[keep]


class _Timeline:
    """Intervals sorted by start, cut to a window in O(log n): steps of long traces each touch
    only their own work."""

    def __init__(self, intervals: Intervals, *extra: np.ndarray) -> None:
        order = np.argsort(intervals[0], kind="stable")
        self.start, self.end = intervals[0][order], intervals[1][order]
        self.extra = [x[order] for x in extra]
        # the latest end so far: everything before the first reach past lo ends by lo
        self.reach = np.maximum.accumulate(self.end) if self.end.size else self.end

    def _slice(self, lo: int, hi: int) -> slice:
        first = int(np.searchsorted(self.reach, lo, side="right"))
        return slice(first, max(first, int(np.searchsorted(self.start, hi, side="left"))))

    def within(self, lo: int, hi: int) -> Intervals:
        """The parts inside [lo, hi) (empty ones dropped)."""
        return self.within_with(lo, hi)[:2]  # type: ignore[return-value]

    def within_with(self, lo: int, hi: int) -> tuple[np.ndarray, ...]:
        """The parts inside [lo, hi), then the extra columns of the same rows."""
        cut = self._slice(lo, hi)
        s, e = np.clip(self.start[cut], lo, hi), np.clip(self.end[cut], lo, hi)
        keep = e > s
        return (s[keep], e[keep], *(x[cut][keep] for x in self.extra))


def exposed_comm_us(comm: Intervals, comp: Intervals) -> float:
    """Time when communication kernels run and no computation kernel does (µs)."""
    if not comm[0].size:
        return 0.0
    both = union_length(np.concatenate([comm[0], comp[0]]), np.concatenate([comm[1], comp[1]]))
    return (both - union_length(*comp)) / 1000.0


def step_windows(table: EventTable) -> list[tuple[int, int, int]]:
    """(step number, start, end) of each ProfilerStep: from its start to the next step's start.
    Steps are the CPU-side ranges: Kineto mirrors them on the GPU timeline as
    ``gpu_user_annotation`` events, which are no steps of their own."""
    names = table.names
    cpu_side = [int(k) for k in CPU_KINDS]
    steps = [
        i
        for i, (n, kind) in enumerate(zip(table.span_name, table.span_kind, strict=True))
        if kind in cpu_side and names[n].startswith("ProfilerStep#")
    ]
    steps.sort(key=lambda i: table.span_ts[i])
    windows = []
    for k, i in enumerate(steps):
        lo = table.span_ts[i]
        hi = table.span_ts[steps[k + 1]] if k + 1 < len(steps) else lo + table.span_dur[i]
        try:
            number = int(names[table.span_name[i]].split("#", 1)[1])
        except ValueError:
            number = k
        windows.append((number, lo, hi))
    return windows


def step_verdicts(
    table: EventTable, work: StreamWork, comm: Intervals, comp: Intervals, span: tuple[int, int]
) -> tuple[StepVerdict, ...]:
    """Per ProfilerStep window: device busy time, idle time by cause and the verdict. ``span`` is
    the trace's (start, end): idle time before the first and after the last device work counts."""
    windows = step_windows(table)
    if not windows:
        return ()
    gap_start, gap_end, cause = device_gaps(work, *span)
    gaps = _Timeline((gap_start, gap_end), cause)
    device, comms, comps = _Timeline((work.start, work.end)), _Timeline(comm), _Timeline(comp)
    verdicts = []
    for number, lo, hi in windows:
        busy = union_length(*device.within(lo, hi)) / 1000.0
        wall = (hi - lo) / 1000.0
        idle = idle_time(*gaps.within_with(lo, hi))
        in_comm, in_comp = comms.within(lo, hi), comps.within(lo, hi)
        exposed = exposed_comm_us(in_comm, in_comp) / busy if busy > 0 else 0.0
        share = busy / wall if wall > 0 else 0.0
        overlap = overlap_share(in_comm, in_comp)
        verdicts.append(StepVerdict(number, wall, busy, step_verdict(share, idle, exposed), idle, overlap))
    return tuple(verdicts)
