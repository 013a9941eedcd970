"""The critical path of a trace window: the chain of CPU ops, launches, device work and
synchronisations that sets the window's length — what, made faster, makes the step faster.

The graph is Holistic Trace Analysis's (``critical_graph.py``); the longest path is a sweep in
topological order; the time on it goes into HTA's bound categories (``cpu_bound``,
``gpu_compute_bound``, ``gpu_communication_bound``, ``gpu_kernel_kernel_overhead``,
``gpu_kernel_launch_overhead``, ``data_loading``), to the ops and kernels it runs through, and, on
traces with layerscope's module ranges, to the modules (forward and backward) those ran in.

Windows: the whole trace, a step (``events/steps.py``), or HTA's: the ``instance``-th span (0-based,
in start order) whose name contains ``annotation``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.analysis.critical_edges import KERNEL_KERNEL, LAUNCH, OPERATOR
from layerscope.analysis.critical_graph import Graph, Window, build_graph
from layerscope.analysis.critical_graph import launchers as _launchers
from layerscope.analysis.critical_longest import heaviest_path
from layerscope.analysis.device import KERNEL_KINDS
from layerscope.attribution.buckets import Buckets, name_roles
from layerscope.attribution.nesting import sweep, time_order
from layerscope.errors import UsageError
from layerscope.events.chrome import TraceTableBuilder
from layerscope.events.names import MODULE_RANGE_PREFIX
from layerscope.events.steps import step_windows
from layerscope.events.stream import stream_trace
from layerscope.events.table import DEVICE_WORK_KINDS, EventTable
from layerscope.model.critical_path import CriticalPath, PathShare, PathWindow
from layerscope.model.profile import Profile

#: HTA's bound categories, in the order reports show them.
CATEGORIES = (
    "cpu_bound",
    "gpu_compute_bound",
    "gpu_communication_bound",
    "gpu_kernel_kernel_overhead",
    "gpu_kernel_launch_overhead",
    "data_loading",
    "idle",
)
_COMMUNICATION = KERNEL_KINDS[0][1]


def select_window(
    table: EventTable, step: int | None = None, annotation: str | None = None, instance: int = 0
) -> tuple[int, int]:
    """``[start, end]`` (ns) of the whole trace, of step ``step``, or of the ``instance``-th span
    whose name contains ``annotation`` (HTA's choice; ``""`` is the whole trace, as in HTA)."""
    ts, dur = table.array("span_ts"), table.array("span_dur")
    if step is not None:
        for w in step_windows(table):
            if w.number == step:
                return w.start, w.end
        raise UsageError(f"no step {step} in the trace (steps: {[w.number for w in step_windows(table)]})")
    if annotation:
        has = np.asarray([annotation in n for n in table.names], dtype=bool)
        spans = np.flatnonzero(has[table.array("span_name")]) if table.span_count else np.zeros(0, np.int64)
        spans = spans[np.argsort(ts[spans], kind="stable")]
        if not 0 <= instance < spans.size:
            raise UsageError(f"{spans.size} spans are named with {annotation!r}; no instance {instance}")
        k = int(spans[instance])
        return int(ts[k]), int(ts[k] + dur[k])
    if not table.span_count:
        raise UsageError("the trace has no spans")
    return int(ts.min()), int((ts + dur).max())


def critical_path(
    table: EventTable,
    step: int | None = None,
    annotation: str | None = None,
    instance: int = 0,
    data_load: tuple[str, ...] = (),
    zero_weight_launch_edges: bool = True,
    top: int = 20,
    hta_compatible: bool = False,
) -> CriticalPath:
    """The critical path of a window of ``table`` (see :func:`select_window`). ``data_load``: name
    patterns of data-loading spans (HTA's ``data_load_events``). ``zero_weight_launch_edges``: keep a
    weightless edge from every launch call to its work (HTA's tests set this; a kernel cannot start
    before its launch, so it is on by default). ``hta_compatible``: Holistic Trace Analysis's graph
    and figures; by default also every CUDA graph kernel, device work running from before the
    window, waits read from overlap where the trace has no sync events (``critical_waits.py``),
    and the time the path spends in no op and no device work as ``idle`` (so ``by_type`` sums to
    ``length_us``, the time from the path's first node to its last)."""
    start, end = select_window(table, step, annotation, instance)
    graph = build_graph(table, Window(start, end, tuple(data_load)), zero_weight_launch_edges, hta_compatible)
    edges = longest_path(graph)
    nodes = len(edges) + 1 if edges else 0
    weight = np.maximum(graph.weight, 0)
    by_type, top_ns, owners = _shares(table, graph, edges, weight, data_load)
    on = np.asarray(edges, dtype=np.int64)
    if not hta_compatible:
        by_type["idle"] = _idle(graph, on, weight)
    ranked = sorted(top_ns.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return CriticalPath(
        length_us=(float(weight[on].sum()) + by_type.get("idle", 0)) / 1000.0 if edges else 0.0,
        by_type={c: by_type[c] / 1000.0 for c in CATEGORIES if by_type.get(c, 0) > 0},
        nodes=nodes,
        top=tuple(PathShare(name, ns / 1000.0) for name, ns in ranked),
        modules=_modules(table, owners),
        window_us=(start / 1000.0, end / 1000.0),
    )


def longest_path(graph: Graph) -> list[int]:
    """The edges of the heaviest path (weights below 0 count 0; where two edges join the same
    nodes the later one stands), in order; ties as ``critical_longest.py`` says."""
    n = graph.node_ts.size
    if not graph.src.size or not n:
        return []
    pair = graph.src * n + graph.dst
    _, last_from_end = np.unique(pair[::-1], return_index=True)
    keep = np.sort(pair.size - 1 - last_from_end)
    weight = np.maximum(graph.weight[keep], 0)
    lanes: np.ndarray | None = graph.lanes
    if graph.lanes.size != n or np.bincount(graph.lanes, minlength=n).max() != 1:
        lanes = None  # not every node once: in node order (the path is the same, found slower)
    path: list[int] = keep[heaviest_path(n, graph.src[keep], graph.dst[keep], weight, lanes)].tolist()
    return path


def _shares(
    table: EventTable, graph: Graph, edges: list[int], weight: np.ndarray, data_load: tuple[str, ...]
) -> tuple[dict[str, int], dict[str, int], tuple[np.ndarray, np.ndarray]]:
    """Time on the path (ns) by category, by op/kernel name (their own edges), and by owning span
    (spans, ns)."""
    on = np.asarray(edges, dtype=np.int64)
    on = on[weight[on] > 0]
    kind, owner, w = graph.kind[on], graph.owner[on], weight[on]
    by_type: dict[str, int] = {}
    for k, category in (
        (KERNEL_KERNEL, "gpu_kernel_kernel_overhead"),
        (LAUNCH, "gpu_kernel_launch_overhead"),
    ):
        if np.any(kind == k):
            by_type[category] = int(w[kind == k].sum())
    own = (kind == OPERATOR) & (owner >= 0)
    spans, ns = _sums(owner[own], w[own])
    names, name_of = table.names, table.array("span_name")
    device = np.isin(table.array("span_kind")[spans], list(DEVICE_WORK_KINDS))
    loading = re.compile("|".join(f"(?:{p})" for p in data_load)) if data_load else None
    # one category per (name, device work or not): HTA decides by name
    key = name_of[spans] * 2 + device
    keys, key_ns = _sums(key, ns)
    by_name: dict[str, int] = {}
    for k, total in zip(keys.tolist(), key_ns.tolist(), strict=True):
        name = names[k // 2]
        category = _category(name, bool(k & 1), loading)
        by_type[category] = by_type.get(category, 0) + total
        by_name[name] = by_name.get(name, 0) + total
    return by_type, by_name, (spans, ns)


def _idle(graph: Graph, on: np.ndarray, weight: np.ndarray) -> int:
    """The time (ns) the path (its edges ``on``) spends on weightless edges: between top-level
    ops, waking from a synchronisation, in a stream's queue."""
    on = on[weight[on] == 0]
    gap = graph.node_ts[graph.dst[on]] - graph.node_ts[graph.src[on]]
    return int(gap[gap > 0].sum())


def _sums(key: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys (sorted) and each one's total value (exact, in integers)."""
    if not key.size:
        return key, value
    order = np.argsort(key, kind="stable")
    key, value = key[order], value[order]
    cuts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    return key[cuts], np.add.reduceat(value, cuts)


def _category(name: str, device: bool, loading: re.Pattern[str] | None) -> str:
    """The bound category of an op's or kernel's own time."""
    if device:
        return "gpu_communication_bound" if _COMMUNICATION.search(name) else "gpu_compute_bound"
    return "data_loading" if loading and loading.search(name) else "cpu_bound"


def _modules(table: EventTable, owners: tuple[np.ndarray, np.ndarray]) -> tuple[PathShare, ...] | None:
    """Time on the path per module and phase: each span's bucket as attribution files it (device
    work: its launch call's); None when the trace has no module ranges."""
    if not any(n.startswith(MODULE_RANGE_PREFIX) for n in table.names):
        return None
    named = name_roles(table.names, None)
    buckets = Buckets(len(named.catalog))
    swept = sweep(table, time_order(table), named.roles, named.role_module, buckets)
    spans, ns = owners
    launcher = _launchers(table)[spans]
    bucket = np.asarray(swept.bucket, dtype=np.int64)[np.where(launcher >= 0, launcher, spans)]
    found: dict[tuple[str, str], int] = {}
    for b, total in zip(*(a.tolist() for a in _sums(bucket, ns)), strict=True):
        if not buckets.is_module(b):
            continue
        phase = "backward" if buckets.is_backward(b) else "forward"
        key = (named.catalog[buckets.module_of(b)].path, phase)
        found[key] = found.get(key, 0) + total
    ranked = sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))
    return tuple(PathShare(path, ns / 1000.0, phase) for (path, phase), ns in ranked)


def profile_critical_path(profile: Profile, window: PathWindow) -> CriticalPath:
    """``Profile.critical_path``: the path of the trace the profile was built from, read again (a
    Profile keeps no events)."""
    trace = profile.meta.trace_file
    if not trace or not Path(trace).is_file():
        where = f"its trace {trace} is gone" if trace else "it was not built from a trace"
        raise UsageError(
            f"the critical path needs the trace's events and {where}: "
            "use layerscope.critical_path(TRACE) or `layerscope analyze TRACE --critical-path`"
        )
    builder = TraceTableBuilder(None, trace)
    result = stream_trace(Path(trace), builder)
    header: Any = result.header
    document = result.whole_document
    if document is not None:  # a trace written as one object or a bare list: read whole
        header = document if isinstance(document, dict) else {"traceEvents": document}
        builder.add_events(list(header.get("traceEvents") or []))
    return critical_path(
        builder.finish(header),
        window.step,
        window.annotation,
        window.instance,
        hta_compatible=window.hta_compatible,
    )


__all__ = [
    "CATEGORIES",
    "CriticalPath",
    "PathShare",
    "PathWindow",
    "critical_path",
    "longest_path",
    "profile_critical_path",
    "select_window",
]
