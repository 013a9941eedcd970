"""Cross-rank views of a distributed job: per-module spread across ranks, per-rank time split, and
the straggler (which rank, which module and phase, and whether the others wait for it)."""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from layerscope.analysis.collectives import CollectiveKernel, LateCollective, late_collectives
from layerscope.errors import UsageError
from layerscope.model.critical_path import CriticalPath
from layerscope.model.profile import ModuleNode, Profile

#: Ops of collective communication (c10d, NCCL, gloo, MPI) as torch names them.
COMMUNICATION = re.compile(
    r"nccl|gloo|mpi:|c10d|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|broadcast|alltoall|"
    r"all_to_all|barrier|ProcessGroup",
    re.I,
)


def rank_of(profile: Profile, default: int) -> int:
    """The profile's rank: from a live capture's meta, a trace's distributedInfo, else ``default``."""
    info = profile.meta.distributed
    return info.rank if info is not None else default


@dataclass(frozen=True, slots=True)
class RankSummary:
    """Where one rank's step went (per step when it has steps, else over the run).

    ``module_us``: the model's own work (the root module, forward + backward; communication kernels
    launched inside it left out); ``communication_us``: communication *kernel* time when every
    rank's profile has a device report (built from traces with device work: ``comm_source``
    "kernels"), else CPU time in collective ops, waiting for the other ranks included
    (``comm_source`` "ops"); ``other_us``: the rest of the step's wall time
    (loss, optimizer, data, Python, idle). ``comm_overlap``: share of communication-kernel time
    overlapped by computation (None without communication kernels).
    """

    rank: int
    wall_us: float
    module_us: float
    communication_us: float
    comm_source: str = "ops"
    comm_overlap: float | None = None

    @property
    def other_us(self) -> float:
        """Wall time outside the model and outside collectives."""
        return max(0.0, self.wall_us - self.module_us - self.communication_us)


@dataclass(frozen=True, slots=True)
class ModuleAcrossRanks:
    """One module and phase across ranks (self time: where the work itself happens)."""

    path: str
    phase: str
    values: tuple[float | None, ...]  # per rank, in ``RankMerge.ranks`` order; None where absent

    @property
    def present(self) -> list[float]:
        """Values of the ranks that have this module."""
        return [v for v in self.values if v is not None]

    @property
    def mean(self) -> float:
        """Mean over the ranks that have it."""
        return statistics.fmean(self.present) if self.present else 0.0

    @property
    def skew(self) -> float:
        """(max - min) / mean."""
        values = self.present
        return (max(values) - min(values)) / self.mean if values and self.mean > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Straggler:
    """The slowest rank and what makes it slow."""

    rank: int
    step_us: float  # the straggler's model work per step
    median_step_us: float  # the other ranks' median model work per step
    module: str | None
    phase: str | None
    module_excess_us: float
    others_wait_us: float  # how much more the other ranks spend in collectives than the straggler
    #: from communication kernels across ranks: the rank that joins collectives last (may differ
    #: from ``rank``, the one with the most model work); None without matched kernels
    late: LateCollective | None = None

    @property
    def is_straggler(self) -> bool:
        """Slower than the median of the other ranks by more than 5%."""
        return self.step_us > 1.05 * self.median_step_us


@dataclass(frozen=True, slots=True)
class StepAcrossRanks:
    """One step number across ranks: its wall time per rank (None where a rank did not keep it),
    lined up by the step's number (flight recorder dumps of every rank, ``ProfilerStep#N``)."""

    step: int
    wall_us: tuple[float | None, ...]  # per rank, in ``RankMerge.ranks`` order

    @property
    def spread_us(self) -> float:
        """The slowest rank's wall time minus the fastest's."""
        present = [v for v in self.wall_us if v is not None]
        return max(present) - min(present) if present else 0.0


@dataclass(frozen=True)
class RankMerge:
    """A distributed job, merged from one profile per rank."""

    ranks: tuple[int, ...]
    metric: str
    summaries: tuple[RankSummary, ...]
    modules: tuple[ModuleAcrossRanks, ...]
    straggler: Straggler | None
    gaps: tuple[str, ...]  # module paths missing on some ranks
    failed: tuple[tuple[str, str], ...] = ()  # (file, reason) of rank files that could not be loaded
    #: the step numbers two or more ranks kept, in step order
    steps: tuple[StepAcrossRanks, ...] = ()
    #: the critical path through all ranks (``analysis/critical_ranks.py``) when the ranks are
    #: traces; None for saved profiles
    critical_path: CriticalPath | None = None

    def slowest_rank(self, row: ModuleAcrossRanks) -> int | None:
        """The rank with the largest value for ``row``."""
        pairs = [(v, r) for v, r in zip(row.values, self.ranks, strict=True) if v is not None]
        return max(pairs)[1] if pairs else None


def merge_profiles(profiles: Sequence[Profile], ranks: Sequence[int] | None = None) -> RankMerge:
    """Merge per-rank profiles. Values are per step when every rank has steps (so ranks that ran
    different numbers of steps compare), device time when any rank has device time, else CPU time.
    Modules are matched by path; one missing on some ranks keeps a gap (None) there."""
    if len(profiles) < 2:
        raise UsageError(f"merging needs at least two rank profiles, got {len(profiles)}")
    rank_ids = tuple(ranks) if ranks is not None else tuple(rank_of(p, k) for k, p in enumerate(profiles))
    if len(set(rank_ids)) != len(rank_ids):
        rank_ids = tuple(range(len(profiles)))  # duplicated or missing rank info: file order
    order = sorted(range(len(profiles)), key=lambda k: rank_ids[k])
    profiles = [profiles[k] for k in order]
    rank_ids = tuple(rank_ids[k] for k in order)
    metric = "device_us" if any(p.has_device_time for p in profiles) else "cpu_us"
    per_step = all(len(p.steps) > 0 for p in profiles)
    scale = [1.0 / len(p.steps) if per_step else 1.0 for p in profiles]

    # communication as kernel time only when every rank has it: one unit across the table
    kernels = all(_comm_kernel_us(p) is not None for p in profiles)
    summaries = tuple(
        _summary(p, r, s, metric, kernels) for p, r, s in zip(profiles, rank_ids, scale, strict=True)
    )
    self_metric = f"self_{metric}"
    keys: dict[tuple[str, str], list[float | None]] = {}
    paths_per_rank = []
    for k, (p, s) in enumerate(zip(profiles, scale, strict=True)):
        paths_per_rank.append({node.path for node in p.modules()})
        for node in p.modules():
            for phase in ("forward", "backward"):
                value = float(getattr(getattr(node, phase), self_metric)) * s
                row = keys.setdefault((node.path, phase), [None] * len(profiles))
                row[k] = value
    modules = tuple(
        ModuleAcrossRanks(path, phase, tuple(values))
        for (path, phase), values in keys.items()
        if any(v for v in values)
    )
    all_paths = set().union(*paths_per_rank)
    gaps = tuple(sorted(p for p in all_paths if not all(p in paths for paths in paths_per_rank)))
    merged = RankMerge(rank_ids, metric, summaries, modules, None, gaps)
    late = late_collectives(rank_ids, [_collectives(p) for p in profiles])
    straggler = _straggler(merged)
    if straggler is not None and late is not None:
        straggler = dataclasses.replace(straggler, late=late)
    return RankMerge(rank_ids, metric, summaries, modules, straggler, gaps, steps=_steps_across(profiles))


def _steps_across(profiles: Sequence[Profile]) -> tuple[StepAcrossRanks, ...]:
    """Every step number that two or more ranks kept, with each rank's wall time."""
    walls: dict[int, list[float | None]] = {}
    for k, profile in enumerate(profiles):
        for step in profile.steps:
            if step.step >= 0:
                walls.setdefault(step.step, [None] * len(profiles))[k] = step.wall_us
    return tuple(
        StepAcrossRanks(number, tuple(row))
        for number, row in sorted(walls.items())
        if sum(v is not None for v in row) >= 2
    )


def _collectives(profile: Profile) -> list[CollectiveKernel]:
    device = profile.meta.device
    rows = device.collectives if device is not None else ()
    return [CollectiveKernel(n, s, e, st) for n, s, e, st in rows]


def _is_collective_module(node: ModuleNode) -> bool:
    """A range named for a collective (``nccl:all_reduce`` read from a trace's annotations)."""
    return bool(COMMUNICATION.search(node.path.rsplit(".", 1)[-1]))


def _communication_in_model(profile: Profile) -> float:
    """Device time of collectives inside the model: ranges named for collectives (with what runs
    inside them) and collective ops elsewhere in the tree."""
    outer: list[ModuleNode] = []
    pending = list(profile.root.children)
    while pending:
        node = pending.pop()
        if _is_collective_module(node):
            outer.append(node)
        else:
            pending.extend(node.children)
    ranges = sum(n.forward.device_us + n.backward.device_us for n in outer)
    prefixes = tuple(n.path for n in outer)
    ops = sum(
        r.metrics.self_device_us
        for r in profile.op_rows
        if r.module is not None
        and COMMUNICATION.search(r.name)
        and not any(r.module == p or r.module.startswith(p + ".") for p in prefixes)
    )
    return ranges + ops


def _comm_kernel_us(profile: Profile) -> float | None:
    """Communication-kernel time of a profile built from a trace with device work (None: no
    device report, e.g. a live CPU capture or a profile saved before reports were kept)."""
    device = profile.meta.device
    return float(device.by_kind.get("communication", 0.0)) if device is not None else None


def _summary(profile: Profile, rank: int, scale: float, metric: str, kernels: bool) -> RankSummary:
    if profile.steps:
        wall = sum(s.wall_us for s in profile.steps) * scale
    else:
        wall = profile.meta.wall_us if profile.meta.wall_us is not None else profile.totals.cpu_us
    root = profile.root
    modules = (getattr(root.forward, metric) + getattr(root.backward, metric)) * scale
    comm_kernels = _comm_kernel_us(profile) if kernels else None
    if comm_kernels is None:
        comm = sum(r.metrics.self_cpu_us for r in profile.op_rows if COMMUNICATION.search(r.name)) * scale
        return RankSummary(rank, wall, modules, comm)
    if metric == "device_us":  # the model's device time holds the collectives it launched
        modules = max(0.0, modules - _communication_in_model(profile) * scale)
    overlap = profile.meta.device.comm_compute_overlap if profile.meta.device is not None else None
    return RankSummary(rank, wall, modules, comm_kernels * scale, "kernels", overlap)


def _straggler(merged: RankMerge) -> Straggler | None:
    """In synchronous training every rank's step lasts as long as the slowest one's: the straggler is
    the rank whose model work is largest (the others spend that difference waiting in collectives)."""
    work = [s.module_us for s in merged.summaries]
    slow = max(range(len(work)), key=lambda k: work[k])
    median = statistics.median([v for k, v in enumerate(work) if k != slow])
    best: tuple[float, str, str] | None = None
    for row in merged.modules:
        if COMMUNICATION.search(row.path.rsplit(".", 1)[-1]):
            continue  # time in a collective is waiting, not the rank's own work
        value = row.values[slow]
        # a module another rank does not have is work that rank does not do
        rest = [v if v is not None else 0.0 for k, v in enumerate(row.values) if k != slow]
        if value is None or not rest:
            continue
        excess = value - statistics.median(rest)
        if best is None or excess > best[0]:
            best = (excess, row.path, row.phase)
    comm = [s.communication_us for s in merged.summaries]
    others_comm = statistics.median([c for k, c in enumerate(comm) if k != slow])
    found = best is not None and best[0] > 0
    return Straggler(
        rank=merged.ranks[slow],
        step_us=work[slow],
        median_step_us=median,
        module=best[1] if found and best else None,
        phase=best[2] if found and best else None,
        module_excess_us=best[0] if found and best else 0.0,
        others_wait_us=max(0.0, others_comm - comm[slow]),
    )
