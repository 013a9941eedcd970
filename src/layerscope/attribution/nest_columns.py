"""The sweep over CPU spans in numpy: the same :class:`~layerscope.attribution.nesting.Sweep` as
:func:`~layerscope.attribution.nesting.sweep`, with Python only for the spans that choose a bucket.

Nesting by torch's rule with a stack per thread has a closed form: a span's parent is the *latest*
earlier span (time order, same thread) that contains it, i.e. that ends no earlier than it and after
it starts. (A span the stack popped was popped by a later span that contains everything the popped
one still could.) Over half the spans are first children (the span just before contains them); the
others are answered at once by a binary descent over a sparse table of range maxima of the ends.

Exclusive time: a span owns its instants from ``own``, the latest of its start, its previous
sibling's end (siblings' ends never decrease in time order) and its ancestors' ``own`` (a maximum up
the chain, by pointer doubling). Its exclusive time is ``end - own`` (never below 0) less what its
children own.

Buckets: a plain span (and a compiled graph call) inside anything but a step inherits its parent's
bucket, so only the others ("anchors": module ranges, backward nodes, steps, top-level ops) go
through the sweep's rules, in time order, which keeps the label buckets numbered in order of first
use; every other span takes its anchor's bucket. Tables where torch.compile compiled (its rule runs
through inherited buckets), or too large for the table of maxima, take the Python sweep.
"""

from __future__ import annotations

import numpy as np

from layerscope.attribution.buckets import (
    LABEL_STEP_GAPS,
    ROLE_BACKWARD_NODE,
    ROLE_COMPILED_GRAPH,
    ROLE_COMPILING,
    ROLE_MODULE,
    ROLE_PLAIN,
    ROLE_STEP,
    Buckets,
)
from layerscope.attribution.nesting import Sweep, forward_ops, sweep
from layerscope.events.names import backward_node_name
from layerscope.events.table import EventTable
from layerscope.model.profile import Phase

#: Above this many CPU spans the table of maxima (8 bytes x spans x log2(spans)) is not worth its
#: memory: the Python sweep runs instead.
MAX_SPANS = 1 << 22


def sweep_columns(
    table: EventTable,
    order: np.ndarray,
    roles: list[int],
    role_module: list[int],
    buckets: Buckets,
    recorded_ops_are_forward: bool = False,
) -> Sweep:
    """What :func:`~layerscope.attribution.nesting.sweep` finds, identical, vectorised."""
    role_of_name = np.asarray(roles, dtype=np.int64)
    span_role = role_of_name[table.array("span_name")] if roles else np.zeros(table.span_count, np.int64)
    role_in_order = span_role[order]
    if order.size > MAX_SPANS or bool((role_in_order == ROLE_COMPILING).any()):
        return sweep(table, order, roles, role_module, buckets, recorded_ops_are_forward)
    parent = parents(table, order)
    excl = exclusive(table, order, parent)
    found = Sweep(
        parent.tolist(),
        excl.tolist(),
        [-1] * table.span_count,
        [0] * buckets.module_count,
        [0] * buckets.module_count,
    )
    found.forward_op_of = forward_ops(table, order)
    found.module_windows = order[role_in_order == ROLE_MODULE].tolist()
    found.backward_windows = order[role_in_order == ROLE_BACKWARD_NODE].tolist()
    found.step_spans = order[role_in_order == ROLE_STEP].tolist()
    anchor = _anchors(order, parent, span_role)
    is_anchor = anchor[order] == order
    found.compiled_graph_spans = order[~is_anchor & (role_in_order == ROLE_COMPILED_GRAPH)].tolist()
    position = np.full(table.span_count, order.size, dtype=np.int64)
    position[order] = np.arange(order.size)
    anchors = order[is_anchor]
    chosen = _anchor_buckets(
        table,
        anchors,
        span_role,
        role_module,
        buckets,
        found,
        parent,
        anchor,
        position,
        recorded_ops_are_forward,
    )
    index = np.zeros(table.span_count, dtype=np.int64)  # an anchor's place among the anchors
    index[anchors] = np.arange(anchors.size)
    everything = np.full(table.span_count, -1, dtype=np.int64)
    everything[order] = np.asarray(chosen, dtype=np.int64)[index[anchor[order]]]
    found.bucket = everything.tolist()
    found.arrays = {"parent": parent, "excl": excl, "bucket": everything}
    return found


def parents(table: EventTable, order: np.ndarray) -> np.ndarray:
    """Each CPU span's parent (-1 at top level; -1 for spans not in ``order``): the latest earlier
    span on its thread whose end is at least its end and after its start."""
    parent = np.full(table.span_count, -1, dtype=np.int64)
    n = order.size
    if not n:
        return parent
    seq = order[np.argsort(table.array("span_tid")[order], kind="stable")]  # per thread, time order
    tid = table.array("span_tid")[seq]
    start = table.array("span_ts")[seq]
    end = start + table.array("span_dur")[seq]
    need = np.maximum(end, start + 1)  # a container ends no earlier, and after the span starts
    first = np.flatnonzero(np.r_[True, tid[1:] != tid[:-1]])
    floor = np.repeat(first, np.diff(np.r_[first, n]))  # the thread's first position
    found = np.arange(-1, n - 1, dtype=np.int64)  # the span just before: a first child's parent
    rest = np.flatnonzero((found < floor) | (end[np.maximum(found, 0)] < need))
    if rest.size:
        found[rest] = _latest_reaching(end, need[rest], rest, floor[rest])
    parent[seq] = np.where(found >= floor, seq[np.maximum(found, 0)], -1)
    return parent


def _latest_reaching(end: np.ndarray, need: np.ndarray, pos: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """For each query, the latest position before ``pos`` (and at or after ``floor``) whose ``end``
    is at least ``need``; ``floor - 1`` where none is. A binary descent over a sparse table of range
    maxima: blocks of ends that all fall short are skipped leftwards, largest blocks first."""
    maxima = [end]  # maxima[k][i] = max(end[i : i + 2**k])
    while (2 << (len(maxima) - 1)) <= end.size:
        prev, half = maxima[-1], 1 << (len(maxima) - 1)
        maxima.append(np.maximum(prev[:-half], prev[half:]))
    pos = pos.copy()
    for k in range(len(maxima) - 1, -1, -1):
        lo = pos - (1 << k)
        skip = maxima[k].take(lo, mode="clip") < need
        skip &= lo >= floor
        pos -= skip.astype(np.int64) << k
    return pos - 1


def exclusive(table: EventTable, order: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Each span's exclusive time as the sweep counts it (overlapping siblings own their instants
    once); spans not in ``order`` keep their duration."""
    ts, dur = table.array("span_ts"), table.array("span_dur")
    excl = dur.copy()
    if not order.size:
        return excl
    end = ts + dur
    # siblings (same parent; top-level spans: same thread) next to each other, in time order
    key = np.where(parent[order] >= 0, parent[order], -1 - table.array("span_tid")[order])
    by_key = np.argsort(key, kind="stable")
    siblings, key = order[by_key], key[by_key]
    start = ts[siblings]
    after = np.flatnonzero(key[1:] == key[:-1]) + 1  # positions with a previous sibling
    claim = start.copy()
    claim[after] = np.maximum(start[after], np.maximum(ts, end)[siblings[after - 1]])
    own = ts.copy()
    own[siblings] = claim
    # and no earlier than its ancestors' own starts: the maximum up the chain, by pointer doubling
    up = parent.copy()
    while True:
        has = np.flatnonzero(up >= 0)
        if not has.size:
            break
        own[has] = np.maximum(own[has], own[up[has]])
        up[has] = up[up[has]]
    own_ns = np.maximum(end - own, 0)
    excl[order] = own_ns[order]
    inner = order[parent[order] >= 0]
    excl -= np.bincount(parent[inner], weights=own_ns[inner], minlength=excl.size).astype(np.int64)
    return excl


def _anchors(order: np.ndarray, parent: np.ndarray, span_role: np.ndarray) -> np.ndarray:
    """Per span, the span whose bucket it takes: itself, or for a plain span (or compiled graph
    call) inside anything but a step, its parent's anchor (pointer doubling up the chain)."""
    anchor = np.arange(parent.size, dtype=np.int64)
    p = parent[order]
    role = span_role[order]
    inherits = ((role == ROLE_PLAIN) | (role == ROLE_COMPILED_GRAPH)) & (p >= 0)
    inherits[inherits] = span_role[p[inherits]] != ROLE_STEP
    anchor[order[inherits]] = p[inherits]
    while True:
        up = anchor[anchor]
        if np.array_equal(up, anchor):
            return anchor
        anchor = up


def _anchor_buckets(
    table: EventTable,
    anchors: np.ndarray,
    span_role: np.ndarray,
    role_module: list[int],
    buckets: Buckets,
    found: Sweep,
    parent: np.ndarray,
    anchor: np.ndarray,
    position: np.ndarray,
    recorded_ops_are_forward: bool,
) -> list[int]:
    """The sweep's bucket rules for the anchors (in time order: label buckets are numbered by first
    use), one bucket per anchor. What the rules ask of other spans is looked up in numpy first."""
    role = span_role[anchors]
    names, name_of = table.names, table.array("span_name")[anchors].tolist()
    seq, fwd_tid = table.array("span_seq")[anchors], table.array("span_fwd_tid")[anchors]
    # a module range inside a backward node is checkpointing's recomputation (recompute.py)
    recomputed = np.zeros(anchors.size, dtype=bool)
    modules = np.flatnonzero(role == ROLE_MODULE)
    up = parent[anchors[modules]]
    while modules.size:  # up the chain, one level per pass
        alive = up >= 0
        modules, up = modules[alive], up[alive]
        hit = span_role[up] == ROLE_BACKWARD_NODE
        recomputed[modules[hit]] = True
        modules, up = modules[~hit], parent[up[~hit]]
    # a backward node's forward op, and the anchor whose bucket it had: set only if it came first
    nodes = np.flatnonzero(role == ROLE_BACKWARD_NODE)
    op_of = found.forward_op_of
    owner = np.fromiter(
        (op_of.get(key, -1) for key in zip(fwd_tid[nodes].tolist(), seq[nodes].tolist(), strict=True)),
        dtype=np.int64,
        count=nodes.size,
    )
    owner[seq[nodes] < 0] = -1
    first = owner >= 0
    first[first] = position[owner[first]] < position[anchors[nodes[first]]]
    owned = np.full(anchors.size, -1, dtype=np.int64)
    owned[nodes[first]] = np.searchsorted(position[anchors], position[anchor[owner[first]]])
    forward_bucket, backward_of = buckets.forward_buckets(), buckets.backward_of_module()
    forward = (recorded_ops_are_forward & (seq >= 0) & (fwd_tid == 0)).tolist()
    bucket: list[int] = []
    node_labels: dict[int, str] = {}  # per backward node name id, its entry's label
    rows = zip(role.tolist(), name_of, recomputed.tolist(), owned.tolist(), forward, strict=True)
    for r, name_id, again, k, is_forward in rows:
        if r == ROLE_MODULE:
            m = role_module[name_id]
            if again:
                found.recompute_calls[m] += 1
                b = forward_bucket[m] + 1
            else:
                found.module_calls[m] += 1
                b = forward_bucket[m]
        elif r == ROLE_BACKWARD_NODE:
            b = backward_of.get(bucket[k], -1) if k >= 0 else -1  # the owner's module, backward
            if b < 0:
                label = node_labels.get(name_id)
                if label is None:
                    label = node_labels[name_id] = backward_node_name(names[name_id]) or ""
                b = buckets.unattributed(label, Phase.BACKWARD)
        elif r == ROLE_STEP:
            b = buckets.unattributed(LABEL_STEP_GAPS, Phase.OTHER)
        else:
            b = buckets.unattributed(names[name_id], Phase.FORWARD if is_forward else Phase.OTHER)
        bucket.append(b)
    return bucket
