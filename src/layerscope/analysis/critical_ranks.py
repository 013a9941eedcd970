"""One critical path through every rank of a distributed job.

Each rank's graph is the one-rank graph (``critical_graph.py``) of the same window (the whole
trace, step N, or the N-th span named with a text, on each rank). The graphs are joined by the
collectives: a collective cannot end on any rank before its last participant has joined, so

- the collectives are matched across ranks and the clocks aligned by their ends
  (``critical_clocks.py``: each rank's offset from the first rank's clock is the end difference
  most matched collectives agree on);
- for each collective, an edge goes from the start of the last arriver's kernel to the end of
  every other rank's kernel, weighted by the time from that start to that end (the collective's
  own work, ``gpu_communication_bound``, owned by the waiting rank's kernel);
- a waiting rank's kernel keeps, as its own time, only what follows the last arrival: the time
  before it is waiting for the other ranks, on nobody's path (so a path through a fast rank's
  long collective does not hide the slow rank that made it long).

The longest path then runs through all ranks at once: a rank that makes the others wait in a
collective is on the path up to that collective, the others after it. Times are reported on the
first rank's clock; the path's time goes to the rank each edge ends on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layerscope.analysis import critical_path as single
from layerscope.analysis.critical_clocks import RankClocks, RankKernels, align_clocks, match_collectives
from layerscope.analysis.critical_edges import OPERATOR
from layerscope.analysis.critical_graph import Graph, Window, build_graph
from layerscope.analysis.device import KERNEL_KINDS
from layerscope.errors import UsageError
from layerscope.events.names import MODULE_RANGE_PREFIX
from layerscope.events.table import EventKind, EventTable
from layerscope.model.critical_path import CriticalPath, PathSegment, PathShare

_COMMUNICATION = KERNEL_KINDS[0][1]


@dataclass(frozen=True)
class RankTable:
    """One rank's trace: its rank and its events."""

    rank: int
    table: EventTable


@dataclass
class _Joined:
    """The ranks' graphs as one: nodes and edges of rank ``k`` follow those of ranks before it."""

    graph: Graph
    node_rank: np.ndarray  # rank index of every node
    edge_rank: np.ndarray  # rank index of every edge (a collective's edge: the rank it ends on)


def rank_ids(tables: Sequence[EventTable]) -> tuple[int, ...]:
    """Each table's rank (the trace's ``distributedInfo``), else their order when some lack one or
    two share one."""
    found: list[int] = []
    for table in tables:
        info = table.meta.get("distributed")
        rank = info.get("rank") if isinstance(info, dict) else None
        if not isinstance(rank, int) or rank in found:
            return tuple(range(len(tables)))
        found.append(rank)
    return tuple(found)


def ranks_critical_path(
    ranks: Sequence[RankTable],
    step: int | None = None,
    annotation: str | None = None,
    instance: int = 0,
    data_load: tuple[str, ...] = (),
    zero_weight_launch_edges: bool = True,
    top: int = 20,
    hta_compatible: bool = False,
) -> CriticalPath:
    """The critical path through every rank's trace (see the module's text): the same window on
    each rank, the collectives joining them. ``top``, ``data_load``, ``zero_weight_launch_edges``
    and ``hta_compatible`` as for one rank (``analysis.critical_path.critical_path``): by default
    the time the path spends in no op and no device work (a waiting kernel's time before the last
    arrival included) is ``idle``, and ``by_type`` sums to ``length_us``."""
    if len(ranks) < 2:
        raise UsageError(f"a path through ranks needs two rank traces or more, got {len(ranks)}")
    ranks = sorted(ranks, key=lambda r: r.rank)
    graphs = []
    for r in ranks:
        start, end = single.select_window(r.table, step, annotation, instance)
        window = Window(start, end, tuple(data_load))
        graphs.append(build_graph(r.table, window, zero_weight_launch_edges, hta_compatible))
    kernels = [_comm_kernels(r.table, g) for r, g in zip(ranks, graphs, strict=True)]
    clocks = align_clocks(kernels)
    joined = _join(graphs, clocks)
    groups = match_collectives(kernels, clocks)
    _collective_edges(joined, graphs, kernels, clocks, groups)
    edges = single.longest_path(joined.graph)
    path = _result(ranks, joined, edges, clocks, (tuple(data_load), top, not hta_compatible))
    return dataclasses.replace(path, collectives=len(groups))


def _comm_kernels(table: EventTable, graph: Graph) -> RankKernels:
    """The communication kernels with nodes in ``graph``."""
    kinds, name_of = table.array("span_kind"), table.array("span_name")
    kernels = graph.spans[kinds[graph.spans] == EventKind.KERNEL]
    ids = np.unique(name_of[kernels])  # the kernels' names only: the string table holds shapes too
    comm = ids[np.asarray([bool(_COMMUNICATION.search(table.names[k])) for k in ids.tolist()], dtype=bool)]
    spans = kernels[np.isin(name_of[kernels], comm)]
    ts, dur = table.array("span_ts"), table.array("span_dur")
    names = tuple(table.names[k] for k in name_of[spans].tolist())
    return RankKernels(spans, names, ts[spans], ts[spans] + dur[spans])


def _join(graphs: Sequence[Graph], clocks: RankClocks) -> _Joined:
    """The graphs side by side, node times on the first rank's clock."""
    sizes = [g.node_ts.size for g in graphs]
    base = np.concatenate([[0], np.cumsum(sizes)])

    def cat(field: str, shift: bool = False) -> np.ndarray:
        parts = [getattr(g, field) + (base[k] if shift else 0) for k, g in enumerate(graphs)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    node_ts = np.concatenate([g.node_ts - clocks.offset_ns[k] for k, g in enumerate(graphs)])
    empty = np.zeros(0, dtype=np.int64)
    graph = Graph(empty, node_ts, empty, empty)
    graph.src, graph.dst, graph.lanes = cat("src", True), cat("dst", True), cat("lanes", True)
    graph.weight, graph.kind, graph.owner = cat("weight").copy(), cat("kind"), cat("owner")
    node_rank = np.repeat(np.arange(len(graphs)), sizes)
    edge_rank = np.repeat(np.arange(len(graphs)), [g.src.size for g in graphs])
    return _Joined(graph, node_rank, edge_rank)


def _collective_edges(
    joined: _Joined,
    graphs: Sequence[Graph],
    kernels: Sequence[RankKernels],
    clocks: RankClocks,
    groups: list[dict[int, int]],
) -> None:
    """For each matched collective: the waiting ranks' kernels lose the time before the last
    arrival, and an edge goes from the last arriver's kernel start to each waiting kernel's end."""
    graph = joined.graph
    base = np.concatenate([[0], np.cumsum([g.node_ts.size for g in graphs])])
    src, dst, owner, rank_of, weight = [], [], [], [], []
    # each kernel's own edge, by its start node (an operator edge from a span's start to its end)
    own = np.flatnonzero((graph.kind == OPERATOR) & (graph.src % 2 == 0) & (graph.dst == graph.src + 1))
    own_of = np.full(graph.node_ts.size, -1, dtype=np.int64)
    own_of[graph.src[own]] = own
    for group in groups:
        starts = {r: int(kernels[r].start[k]) - clocks.offset_ns[r] for r, k in group.items()}
        last = max(starts, key=lambda r: (starts[r], r))
        last_node = int(base[last] + graphs[last].start(int(kernels[last].spans[group[last]])))
        for r, k in group.items():
            if r == last:
                continue
            span = int(kernels[r].spans[k])
            start_node, end_node = base[r] + graphs[r].start(span), base[r] + graphs[r].end(span)
            after = int(graph.node_ts[end_node]) - starts[last]
            edge = int(own_of[start_node])
            if edge >= 0:
                graph.weight[edge] = max(0, min(int(graph.weight[edge]), after))
            if after > 0:
                src.append(last_node)
                dst.append(int(end_node))
                owner.append(span)
                rank_of.append(r)
                weight.append(after)
    if not src:
        return
    graph.src = np.concatenate([graph.src, src])
    graph.dst = np.concatenate([graph.dst, dst])
    graph.weight = np.concatenate([graph.weight, weight])
    graph.kind = np.concatenate([graph.kind, np.full(len(src), OPERATOR)])
    graph.owner = np.concatenate([graph.owner, owner])
    joined.edge_rank = np.concatenate([joined.edge_rank, rank_of])


def _result(
    ranks: Sequence[RankTable],
    joined: _Joined,
    edges: list[int],
    clocks: RankClocks,
    options: tuple[tuple[str, ...], int, bool],
) -> CriticalPath:
    """Where the joined path's time goes: by type, by (op or kernel, rank), by (module, rank), by
    rank, and its stretches rank by rank. ``options``: data-loading patterns, how many top ops,
    whether time on no op and no device work counts (``idle``)."""
    data_load, top, with_idle = options
    graph = joined.graph
    weight = np.maximum(graph.weight, 0)
    on = np.asarray(edges, dtype=np.int64)
    # idle: what an edge spans beyond its weight (weightless edges, a waiting kernel's wait)
    idle = np.zeros(graph.src.size, dtype=np.int64)
    if with_idle and on.size:
        gap = graph.node_ts[graph.dst[on]] - graph.node_ts[graph.src[on]]
        idle[on] = np.maximum(gap - weight[on], 0)
    total = weight + idle
    by_type: dict[str, int] = {"idle": int(idle[on].sum())} if with_idle else {}
    by_name: dict[tuple[str, int], int] = {}
    modules: list[PathShare] | None = None
    per_rank: dict[int, float] = {}
    for k, r in enumerate(ranks):
        mine = on[joined.edge_rank[on] == k].tolist()
        per_rank[r.rank] = float(total[np.asarray(mine, dtype=np.int64)].sum()) / 1000.0
        types, names, owners = single._shares(r.table, graph, mine, weight, data_load)
        for category, ns in types.items():
            by_type[category] = by_type.get(category, 0) + ns
        for name, ns in names.items():
            by_name[(name, r.rank)] = ns
        # a rank off the path has no module time on it: its attribution sweep is skipped
        found = single._modules(r.table, owners) if owners[0].size else _no_modules(r.table)
        if found is not None:
            modules = (modules or []) + [PathShare(m.name, m.us, m.phase, r.rank) for m in found]
    ranked = sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    ts = graph.node_ts
    return CriticalPath(
        length_us=float(total[on].sum()) / 1000.0 if on.size else 0.0,
        by_type={c: by_type[c] / 1000.0 for c in single.CATEGORIES if by_type.get(c, 0) > 0},
        nodes=on.size + 1 if on.size else 0,
        top=tuple(PathShare(name, ns / 1000.0, None, rank) for (name, rank), ns in ranked),
        modules=None if modules is None else tuple(sorted(modules, key=lambda m: (-m.us, m.name))),
        window_us=(float(ts.min()) / 1000.0, float(ts.max()) / 1000.0) if ts.size else (0.0, 0.0),
        ranks=per_rank,
        segments=_segments(ranks, joined, on, total),
        clock_offsets_us={r.rank: clocks.offset_ns[k] / 1000.0 for k, r in enumerate(ranks)},
    )


def _no_modules(table: EventTable) -> tuple[PathShare, ...] | None:
    """No module on the path: empty when the trace has module ranges, else None (as one rank's)."""
    return () if any(n.startswith(MODULE_RANGE_PREFIX) for n in table.names) else None


def _segments(
    ranks: Sequence[RankTable], joined: _Joined, on: np.ndarray, weight: np.ndarray
) -> tuple[PathSegment, ...]:
    """The path's edges grouped into runs on one rank (an edge's rank: the rank it ends on), each
    with its edges' time (``weight``, idle included)."""
    if not on.size:
        return ()
    graph = joined.graph
    rank = joined.edge_rank[on]
    cuts = np.flatnonzero(np.concatenate([[True], rank[1:] != rank[:-1], [True]]))
    found = []
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        part = on[a:b]
        found.append(
            PathSegment(
                ranks[int(rank[a])].rank,
                float(graph.node_ts[graph.src[part[0]]]) / 1000.0,
                float(graph.node_ts[graph.dst[part[-1]]]) / 1000.0,
                float(weight[part].sum()) / 1000.0,
                int(part.size),
            )
        )
    return tuple(found)


__all__ = ["RankTable", "rank_ids", "ranks_critical_path"]
