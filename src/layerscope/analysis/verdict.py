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

from layerscope.analysis.streams import KERNEL_WAIT_US, IdleTime, StreamWork, idle_time, overlap_parts
from layerscope.events.intervals import union_length
from layerscope.events.steps import step_windows
from layerscope.events.table import EventTable

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
    if busy_share >= 0.5 and max(idle.host_wait_us, idle.kernel_wait_us, idle.other_us) < 0.5 * idle.total_us:
        return "balanced"
    return {"host_wait": "CPU-bound", "other": "waiting on dependencies", "kernel_wait": "launch-bound"}[
        cause
    ]


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """Device activity inside one step's window, what its idle time waited on, and what bounds it.
    ``idle`` is the device's idle time (no stream busy) by cause: with busy time it adds up to the
    wall time (times the number of devices, each device its own timeline)."""

    step: int
    wall_us: float
    device_busy_us: float
    verdict: str  # one of VERDICTS
    idle: IdleTime = field(default_factory=IdleTime)
    #: share of the step's communication-kernel time overlapped by computation (None: none ran)
    comm_overlap: float | None = None
    #: devices in the trace: busy and idle time are summed over them
    devices: int = 1

    @property
    def utilisation(self) -> float:
        """Busy share of the step's device time (wall time on each device)."""
        return self.device_busy_us / (self.wall_us * self.devices) if self.wall_us > 0 else 0.0


def device_gaps(work: StreamWork, origin: int, horizon: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stretches of [origin, horizon) when no device work runs, split by cause: (start, end, cause)
    with cause 0 host wait, 1 kernel wait, 2 other (see the module docstring)."""
    if not work.start.size:
        return np.asarray([origin], np.int64), np.asarray([horizon], np.int64), np.zeros(1, np.int64)
    order = np.argsort(work.start, kind="stable")
    start, end = work.start[order], work.end[order]
    reach = np.maximum.accumulate(end)
    # a gap before work i when it starts after everything before it ended
    opens = np.flatnonzero(start[1:] > reach[:-1]) + 1
    gap_start = np.concatenate([[origin], reach[opens - 1], [reach[-1]]]).astype(np.int64)
    gap_end = np.concatenate([[start[0]], start[opens], [horizon]]).astype(np.int64)
    # earliest launch of any work that starts at or after each gap's end; work without a launch
    # call queues nothing we know of. int64 throughout: epoch nanoseconds do not fit a float64.
    never = np.iinfo(np.int64).max
    launch = np.where(work.launch_start[order] < 0, never, work.launch_start[order])
    later_launch = np.minimum.accumulate(launch[::-1])[::-1]
    first_after = np.searchsorted(start, gap_end, side="left")
    queued_from = np.full(gap_end.size, never, dtype=np.int64)
    inside = first_after < start.size
    queued_from[inside] = later_launch[first_after[inside]]
    split = np.minimum(np.maximum(queued_from, gap_start), gap_end)
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


def device_idle(work: StreamWork, span: tuple[int, int]) -> IdleTime:
    """Idle time by cause over ``span`` (ns), each device on its own timeline, summed."""
    total = IdleTime()
    for rows in work.devices():
        total = total + idle_time(*device_gaps(work.take(rows), *span))
    return total


def comm_overlap(work: StreamWork, is_comm: np.ndarray, is_comp: np.ndarray) -> float | None:
    """Communication/computation overlap, each device on its own (a collective on one GPU is not
    hidden by computation on another), combined over devices."""
    overlapped = comm_total = 0.0
    for rows in work.devices():
        o, c = overlap_parts(
            (work.start[rows & is_comm], work.end[rows & is_comm]),
            (work.start[rows & is_comp], work.end[rows & is_comp]),
        )
        overlapped, comm_total = overlapped + o, comm_total + c
    return overlapped / comm_total if comm_total > 0 else None


@dataclass
class _DeviceTimelines:
    """One device's work, gaps, communication and computation, each cut to a window cheaply."""

    work: _Timeline
    gaps: _Timeline
    comm: _Timeline
    comp: _Timeline

    @staticmethod
    def of(
        work: StreamWork, rows: np.ndarray, is_comm: np.ndarray, is_comp: np.ndarray, span: tuple[int, int]
    ) -> _DeviceTimelines:
        mine = work.take(rows)
        gap_start, gap_end, cause = device_gaps(mine, *span)
        return _DeviceTimelines(
            _Timeline((mine.start, mine.end)),
            _Timeline((gap_start, gap_end), cause),
            _Timeline((work.start[rows & is_comm], work.end[rows & is_comm])),
            _Timeline((work.start[rows & is_comp], work.end[rows & is_comp])),
        )


def step_verdicts(
    table: EventTable, work: StreamWork, is_comm: np.ndarray, is_comp: np.ndarray, span: tuple[int, int]
) -> tuple[StepVerdict, ...]:
    """Per step window (``events/steps.py``: the step table's windows): device busy time, idle time
    by cause and the verdict, each device on its own timeline and summed. ``is_comm``/``is_comp``
    mark the communication and computation kernels among ``work``'s rows; ``span`` is the trace's
    (start, end): idle time before the first and after the last device work counts."""
    windows = step_windows(table)
    if not windows:
        return ()
    devices = [_DeviceTimelines.of(work, rows, is_comm, is_comp, span) for rows in work.devices()]
    verdicts = []
    for window in windows:
        lo, hi = window.start, window.end
        busy_ns = exposed_ns = overlapped = comm_total = 0.0
        idle = IdleTime()
        for d in devices:
            busy = union_length(*d.work.within(lo, hi))
            in_comm, in_comp = d.comm.within(lo, hi), d.comp.within(lo, hi)
            idle = idle + idle_time(*d.gaps.within_with(lo, hi))
            exposed_ns += exposed_comm_us(in_comm, in_comp) * 1000.0
            o, c = overlap_parts(in_comm, in_comp)
            busy_ns, overlapped, comm_total = busy_ns + busy, overlapped + o, comm_total + c
        wall = (hi - lo) / 1000.0
        share = busy_ns / ((hi - lo) * len(devices)) if hi > lo else 0.0
        exposed = exposed_ns / busy_ns if busy_ns > 0 else 0.0
        verdicts.append(
            StepVerdict(
                window.number,
                wall,
                busy_ns / 1000.0,
                step_verdict(share, idle, exposed),
                idle,
                overlapped / comm_total if comm_total > 0 else None,
                len(devices),
            )
        )
    return tuple(verdicts)
