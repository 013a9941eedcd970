"""Device analysis of a trace: busy and idle time, kernel time by kind, top kernels, launch
overhead, host-device synchronisation, streams (analysis/streams.py), memory-copy bandwidth,
communication/computation overlap, and a verdict per step from what the device's idle time waited on."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from layerscope.analysis.collectives import CollectiveKernel
from layerscope.analysis.streams import (
    IdleTime,
    StreamStats,
    StreamWork,
    stream_stats,
)
from layerscope.analysis.verdict import StepVerdict, comm_overlap, device_idle, step_verdicts
from layerscope.events.intervals import union_length
from layerscope.events.steps import step_windows
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
    for k, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and k > 0 and not name.startswith("(anonymous namespace)", k):
            return name[:k]
    return name


SYNC_CALLS = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "hipDeviceSynchronize",
    "hipStreamSynchronize",
    "hipEventSynchronize",
    "cudaMemcpy",
    "hipMemcpy",
)
TINY_KERNEL_US = 10.0


def is_sync_call(name: str) -> bool:
    """Runtime calls that block the host until the device catches up (async copies and device-side
    waits do not)."""
    return name.startswith(SYNC_CALLS) and "Async" not in name


#: Runtime calls that launch a whole captured graph: one call, many kernels.
GRAPH_LAUNCH_CALLS = ("cudaGraphLaunch", "hipGraphLaunch")


def is_graph_launch(name: str) -> bool:
    """A CUDA/HIP graph launch: its kernels are no launch-bound evidence, since one call (often
    ~1 ms) launches the whole graph; comparing each kernel with it would call them all too short.
    HTA's launch statistics leave these calls out too."""
    return name.startswith(GRAPH_LAUNCH_CALLS)


def kernel_kind(name: str, kind: int) -> str:
    """The kind of one piece of device work (memcpy directions from Kineto's names)."""
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
class SyncPoint:
    """A host-device synchronisation call, with the op that made it."""

    call: str
    op: str
    count: int
    total_us: float


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

    work = StreamWork.of(table, device)
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
