"""The windows whose running peaks become each bucket's peak.

* Every entry into a bucket: a module call, a backward node, the outermost span of an unattributed
  entry (the optimizer step, zero_grad, an op outside every module) — any CPU span whose parent is in
  another bucket, or that has none. Steps are no entry: their peaks are the step table's.
* Every module call's backward stretch: from the first to the last backward node made by an op inside
  that call (its children's ops included), on the thread that ran them. A module's backward peak is
  the running peak over that stretch, not the largest single node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.attribution import nest_native
from layerscope.attribution.buckets import Buckets
from layerscope.attribution.nesting import Sweep
from layerscope.events.table import EventTable


@dataclass(frozen=True)
class Windows:
    """Time windows as columns: thread, start and end (ns), and the bucket each one's peak goes to."""

    tid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    bucket: np.ndarray

    def joined(self, other: Windows) -> Windows:
        """These windows and ``other``'s."""
        return Windows(
            np.concatenate([self.tid, other.tid]),
            np.concatenate([self.start, other.start]),
            np.concatenate([self.end, other.end]),
            np.concatenate([self.bucket, other.bucket]),
        )


def peak_windows(
    table: EventTable,
    order: np.ndarray,
    parent: np.ndarray,
    bucket: np.ndarray,
    buckets: Buckets,
    swept: Sweep,
) -> Windows:
    """Entries into buckets plus the backward stretch of every module call (module docstring)."""
    ts, dur, tids = table.array("span_ts"), table.array("span_dur"), table.array("span_tid")
    p = parent[order]
    entry = (p < 0) | (bucket[np.maximum(p, 0)] != bucket[order])
    entries = order[entry & (bucket[order] >= 0)]
    if swept.step_spans:
        entries = entries[~np.isin(entries, np.asarray(swept.step_spans, dtype=np.int64))]
    entry_windows = Windows(tids[entries], ts[entries], (ts + dur)[entries], bucket[entries])
    stretches = _backward_stretches(table, parent, bucket, buckets, swept)
    return Windows(
        *(
            np.concatenate([getattr(entry_windows, f), getattr(stretches, f)])
            for f in ("tid", "start", "end", "bucket")
        )
    )


def _backward_stretches(
    table: EventTable, parent: np.ndarray, bucket: np.ndarray, buckets: Buckets, swept: Sweep
) -> Windows:
    empty = np.zeros(0, dtype=np.int64)
    none = Windows(empty, empty, empty, empty)
    if not swept.module_windows or not swept.backward_windows:
        return none
    ts, dur, tids = table.array("span_ts"), table.array("span_dur"), table.array("span_tid")
    nodes = np.asarray(swept.backward_windows, dtype=np.int64)
    # each node's forward op, as the sweep found it
    owner = swept.forward_op_of.lookup(table.array("span_fwd_tid")[nodes], table.array("span_seq")[nodes])
    nodes, cand = nodes[owner >= 0], owner[owner >= 0]
    is_call = np.zeros(table.span_count, dtype=bool)
    is_call[np.asarray(swept.module_windows, dtype=np.int64)] = True
    pair_call: list[np.ndarray] = []
    pair_node: list[np.ndarray] = []
    # Walk every node's forward op up through its ancestors at once, one nesting level per step,
    # pairing the node with each module call on the way.
    while cand.size:
        hit = is_call[cand]
        pair_call.append(cand[hit])
        pair_node.append(nodes[hit])
        up = parent[cand]
        nodes, cand = nodes[up >= 0], up[up >= 0]
    if not pair_call:
        return none
    calls = np.concatenate(pair_call)
    node_of = np.concatenate(pair_node)
    if not calls.size:
        return none
    unique_calls, _, slot = nest_native.unique(calls)
    start = np.full(unique_calls.size, np.iinfo(np.int64).max, dtype=np.int64)
    end = np.zeros(unique_calls.size, dtype=np.int64)
    np.minimum.at(start, slot, ts[node_of])
    np.maximum.at(end, slot, ts[node_of] + dur[node_of])
    first_node = np.full(unique_calls.size, -1, dtype=np.int64)
    first_node[slot[::-1]] = node_of[::-1]  # any node of the call: its thread ran the backward
    backward_of = buckets.backward_of_module()  # recomputed ops run in backward buckets
    lookup = np.full(buckets.count + 1, -1, dtype=np.int64)  # the last entry: no bucket (-1)
    if backward_of:
        lookup[np.fromiter(backward_of, dtype=np.int64)] = np.fromiter(backward_of.values(), dtype=np.int64)
    stretch_bucket = lookup[bucket[unique_calls]]
    keep = stretch_bucket >= 0
    return Windows(tids[first_node][keep], start[keep], end[keep], stretch_bucket[keep])
