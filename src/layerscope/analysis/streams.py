"""Per-stream device analysis of a trace: idle time by cause, queue length, launch delay, and
communication/computation overlap — with Holistic Trace Analysis's definitions, so the figures agree
with HTA's where both measure (docs/compared.md has the table):

- Idle time (HTA ``get_idle_time_breakdown``): on each stream, the gap before each piece of device
  work (kernel, copy, set) after the previous one ended. *Host wait* when the work's launch call
  began after the previous work ended (nothing was queued: the CPU was late); *kernel wait* when it
  was already queued and the gap is under :data:`KERNEL_WAIT_US` (back-to-back launch overhead);
  *other* for the rest (queued but held back: events, other streams, synchronisation).
- Queue length (HTA ``get_queue_length_summary``): work launched on a stream and not yet started,
  +1 at each launch call (kernel, copy and set launches), -1 when its work starts; mean and maximum
  over the values it takes (HTA's ``describe()`` of the step function's values); time at
  :data:`MAX_QUEUE` or more, when launch calls block the CPU (HTA
  ``get_time_spent_blocked_on_full_queue``).
- Launch delay (HTA ``get_cuda_kernel_launch_stats``): the work's start minus the end of its launch
  call, 0 when negative.
- Communication/computation overlap (HTA ``get_comm_comp_overlap``): the share of communication
  time (communication kernels merged into one timeline) during which a computation kernel runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.analysis.device_columns import launch_calls, name_flags, thread_groups
from layerscope.events.intervals import union_length
from layerscope.events.table import EventKind, EventTable

#: Gaps between queued work under this are launch overhead, not waiting (HTA's default, in µs).
KERNEL_WAIT_US = 30.0

#: Launches a stream's queue holds before the next launch call blocks the CPU (HTA's
#: CUDA_MAX_LAUNCH_QUEUE_PER_STREAM; blocking is seen from about 1022 on).
MAX_QUEUE = 1024

#: Runtime calls that queue one piece of device work (graph launches queue many: left out, as HTA does).
LAUNCH_CALLS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaMemcpyAsync",
        "cudaMemsetAsync",
        "hipLaunchKernel",
        "hipExtModuleLaunchKernel",
        "hipMemcpyAsync",
        "hipMemsetAsync",
        "hipMemcpyWithStream",
    }
)


@dataclass(frozen=True, slots=True)
class IdleTime:
    """Device idle time between pieces of work on a stream, by cause (µs)."""

    host_wait_us: float = 0.0
    kernel_wait_us: float = 0.0
    other_us: float = 0.0

    @property
    def total_us(self) -> float:
        """All three causes."""
        return self.host_wait_us + self.kernel_wait_us + self.other_us

    def __add__(self, other: IdleTime) -> IdleTime:
        return IdleTime(
            self.host_wait_us + other.host_wait_us,
            self.kernel_wait_us + other.kernel_wait_us,
            self.other_us + other.other_us,
        )

    def dominant(self) -> str | None:
        """The cause with the most time ("host_wait", "kernel_wait", "other"), None when no idle."""
        if self.total_us <= 0:
            return None
        causes = {"host_wait": self.host_wait_us, "kernel_wait": self.kernel_wait_us, "other": self.other_us}
        return max(causes, key=lambda k: causes[k])


@dataclass(frozen=True, slots=True)
class StreamStats:
    """One device stream: its work, busy time, queue and launch delay, and idle time by cause."""

    device: str
    stream: str
    kernels: int  # kernels (copies and sets not counted)
    work: int  # kernels, copies and sets
    busy_us: float
    queue_mean: float | None  # None: no work with a launch call on this stream
    queue_max: int | None
    launch_delay_median_us: float | None
    launch_delay_p95_us: float | None
    idle: IdleTime
    full_queue_us: float = 0.0  # time the queue was full (MAX_QUEUE): launch calls block the CPU


@dataclass(frozen=True)
class StreamWork:
    """Device work in one trace, one row per piece, with its stream and launch call (columns)."""

    start: np.ndarray  # ns
    end: np.ndarray
    stream: np.ndarray  # index into ``keys``
    keys: list[tuple[str, str]]  # (device, stream) per stream index
    is_kernel: np.ndarray
    launch_start: np.ndarray  # ns, or -1 without a launch call
    launch_end: np.ndarray
    queued: np.ndarray  # the launch call queues this work alone (LAUNCH_CALLS)

    def devices(self) -> list[np.ndarray]:
        """Row masks, one per device (streams of one device share its timeline)."""
        of_stream = [key[0] for key in self.keys]
        names = sorted(set(of_stream))
        device_of_row = np.asarray([names.index(d) for d in of_stream], dtype=np.int64)[self.stream]
        return [device_of_row == k for k in range(len(names))] if self.stream.size else []

    def take(self, rows: np.ndarray) -> StreamWork:
        """The work at ``rows`` (a mask or indices), streams keyed as before."""
        return StreamWork(
            start=self.start[rows],
            end=self.end[rows],
            stream=self.stream[rows],
            keys=self.keys,
            is_kernel=self.is_kernel[rows],
            launch_start=self.launch_start[rows],
            launch_end=self.launch_end[rows],
            queued=self.queued[rows],
        )

    @staticmethod
    def of(table: EventTable, device: np.ndarray, launchers: np.ndarray | None = None) -> StreamWork:
        """The work at span positions ``device``, linked to launch calls by correlation id
        (``launchers``: each one's launch call or -1, when the caller has them already)."""
        kinds = table.array("span_kind")
        ts, dur = table.array("span_ts"), table.array("span_dur")
        if launchers is None:
            launchers = launch_calls(table, device)
        has = launchers >= 0
        picked = np.where(has, launchers, 0)
        launch_start = np.where(has, ts[picked], -1) if device.size else np.zeros(0, np.int64)
        launch_end = np.where(has, ts[picked] + dur[picked], -1) if device.size else np.zeros(0, np.int64)
        queued = has.copy()
        queued[has] = name_flags(table, launchers[has], LAUNCH_CALLS.__contains__)
        keys, stream = thread_groups(table, device, lambda tid: _stream_key(table, tid))
        return StreamWork(
            start=ts[device],
            end=ts[device] + dur[device],
            stream=stream,
            keys=keys,
            is_kernel=kinds[device] == EventKind.KERNEL,
            launch_start=launch_start,
            launch_end=launch_end,
            queued=queued,
        )


def _stream_key(table: EventTable, tid: int) -> tuple[str, str]:
    """(device, stream) of a device span's thread: the trace's (pid, tid), or the live reader's
    (device index, stream) (``capture/device_streams.py``); ("?", tid) for a thread named by none."""
    device, stream = table.threads.get(tid, ("?", tid))
    return str(device), str(stream)


def idle_gaps(work: StreamWork, pick: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The idle gaps of one stream's work ``pick`` (in start order): (gap start, gap end, cause),
    cause 0 host wait, 1 kernel wait, 2 other. The first piece of work has no gap before it."""
    order = pick[np.argsort(work.start[pick], kind="stable")]
    if order.size < 2:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    prev_end = work.end[order[:-1]]
    nxt = order[1:]
    gap_start, gap_end = prev_end, work.start[nxt]
    has_launch = work.launch_start[nxt] >= 0
    host = has_launch & (work.launch_start[nxt] > prev_end)
    short = (gap_end - gap_start) < KERNEL_WAIT_US * 1000
    cause = np.where(host, 0, np.where(short, 1, 2))
    return gap_start, gap_end, cause


def idle_time(gap_start: np.ndarray, gap_end: np.ndarray, cause: np.ndarray) -> IdleTime:
    """Idle time by cause from gaps (negative gaps, work overlapping on a stream, count as 0: HTA
    sums them as they are, which only matters for traces whose clocks disagree)."""
    length = np.maximum(gap_end - gap_start, 0) / 1000.0
    return IdleTime(*(float(length[cause == c].sum()) for c in range(3)))


def _queue(work: StreamWork, pick: np.ndarray) -> tuple[float | None, int | None, float]:
    """Mean and max of the queue length's values (launch +1, start -1), HTA's way, and the time
    (µs) it stood at :data:`MAX_QUEUE` or more: launch calls then block the CPU."""
    queued = pick[work.queued[pick]]
    if not queued.size:
        return None, None, 0.0
    times = np.concatenate([work.launch_start[queued], work.start[queued]])
    steps = np.concatenate([np.ones(queued.size, np.int64), -np.ones(queued.size, np.int64)])
    order = np.argsort(times, kind="stable")
    length = np.cumsum(steps[order])
    held = np.diff(times[order])
    full = float(held[length[:-1] >= MAX_QUEUE].sum()) / 1000.0
    return float(length.mean()), int(length.max()), full


def _launch_delay(work: StreamWork, pick: np.ndarray) -> tuple[float | None, float | None]:
    """Median and 95th percentile of start minus launch-call end (µs, 0 when negative) of the work
    launched by :data:`LAUNCH_CALLS` (kernels, copies, sets; HTA leaves out ``cuLaunchKernel``,
    Triton's launch call, which we count)."""
    launched = pick[work.queued[pick]]
    if not launched.size:
        return None, None
    delay = np.maximum(work.start[launched] - work.launch_end[launched], 0) / 1000.0
    return float(np.median(delay)), float(np.percentile(delay, 95))


def stream_stats(work: StreamWork) -> tuple[StreamStats, ...]:
    """Per stream, busiest first."""
    if not work.keys:
        return ()
    found = []
    # each stream's rows in row order, from one sort (of 16-bit numbers: numpy's radix sort)
    narrow = work.stream.astype(np.int16) if len(work.keys) < 1 << 15 else work.stream
    order = np.argsort(narrow, kind="stable")
    picks = np.split(order, np.searchsorted(work.stream[order], np.arange(1, len(work.keys))))
    for (device, stream), pick in zip(work.keys, picks, strict=True):
        busy = union_length(work.start[pick], work.end[pick]) / 1000.0
        queue_mean, queue_max, full_queue = _queue(work, pick)
        delay_median, delay_p95 = _launch_delay(work, pick)
        found.append(
            StreamStats(
                device=device,
                stream=stream,
                kernels=int(work.is_kernel[pick].sum()),
                work=int(pick.size),
                busy_us=busy,
                queue_mean=queue_mean,
                queue_max=queue_max,
                launch_delay_median_us=delay_median,
                launch_delay_p95_us=delay_p95,
                idle=idle_time(*idle_gaps(work, pick)),
                full_queue_us=full_queue,
            )
        )
    return tuple(sorted(found, key=lambda st: -st.busy_us))


def overlap_share(comm: tuple[np.ndarray, np.ndarray], comp: tuple[np.ndarray, np.ndarray]) -> float | None:
    """Share of communication time (the union of communication kernels, as HTA merges them) during
    which at least one computation kernel runs (None without communication kernels). Intervals as
    (starts, ends)."""
    overlapped, comm_total = overlap_parts(comm, comp)
    return overlapped / comm_total if comm_total > 0 else None


def overlap_parts(
    comm: tuple[np.ndarray, np.ndarray], comp: tuple[np.ndarray, np.ndarray]
) -> tuple[float, float]:
    """(time with communication and computation both running, communication time), in the
    intervals' unit: the parts of :func:`overlap_share`, to add up over devices."""
    comm_start, comm_end = comm
    comm_total = float(union_length(comm_start, comm_end)) if comm_start.size else 0.0
    if comm_total <= 0:
        return 0.0, 0.0
    times = np.concatenate([comm_start, comm_end, comp[0], comp[1]])
    is_comm = np.concatenate([np.ones(comm_start.size * 2, bool), np.zeros(comp[0].size * 2, bool)])
    delta = np.concatenate(
        [np.ones(comm_start.size), -np.ones(comm_end.size), np.ones(comp[0].size), -np.ones(comp[1].size)]
    ).astype(np.int64)
    # ends before starts at the same instant: touching intervals do not overlap
    order = np.lexsort((delta, times))
    times, is_comm, delta = times[order], is_comm[order], delta[order]
    comm_running = np.cumsum(np.where(is_comm, delta, 0))
    comp_running = np.cumsum(np.where(is_comm, 0, delta))
    both = (comm_running[:-1] > 0) & (comp_running[:-1] > 0)
    return float((np.diff(times)[both]).sum()), comm_total
