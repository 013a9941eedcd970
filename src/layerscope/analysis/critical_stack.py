"""The critical path's call-stack edges (HTA's DFS of each CPU thread's call tree), vectorised.

HTA builds each thread's call tree with a stack over the spans' starts and ends in time order (at
one instant ends first, longer spans open first and close last; each start a child of the span on
top, each end closing the top), then walks it depth first. That walk *is* the stack's sequence of
events, an end standing for the span on top of the stack when it comes, so no tree is built here:
the events are sorted once (all threads, thread by thread) and each end is matched to the start it
closes by bracket matching (at each depth, starts and ends alternate in time order).
"""

from __future__ import annotations

import numpy as np

from layerscope.analysis.critical_edges import DEPENDENCY, OPERATOR, Edges
from layerscope.events.table import EventTable


def stack_events(table: EventTable, threads: list[np.ndarray], parent: np.ndarray) -> tuple[np.ndarray, ...]:
    """The depth-first walk of every thread's call tree, threads one after another: per event its
    span (for an end, the span it closes), whether it is a start, and its thread's rank. Sets
    ``parent`` (table index -> the span on top of the stack when it started, -1)."""
    spans = np.concatenate(threads)
    rank = np.repeat(np.arange(len(threads)), [t.size for t in threads])
    start, dur = table.array("span_ts")[spans], table.array("span_dur")[spans]
    opens = np.concatenate([np.ones(spans.size, bool), np.zeros(spans.size, bool)])
    order = np.lexsort(
        (
            np.concatenate([spans, -spans]),
            np.concatenate([-dur, dur]),
            opens,
            np.concatenate([start, start + dur]),
            np.concatenate([rank, rank]),
        )
    )
    span, is_open, thread = (
        np.concatenate([spans, spans])[order],
        opens[order],
        np.concatenate([rank, rank])[order],
    )
    # every span ends after it starts, so each thread's walk is balanced and depth is a running sum
    depth = np.cumsum(np.where(is_open, 1, -1))
    level = np.where(is_open, depth, depth + 1)
    by_level = np.argsort(level, kind="stable")
    closes = np.flatnonzero(~is_open[by_level])
    span[by_level[closes]] = span[by_level[closes - 1]]
    starts = np.flatnonzero(is_open)
    width = np.int64(span.size + 1)
    keys = level[starts] * width + starts  # by depth, then position
    ranked = np.argsort(keys, kind="stable")
    below = np.searchsorted(keys[ranked], (level[starts] - 1) * width + starts) - 1
    enclosing = span[starts[ranked[np.maximum(below, 0)]]]
    parent[span[starts]] = np.where(level[starts] > 1, enclosing, -1)
    return span, is_open, thread


def call_stack_edges(
    table: EventTable,
    threads: list[np.ndarray],
    slot: np.ndarray,
    parent: np.ndarray,
    lock: np.ndarray,
    blocking: np.ndarray,
) -> tuple[Edges, np.ndarray]:
    """Edges between consecutive nodes of each thread's walk (spans without nodes skipped): a
    dependency into a top-level span's start, else an operator edge owned by the span the time is
    spent in; none between two nodes of runtime-lock calls that the lock's edges join instead.
    Also the nodes in walk order, thread after thread."""
    if not threads:
        return Edges.of([], [], []), np.zeros(0, dtype=np.int64)
    span, is_open, thread = stack_events(table, threads, parent)
    keep = slot[span] >= 0
    span, is_open, thread = span[keep], is_open[keep], thread[keep]
    node = 2 * slot[span] + ~is_open
    step = np.where(is_open, 1, -1)
    depth = np.cumsum(step) - step  # node spans open before this event, on its thread
    v = np.flatnonzero(thread[1:] == thread[:-1]) + 1
    u = v - 1
    u_span, s, entering, after_start = span[u], span[v], is_open[v], is_open[u]
    shares_lock = lock[u_span] & lock[s] & (after_start | ~entering)
    owner = np.where(after_start, u_span, np.where(entering, parent[u_span], s))
    kind = np.where(entering & (depth[v] == 0), DEPENDENCY, OPERATOR)
    edges = Edges.of(node[u], node[v], kind, owner, ~entering & blocking[s])
    return edges.take(~shares_lock), node
