"""The heaviest path through the critical path's graph, mostly in numpy.

Nearly every node of the graph (~95% on real traces) has exactly one incoming edge: a node's
distance is then its predecessor's plus the edge. Runs of such nodes that follow each other on a
thread or stream are cumulative sums; the runs are chained by pointer jumping (each node's distance
from the nearest node with zero or several incoming edges, its *root*); only the roots with several
incoming edges go through a loop, in topological order.

Ties are broken as before this was vectorised (``tests/critical_reference.py``): a node's best
incoming edge is the first heaviest in edge order; the path ends at the first node of the longest
distance in Kahn's order (time order among those ready). That node is the one tied node no other
tied node reaches, when there is one (there always was on the traces we have); otherwise Kahn's
order is computed, in a plain loop.
"""

from __future__ import annotations

import numpy as np


def heaviest_path(
    n: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray, lanes: np.ndarray | None = None
) -> np.ndarray:
    """The edges (indices into ``src``) of the heaviest path through a DAG of ``n`` nodes, in
    order; weights are at least 0, no two edges join the same two nodes. Raises on a cycle.
    ``lanes``: the nodes in an order where a node's single predecessor often comes just before it
    (a thread's nodes in time order, then another's): such runs are summed at once."""
    if np.any(src == dst):
        raise ValueError("the dependency graph has a cycle")
    indeg = np.bincount(dst, minlength=n)
    into = np.argsort(dst, kind="stable")  # incoming edges, node by node, in edge order
    first_in = np.searchsorted(dst[into], np.arange(n + 1))
    single = indeg == 1
    best = np.full(n, -1, dtype=np.int64)
    best[single] = into[first_in[:-1][single]]
    runs = _Runs(lanes if lanes is not None else np.arange(n), src, weight, best)
    root, offset = runs.roots()
    dist = np.zeros(n, dtype=np.int64)  # for now, of the roots only
    merge = np.flatnonzero(indeg > 1)
    if merge.size:
        _merge_distances(merge, root, offset, (src, weight, into, first_in), dist, best)
    dist = dist[root] + offset
    path: np.ndarray = best[runs.walk(_path_end(n, src, dst, dist), src, best)[1:]]
    return path


class _Runs:
    """Runs of nodes, consecutive in ``lanes``, each the single successor of the one before: a
    node's distance from its run's head is a cumulative sum."""

    def __init__(self, lanes: np.ndarray, src: np.ndarray, weight: np.ndarray, best: np.ndarray) -> None:
        n = lanes.size
        self.lanes = lanes
        self.pos = np.empty(n, dtype=np.int64)
        self.pos[lanes] = np.arange(n)
        self.single = best >= 0
        self.parent = np.where(self.single, src[np.maximum(best, 0)], -1)
        self.gain = np.where(self.single, weight[np.maximum(best, 0)], 0)
        linked = (self.single & (self.pos[np.maximum(self.parent, 0)] == self.pos - 1))[lanes]
        starts = np.flatnonzero(~linked)
        run = np.cumsum(~linked) - 1
        total = np.cumsum(np.where(linked, self.gain[lanes], 0))
        self.head = np.empty(n, dtype=np.int64)
        self.head[lanes] = lanes[starts][run]
        self.within = np.empty(n, dtype=np.int64)
        self.within[lanes] = total - total[starts][run]
        self.heads = lanes[starts]

    def roots(self) -> tuple[np.ndarray, np.ndarray]:
        """Each node's root (the end of its chain of single predecessors) and distance from it."""
        n = self.lanes.size
        up, off = np.arange(n), np.zeros(n, dtype=np.int64)
        chained = self.heads[self.single[self.heads]]
        p = self.parent[chained]
        up[chained] = self.head[p]
        off[chained] = self.gain[chained] + self.within[p]
        _jump(up, off, chained)
        if np.any(self.single[up[chained]]):  # a root with a predecessor: the chain was a cycle
            raise ValueError("the dependency graph has a cycle")
        return up[self.head], off[self.head] + self.within

    def walk(self, end: int, src: np.ndarray, best: np.ndarray) -> np.ndarray:
        """The nodes of the best path into ``end``, from its first node, a run at a time."""
        parts = []
        v = end
        while v >= 0:
            h = int(self.head[v])
            parts.append(self.lanes[self.pos[h] : self.pos[v] + 1])
            v = int(src[best[h]]) if best[h] >= 0 else -1
        return np.concatenate(parts[::-1])


def _jump(root: np.ndarray, offset: np.ndarray, among: np.ndarray) -> None:
    """Pointer jumping over the nodes ``among`` (their roots among them too): each one's ``root``
    (the end of its chain) and its distance from it, in place. Raises when a chain never ends (a
    cycle; one whose length is a power of two ends on itself instead: the caller checks roots)."""
    active = among[root[root[among]] != root[among]]
    for _ in range(int(root.size).bit_length() + 1):
        if not active.size:
            return
        up = root[active]
        offset[active] += offset[up]
        root[active] = root[up]
        active = active[root[root[active]] != root[active]]
    if active.size:
        raise ValueError("the dependency graph has a cycle")


def _merge_distances(
    merge: np.ndarray,
    root: np.ndarray,
    offset: np.ndarray,
    edges: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    dist: np.ndarray,
    best: np.ndarray,
) -> None:
    """The distances and best incoming edges of the nodes with several incoming edges (``merge``),
    in Kahn's order of the graph between them: a node after the roots of its predecessors."""
    src, weight, into, first_in = edges
    count = first_in[merge + 1] - first_in[merge]
    bounds = np.concatenate([[0], np.cumsum(count)])
    incoming = into[np.repeat(first_in[merge] - bounds[:-1], count) + np.arange(bounds[-1])]
    local = np.full(dist.size, -1, dtype=np.int64)
    local[merge] = np.arange(merge.size)
    via = local[root[src[incoming]]]  # the merge node the edge's chain starts from, -1 a source
    gain = offset[src[incoming]] + weight[incoming]  # the edge's distance: its root's + gain
    head = np.repeat(np.arange(merge.size), count)
    waits = via >= 0
    need = np.bincount(head[waits], minlength=merge.size).tolist()
    by_via = np.argsort(via[waits], kind="stable")
    unblocks = head[waits][by_via].tolist()
    unblocks_at = np.searchsorted(via[waits][by_via], np.arange(merge.size + 1)).tolist()
    via_l, gain_l, at = via.tolist(), gain.tolist(), bounds.tolist()
    found = [0] * (merge.size + 1)  # per merge node; the last entry, 0, for sources (via -1)
    pick = [0] * merge.size
    ready = [k for k in range(merge.size) if need[k] == 0]
    done = 0
    while ready:
        k = ready.pop()
        done += 1
        top, chosen = -1, -1
        for i in range(at[k], at[k + 1]):
            d = found[via_l[i]] + gain_l[i]
            if d > top:
                top, chosen = d, i
        found[k], pick[k] = top, chosen
        for j in unblocks[unblocks_at[k] : unblocks_at[k + 1]]:
            need[j] -= 1
            if need[j] == 0:
                ready.append(j)
    if done != merge.size:
        raise ValueError("the dependency graph has a cycle")
    dist[merge] = found[:-1]
    best[merge] = incoming[np.asarray(pick, dtype=np.int64)]


def _path_end(n: int, src: np.ndarray, dst: np.ndarray, dist: np.ndarray) -> int:
    """The first node of the longest distance in Kahn's order: among the tied nodes, the one no
    other reaches (a zero-weight path between tied nodes), when there is one."""
    tied = dist == dist.max()
    reached = np.zeros(n, dtype=bool)
    reached[dst[tied[src] & tied[dst]]] = True
    first = np.flatnonzero(tied & ~reached)
    if first.size == 1:
        return int(first[0])
    order = kahn_order(n, src, dst)
    return max(order, key=lambda node: int(dist[node]))


def kahn_order(n: int, src: np.ndarray, dst: np.ndarray) -> list[int]:
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
