"""What a profile knows besides its numbers (:class:`ProfileMeta`): one typed, frozen record per
concept, each written by one owner.

=====================  =============================================  ===============================
record                 what it holds                                  written by
=====================  =============================================  ===============================
:class:`Environment`   versions, devices, the distributed job, the    ``capture/environment.py``
                       numeric settings MFU follows
:class:`CaptureInfo`   a live block: options, reader, scope plan,     ``capture/recording.py``
                       cycle, errors met while recording
:class:`TraceInfo`     what the event source said about itself        ``attribution/profile_meta.py``
:class:`CompileReport` what placing compiled kernels did              ``attribution/compiled.py``
                                                                      (its ``note``: recording)
:class:`FlopsByDtype`  the run's FLOPs per dtype class                ``attribution/attribute.py``
:class:`DeviceSummary` the device report's figures                    ``analysis/device_summary.py``
:class:`FlightInfo`    a flight recorder's dump: what triggered it    ``attribution/flight_profile.py``
:class:`EstimateInfo`  an estimate: the device spec and step it        ``estimates/build.py``
                       predicted, and whether the peak fits
memory records         :mod:`layerscope.model.memory`                 ``attribution/memory/``
=====================  =============================================  ===============================

Saved by one pair of functions (:mod:`layerscope.model.meta_json`); files of schema v1 (a flat dict)
load into the same records. ``meta["key"]`` still reads the v1 form, with a DeprecationWarning.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from layerscope.model.memory import MemoryReport, MemoryTimeline

#: The version of the saved profile format: 2 since meta became typed records.
SCHEMA_VERSION = 2

LIVE = "live"
TRACE = "trace"
#: A flight recorder's dump (``ls.flight_recorder``): steps and module calls, no op events.
FLIGHT = "flight"

#: An estimate (``ls.estimate``): predicted from fake tensors, nothing measured.
ESTIMATE = "estimate"

#: What makes a flight recorder write a dump (:attr:`FlightTrigger.reason`).
TRIGGER_REASONS = ("signal", "slow_step", "exception", "oom", "manual", "memory")


@dataclass(frozen=True)
class DeviceInfo:
    """One CUDA device torch saw: name, index, memory in bytes."""

    name: str
    index: int = 0
    total_memory: int = 0


@dataclass(frozen=True)
class DistributedInfo:
    """The torch.distributed job a process belonged to (backend None: read from torchrun's env)."""

    rank: int
    world_size: int
    backend: str | None = None


@dataclass(frozen=True)
class Environment:
    """Where a live profile ran: versions, devices, and the settings that change what peak FLOP
    rate the run could reach."""

    layerscope_version: str = ""
    torch_version: str = ""
    python_version: str = ""
    created_at: str = ""
    #: "highest": fp32 matmuls at the fp32 rate; "high"/"medium": TF32 (MFU's peak follows it)
    float32_matmul_precision: str = "highest"
    #: fp32 convolutions in TF32
    cudnn_allow_tf32: bool = True
    #: whether gradient checkpointing's recomputation stops early (``attribution/recompute.py``)
    checkpoint_early_stop: bool = True
    devices: tuple[DeviceInfo, ...] = ()
    distributed: DistributedInfo | None = None


@dataclass(frozen=True)
class SavedOptions:
    """The capture options a live profile was recorded with (``CaptureOptions`` as saved)."""

    activities: tuple[str, ...] = ("cpu",)
    memory: bool = False
    shapes: bool = False
    flops: bool = False
    with_stack: bool = False
    lines: bool = False
    nvtx: bool = False
    paths: tuple[str, ...] | None = None
    depth: int | None = None
    all_threads: bool = False


@dataclass(frozen=True)
class ScopeReason:
    """How a group of modules was scoped: the mechanism, its clock (marks, ranges) and why."""

    mechanism: str
    clock: str | None
    reason: str


@dataclass(frozen=True)
class ScopePlanRecord:
    """The scope plan as saved: ``kinds`` is ``ranges``, ``marks`` or ``marks and ranges``;
    ``modules`` is ``(path, type, index into reasons)`` in model order."""

    kinds: str = "ranges"
    reasons: tuple[ScopeReason, ...] = ()
    modules: tuple[tuple[str, str, int], ...] = ()


@dataclass(frozen=True)
class BlockError:
    """The exception a profiling block raised: type, first line, and the innermost module of the
    model whose ``forward`` it passed through (None: none)."""

    type: str
    message: str = ""
    module: str | None = None


@dataclass(frozen=True)
class CaptureInfo:
    """What a live block recorded, beside its events."""

    options: SavedOptions = field(default_factory=SavedOptions)
    #: the block's wall time as the session measured it
    block_us: float = 0.0
    #: which reader turned torch's events into a table: ``native`` or ``python``
    reader: str = ""
    scope_plan: ScopePlanRecord = field(default_factory=ScopePlanRecord)
    #: the cycle's index under a schedule (None: the whole block)
    cycle: int | None = None
    #: module marks without their other half (calls still running at the end)
    unmatched_module_marks: int = 0
    #: event names the reader could not decode
    undecodable_names: int = 0
    #: op -> how many times its FLOP formula failed
    flop_formula_failures: Mapping[str, int] = field(default_factory=dict)
    block_error: BlockError | None = None
    #: the first errors the memory watch met (at most 20)
    memory_watch_errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class TraceInfo:
    """What the event source said about itself. ``other`` keeps what a trace file adds that
    layerscope does not read by name (its ``layerscope`` header among them)."""

    #: the trace's own format version (torch's ``schemaVersion``); None for live events
    schema_version: int | str | None = None
    device_properties: tuple[Mapping[str, Any], ...] = ()
    distributed: Mapping[str, Any] | None = None
    skipped_events: int = 0
    #: reason -> how many events were skipped as malformed
    malformed_events: Mapping[str, int] = field(default_factory=dict)
    #: the allocator's own running peak per device class (``cpu``, ``device``)
    peak_allocated_bytes: Mapping[str, int] = field(default_factory=dict)
    #: what the allocator held before the first event, per device class
    allocated_before_bytes: Mapping[str, int] = field(default_factory=dict)
    #: one row per (collective, group, dtype): calls, bytes, CPU time
    communication: tuple[Mapping[str, Any], ...] = ()
    #: copy kind -> bytes
    copy_bytes: Mapping[str, int] = field(default_factory=dict)
    #: the file ended early (a killed job), and how many bytes after the last event were lost
    truncated: bool = False
    lost_bytes: int = 0
    other: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompileReport:
    """What placing compiled kernels did: graph calls, those matched to a compiled graph, kernel
    spans matched and moved below the compiled module, paths named that the tree lacks (the most
    named first), and the warning recording gave about what stayed unplaced."""

    graph_calls: int = 0
    mapped_graph_calls: int = 0
    kernels_matched: int = 0
    kernels_placed: int = 0
    kernels_not_in_tree: int = 0
    paths_not_in_tree: Mapping[str, int] = field(default_factory=dict)
    note: str | None = None


@dataclass(frozen=True)
class CallLinesInfo:
    """Call lines recorded: ops that have one, distinct stacks."""

    ops: int
    stacks: int


@dataclass(frozen=True)
class FlopsByDtype:
    """The run's FLOPs per dtype class and, in a mixed run, each module's (its MFU is held to its
    own mix)."""

    run: Mapping[str, int]
    per_module: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class IdleSplit:
    """Idle device time by cause, µs."""

    host_wait_us: float = 0.0
    kernel_wait_us: float = 0.0
    other_us: float = 0.0


@dataclass(frozen=True)
class DeviceSummary:
    """The device report's figures (µs, shares 0-1, None where there is nothing to measure).
    ``streams``, ``copies`` and ``steps`` are rows as ``to_pandas`` shows them; ``collectives`` is
    ``(name, start µs, end µs, step)`` in start order."""

    window_us: float
    busy_us: float
    utilisation: float
    idle: IdleSplit
    comm_compute_overlap: float | None
    launches: int
    tiny_kernels: int
    launch_bound: int
    by_kind: Mapping[str, float]
    streams: tuple[Mapping[str, Any], ...] = ()
    copies: tuple[Mapping[str, Any], ...] = ()
    collectives: tuple[tuple[str, float, float, int | None], ...] = ()
    steps: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class FlightTrigger:
    """What made a flight recorder dump: ``reason`` (one of :data:`TRIGGER_REASONS`), the step it
    happened in, the module named (the one open when an exception passed, or the one holding most
    of a slow step's extra time; None when none), and a one-line message (the exception's)."""

    reason: str
    step: int
    module: str | None = None
    message: str = ""


@dataclass(frozen=True)
class FlightInfo:
    """A flight recorder's dump: its trigger and the recorder's settings. ``median_step_us`` is the
    rolling median step the slow-step trigger compared with (None before the warm-up ended);
    ``detail_file`` the latest detailed profile (``detail_every``), saved beside the dump, and
    ``detail_step`` its step (None without one); ``detail_budget`` the share of the job's time the
    detailed steps were held to (None: no cap); ``steps_seen`` how many steps the recorder saw in
    all; ``ring_bytes`` what the kept records held."""

    trigger: FlightTrigger
    keep: int
    steps_seen: int
    slow: float | None = None
    median_step_us: float | None = None
    detail_every: int = 0
    detail_file: str | None = None
    detail_step: int | None = None
    ring_bytes: int = 0
    detail_budget: float | None = None


@dataclass(frozen=True)
class EstimateInfo:
    """What an estimate (``ls.estimate``) predicted for and how: the device spec (``device`` its
    key, ``device_name``, its memory, bandwidth and dense peaks in TFLOP/s per dtype class, the
    per-op costs added to each op's roofline time), the step (``train``, ``optimizer``, ``dtype``
    None: the model's own), where predicted times are kept (``time_field``: ``cpu_us`` for the CPU,
    ``device_us`` for an accelerator), the predicted absolute peak against the memory usable after
    the reserve (``fits``), the estimate's own cost on this machine (``wall_s``), and the state's
    bytes by category (``state_bytes``)."""

    device: str
    device_name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    peak_tflops: Mapping[str, float]
    op_overhead_us: float
    view_overhead_us: float
    train: bool
    optimizer: str | None
    dtype: str | None
    time_field: str
    peak_bytes: int
    usable_bytes: int
    fits: bool
    wall_s: float = 0.0
    #: bytes of each category live when the step ends (``parameter``, ``gradient``,
    #: ``optimizer_state``, ``input``): the model's state, whether or not it was live at the peak
    state_bytes: Mapping[str, int] = field(default_factory=dict)
    #: module path -> bytes its own ops read and wrote, (forward, backward): the roofline's bytes
    #: (FLOPs are in the tree; a Metrics has no field for bytes moved)
    module_bytes: Mapping[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileMeta:
    """Everything a profile knows besides its numbers; each field one record with one owner.

    ``source`` is ``live`` (a capture), ``trace`` (built from a trace file, ``trace_file``),
    ``flight`` (a flight recorder's dump, ``flight``) or ``estimate`` (``ls.estimate``, ``estimate``);
    ``extra`` keeps keys
    a file held that this version does not know, so that saving again loses nothing.
    """

    source: str = LIVE
    model: str | None = None
    trace_file: str | None = None
    event_count: int = 0
    #: the recorded window: first CPU event's start to the last one's end
    wall_us: float | None = None
    #: what the tree is made of when the trace named no module (``record_function regions``, ``none``)
    module_source: str | None = None
    environment: Environment | None = None
    capture: CaptureInfo | None = None
    trace: TraceInfo = field(default_factory=TraceInfo)
    memory: MemoryReport | None = None
    memory_timeline: MemoryTimeline | None = None
    compiled: CompileReport | None = None
    call_lines: CallLinesInfo | None = None
    flops_by_dtype: FlopsByDtype | None = None
    device: DeviceSummary | None = None
    flight: FlightInfo | None = None
    estimate: EstimateInfo | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def memory_recorded(self) -> bool:
        """Whether memory events were asked for (live) or found (trace)."""
        if self.capture is not None:
            return self.capture.options.memory
        return self.memory is not None or self.memory_timeline is not None

    @property
    def device_names(self) -> list[str]:
        """The devices the run used, by name: a live capture's, then the trace's properties (an
        estimate: the device it predicted for)."""
        live = [d.name for d in self.environment.devices] if self.environment is not None else []
        predicted = [self.estimate.device_name] if self.estimate is not None else []
        return live + [str(p["name"]) for p in self.trace.device_properties if p.get("name")] + predicted

    @property
    def distributed(self) -> DistributedInfo | None:
        """The job's rank and size: a live capture's, else the trace's ``distributedInfo``."""
        if self.environment is not None and self.environment.distributed is not None:
            return self.environment.distributed
        info = self.trace.distributed
        if isinstance(info, Mapping) and isinstance(info.get("rank"), int):
            size, backend = info.get("world_size"), info.get("backend")
            return DistributedInfo(
                int(info["rank"]),
                size if isinstance(size, int) else 1,
                backend if isinstance(backend, str) else None,
            )
        return None

    # ----- the v1 dict form, for one release ------------------------------------------------------
    def _v1(self, key: str) -> dict[str, Any]:
        from layerscope.model.meta_json import meta_to_v1

        warnings.warn(
            f"profile.meta[{key!r}]: meta is a ProfileMeta now; read its attributes "
            "(the dict form goes in the next release)",
            DeprecationWarning,
            stacklevel=3,
        )
        return meta_to_v1(self)

    def __getitem__(self, key: str) -> Any:
        return self._v1(key)[key]

    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated: the v1 dict form's ``get``."""
        return self._v1(key).get(key, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._v1(key)
