"""Memory records: what a profile keeps about memory, one typed frozen record per concept.

:class:`MemoryReport` is ``meta.memory`` (per device class the absolute peak and what was live at
it, per-step figures, bytes saved for backward, allocations refused) and :class:`MemoryTimeline` is
``meta.memory_timeline`` (memory in use over time, for the plot). Each has one ``to_json`` /
``from_json`` pair; ``from_json`` also reads the positional form schema v1 saved.

Names follow the glossary (docs/usage.md, "What the metrics mean"): ``alloc_bytes`` allocated,
``net_bytes`` allocated minus freed, ``relative_peak_bytes`` the most added on top of what was
live when a window began, ``absolute_peak_bytes`` the most live, what was live before included.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from layerscope.model.metrics import Metrics

#: The module of storages live before the recording began.
BEFORE_BLOCK = "(before the block)"
#: The module of live bytes no address pairs with an allocation (a trace without addresses).
UNPAIRED = "(addresses not recorded)"


@dataclass(frozen=True)
class MemoryRow:
    """Bytes of one category live at the peak, by the module (or entry) whose work allocated them
    and its phase. Storages from before the block read ``(before the block)``; activations are
    charged to the module whose op allocated them (:attr:`MemoryAtPeak.saved` says who keeps them)."""

    category: str
    module: str
    phase: str
    bytes: int


@dataclass(frozen=True)
class StepMemory:
    """One step's memory on one device class: its absolute peak, bytes allocated, net change."""

    step: int
    absolute_peak_bytes: int
    alloc_bytes: int
    net_bytes: int


@dataclass(frozen=True)
class MemoryOverTime:
    """Absolute memory of one device class over time, stacked by category (what was live before the
    block included), sampled so that no peak is hidden: at each point ``t_us`` (since the recording
    began), the live bytes of each of ``categories`` (they add up to the live total), and the phase
    and module whose work ran the event there ("" outside every module)."""

    t_us: tuple[float, ...]
    categories: tuple[str, ...]
    bytes_by_category: tuple[tuple[int, ...], ...]
    phases: tuple[str, ...]
    modules: tuple[str, ...]

    def totals(self) -> list[int]:
        """The live total at each point."""
        if not self.bytes_by_category:  # nothing was ever live
            return [0] * len(self.t_us)
        return [sum(column) for column in zip(*self.bytes_by_category, strict=True)]

    def to_json(self) -> dict[str, Any]:
        """The JSON form: one list per category, modules as indices into ``module_names``."""
        names = list(dict.fromkeys(self.modules))
        index = {name: k for k, name in enumerate(names)}
        return {
            "t_us": list(self.t_us),
            "categories": list(self.categories),
            "bytes_by_category": [list(series) for series in self.bytes_by_category],
            "phases": list(self.phases),
            "module_names": names,
            "modules": [index[m] for m in self.modules],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryOverTime:
        """Inverse of :meth:`to_json`."""
        names = [str(n) for n in data["module_names"]]
        points = len(data["t_us"])
        columns = [*data["bytes_by_category"], data["phases"], data["modules"]]
        if any(len(column) != points for column in columns) or len(data["categories"]) != len(
            data["bytes_by_category"]
        ):
            raise ValueError("memory over time: its series differ in length")
        return cls(
            t_us=tuple(float(t) for t in data["t_us"]),
            categories=tuple(str(c) for c in data["categories"]),
            bytes_by_category=tuple(tuple(int(b) for b in s) for s in data["bytes_by_category"]),
            phases=tuple(str(p) for p in data["phases"]),
            modules=tuple(names[int(k)] for k in data["modules"]),
        )


@dataclass(frozen=True)
class ClassMemory:
    """One device class (CPU, or the accelerator): baseline, absolute peak and what was live at it."""

    device: bool
    addressed: bool
    baseline_bytes: int
    absolute_peak_bytes: int
    #: When the peak was reached (the recording's clock, ns); None when the peak is the start.
    peak_ts_ns: int | None
    #: Module, phase and op running at the peak (None when the peak is the start).
    where: Mapping[str, str] | None
    rows: tuple[MemoryRow, ...]
    steps: tuple[StepMemory, ...] = ()
    baseline_seen_bytes: int | None = None
    baseline_allocator_bytes: int | None = None
    #: Live memory over time by category (None: a profile saved before 0.2, or no addresses).
    over_time: MemoryOverTime | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form (names as the glossary's)."""
        over_time = {"over_time": self.over_time.to_json()} if self.over_time is not None else {}
        return over_time | {
            "device": self.device,
            "addressed": self.addressed,
            "baseline_bytes": self.baseline_bytes,
            "baseline_seen_bytes": self.baseline_seen_bytes,
            "baseline_allocator_bytes": self.baseline_allocator_bytes,
            "absolute_peak_bytes": self.absolute_peak_bytes,
            "peak_ts_ns": self.peak_ts_ns,
            "where": dict(self.where) if self.where is not None else None,
            "rows": [[r.category, r.module, r.phase, r.bytes] for r in self.rows],
            "steps": [[s.step, s.absolute_peak_bytes, s.alloc_bytes, s.net_bytes] for s in self.steps],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClassMemory:
        """Inverse of :meth:`to_json`; reads schema v1's ``peak_bytes`` too."""
        peak = data["absolute_peak_bytes"] if "absolute_peak_bytes" in data else data["peak_bytes"]
        where = data.get("where")
        return cls(
            device=bool(data["device"]),
            addressed=bool(data.get("addressed")),
            baseline_bytes=int(data["baseline_bytes"]),
            absolute_peak_bytes=int(peak),
            peak_ts_ns=_int_or_none(data.get("peak_ts_ns")),
            where={str(k): str(v) for k, v in where.items()} if isinstance(where, Mapping) else None,
            rows=tuple(MemoryRow(str(c), str(m), str(p), int(b)) for c, m, p, b in data.get("rows") or []),
            steps=tuple(StepMemory(int(n), int(p), int(a), int(t)) for n, p, a, t in data.get("steps") or []),
            baseline_seen_bytes=_int_or_none(data.get("baseline_seen_bytes")),
            baseline_allocator_bytes=_int_or_none(data.get("baseline_allocator_bytes")),
            over_time=MemoryOverTime.from_json(data["over_time"]) if data.get("over_time") else None,
        )


@dataclass(frozen=True)
class OutOfMemory:
    """An allocation the allocator refused: what it asked for, where, and what was live then."""

    requested_bytes: int | None
    device: bool
    module: str
    phase: str
    op: str
    #: Memory live on its device class then (absolute, as the peak); None without memory events.
    live_bytes: int | None
    allocator_allocated_bytes: int | None
    ts_ns: int


@dataclass(frozen=True)
class MemoryReport:
    """``meta.memory``: per device class the baseline, the absolute peak and what was live at it,
    per-step figures, bytes saved for backward per keeping module, and allocations refused."""

    classes: tuple[ClassMemory, ...]
    #: Bytes saved for backward per keeping module: {"activation", "parameter", "input"} each.
    saved: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: Whether layerscope's memory watch named the categories (a live capture with ``memory=True``).
    watched: bool = False
    #: The recording's first event (ns), the origin of the report's times.
    start_ns: int | None = None
    out_of_memory: tuple[OutOfMemory, ...] = ()
    #: Whether the memory events carry addresses (so live bytes pair with allocations).
    addresses: bool = False

    def main_class(self) -> ClassMemory | None:
        """The class a summary shows: the accelerator's when it recorded memory, else the CPU's."""
        return next((c for c in self.classes if c.device), self.classes[0] if self.classes else None)

    def to_json(self) -> dict[str, Any]:
        """The JSON form; :meth:`from_json` reads it back."""
        out: dict[str, Any] = {
            "classes": [c.to_json() for c in self.classes],
            "saved": {m: dict(f) for m, f in self.saved.items()},
            "watched": self.watched,
            "addresses": self.addresses,
        }
        if self.start_ns is not None:
            out["start_ns"] = self.start_ns
        if self.out_of_memory:
            out["out_of_memory"] = [_oom_json(o) for o in self.out_of_memory]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryReport:
        """Inverse of :meth:`to_json`; also reads the form schema v1 saved."""
        return cls(
            classes=tuple(ClassMemory.from_json(c) for c in data.get("classes") or []),
            saved={
                str(m): {str(k): int(v) for k, v in f.items()} for m, f in (data.get("saved") or {}).items()
            },
            watched=bool(data.get("watched")),
            start_ns=_int_or_none(data.get("start_ns")),
            out_of_memory=tuple(OutOfMemory(**o) for o in data.get("out_of_memory") or []),
            addresses=bool(data.get("addresses")),
        )

    def __getitem__(self, key: str) -> Any:
        """Deprecated: ``meta["memory"]["..."]`` as in 0.2 (a dict); use the record's attributes."""
        warnings.warn(
            "meta['memory'] is a MemoryReport: read its attributes (the dict form goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.to_json()[key]


@dataclass(frozen=True)
class TimelinePeak:
    """The highest point of the timeline and the work running there."""

    t_us: float
    #: Bytes in use at the peak, counted from the window's start (what was live before excluded).
    relative_peak_bytes: int
    device: bool
    module: str
    phase: str | None


@dataclass(frozen=True)
class MemoryTimeline:
    """``meta.memory_timeline``: net bytes allocated since the window began over time (CPU, and the
    device when it recorded memory), sampled so that no local maximum is hidden, and its peak."""

    t_us: tuple[float, ...]
    cpu_net_bytes: tuple[int, ...]
    device_net_bytes: tuple[int, ...]
    peak: TimelinePeak

    def to_json(self) -> dict[str, Any]:
        """The JSON form (also the HTML report's data); :meth:`from_json` reads it back."""
        p = self.peak
        return {
            "t_us": list(self.t_us),
            "cpu_net_bytes": list(self.cpu_net_bytes),
            "device_net_bytes": list(self.device_net_bytes),
            "peak": {
                "t_us": p.t_us,
                "relative_peak_bytes": p.relative_peak_bytes,
                "device": p.device,
                "module": p.module,
                "phase": p.phase,
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryTimeline:
        """Inverse of :meth:`to_json`; also reads schema v1's ``cpu_bytes``/``device_bytes``/``bytes``."""
        p = data["peak"]
        return cls(
            t_us=tuple(float(t) for t in data["t_us"]),
            cpu_net_bytes=tuple(int(b) for b in data.get("cpu_net_bytes", data.get("cpu_bytes")) or []),
            device_net_bytes=tuple(
                int(b) for b in data.get("device_net_bytes", data.get("device_bytes")) or []
            ),
            peak=TimelinePeak(
                t_us=float(p["t_us"]),
                relative_peak_bytes=int(
                    p["relative_peak_bytes"] if "relative_peak_bytes" in p else p["bytes"]
                ),
                device=bool(p["device"]),
                module=str(p["module"]),
                phase=p.get("phase"),
            ),
        )


def block_relative_peaks(report: MemoryReport | None) -> dict[bool, int]:
    """The block's relative peak per device class (True: the device's): its absolute peak less what
    was live before it; the figures of ``Profile.totals``."""
    if report is None:
        return {}
    return {c.device: c.absolute_peak_bytes - c.baseline_bytes for c in report.classes}


def relative_totals(totals: Metrics, report: MemoryReport | None) -> Metrics:
    """Totals saved by 0.2, whose peaks were the block's absolute ones, with relative peaks."""
    peaks = block_relative_peaks(report)
    return replace(
        totals,
        cpu_relative_peak_bytes=peaks.get(False, 0),
        device_relative_peak_bytes=peaks.get(True, 0),
    )


def _oom_json(oom: OutOfMemory) -> dict[str, Any]:
    return {
        "requested_bytes": oom.requested_bytes,
        "device": oom.device,
        "module": oom.module,
        "phase": oom.phase,
        "op": oom.op,
        "live_bytes": oom.live_bytes,
        "allocator_allocated_bytes": oom.allocator_allocated_bytes,
        "ts_ns": oom.ts_ns,
    }


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
