"""The dependency graph of one rank's trace window, with Holistic Trace Analysis's model (HTA's
``CPGraph``, ``hta/analyzers/critical_path_analysis.py`` at f4d0062), in numpy: each kind of edge is
made as arrays (``critical_stack.py``, ``critical_device.py``), in the order a walk would add them.

Every CPU op and runtime call in the window, and every piece of device work launched from it, has a
start node and an end node. Edges, each with a weight (ns) and the span its time belongs to:

- *operator*: between consecutive nodes of one CPU thread's call stack (a DFS of the nesting), so a
  span's own time is the sum of its edges between children; the time between two top-level ops is
  a zero-weight *dependency* (HTA counts it nowhere). Blocking synchronisations (HTA's list) weigh 0.
- runtime calls that take CUDA's runtime lock (``cudaLaunchKernel``, ``cudaMemcpyAsync``,
  ``cudaHostAlloc``) are ordered across threads by when they end; their own time is one edge.
- *launch*: from a launch call's start to its work's start, when the work found an empty stream
  (the stream's queue held only it), else a zero-weight launch edge keeps causality;
  *kernel-kernel*: from the previous work's end on the stream to the next one's start (gaps under
  1.5 ms);
- *sync*: ``cudaStreamWaitEvent`` (the work recorded before the event, to the next work launched on
  the waiting stream), ``cudaEventSynchronize``, ``cudaStreamSynchronize`` and
  ``cudaDeviceSynchronize`` (the work waited on, to the call's end), read from the trace's
  ``cuda_sync`` events.

Where two edges join the same two nodes the later one stands, as in HTA's networkx graph.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from layerscope.analysis.critical_device import device_edges
from layerscope.analysis.critical_edges import (
    DEPENDENCY,
    OPERATOR,
    SYNC,
    Edges,
    ordered,
)
from layerscope.analysis.critical_stack import call_stack_edges
from layerscope.analysis.critical_sync import sync_links
from layerscope.analysis.critical_waits import hidden_graph_work, waits_from_overlap
from layerscope.events.table import EventKind, EventTable

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
_CPU_KINDS = (EventKind.CPU_OP, EventKind.USER_ANNOTATION, EventKind.RUNTIME, EventKind.PYTHON)
_WORK_KINDS = (EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET)


def _none() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass
class Graph:
    """Nodes (two per span in ``spans``: ``2j`` its start, ``2j + 1`` its end) and edges (arrays)."""

    spans: np.ndarray  # the spans with nodes, table indices
    node_ts: np.ndarray  # ns
    slot: np.ndarray  # table index -> j, -1 for spans without nodes
    parent: np.ndarray  # table index -> enclosing CPU span on its (merged) thread, -1
    src: np.ndarray = field(default_factory=_none)
    dst: np.ndarray = field(default_factory=_none)
    weight: np.ndarray = field(default_factory=_none)  # ns; 0: dependencies, syncs, zero edges
    kind: np.ndarray = field(default_factory=_none)
    owner: np.ndarray = field(default_factory=_none)  # the span an edge's time belongs to, -1 none
    lanes: np.ndarray = field(default_factory=_none)  # the nodes thread by thread, stream by stream

    def start(self, span: int) -> int:
        """The start node of ``span`` (-1 without nodes)."""
        j = int(self.slot[span])
        return 2 * j if j >= 0 else -1

    def end(self, span: int) -> int:
        """The end node of ``span`` (-1 without nodes)."""
        j = int(self.slot[span])
        return 2 * j + 1 if j >= 0 else -1

    def set_edges(self, edges: Edges) -> None:
        """The graph's edges, in order; weighted by the time between their nodes unless a
        dependency, a sync or zero."""
        weighted = ~edges.zero & (edges.kind != DEPENDENCY) & (edges.kind != SYNC)
        self.src, self.dst, self.kind, self.owner = edges.src, edges.dst, edges.kind, edges.owner
        self.weight = np.where(weighted, self.node_ts[edges.dst] - self.node_ts[edges.src], 0)


@dataclass(frozen=True)
class Window:
    """What of the table a graph covers: CPU spans starting in ``[start, end]``, and the work and
    synchronisations their calls launched."""

    start: int
    end: int
    data_load: tuple[str, ...] = ()  # name patterns (regex) of data-loading spans: nodes too


def build_graph(
    table: EventTable, window: Window, zero_weight_launch_edges: bool = True, hta_compatible: bool = False
) -> Graph:
    """The dependency graph of ``window``: nodes, then the lock, call-stack and device edges.
    ``hta_compatible``: HTA's graph exactly; else also every kernel of a CUDA graph launch, the
    device work still running from before the window (from the window's start), and waits read
    from overlap where the trace has no ``cuda_sync`` event (``critical_waits.py``)."""
    kinds = table.array("span_kind")
    ts, dur = table.array("span_ts"), table.array("span_dur")
    launcher = launchers(table)
    cpu = np.isin(kinds, [int(k) for k in _CPU_KINDS]) & (ts >= window.start) & (ts <= window.end) & (dur > 0)
    launched = (launcher >= 0) & cpu[np.maximum(launcher, 0)]
    is_work = np.isin(kinds, [int(k) for k in _WORK_KINDS])
    work = is_work & launched
    lagging = np.zeros(table.span_count, dtype=bool)
    if hta_compatible:
        work[hidden_graph_work(table, launcher, work)] = False
    else:  # launched before the window, still running in it
        before = (launcher >= 0) & ~launched & (ts[np.maximum(launcher, 0)] < window.start)
        lagging = is_work & before & (ts < window.end) & (ts + dur > window.start)
        work |= lagging
    node_cpu = cpu & np.isin(kinds, [int(EventKind.CPU_OP), int(EventKind.RUNTIME)])
    if window.data_load:
        pattern = re.compile("|".join(f"(?:{p})" for p in window.data_load))
        loading = np.asarray([bool(pattern.search(n)) for n in table.names], dtype=bool)
        node_cpu |= cpu & loading[table.array("span_name")]
    spans = np.flatnonzero(node_cpu | work)
    slot = np.full(table.span_count, -1, dtype=np.int64)
    slot[spans] = np.arange(spans.size)
    node_ts = np.empty(2 * spans.size, dtype=np.int64)
    node_ts[0::2] = np.where(lagging[spans], np.maximum(ts[spans], window.start), ts[spans])
    node_ts[1::2] = ts[spans] + dur[spans]
    graph = Graph(spans, node_ts, slot, np.full(table.span_count, -1, dtype=np.int64))
    names = table.names
    name_of = table.array("span_name")
    lock = np.asarray([n in LOCK_CALLS for n in names], dtype=bool)[name_of] & (slot >= 0)
    blocking = np.asarray([n in BLOCKING_CALLS for n in names], dtype=bool)[name_of]
    threads = _threads(table, np.flatnonzero(cpu))
    syncs = sync_links(table, launcher, (window.start, window.end), cpu)
    nodes = (spans, node_ts, slot)
    stack, cpu_lanes = call_stack_edges(table, threads, slot, graph.parent, lock, blocking)
    device, device_lanes = device_edges(
        table, nodes, work, launcher, syncs, zero_weight_launch_edges, hta_compatible
    )
    edges = Edges.join([_lock_edges(graph, np.flatnonzero(lock)), stack, device])
    if not hta_compatible:
        edges = waits_from_overlap(table, launcher, syncs, nodes, work, edges)
    graph.set_edges(edges)
    graph.lanes = np.concatenate([cpu_lanes, device_lanes])
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


def _lock_edges(graph: Graph, lock: np.ndarray) -> Edges:
    """Runtime calls under CUDA's runtime lock, all threads: nodes in time order; at each end, an
    edge from every start still open, latest first (the call's own time from its start, a
    dependency from the others'), and a dependency from the previous node when that was an end."""
    if not lock.size:
        return Edges.of([], [], [])
    nodes = np.concatenate([2 * graph.slot[lock], 2 * graph.slot[lock] + 1])
    span = np.concatenate([lock, lock])
    order = np.lexsort((nodes & 1, span, graph.node_ts[nodes]))
    seq, span = nodes[order], span[order]
    is_end = (seq & 1).astype(bool)
    ends = np.flatnonzero(is_end)
    # every end takes the starts since the previous end: the k-th end those with k ends before them
    starts = np.flatnonzero(~is_end)
    taken = (np.cumsum(is_end) - is_end)[starts]
    starts, by = starts[taken < ends.size], ends[taken[taken < ends.size]]
    own = seq[starts] == seq[by] - 1
    popped = Edges.of(seq[starts], seq[by], np.where(own, OPERATOR, DEPENDENCY), np.where(own, span[by], -1))
    after_end = ends[(ends > 0) & is_end[np.maximum(ends - 1, 0)]]
    chained = Edges.of(seq[after_end - 1], seq[after_end], DEPENDENCY)
    return ordered([(by, -starts, popped), (after_end, np.full(after_end.size, seq.size), chained)])


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
