"""An estimate's records as a :class:`Profile`, so that every view, ``save``, the HTML report and
``ls.diff`` read it as they read a measured one.

Predicted times go where the device's measured times would: ``cpu_us`` for ``device="cpu"``,
``device_us`` for an accelerator; allocations likewise. The memory report has one class (the
device's), every storage addressed, the state the step starts with ``(before the block)``, so that
``memory_at_peak()`` returns what a measured profile's returns.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from layerscope.attribution.catalog import ModuleInfo
from layerscope.attribution.tree import assemble_tree
from layerscope.estimates.recorder import StepRecord, Sums
from layerscope.estimates.scopes import BACKWARD, FORWARD, ScopeTracker
from layerscope.estimates.storages import StorageLedger
from layerscope.model.memory import ClassMemory, MemoryReport, MemoryRow
from layerscope.model.meta import ESTIMATE, EstimateInfo, FlopsByDtype, ProfileMeta
from layerscope.model.metrics import Metrics, own_metrics, sum_metrics
from layerscope.model.profile import OpStats, Phase, Profile, UnattributedEntry


def _metrics(sums: Sums, device: bool, peak: int = 0) -> Metrics:
    prefix = "device" if device else "cpu"
    return own_metrics(
        {
            f"{prefix}_us": sums.time_us,
            "flops": sums.flops,
            f"{prefix}_alloc_bytes": sums.alloc_bytes,
            "net_bytes": sums.net_bytes,
            f"{prefix}_relative_peak_bytes": peak,
        }
    )


def memory_report(
    ledger: StorageLedger, scopes: ScopeTracker, saved: dict[str, dict[str, int]], device: bool
) -> MemoryReport:
    """The report of what was live at the predicted peak, by category, module and phase."""
    peak = ledger.peak
    grouped: dict[tuple[str, str, str], int] = {}
    for info in peak.storages:
        key = (info.category, info.module, info.phase)
        grouped[key] = grouped.get(key, 0) + info.nbytes
    rows = tuple(
        MemoryRow(category, module, phase, nbytes)
        for (category, module, phase), nbytes in sorted(grouped.items(), key=lambda kv: -kv[1])
    )
    at_start = peak.where is None
    figures = ClassMemory(
        device=device,
        addressed=True,
        baseline_bytes=ledger.baseline_bytes,
        absolute_peak_bytes=peak.live_bytes,
        peak_ts_ns=None if at_start else round(peak.t_us * 1000),
        where=peak.where,
        rows=rows,
        baseline_seen_bytes=ledger.baseline_bytes,
    )
    return MemoryReport(classes=(figures,), saved=saved, watched=True, start_ns=0, addresses=True)


def _tree(catalog: list[ModuleInfo], record: StepRecord, scopes: ScopeTracker, device: bool) -> Any:
    index = {info.path: k for k, info in enumerate(catalog)}
    own = []
    for info in catalog:
        forward = _metrics(
            record.modules.get((info.path, FORWARD), Sums()), device, scopes.forward_peaks.get(info.path, 0)
        )
        backward = _metrics(record.modules.get((info.path, BACKWARD), Sums()), device)
        own.append((forward, backward))
    calls = [scopes.calls.get(info.path, 0) for info in catalog]
    recompute = [scopes.recompute_calls.get(info.path, 0) for info in catalog]
    first = {index[p]: order for p, order in scopes.first_call.items() if p in index}
    return assemble_tree(catalog, own, calls, first, recompute)


def _op_rows(record: StepRecord, device: bool) -> tuple[OpStats, ...]:
    rows = []
    for (name, phase, module, label, shapes), sums in record.ops.items():
        metrics = _metrics(sums, device)
        rows.append(OpStats(name, Phase(phase), module, shapes, sums.calls, metrics, scope=label))
    return tuple(rows)


def _flops_by_dtype(record: StepRecord, root: Any) -> FlopsByDtype | None:
    run: dict[str, int] = {}
    for mix in record.flops_by_dtype.values():
        for dtype, flops in mix.items():
            run[dtype] = run.get(dtype, 0) + flops
    if not run:
        return None
    run = dict(sorted(run.items(), key=lambda kv: -kv[1]))
    if len(run) == 1:
        return FlopsByDtype(run)
    # in a mixed run every module's mix, its subtree's FLOPs included (what validate checks)
    per_module: dict[str, dict[str, int]] = {}
    for node in root.walk():
        subtree: dict[str, int] = {}
        for path, own in record.flops_by_dtype.items():
            if path is not None and (path == node.path or not node.path or path.startswith(node.path + ".")):
                for dtype, flops in own.items():
                    subtree[dtype] = subtree.get(dtype, 0) + flops
        per_module[node.path] = subtree
    return FlopsByDtype(run, per_module)


def estimate_profile(
    catalog: list[ModuleInfo],
    record: StepRecord,
    scopes: ScopeTracker,
    report: MemoryReport,
    info: EstimateInfo,
    model_name: str,
) -> Profile:
    """The estimate as a Profile (``meta.source`` ``estimate``, ``meta.estimate`` its record)."""
    device = info.time_field == "device_us"
    root = _tree(catalog, record, scopes, device)
    unattributed = tuple(
        UnattributedEntry(
            label, Phase(phase), record.label_calls.get(label, sums.calls), _metrics(sums, device)
        )
        for (label, phase), sums in sorted(record.unattributed.items(), key=lambda kv: -kv[1].time_us)
    )
    totals = sum_metrics([root.total.folded(), *(e.metrics for e in unattributed)])
    block_peak = report.classes[0].absolute_peak_bytes - report.classes[0].baseline_bytes
    peak_field = "device_relative_peak_bytes" if device else "cpu_relative_peak_bytes"
    totals = replace(totals, **{peak_field: block_peak})
    meta = ProfileMeta(
        source=ESTIMATE,
        model=model_name,
        wall_us=record.clock_us,
        memory=report,
        flops_by_dtype=_flops_by_dtype(record, root),
        estimate=info,
    )
    return Profile(
        meta=meta, root=root, op_rows=_op_rows(record, device), unattributed=unattributed, totals=totals
    )
