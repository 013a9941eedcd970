"""The critical path's graph and longest path as first written (commit 59cb6d9, plain Python
loops): the reference ``tests/test_critical_path_fast.py`` checks the vectorised code against,
edge for edge and path for path. Not used by the package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from layerscope.analysis.critical_sync import (
    EVENT_SYNC,
    STREAM_SYNC,
    STREAM_WAIT,
    SyncLinks,
    queue_lengths,
    sync_links,
)
from layerscope.events.table import EventKind, EventTable

#: Edge types (HTA's ``CPEdgeType``).
OPERATOR, DEPENDENCY, LAUNCH, KERNEL_KERNEL, SYNC = range(5)

#: Runtime calls that hold CUDA's runtime lock: one at a time across threads (HTA's list).
LOCK_CALLS = frozenset({"cudaHostAlloc", "cudaLaunchKernel", "cudaMemcpyAsync"})
#: Calls that wait for the device; their own time weighs 0 (HTA's list; ``cudaMemcpyAsync`` also
#: takes the lock, whose edge keeps its time: HTA counts it as CPU time).
BLOCKING_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventQuery",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpyAsync",
    }
)
#: Gaps between work on a stream longer than this are no kernel-kernel edge (HTA's 1.5 ms).
KERNEL_GAP_NS = 1_500_000

_CPU_KINDS = (EventKind.CPU_OP, EventKind.USER_ANNOTATION, EventKind.RUNTIME, EventKind.PYTHON)
_WORK_KINDS = (EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET)


@dataclass
class Graph:
    """Nodes (two per span in ``spans``: ``2j`` its start, ``2j + 1`` its end) and edges."""

    spans: np.ndarray  # the spans with nodes, table indices
    node_ts: np.ndarray  # ns
    slot: np.ndarray  # table index -> j, -1 for spans without nodes
    parent: np.ndarray  # table index -> enclosing CPU span on its (merged) thread, -1
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    weight: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    owner: list[int] = field(default_factory=list)  # the span an edge's time belongs to, -1 none

    def start(self, span: int) -> int:
        """The start node of ``span`` (-1 without nodes)."""
        j = int(self.slot[span])
        return 2 * j if j >= 0 else -1

    def end(self, span: int) -> int:
        """The end node of ``span`` (-1 without nodes)."""
        j = int(self.slot[span])
        return 2 * j + 1 if j >= 0 else -1

    def add(self, u: int, v: int, kind: int, owner: int = -1, zero: bool = False) -> None:
        """An edge ``u -> v``; weighted by the time between its nodes unless a dependency, a sync
        or ``zero``."""
        weighted = not zero and kind not in (DEPENDENCY, SYNC)
        self.src.append(u)
        self.dst.append(v)
        self.weight.append(int(self.node_ts[v] - self.node_ts[u]) if weighted else 0)
        self.kind.append(kind)
        self.owner.append(owner)


@dataclass(frozen=True)
class Window:
    """What of the table a graph covers: CPU spans starting in ``[start, end]``, and the work and
    synchronisations their calls launched."""

    start: int
    end: int
    data_load: tuple[str, ...] = ()  # name patterns (regex) of data-loading spans: nodes too


def build_graph(table: EventTable, window: Window, zero_weight_launch_edges: bool = True) -> Graph:
    """The dependency graph of ``window``: nodes, then the lock, call-stack and device edges."""
    kinds = table.array("span_kind")
    ts, dur = table.array("span_ts"), table.array("span_dur")
    launcher = launchers(table)
    cpu = np.isin(kinds, [int(k) for k in _CPU_KINDS]) & (ts >= window.start) & (ts <= window.end) & (dur > 0)
    launched = (launcher >= 0) & cpu[np.maximum(launcher, 0)]
    work = np.isin(kinds, [int(k) for k in _WORK_KINDS]) & launched
    node_cpu = cpu & np.isin(kinds, [int(EventKind.CPU_OP), int(EventKind.RUNTIME)])
    if window.data_load:
        pattern = re.compile("|".join(f"(?:{p})" for p in window.data_load))
        loading = np.asarray([bool(pattern.search(n)) for n in table.names], dtype=bool)
        node_cpu |= cpu & loading[table.array("span_name")]
    spans = np.flatnonzero(node_cpu | work)
    slot = np.full(table.span_count, -1, dtype=np.int64)
    slot[spans] = np.arange(spans.size)
    node_ts = np.empty(2 * spans.size, dtype=np.int64)
    node_ts[0::2], node_ts[1::2] = ts[spans], ts[spans] + dur[spans]
    graph = Graph(spans, node_ts, slot, np.full(table.span_count, -1, dtype=np.int64))
    names = table.names
    name_of = table.array("span_name")
    lock = np.asarray([n in LOCK_CALLS for n in names], dtype=bool)[name_of] & (slot >= 0)
    _lock_edges(graph, np.flatnonzero(lock), ts)
    blocking = np.asarray([n in BLOCKING_CALLS for n in names], dtype=bool)[name_of]
    for thread_spans in _threads(table, np.flatnonzero(cpu)):
        _call_stack_edges(graph, table, thread_spans, lock, blocking)
    syncs = sync_links(table, launcher, (window.start, window.end), cpu)
    _device_edges(graph, table, work, launcher, syncs, zero_weight_launch_edges)
    return graph


def launchers(table: EventTable) -> np.ndarray:
    """Per span, the runtime call with its correlation id (-1 none; runtime calls themselves -1)."""
    kinds, corr = table.array("span_kind"), table.array("span_corr")
    runtime = np.flatnonzero((kinds == EventKind.RUNTIME) & (corr > 0))
    found = np.full(table.span_count, -1, dtype=np.int64)
    if not runtime.size:
        return found
    order = runtime[np.argsort(corr[runtime], kind="stable")]
    keys = corr[order]
    linked = (kinds != EventKind.RUNTIME) & (corr > 0)
    where = np.clip(np.searchsorted(keys, corr), 0, keys.size - 1)
    hit = linked & (keys[where] == corr)
    found[hit] = order[where[hit]]
    return found


def _lock_edges(graph: Graph, lock: np.ndarray, ts: np.ndarray) -> None:
    """Runtime calls under CUDA's runtime lock, all threads: nodes in time order; at each end, an
    edge from every start still open (the call's own time from its start, a dependency from the
    others'), and a dependency from the previous node when that was an end."""
    if not lock.size:
        return
    nodes = np.concatenate([2 * graph.slot[lock], 2 * graph.slot[lock] + 1])
    span = np.concatenate([lock, lock])
    order = np.lexsort((nodes & 1, span, graph.node_ts[nodes]))
    open_starts: list[int] = []
    last = -1
    for node, s in zip(nodes[order].tolist(), span[order].tolist(), strict=True):
        if not node & 1:
            open_starts.append(node)
        else:
            while open_starts:
                u = open_starts.pop()
                if u == node - 1:
                    graph.add(u, node, OPERATOR, owner=s)
                else:
                    graph.add(u, node, DEPENDENCY)
            if last >= 0 and last & 1:
                graph.add(last, node, DEPENDENCY)
        last = node


def _threads(table: EventTable, cpu: np.ndarray) -> list[np.ndarray]:
    """The window's CPU spans per thread, the backward thread merged into the forward one when each
    is the only thread with ops named ``forward`` / ``autograd`` (HTA's rule)."""
    tid = table.array("span_tid")[cpu].copy()
    kinds = table.array("span_kind")[cpu]
    named = np.isin(kinds, [int(EventKind.CPU_OP), int(EventKind.USER_ANNOTATION)])
    name_of = table.array("span_name")[cpu]

    def only_thread(word: str) -> int | None:
        has = np.asarray([word in n for n in table.names], dtype=bool)
        tids = np.unique(tid[named & has[name_of]])
        return int(tids[0]) if tids.size == 1 else None

    fwd, bwd = only_thread("forward"), only_thread("autograd")
    if fwd is not None and bwd is not None and fwd != bwd:
        tid[tid == bwd] = fwd
    order = np.argsort(tid, kind="stable")
    cuts = np.flatnonzero(np.diff(tid[order])) + 1
    return [cpu[part] for part in np.split(order, cuts)]


def _nesting(table: EventTable, spans: np.ndarray, parent: np.ndarray) -> dict[int, list[int]]:
    """One thread's call tree, HTA's way: starts and ends in time order (at one instant ends first,
    longer spans open first and close last), each start a child of the span on top of the stack,
    each end closing the top. Sets ``parent``; returns each span's children in start order."""
    start = table.array("span_ts")[spans]
    dur = table.array("span_dur")[spans]
    time = np.concatenate([start, start + dur])
    opens = np.concatenate([np.ones(spans.size, np.int64), np.zeros(spans.size, np.int64)])
    order = np.lexsort((np.concatenate([spans, -spans]), np.concatenate([-dur, dur]), opens, time))
    children: dict[int, list[int]] = {-1: []}
    stack: list[int] = []
    for s, is_open in zip(np.concatenate([spans, spans])[order].tolist(), opens[order].tolist(), strict=True):
        if is_open:
            p = stack[-1] if stack else -1
            children.setdefault(p, []).append(s)
            parent[s] = p
            stack.append(s)
        elif stack:
            stack.pop()
    return children


def _walk(children: dict[int, list[int]]) -> list[tuple[int, bool]]:
    """Depth-first order of a call tree: (span, entering) pairs, the root's children first."""
    out: list[tuple[int, bool]] = []
    todo: list[tuple[int, bool]] = [(c, False) for c in reversed(children[-1])]
    while todo:
        s, done = todo.pop()
        out.append((s, not done))
        if not done:
            todo.append((s, True))
            todo.extend((c, False) for c in reversed(children.get(s, ())))
    return out


def _call_stack_edges(
    graph: Graph, table: EventTable, spans: np.ndarray, lock: np.ndarray, blocking: np.ndarray
) -> None:
    """Edges between consecutive nodes of one thread's call tree (HTA's DFS): a dependency between
    top-level spans, else an operator edge owned by the span the time is spent in; the lock's own
    edges are left to :func:`_lock_edges`."""
    parent = graph.parent
    node_span = graph.spans
    last, depth, last_parent = -1, 0, -1
    for s, entering in _walk(_nesting(table, spans, parent)):
        if graph.slot[s] < 0:
            continue
        node = graph.start(s) if entering else graph.end(s)
        if last >= 0:
            u_span = int(node_span[last // 2])
            shares_lock = lock[u_span] and lock[s] and (not last & 1 or not entering)
            if not shares_lock:
                owner = u_span if not last & 1 else s if not entering else last_parent
                kind = DEPENDENCY if entering and depth == 0 else OPERATOR
                graph.add(last, node, kind, owner=owner, zero=not entering and bool(blocking[s]))
        last, last_parent = node, int(parent[s])
        depth += 1 if entering else -1


def _device_edges(
    graph: Graph,
    table: EventTable,
    work: np.ndarray,
    launcher: np.ndarray,
    syncs: SyncLinks,
    zero_weight_launch_edges: bool,
) -> None:
    """Device work in start order (synchronisations at their end): its own edge, then a sync edge
    from the work it waits on, a launch edge when it found its stream empty, else a kernel-kernel
    edge from the stream's previous work."""
    ts, dur, tid = table.array("span_ts"), table.array("span_dur"), table.array("span_tid")
    rows = np.concatenate([np.flatnonzero(work), syncs.rows])
    key = np.concatenate([ts[np.flatnonzero(work)], ts[syncs.rows] + dur[syncs.rows]])
    at_launch, at_start = queue_lengths(table, launcher)
    last: dict[int, int] = {}  # stream -> end node of its latest work
    pending: dict[int, int] = {}  # work -> work it waits on (cudaStreamWaitEvent)
    for r in rows[np.lexsort((rows, key))].tolist():
        if r in syncs.kind:
            _sync_edges(graph, syncs, r, int(launcher[r]), last, pending)
            continue
        s, e, stream, runtime = graph.start(r), graph.end(r), int(tid[r]), int(launcher[r])
        graph.add(s, e, OPERATOR, owner=r)
        waited = pending.pop(r, -1)
        waited_end = graph.end(waited) if waited >= 0 else -1
        if waited_end >= 0:
            graph.add(waited_end, s, SYNC)
        prev = last.get(stream, -1)
        launch_ts = ts[runtime]
        launched = False
        if (
            at_launch[r] == 1
            and at_start[r] == 0
            and (prev < 0 or graph.node_ts[prev] < launch_ts)
            and (waited_end < 0 or graph.node_ts[waited_end] < launch_ts)
        ):
            graph.add(graph.start(runtime), s, LAUNCH)
            launched = True
        elif (
            prev >= 0
            and graph.node_ts[s] - graph.node_ts[prev] < KERNEL_GAP_NS
            and (waited_end < 0 or graph.node_ts[waited_end] < graph.node_ts[prev])
        ):
            graph.add(prev, s, KERNEL_KERNEL, owner=int(graph.spans[prev // 2]))
        if zero_weight_launch_edges and not launched:
            graph.add(graph.start(runtime), s, LAUNCH, zero=True)
        last[stream] = e


def _sync_edges(
    graph: Graph, syncs: SyncLinks, r: int, runtime: int, last: dict[int, int], pending: dict[int, int]
) -> None:
    """One synchronisation: a wait between streams becomes pending for the work it holds back; a
    CPU wait gets edges from the work it waited on to its runtime call's end."""
    kind = syncs.kind[r]
    if kind == STREAM_WAIT:
        src, dest = syncs.wait_src.get(r, -1), syncs.wait_dest.get(r, -1)
        if src >= 0 and dest >= 0:
            pending[dest] = src
        return
    call_end = graph.end(runtime) if runtime >= 0 else -1
    if call_end < 0:
        return
    if kind == EVENT_SYNC:
        src = syncs.wait_src.get(r, -1)
        waited = [graph.end(src)] if src >= 0 else []
    elif kind == STREAM_SYNC:
        waited = [last.get(syncs.stream[r], -1)]
    else:
        waited = list(last.values())
    for u in waited:
        if u >= 0:
            graph.add(u, call_end, SYNC)


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
