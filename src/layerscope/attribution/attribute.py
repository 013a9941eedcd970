"""``build_profile``: every piece of work in an EventTable goes to exactly one bucket, then the Profile.

The recipe, one module per step: name roles and buckets (``buckets``) → nesting, exclusive time and
ownership in one sweep (``nesting``) → device work to its launching op (``devices``) → memory to its
owner span, per-call peaks (``memory/``) → op rows (``op_rows``) → assemble the tree, the unattributed
entries, the totals and the steps. Totals are computed from the events directly, not by summing
buckets, so that ``Profile.validate()`` can reconcile the two.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from layerscope.attribution.buckets import (
    LABEL_MEMORY_OUTSIDE_OPS,
    LABEL_UNLINKED_DEVICE,
    ROLE_STEP,
    Buckets,
    NameRoles,
    name_roles,
)
from layerscope.attribution.call_lines import call_line_stacks
from layerscope.attribution.catalog import ModuleInfo, saved_modules
from layerscope.attribution.compiled import (
    CompiledAttribution,
    CompiledGraph,
    attribute_compiled_kernels,
    graphs_from_meta,
)
from layerscope.attribution.devices import DeviceWork, link_device_work
from layerscope.attribution.flop_dtypes import flops_split
from layerscope.attribution.memory.report import build_memory_report, with_step_memory
from layerscope.attribution.memory.sums import (
    bucket_memory,
    memory_owners,
    memory_totals,
    span_memory,
    window_peaks,
)
from layerscope.attribution.memory.windows import peak_windows
from layerscope.attribution.nest_columns import sweep_columns
from layerscope.attribution.nesting import (
    Sweep,
    covered_ns,
    depths,
    exact_sums,
    inclusive,
    levels,
    outermost_flops,
    time_order,
)
from layerscope.attribution.op_rows import SpanFigures, make_objects, op_rows
from layerscope.attribution.profile_meta import full_meta as table_meta
from layerscope.attribution.recompute import stopped_recompute_ops
from layerscope.attribution.span_bytes import SpanBytes, span_bytes
from layerscope.attribution.stacks import op_stacks
from layerscope.attribution.steps import step_stats
from layerscope.attribution.tree import module_tree
from layerscope.events.memory_snapshots import Snapshot
from layerscope.events.steps import step_windows
from layerscope.events.table import EventKind, EventTable
from layerscope.model.memory import MemoryReport, block_relative_peaks
from layerscope.model.meta import CallLinesInfo, ProfileMeta
from layerscope.model.metrics import Metrics, own_metrics
from layerscope.model.profile import ModuleNode, OpStats, Phase, Profile, UnattributedEntry


def build_profile(
    table: EventTable,
    catalog: list[ModuleInfo] | None = None,
    meta: ProfileMeta | None = None,
    compiled_graphs: list[Any] | None = None,
    snapshots: list[Snapshot] | None = None,
) -> Profile:
    """Attribute every event of ``table`` and return the Profile.

    ``catalog`` lists the modules (from a live capture); without one, modules are discovered from
    the layerscope ranges found in the trace. ``compiled_graphs`` (capture's record of which module
    each kernel of a compiled graph comes from) places the kernels run inside compiled regions; a
    trace saved by layerscope carries its own. ``meta`` is what the caller knows (source, model,
    environment, capture, device summary); attribution adds what the events tell.
    """
    table.check()
    found = table.meta.get("layerscope")
    saved: dict[str, Any] = found if isinstance(found, dict) else {}

    # ---- name roles: the catalog, what each name means, where work can go ----------------------------
    named = name_roles(
        table.names, catalog, saved_modules(saved), _annotation_names(table) if catalog is None else None
    )
    buckets = Buckets(len(named.catalog))
    # a live capture always knows its modules; a trace does when it has module ranges (or saved ones)
    modules_known = catalog is not None or (bool(named.module_ranges) and not named.regions)

    # ---- nest: parents, exclusive time, buckets, FLOPs that count ------------------------------------
    graph_entries = compiled_graphs if compiled_graphs is not None else saved.get("compiled_graphs")
    early_stop = _checkpoint_early_stop(meta, saved)
    nested = _nest(table, named, buckets, graphs_from_meta(graph_entries), modules_known, early_stop)

    # ---- link devices: kernels to their launching op -------------------------------------------------
    device = link_device_work(table, nested.order, nested.parent, _step_names(named))

    # ---- memory: each event to the innermost CPU span containing it ----------------------------------
    owners = (
        memory_owners(table, nested.order, nested.parent)
        if table.memory_count
        else np.zeros(0, dtype=np.int64)
    )
    outside = int((owners == -1).sum())
    # Label buckets are numbered in order of first use: memory outside ops, then unlinked device work.
    outside_bucket = buckets.unattributed(LABEL_MEMORY_OUTSIDE_OPS, Phase.OTHER, outside) if outside else -1
    unlinked_bucket = (
        buckets.unattributed(LABEL_UNLINKED_DEVICE, Phase.OTHER, len(device.unlinked))
        if device.unlinked
        else -1
    )

    # ---- op rows -------------------------------------------------------------------------------------
    rows = _op_rows(table, named, buckets, nested, device, owners)
    nested = nested.after_op_rows()

    # ---- assemble: the tree, the unattributed entries, the totals, the steps -------------------------
    per_bucket = _bucket_metrics(table, buckets, nested, device, owners, outside_bucket, unlinked_bucket)
    root = module_tree(table, named, buckets, nested.swept, per_bucket)
    steps = step_stats(
        table,
        step_windows(table),
        nested.order,
        nested.bucket,
        nested.excl,
        named.catalog,
        buckets,
        {node.path for node in root.walk()},
        drop_idle_last=not named.regions,
    )
    memory = _memory_report(table, owners, nested, buckets, named.catalog, snapshots)
    if memory is not None:
        steps = with_step_memory(steps, memory)
    full_meta = _profile_meta(table, named, buckets, nested, owners, meta, modules_known, root, memory)
    return Profile(
        meta=full_meta,
        root=root,
        op_rows=rows,
        unattributed=_unattributed(buckets, per_bucket),
        totals=_totals(table, nested, device, full_meta),
        steps=steps,
    )


@dataclass(frozen=True)
class _Nested:
    """The sweep's findings, compiled kernels placed, as arrays, with what follows from nesting alone."""

    order: np.ndarray  # CPU spans in time order
    swept: Sweep  # its ``bucket`` list has the compiled kernels placed, like ``bucket``
    parent: np.ndarray
    bucket: np.ndarray
    excl: np.ndarray
    levels: list[np.ndarray]  # span indices by nesting depth
    flops: np.ndarray  # FLOPs that count (outermost only, none while compiling)
    compiled: CompiledAttribution
    bytes: SpanBytes | None = None  # bytes that count (span_bytes.py), None without dtypes

    def after_op_rows(self) -> _Nested:
        """The findings without what only the op rows read (the levels, the bytes that count): at a
        few columns per span, letting them go lowers the peak of what follows."""
        self.swept.levels = None
        return replace(self, levels=[], bytes=None)


def _nest(
    table: EventTable,
    named: NameRoles,
    buckets: Buckets,
    graphs: list[CompiledGraph],
    modules_known: bool,
    early_stop: bool,
) -> _Nested:
    """The sweep over CPU spans, then the kernels of compiled graphs moved to their modules."""
    order = time_order(table)
    swept = sweep_columns(
        table, order, named.roles, named.role_module, buckets, recorded_ops_are_forward=not modules_known
    )
    compiled = attribute_compiled_kernels(
        table,
        order,
        swept.parent,
        swept.bucket,
        swept.compiled_graph_spans,
        graphs,
        named.catalog,
        buckets,
        swept.module_calls,
    )
    parent, bucket = swept.parent, swept.bucket  # the compiled kernels placed
    by_level = swept.levels if swept.levels is not None else levels(order, depths(parent))
    # Ops run while compiling work on fake tensors, and ops a checkpoint's recomputation stopped in
    # never ran their kernels: their FLOPs are no work done.
    not_run = stopped_recompute_ops(table, named.roles, parent, by_level) if early_stop else None
    if swept.compiling_bucket >= 0:
        compiling = bucket == swept.compiling_bucket
        not_run = compiling if not_run is None else not_run | compiling
    counted_flops = outermost_flops(table.array("span_flops"), parent, by_level, not_run)
    excl = swept.excl
    moved = span_bytes(table, parent, by_level, counted_flops, not_run)
    return _Nested(order, swept, parent, bucket, excl, by_level, counted_flops, compiled, moved)


def _memory_report(
    table: EventTable,
    owners: np.ndarray,
    nested: _Nested,
    buckets: Buckets,
    catalog: list[ModuleInfo],
    snapshots: list[Snapshot] | None,
) -> MemoryReport | None:
    """Absolute memory (``memory/report.py``), when the table has memory events."""
    if not table.memory_count and not table.out_of_memory:
        return None
    return build_memory_report(
        table,
        owners,
        nested.order,
        nested.bucket,
        buckets,
        catalog,
        snapshots,
        nested.swept,
        nested.parent,
    )


def _step_names(named: NameRoles) -> set[int]:
    """The name ids of step ranges (``events/steps.py``): steps, never ops (no op row, no device launch)."""
    return {i for i, role in enumerate(named.roles) if role == ROLE_STEP}


def _op_rows(
    table: EventTable,
    named: NameRoles,
    buckets: Buckets,
    nested: _Nested,
    device: DeviceWork,
    owners: np.ndarray,
) -> tuple[OpStats, ...]:
    """The op table, from each span's own and inclusive figures."""
    figures = SpanFigures(
        excl=nested.excl,
        device_self=device.self_ns,
        device_total=inclusive(device.self_ns.astype(np.float64), nested.parent, nested.levels),
        flops=nested.flops,
        memory=span_memory(table, owners, nested.parent, nested.levels),
        bytes=nested.bytes,
    )
    # A region (a user annotation standing in for a module) can launch device work itself: it stays
    # an op row, where a layerscope module range never is one. A step range is no op either: its own
    # time stays in the "(Python between ops)" entry and the step table shows each step.
    not_ops = _step_names(named)
    if not named.regions:
        not_ops.update(named.module_ranges)
    # Call lines (lines=True) when recorded, else Python call stacks (with_stack), else None.
    stacks = call_line_stacks(table, nested.parent, nested.levels, nested.swept.forward_op_of)
    if stacks is None:
        stacks = op_stacks(table)
    return op_rows(
        table,
        nested.order,
        nested.parent,
        nested.bucket,
        buckets,
        named.catalog,
        not_ops,
        figures,
        device.unlinked,
        stacks,
    )


def _bucket_metrics(
    table: EventTable,
    buckets: Buckets,
    nested: _Nested,
    device: DeviceWork,
    owners: np.ndarray,
    outside_bucket: int,
    unlinked_bucket: int,
) -> list[Metrics]:
    """Every bucket's own metrics: the sums over its spans (exclusive time, device time they launched,
    FLOPs that count, memory) and the highest peak of its windows (module calls, backward nodes)."""
    nb = buckets.count
    order, swept = nested.order, nested.swept
    b_order = nested.bucket[order]
    self_cpu_ns = np.bincount(b_order, weights=nested.excl[order], minlength=nb)
    self_dev_ns = np.bincount(b_order, weights=device.self_ns[order], minlength=nb)
    if device.unlinked:
        self_dev_ns[unlinked_bucket] += sum(table.array("span_dur")[device.unlinked].tolist())
    self_flops = exact_sums(nested.bucket, nested.flops, nb)
    mem = bucket_memory(table, owners, nested.bucket, outside_bucket, nb)
    peaks = [[0, 0] for _ in range(nb)]  # per bucket: [cpu, device]
    if table.memory_count:
        w = peak_windows(table, order, nested.parent, nested.bucket, buckets, swept)
        window_peaks(table, w.tid, w.start, w.end, w.bucket, peaks)
    # Each bucket's figures are all its own (own_metrics: self = total, times as floats, the rest as
    # ints), made a column at a time.
    cpu_us = [float(v) for v in (self_cpu_ns / 1000.0).tolist()]
    device_us = [float(v) for v in (self_dev_ns / 1000.0).tolist()]
    flops = [int(v) for v in self_flops]
    cpu_alloc, device_alloc, net = (
        [int(v) for v in m.tolist()] for m in (mem.cpu_alloc, mem.device_alloc, mem.net)
    )
    columns: list[list[Any]] = [cpu_us, cpu_us, device_us, device_us, flops, flops, cpu_alloc, cpu_alloc]
    columns += [
        device_alloc,
        device_alloc,
        net,
        net,
        [int(cpu) for cpu, _ in peaks],
        [int(dev) for _, dev in peaks],
    ]
    return make_objects(Metrics, columns)


def _unattributed(buckets: Buckets, per_bucket: list[Metrics]) -> tuple[UnattributedEntry, ...]:
    """One entry per label, in order of first use."""
    return tuple(
        UnattributedEntry(
            label=label,
            phase=phase,
            calls=buckets.occurrences[k],
            metrics=per_bucket[buckets.label_bucket(k)],
        )
        for k, (label, phase) in enumerate(buckets.labels)
    )


def _totals(table: EventTable, nested: _Nested, device: DeviceWork, meta: ProfileMeta) -> Metrics:
    """The run's totals, from the events themselves rather than the buckets (``validate`` compares);
    the peaks are the block's relative ones: its absolute peak less what was live before it."""
    mem_totals = memory_totals(table)
    peaks = block_relative_peaks(meta.memory)
    return own_metrics(
        {
            "cpu_us": covered_ns(table, nested.order, nested.parent) / 1000.0,
            "device_us": device.total_ns(table) / 1000.0,
            "flops": int(nested.flops.sum()),
            "cpu_alloc_bytes": mem_totals.cpu_alloc,
            "device_alloc_bytes": mem_totals.device_alloc,
            "net_bytes": mem_totals.net,
            "cpu_relative_peak_bytes": peaks.get(False, 0),
            "device_relative_peak_bytes": peaks.get(True, 0),
        }
    )


def _profile_meta(
    table: EventTable,
    named: NameRoles,
    buckets: Buckets,
    nested: _Nested,
    owners: np.ndarray,
    meta: ProfileMeta | None,
    modules_known: bool,
    root: ModuleNode,
    memory: MemoryReport | None,
) -> ProfileMeta:
    """The caller's meta, plus :func:`table_meta`, where the tree's modules came from, what compiled
    graphs did, the FLOPs by dtype and the memory report."""
    lines = table.call_lines
    counted = nested.flops
    return replace(
        table_meta(table, nested.order, owners, nested.bucket, buckets, named.catalog, meta or ProfileMeta()),
        # what the tree is made of when the trace named no module (the CLI says so in one line)
        module_source=None if modules_known else "record_function regions" if named.regions else "none",
        call_lines=CallLinesInfo(lines.op_count, len(lines.stacks)) if lines is not None else None,
        compiled=nested.compiled.report() if nested.compiled.graph_calls else None,
        flops_by_dtype=flops_split(table, counted, nested.bucket, buckets, named.catalog, root),
        memory=memory,
    )


def _checkpoint_early_stop(meta: ProfileMeta | None, saved: dict[str, Any]) -> bool:
    """Whether checkpointing's recomputation stops early: torch's default (yes) unless the capture
    recorded that the block turned it off."""
    env = meta.environment if meta is not None else None
    return (env.checkpoint_early_stop if env else saved.get("checkpoint_early_stop")) is not False


def _annotation_names(table: EventTable) -> set[int]:
    """Name ids of user annotations (``record_function`` ranges) in the table."""
    kinds = table.array("span_kind")
    names = table.array("span_name")
    return set(np.unique(names[kinds == int(EventKind.USER_ANNOTATION)]).tolist())
