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

from layerscope.analysis.critical_graph import KERNEL_KERNEL, LAUNCH, OPERATOR, Graph, Window, build_graph
from layerscope.analysis.critical_graph import launchers as _launchers
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
) -> CriticalPath:
    """The critical path of a window of ``table`` (see :func:`select_window`). ``data_load``: name
    patterns of data-loading spans (HTA's ``data_load_events``). ``zero_weight_launch_edges``: keep a
    weightless edge from every launch call to its work (HTA's tests set this; a kernel cannot start
    before its launch, so it is on by default)."""
    start, end = select_window(table, step, annotation, instance)
    graph = build_graph(table, Window(start, end, tuple(data_load)), zero_weight_launch_edges)
    edges = longest_path(graph)
    nodes = len(edges) + 1 if edges else 0
    weight = np.maximum(np.asarray(graph.weight, dtype=np.int64), 0)
    by_type, top_ns, owners = _shares(table, graph, edges, weight, data_load)
    ranked = sorted(top_ns.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return CriticalPath(
        length_us=float(weight[edges].sum()) / 1000.0 if edges else 0.0,
        by_type={c: by_type[c] / 1000.0 for c in CATEGORIES if by_type.get(c, 0) > 0},
        nodes=nodes,
        top=tuple(PathShare(name, ns / 1000.0) for name, ns in ranked),
        modules=_modules(table, owners),
        window_us=(start / 1000.0, end / 1000.0),
    )


def longest_path(graph: Graph) -> list[int]:
    """The edges of the heaviest path (weights below 0 count 0; where two edges join the same
    nodes the later one stands), in order. Kahn's topological order, then each node's best
    predecessor (the first heaviest, in edge order, as networkx picks it)."""
    n = graph.node_ts.size
    if not graph.src or not n:
        return []
    src, dst = np.asarray(graph.src, np.int64), np.asarray(graph.dst, np.int64)
    pair = src * n + dst
    _, last_from_end = np.unique(pair[::-1], return_index=True)
    keep = np.sort(pair.size - 1 - last_from_end)
    weight = np.maximum(np.asarray(graph.weight, np.int64)[keep], 0)
    order = _topological(n, src[keep], dst[keep])
    by_dst = np.argsort(dst[keep], kind="stable")
    starts = np.searchsorted(dst[keep][by_dst], np.arange(n + 1))
    dist = [0] * n
    best = [-1] * n
    k_src, k_w, into = src[keep].tolist(), weight.tolist(), by_dst.tolist()
    bounds = starts.tolist()
    for v in order:
        top_d, top_e = -1, -1
        for e in into[bounds[v] : bounds[v + 1]]:
            d = dist[k_src[e]] + k_w[e]
            if d > top_d:
                top_d, top_e = d, e
        if top_e >= 0:
            dist[v], best[v] = top_d, top_e
    v = max(order, key=lambda node: dist[node])  # the first node of the longest distance
    path: list[int] = []
    while best[v] >= 0:
        path.append(int(keep[best[v]]))
        v = k_src[best[v]]
    return path[::-1]


def _topological(n: int, src: np.ndarray, dst: np.ndarray) -> list[int]:
    """Kahn's order of ``n`` nodes (time order among those ready); raises on a cycle."""
    indeg = np.bincount(dst, minlength=n).tolist()
    by_src = np.argsort(src, kind="stable")
    bounds = np.searchsorted(src[by_src], np.arange(n + 1)).tolist()
    out_dst = dst[by_src].tolist()
    ready = [v for v in range(n) if indeg[v] == 0][::-1]
    order: list[int] = []
    while ready:
        u = ready.pop()
        order.append(u)
        for v in out_dst[bounds[u] : bounds[u + 1]]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if len(order) != n:
        raise ValueError("the dependency graph has a cycle")
    return order


def _shares(
    table: EventTable, graph: Graph, edges: list[int], weight: np.ndarray, data_load: tuple[str, ...]
) -> tuple[dict[str, int], dict[str, int], dict[int, int]]:
    """Time on the path (ns) by category, by op/kernel name (their own edges), and by owning span."""
    kinds, name_of, names = table.array("span_kind"), table.array("span_name"), table.names
    loading = re.compile("|".join(f"(?:{p})" for p in data_load)) if data_load else None
    by_type: dict[str, int] = {}
    by_name: dict[str, int] = {}
    owners: dict[int, int] = {}
    seen: dict[tuple[int, bool], str] = {}  # (name, is device work) -> category
    for e in edges:
        w, kind, owner = int(weight[e]), graph.kind[e], graph.owner[e]
        if w <= 0:
            continue
        if kind == KERNEL_KERNEL:
            category = "gpu_kernel_kernel_overhead"
        elif kind == LAUNCH:
            category = "gpu_kernel_launch_overhead"
        elif kind != OPERATOR or owner < 0:
            continue
        else:
            name = names[name_of[owner]]
            key = (int(name_of[owner]), int(kinds[owner]) in DEVICE_WORK_KINDS)
            category = seen.get(key) or seen.setdefault(key, _category(name, key[1], loading))
            by_name[name] = by_name.get(name, 0) + w
            owners[owner] = owners.get(owner, 0) + w
        by_type[category] = by_type.get(category, 0) + w
    return by_type, by_name, owners


def _category(name: str, device: bool, loading: re.Pattern[str] | None) -> str:
    """The bound category of an op's or kernel's own time."""
    if device:
        return "gpu_communication_bound" if _COMMUNICATION.search(name) else "gpu_compute_bound"
    return "data_loading" if loading and loading.search(name) else "cpu_bound"


def _modules(table: EventTable, owners: dict[int, int]) -> tuple[PathShare, ...] | None:
    """Time on the path per module and phase: each span's bucket as attribution files it (device
    work: its launch call's); None when the trace has no module ranges."""
    if not any(n.startswith(MODULE_RANGE_PREFIX) for n in table.names):
        return None
    named = name_roles(table.names, None)
    buckets = Buckets(len(named.catalog))
    swept = sweep(table, time_order(table), named.roles, named.role_module, buckets)
    launcher = _launchers(table)
    found: dict[tuple[str, str], int] = {}
    for span, ns in owners.items():
        cpu_span = int(launcher[span]) if launcher[span] >= 0 else span
        bucket = swept.bucket[cpu_span]
        if not buckets.is_module(bucket):
            continue
        phase = "backward" if buckets.is_backward(bucket) else "forward"
        key = (named.catalog[buckets.module_of(bucket)].path, phase)
        found[key] = found.get(key, 0) + ns
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
    return critical_path(builder.finish(header), window.step, window.annotation, window.instance)


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
