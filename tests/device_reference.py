"""The device report as first written (main at e00f023: Python loops over events, one window at a
time): the reference ``tests/test_device_columns.py`` checks the column code against, figure for
figure. Not used by the package."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.analysis.collectives import CollectiveKernel
from layerscope.analysis.device import (
    TINY_KERNEL_US,
    CopyStats,
    DeviceReport,
    KernelStats,
    is_graph_launch,
    kernel_kind,
)
from layerscope.analysis.streams import (
    LAUNCH_CALLS,
    IdleTime,
    StreamStats,
    StreamWork,
    _launch_delay,
    _queue,
    idle_gaps,
    idle_time,
    overlap_parts,
)
from layerscope.analysis.sync_points import SyncPoint, is_sync_call
from layerscope.analysis.verdict import StepVerdict, comm_overlap, device_gaps, step_verdict
from layerscope.events.intervals import union_length
from layerscope.events.steps import step_windows
from layerscope.events.table import EventKind, EventTable

Intervals = tuple[np.ndarray, np.ndarray]


def kernel_function_name(name: str) -> str:
    """A demangled kernel name without its parameter list: ``void f<T>(int, Foo)`` -> ``void f<T>``."""
    depth = 0
    for k, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and k > 0 and not name.startswith("(anonymous namespace)", k):
            return name[:k]
    return name


def stream_work(table: EventTable, device: np.ndarray) -> StreamWork:
    """The work at span positions ``device``, linked to launch calls by correlation id."""
    kinds = table.array("span_kind")
    ts, dur = table.array("span_ts"), table.array("span_dur")
    names = table.names
    runtime = {
        table.span_corr[i]: i
        for i in np.flatnonzero(kinds == EventKind.RUNTIME).tolist()
        if table.span_corr[i] > 0
    }
    launchers = [runtime.get(table.span_corr[k], -1) for k in device.tolist()]
    has = np.asarray([j >= 0 for j in launchers], dtype=bool)
    picked = np.asarray([j if j >= 0 else 0 for j in launchers], dtype=np.int64)
    launch_start = np.where(has, ts[picked], -1) if device.size else np.zeros(0, np.int64)
    launch_end = np.where(has, ts[picked] + dur[picked], -1) if device.size else np.zeros(0, np.int64)
    queued = np.asarray([j >= 0 and names[table.span_name[j]] in LAUNCH_CALLS for j in launchers], dtype=bool)
    index: dict[tuple[str, str], int] = {}
    stream = np.asarray(
        [
            index.setdefault(_stream_key(table, int(t)), len(index))
            for t in table.array("span_tid")[device].tolist()
        ],
        dtype=np.int64,
    )
    return StreamWork(
        start=ts[device],
        end=ts[device] + dur[device],
        stream=stream,
        keys=list(index),
        is_kernel=kinds[device] == EventKind.KERNEL,
        launch_start=launch_start,
        launch_end=launch_end,
        queued=queued,
    )


def _stream_key(table: EventTable, tid: int) -> tuple[str, str]:
    """(device, stream) of a device span's thread: the trace's (pid, tid); live captures name none."""
    device, stream = table.threads.get(tid, ("?", tid))
    return str(device), str(stream)


def stream_stats(work: StreamWork) -> tuple[StreamStats, ...]:
    """Per stream, busiest first."""
    found = []
    for s, (device, stream) in enumerate(work.keys):
        pick = np.flatnonzero(work.stream == s)
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


def _enclosing_ops(table: EventTable, wanted: list[int]) -> dict[int, int]:
    """For each span in ``wanted``, the innermost CPU op or range around it on its thread (-1)."""
    if not wanted:
        return {}
    kinds = table.array("span_kind")
    ts, dur = table.array("span_ts"), table.array("span_dur")
    cpu = np.flatnonzero((kinds == EventKind.CPU_OP) | (kinds == EventKind.USER_ANNOTATION))
    cpu_order = cpu[np.lexsort((-dur[cpu], ts[cpu]))].tolist()
    targets = sorted(wanted, key=lambda i: int(ts[i]))
    result: dict[int, int] = {}
    stacks: dict[int, list[int]] = {}
    j = 0
    span_ts, span_dur, span_tid = table.span_ts, table.span_dur, table.span_tid
    for i in targets:
        t = span_ts[i]
        while j < len(cpu_order) and span_ts[cpu_order[j]] <= t:
            k = cpu_order[j]
            stack = stacks.setdefault(span_tid[k], [])
            while stack and span_ts[stack[-1]] + span_dur[stack[-1]] < span_ts[k] + span_dur[k]:
                stack.pop()
            stack.append(k)
            j += 1
        stack = stacks.get(span_tid[i], [])
        while stack and span_ts[stack[-1]] + span_dur[stack[-1]] < t + span_dur[i]:
            stack.pop()
        result[i] = stack[-1] if stack else -1
    return result


def device_report(table: EventTable) -> DeviceReport | None:
    """The device section of an analysis, or None when the trace has no device work."""
    kinds = table.array("span_kind")
    device = np.flatnonzero((kinds >= EventKind.KERNEL) & (kinds <= EventKind.MEMSET))
    if not device.size:
        return None
    ts, dur = table.array("span_ts"), table.array("span_dur")
    starts, ends = ts[device], ts[device] + dur[device]
    busy_ns = 0
    devices = [table.threads.get(int(t), (0, 0))[0] for t in table.array("span_tid")[device].tolist()]
    for dev in set(devices):
        pick = np.asarray([d == dev for d in devices])
        busy_ns += union_length(starts[pick], ends[pick])
    cpu = np.flatnonzero(kinds < EventKind.PYTHON)
    lo = min(int(starts.min()), int(ts[cpu].min())) if cpu.size else int(starts.min())
    hi = max(int(ends.max()), int((ts[cpu] + dur[cpu]).max())) if cpu.size else int(ends.max())
    window_ns = (hi - lo) * max(1, len(set(devices)))

    names = table.names
    per_name: dict[tuple[int, int], list[int]] = {}
    for k in device.tolist():
        per_name.setdefault((table.span_name[k], table.span_kind[k]), []).append(table.span_dur[k])
    kernels = sorted(
        (
            KernelStats(names[n], kernel_kind(names[n], kd), len(d), sum(d) / 1000.0)
            for (n, kd), d in per_name.items()
        ),
        key=lambda s: -s.total_us,
    )
    by_kind: dict[str, float] = {}
    for stat in kernels:
        by_kind[stat.kind] = by_kind.get(stat.kind, 0.0) + stat.total_us
    is_kernel = kinds[device] == EventKind.KERNEL
    tiny = int(((dur[device] < TINY_KERNEL_US * 1000) & is_kernel).sum())

    work = stream_work(table, device)
    is_comm, is_comp = _comm_and_comp(table, device)
    return DeviceReport(
        window_us=window_ns / 1000.0,
        busy_us=busy_ns / 1000.0,
        by_kind=by_kind,
        kernels=tuple(kernels),
        launches=int(is_kernel.sum()),
        tiny_kernels=tiny,
        launch_bound=_launch_bound(table, device[is_kernel]),
        syncs=_sync_points(table),
        steps=step_verdicts(table, work, is_comm, is_comp, (lo, hi)),
        idle=device_idle(work, (lo, hi)),
        streams=stream_stats(work),
        copies=_copies(table, device),
        comm_compute_overlap=comm_overlap(work, is_comm, is_comp),
        collectives=_collective_kernels(table, device[is_comm]),
    )


def _launch_bound(table: EventTable, kernels: np.ndarray) -> int:
    """Kernels shorter than the runtime call that launched them (graph launches left out: one call
    runs a whole graph)."""
    kinds = table.array("span_kind")
    names = table.names
    runtime_by_corr = {
        table.span_corr[i]: i
        for i in np.flatnonzero(kinds == EventKind.RUNTIME).tolist()
        if table.span_corr[i] > 0
    }
    count = 0
    for k in kernels.tolist():
        launcher = runtime_by_corr.get(table.span_corr[k])
        if (
            launcher is not None
            and table.span_dur[k] < table.span_dur[launcher]
            and not is_graph_launch(names[table.span_name[launcher]])
        ):
            count += 1
    return count


def _sync_points(table: EventTable) -> tuple[SyncPoint, ...]:
    """Synchronising runtime calls grouped by call and the op around them, longest first."""
    names = table.names
    sync_calls = [
        i
        for i in np.flatnonzero(table.array("span_kind") == EventKind.RUNTIME).tolist()
        if is_sync_call(names[table.span_name[i]])
    ]
    owner = _enclosing_ops(table, sync_calls)
    syncs: dict[tuple[str, str], list[int]] = {}
    for i in sync_calls:
        p = owner.get(i, -1)
        op = names[table.span_name[p]] if p >= 0 else "(outside ops)"
        syncs.setdefault((names[table.span_name[i]], op), []).append(table.span_dur[i])
    return tuple(
        sorted(
            (SyncPoint(c, o, len(d), sum(d) / 1000.0) for (c, o), d in syncs.items()),
            key=lambda s: -s.total_us,
        )
    )


def _comm_and_comp(table: EventTable, device: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``device`` are communication kernels and which computation kernels (copies and
    sets are neither, as in HTA)."""
    names, kinds = table.names, table.span_kind
    is_comm = np.zeros(device.size, dtype=bool)
    is_comp = np.zeros(device.size, dtype=bool)
    kind_of: dict[int, bool] = {}
    for j, k in enumerate(device.tolist()):
        if kinds[k] != EventKind.KERNEL:
            continue
        n = table.span_name[k]
        comm = kind_of.get(n)
        if comm is None:
            comm = kind_of[n] = kernel_kind(names[n], EventKind.KERNEL) == "communication"
        is_comm[j], is_comp[j] = comm, not comm
    return is_comm, is_comp


def _collective_kernels(table: EventTable, comm: np.ndarray) -> tuple[CollectiveKernel, ...]:
    """The communication kernels at span positions ``comm``, with the step each started in."""
    windows = step_windows(table)
    found = []
    for k in comm.tolist():
        start = table.span_ts[k]
        step = next((w.number for w in windows if w.start <= start < w.end), None)
        name = kernel_function_name(table.names[table.span_name[k]]).removeprefix("void ")
        found.append(CollectiveKernel(name, start / 1000.0, (start + table.span_dur[k]) / 1000.0, step))
    return tuple(sorted(found, key=lambda c: c.start_us))


def _copies(table: EventTable, device: np.ndarray) -> tuple[CopyStats, ...]:
    """Memory copies by kind, with the bytes the trace says each moved (``args.bytes``)."""
    copy_bytes: dict[str, int] = table.meta.get("copy_bytes", {})
    found: dict[str, list[int]] = {}
    counted: set[str] = set()
    for k in device.tolist():
        if table.span_kind[k] != EventKind.MEMCPY:
            continue
        name = table.names[table.span_name[k]]
        entry = found.setdefault(kernel_kind(name, EventKind.MEMCPY), [0, 0, 0])
        entry[0] += 1
        entry[2] += table.span_dur[k]
        if name not in counted:
            counted.add(name)
            entry[1] += int(copy_bytes.get(name, 0))
    return tuple(
        sorted(
            (CopyStats(kind, c, b, ns / 1000.0) for kind, (c, b, ns) in found.items()),
            key=lambda c: -c.time_us,
        )
    )
