"""Device analysis of a trace: busy and idle time, kernel time by kind, top kernels, launch
overhead, host-device synchronisation, streams (analysis/streams.py), memory-copy bandwidth,
communication/computation overlap, and a verdict per step from what the device's idle time waited on."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from layerscope.analysis.collectives import CollectiveKernel
from layerscope.analysis.device_columns import first_seen, group_sums, launch_calls, name_flags, thread_groups
from layerscope.analysis.streams import (
    IdleTime,
    StreamStats,
    StreamWork,
    stream_stats,
)
from layerscope.analysis.sync_points import SyncPoint as SyncPoint
from layerscope.analysis.sync_points import sync_points
from layerscope.analysis.verdict import (
    StepVerdict,
    comm_overlap,
    device_idle,
    device_timelines,
    step_verdicts,
)
from layerscope.events.intervals import union_length
from layerscope.events.steps import StepWindow, step_windows
from layerscope.events.table import EventKind, EventTable

#: Kernel kinds, first match wins (names of cuBLAS/cuDNN/CUTLASS/Triton/NCCL/ROCm kernels), tried on
#: the kernel's own name without its parameter list (the arguments name types such as
#: ``fbgemm_gpu::...`` or ``cudnnTensorStruct`` that say nothing about the kernel's job).
#: Reviewed against every distinct kernel name in the real traces: tests/golden/kernel_kinds.tsv.
KERNEL_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "communication",
        re.compile(r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|alltoall|broadcast", re.I),
    ),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|softmax_warp_forward_mha", re.I)),
    (
        "normalization",
        re.compile(
            r"batch_?norm|bn_(?:fw|bw)|layer_?norm|group_?norm|instance_?norm|rms_?norm|GammaBeta|"
            r"RowwiseMoments",
            re.I,
        ),
    ),
    ("convolution", re.compile(r"conv|cudnn|winograd|implicit_?gemm|fprop|dgrad|wgrad|miopen|fft2d", re.I)),
    ("embedding", re.compile(r"embedding|embs|indexSelect|bounds_check_indices", re.I)),
    (
        "gemm",
        re.compile(
            r"(?<!fb)gemm|gemv|cublasLt|epilogue::impl|matmul|cutlass|cublas|wgmma|xmma|sgemm|Cijk|splitKreduce",
            re.I,
        ),
    ),
    ("pooling", re.compile(r"pool", re.I)),
    ("optimizer", re.compile(r"multi_tensor_apply|adam|adagrad|sgd_|fused_sgd", re.I)),
    ("reduction", re.compile(r"reduce|norm|softmax|sum_|mean|argmax|topk|scan|DeviceRadixSort", re.I)),
    (
        "elementwise",
        re.compile(
            r"elementwise|vectorized|unrolled|pointwise|triton_poi|fill|copy|cat_|CatArray|index|dropout",
            re.I,
        ),
    ),
)


def kernel_function_name(name: str) -> str:
    """A demangled kernel name without its parameter list: ``void f<T>(int, Foo)`` -> ``void f<T>``."""
    depth = 0
    for found in _BRACKETS.finditer(name):  # only the brackets: names run to hundreds of characters
        ch, k = found.group(), found.start()
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0 and k > 0 and not name.startswith("(anonymous namespace)", k):
            return name[:k]
    return name


_BRACKETS = re.compile(r"[<>(]")


TINY_KERNEL_US = 10.0


#: Runtime calls that launch a whole captured graph: one call, many kernels.
GRAPH_LAUNCH_CALLS = ("cudaGraphLaunch", "hipGraphLaunch")


def is_graph_launch(name: str) -> bool:
    """A CUDA/HIP graph launch: its kernels are no launch-bound evidence, since one call (often
    ~1 ms) launches the whole graph; comparing each kernel with it would call them all too short.
    HTA's launch statistics leave these calls out too."""
    return name.startswith(GRAPH_LAUNCH_CALLS)


@functools.lru_cache(maxsize=1 << 14)
def kernel_kind(name: str, kind: int) -> str:
    """The kind of one piece of device work (memcpy directions from Kineto's names); remembered,
    since ranks and traces of one job share their kernel names and the patterns are many."""
    if kind == EventKind.MEMSET:
        return "memset"
    if kind == EventKind.MEMCPY:
        for tag, label in (("HtoD", "memcpy H2D"), ("DtoH", "memcpy D2H"), ("DtoD", "memcpy D2D")):
            if tag in name:
                return label
        return "memcpy other"
    core = kernel_function_name(name)
    for label, pattern in KERNEL_KINDS:
        if pattern.search(core):
            return label
    return "other"


@dataclass(frozen=True, slots=True)
class KernelStats:
    """One kernel name: launches, total and mean time, and its kind."""

    name: str
    kind: str
    launches: int
    total_us: float

    @property
    def mean_us(self) -> float:
        """Mean duration of one launch."""
        return self.total_us / self.launches if self.launches else 0.0


@dataclass(frozen=True, slots=True)
class CopyStats:
    """Memory copies of one kind (``memcpy H2D``...): count, bytes, time and bandwidth."""

    kind: str
    count: int
    bytes: int
    time_us: float

    @property
    def gb_per_s(self) -> float | None:
        """Bytes moved per second of copying, in GB/s (None without byte counts)."""
        return self.bytes / (self.time_us * 1000.0) if self.bytes and self.time_us > 0 else None


@dataclass(frozen=True)
class DeviceReport:
    """What the device did during a trace."""

    window_us: float
    busy_us: float
    by_kind: dict[str, float]
    kernels: tuple[KernelStats, ...]
    launches: int
    tiny_kernels: int  # launches shorter than TINY_KERNEL_US
    launch_bound: int  # kernels shorter than the call that launched them (graph launches left out)
    syncs: tuple[SyncPoint, ...]
    steps: tuple[StepVerdict, ...] = field(default=())
    streams: tuple[StreamStats, ...] = field(default=())
    copies: tuple[CopyStats, ...] = field(default=())
    #: share of communication-kernel time with a computation kernel running; None: no communication
    comm_compute_overlap: float | None = None
    #: the device's idle time in the window (no stream busy) by cause; streams have their own
    idle: IdleTime = field(default_factory=IdleTime)
    #: communication kernels in start order (matched across ranks by ``merge``)
    collectives: tuple[CollectiveKernel, ...] = field(default=())

    @property
    def idle_us(self) -> float:
        """Window minus busy time."""
        return max(0.0, self.window_us - self.busy_us)

    @property
    def utilisation(self) -> float:
        """Busy share of the window."""
        return self.busy_us / self.window_us if self.window_us > 0 else 0.0


def _kernel_stats(table: EventTable, device: np.ndarray) -> list[KernelStats]:
    """One row per kernel name (and kind of work), most time first; ties in the order first run."""
    width = max(EventKind) + 1
    keys, group = first_seen(table.array("span_name")[device] * width + table.array("span_kind")[device])
    launches = np.bincount(group, minlength=keys.size)
    total = group_sums(group, table.array("span_dur")[device], keys.size)
    rows = []
    for key, count, ns in zip(keys.tolist(), launches.tolist(), total.tolist(), strict=True):
        name = table.names[key // width]
        rows.append(KernelStats(name, kernel_kind(name, key % width), count, ns / 1000.0))
    return sorted(rows, key=lambda s: -s.total_us)


def device_report(table: EventTable) -> DeviceReport | None:
    """The device section of an analysis, or None when the trace has no device work."""
    kinds = table.array("span_kind")
    device = np.flatnonzero((kinds >= EventKind.KERNEL) & (kinds <= EventKind.MEMSET))
    if not device.size:
        return None
    ts, dur = table.array("span_ts"), table.array("span_dur")
    starts, ends = ts[device], ts[device] + dur[device]
    devices, device_of = thread_groups(table, device, lambda tid: table.threads.get(tid, (0, 0))[0])
    busy_ns = sum(union_length(starts[device_of == k], ends[device_of == k]) for k in range(len(devices)))
    # the CPU side's first start and last end, read in place (no copy of the CPU spans)
    cpu = kinds < EventKind.PYTHON
    lo = int(ts.min(where=cpu, initial=starts.min()))
    hi = int((ts + dur).max(where=cpu, initial=ends.max()))
    window_ns = (hi - lo) * max(1, len(devices))

    kernels = _kernel_stats(table, device)
    by_kind: dict[str, float] = {}
    for stat in kernels:
        by_kind[stat.kind] = by_kind.get(stat.kind, 0.0) + stat.total_us
    is_kernel = kinds[device] == EventKind.KERNEL
    tiny = int(((dur[device] < TINY_KERNEL_US * 1000) & is_kernel).sum())

    launchers = launch_calls(table, device)
    work = StreamWork.of(table, device, launchers)
    is_comm, is_comp = _comm_and_comp(table, device, kernels)
    windows = step_windows(table)
    timelines = device_timelines(work, (lo, hi))
    return DeviceReport(
        window_us=window_ns / 1000.0,
        busy_us=busy_ns / 1000.0,
        by_kind=by_kind,
        kernels=tuple(kernels),
        launches=int(is_kernel.sum()),
        tiny_kernels=tiny,
        launch_bound=_launch_bound(table, device[is_kernel], launchers[is_kernel]),
        syncs=sync_points(table),
        steps=step_verdicts(windows, work, timelines, is_comm, is_comp),
        idle=device_idle(timelines),
        streams=stream_stats(work),
        copies=_copies(table, device),
        comm_compute_overlap=comm_overlap(work, is_comm, is_comp),
        collectives=_collective_kernels(table, device[is_comm], windows),
    )


def _launch_bound(table: EventTable, kernels: np.ndarray, launchers: np.ndarray) -> int:
    """Kernels shorter than the runtime call that launched them (``launchers``; graph launches left
    out: one call runs a whole graph)."""
    dur = table.array("span_dur")
    has = launchers >= 0
    kernels, launchers = kernels[has], launchers[has]
    shorter = dur[kernels] < dur[launchers]
    return int((shorter & ~name_flags(table, launchers, is_graph_launch)).sum())


def _comm_and_comp(
    table: EventTable, device: np.ndarray, kernels: Sequence[KernelStats]
) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``device`` are communication kernels and which computation kernels (copies and
    sets are neither, as in HTA), by the kinds ``kernels`` found for their names (only kernels are
    of kind communication)."""
    is_kernel = table.array("span_kind")[device] == EventKind.KERNEL
    communication = {stat.name for stat in kernels if stat.kind == "communication"}
    is_comm = np.zeros(device.size, dtype=bool)
    is_comm[is_kernel] = name_flags(table, device[is_kernel], communication.__contains__)
    return is_comm, is_kernel & ~is_comm


def _step_of(windows: Sequence[StepWindow], starts: np.ndarray) -> list[int | None]:
    """The number of the step window each of ``starts`` falls in (None: none)."""
    w_start = np.asarray([w.start for w in windows], dtype=np.int64)
    w_end = np.asarray([w.end for w in windows], dtype=np.int64)
    if w_start.size > 1 and not bool((w_end[:-1] <= w_start[1:]).all()):
        # windows out of order or overlapping (step_windows makes none): the first that holds it
        return [next((w.number for w in windows if w.start <= s < w.end), None) for s in starts.tolist()]
    at = np.searchsorted(w_start, starts, side="right") - 1
    inside = (at >= 0) & (starts < w_end[np.maximum(at, 0)]) if w_start.size else np.zeros(starts.size, bool)
    numbers = [w.number for w in windows]
    return [numbers[a] if ok else None for a, ok in zip(at.tolist(), inside.tolist(), strict=True)]


def _collective_kernels(
    table: EventTable, comm: np.ndarray, windows: Sequence[StepWindow]
) -> tuple[CollectiveKernel, ...]:
    """The communication kernels at span positions ``comm``, with the step each started in."""
    starts = table.array("span_ts")[comm]
    ends = (starts + table.array("span_dur")[comm]).tolist()
    short: dict[int, str] = {}
    names = table.names
    found = []
    for n, start, end, step in zip(
        table.array("span_name")[comm].tolist(), starts.tolist(), ends, _step_of(windows, starts), strict=True
    ):
        name = short.get(n)
        if name is None:
            name = short[n] = kernel_function_name(names[n]).removeprefix("void ")
        found.append(CollectiveKernel(name, start / 1000.0, end / 1000.0, step))
    return tuple(sorted(found, key=lambda c: c.start_us))


def _copies(table: EventTable, device: np.ndarray) -> tuple[CopyStats, ...]:
    """Memory copies by kind, with the bytes the trace says each moved (``args.bytes``)."""
    copies = device[table.array("span_kind")[device] == EventKind.MEMCPY]
    if not copies.size:
        return ()
    copy_bytes: dict[str, int] = table.meta.get("copy_bytes", {})
    ids, group = first_seen(table.array("span_name")[copies])
    count = np.bincount(group, minlength=ids.size)
    time_ns = group_sums(group, table.array("span_dur")[copies], ids.size)
    found: dict[str, list[int]] = {}
    for name_id, n, ns in zip(ids.tolist(), count.tolist(), time_ns.tolist(), strict=True):
        name = table.names[name_id]
        entry = found.setdefault(kernel_kind(name, EventKind.MEMCPY), [0, 0, 0])
        entry[0] += n
        entry[1] += int(copy_bytes.get(name, 0))
        entry[2] += ns
    return tuple(
        sorted(
            (CopyStats(kind, c, b, ns / 1000.0) for kind, (c, b, ns) in found.items()),
            key=lambda c: -c.time_us,
        )
    )
