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

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from layerscope.analysis.segments import covered_in_windows, segment_sums, window_pieces
from layerscope.analysis.streams import KERNEL_WAIT_US, IdleTime, StreamWork, idle_time, overlap_parts
from layerscope.events.steps import StepWindow

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
    return _gaps(work.start, work.end, work.launch_start, origin, horizon)


def _gaps(
    start: np.ndarray, end: np.ndarray, launch_start: np.ndarray, origin: int, horizon: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`device_gaps` of work's columns. At 1 GB of trace these are ~700k rows and as many gaps:
    each array made here is megabytes of fresh pages, so the steps fill few of them, in place."""
    if not start.size:
        return np.asarray([origin], np.int64), np.asarray([horizon], np.int64), np.zeros(1, np.int64)
    if bool((start[1:] < start[:-1]).any()):
        order = np.argsort(start, kind="stable")
        start, end, launch_start = start[order], end[order], launch_start[order]
    reach = np.maximum.accumulate(end)
    # a gap after work i when the next starts after everything up to i ended
    before = np.flatnonzero(start[1:] > reach[:-1])
    gap_start = np.empty(before.size + 2, np.int64)
    gap_start[0], gap_start[-1] = origin, reach[-1]
    np.take(reach, before, out=gap_start[1:-1], mode="clip")  # in range: clip only skips a buffer
    del reach
    gap_end = np.empty(before.size + 2, np.int64)
    gap_end[0], gap_end[-1] = start[0], horizon
    np.take(start[1:], before, out=gap_end[1:-1], mode="clip")
    del before
    # earliest launch of any work that starts at or after each gap's end (`never` past the last);
    # work without a launch call queues nothing we know of. int64 throughout: epoch nanoseconds do
    # not fit a float64.
    never = np.iinfo(np.int64).max
    later_launch = np.empty(start.size + 1, np.int64)
    later_launch[:-1] = launch_start
    later_launch[:-1][launch_start < 0] = never
    later_launch[-1] = never
    np.minimum.accumulate(later_launch[::-1], out=later_launch[::-1])
    split = later_launch[np.searchsorted(start, gap_end, side="left")]
    del later_launch
    np.maximum(split, gap_start, out=split)
    np.minimum(split, gap_end, out=split)
    # each gap: its host wait [gap_start, split), then its held part [split, gap_end), where not empty
    waits, held = split > gap_start, gap_end > split
    starts = np.concatenate([gap_start[waits], split[held]])
    ends = np.concatenate([split[waits], gap_end[held]])
    causes = np.zeros(starts.size, np.int64)
    tail = slice(starts.size - int(np.count_nonzero(held)), None)
    causes[tail] = np.where(ends[tail] - starts[tail] < KERNEL_WAIT_US * 1000, 1, 2)
    return starts, ends, causes


@dataclass(frozen=True)
class DeviceTimeline:
    """One device's work: its rows in ``work`` sorted by start, and its idle gaps over the trace's
    span (:func:`device_gaps`), made once for the whole-trace idle time and the step verdicts."""

    order: np.ndarray
    gaps: tuple[np.ndarray, np.ndarray, np.ndarray]


def device_timelines(work: StreamWork, span: tuple[int, int]) -> list[DeviceTimeline]:
    """Per device (streams of one device share its timeline), its work sorted and its gaps."""
    found = []
    for rows in work.devices():
        pick = np.flatnonzero(rows)
        # only the columns the gaps read, copied only for a device of several or out of order
        columns = [work.start, work.end, work.launch_start]
        if pick.size < rows.size:
            columns = [column[pick] for column in columns]
        if bool((columns[0][1:] < columns[0][:-1]).any()):
            by_start = np.argsort(columns[0], kind="stable")
            pick, columns = pick[by_start], [column[by_start] for column in columns]
        found.append(DeviceTimeline(pick, _gaps(columns[0], columns[1], columns[2], *span)))
    return found


def device_idle(devices: Sequence[DeviceTimeline]) -> IdleTime:
    """Idle time by cause over the trace's span, each device on its own timeline, summed."""
    total = IdleTime()
    for device in devices:
        total = total + idle_time(*device.gaps)
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


class _Timeline:
    """Intervals sorted by start (with extra columns of the same rows), cut to many windows at once."""

    def __init__(self, intervals: Intervals, *extra: np.ndarray) -> None:
        self.start, self.end = intervals
        self.extra = list(extra)
        if bool((self.start[1:] < self.start[:-1]).any()):
            order = np.argsort(self.start, kind="stable")
            self.start, self.end = self.start[order], self.end[order]
            self.extra = [x[order] for x in extra]
        # the latest end so far: everything before the first reach past a window's start ends by it
        self.reach = np.maximum.accumulate(self.end) if self.end.size else self.end

    def covered(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Per window ``[lo, hi)``, the time the intervals cover (int64 ns, overlaps once)."""
        return covered_in_windows(self.start, self.end, lo, hi)

    def idle(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Gaps (the first extra column their cause) per window: idle µs by cause, shape (3, windows),
        each sum the float :func:`~layerscope.analysis.streams.idle_time` gives the window's gaps."""
        found = np.zeros((3, lo.size))
        for cut in window_pieces(self.start, self.end, self.reach, lo, hi):
            length = np.maximum(cut.end - cut.start, 0) / 1000.0
            cause = self.extra[0][cut.rows]
            window = np.repeat(np.arange(cut.bounds.size - 1), np.diff(cut.bounds))
            for c in range(3):
                mine = cause == c
                bounds = np.concatenate(
                    [[0], np.cumsum(np.bincount(window[mine], minlength=cut.bounds.size - 1))]
                )
                found[c, cut.windows] = segment_sums(length[mine], bounds)
        return found


@dataclass
class _DeviceWindows:
    """One device's figures per window: busy time, idle time by cause, communication and
    computation time and both together (int64 ns; idle float µs, shape (3, windows))."""

    busy: np.ndarray
    idle: np.ndarray
    comm: np.ndarray
    comp: np.ndarray
    either: np.ndarray

    @staticmethod
    def of(
        work: StreamWork,
        device: DeviceTimeline,
        is_comm: np.ndarray,
        is_comp: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
    ) -> _DeviceWindows:
        def covered(rows: np.ndarray) -> np.ndarray:
            # a subset of rows sorted by start stays sorted: no sort again
            return _Timeline((work.start[rows], work.end[rows])).covered(lo, hi)

        comm_rows = device.order[is_comm[device.order]]
        comp = covered(device.order[is_comp[device.order]])
        return _DeviceWindows(
            busy=covered(device.order),
            idle=_Timeline(device.gaps[:2], device.gaps[2]).idle(lo, hi),
            comm=covered(comm_rows) if comm_rows.size else np.zeros(lo.size, dtype=np.int64),
            comp=comp,
            either=covered(device.order[(is_comm | is_comp)[device.order]]) if comm_rows.size else comp,
        )


def step_verdicts(
    windows: Sequence[StepWindow],
    work: StreamWork,
    timelines: Sequence[DeviceTimeline],
    is_comm: np.ndarray,
    is_comp: np.ndarray,
) -> tuple[StepVerdict, ...]:
    """Per step window (``events/steps.py``: the step table's windows): device busy time, idle time
    by cause and the verdict, each device on its own timeline and summed. ``is_comm``/``is_comp``
    mark the communication and computation kernels among ``work``'s rows; ``timelines`` are its
    devices' (:func:`device_timelines`, whose gaps count idle time before the first and after the
    last device work).

    All windows at once, with the very float operations (same order) a loop over windows makes:
    per device the time communication and computation overlap is ``comm + comp - either``
    (integers), the exposed communication ``either - comp``."""
    if not windows:
        return ()
    lo = np.asarray([w.start for w in windows], dtype=np.int64)
    hi = np.asarray([w.end for w in windows], dtype=np.int64)
    devices = [_DeviceWindows.of(work, device, is_comm, is_comp, lo, hi) for device in timelines]
    busy_ns, exposed_ns, overlapped, comm_total = (np.zeros(lo.size) for _ in range(4))
    idle = np.zeros((3, lo.size))
    for d in devices:
        idle = idle + d.idle
        ran = d.comm > 0
        exposed_ns = exposed_ns + np.where(ran, ((d.either - d.comp) / 1000.0) * 1000.0, 0.0)
        overlapped = overlapped + np.where(ran, d.comm + d.comp - d.either, 0)
        comm_total = comm_total + np.where(ran, d.comm, 0)
        busy_ns = busy_ns + d.busy
    span_ns = hi - lo
    wall = (span_ns / 1000.0).tolist()
    share = np.where(span_ns > 0, busy_ns / np.maximum(span_ns * len(devices), 1), 0.0).tolist()
    exposed = np.where(busy_ns > 0, exposed_ns / np.where(busy_ns > 0, busy_ns, 1.0), 0.0).tolist()
    comm_share = (overlapped / np.where(comm_total > 0, comm_total, 1.0)).tolist()
    has_comm = (comm_total > 0).tolist()
    busy_us = (busy_ns / 1000.0).tolist()
    idle_rows = idle.T.tolist()
    verdicts = []
    for k, window in enumerate(windows):
        idle_k = IdleTime(*idle_rows[k])
        verdicts.append(
            StepVerdict(
                window.number,
                wall[k],
                busy_us[k],
                step_verdict(share[k], idle_k, exposed[k]),
                idle_k,
                comm_share[k] if has_comm[k] else None,
                len(devices),
            )
        )
    return tuple(verdicts)
