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

from layerscope.attribution import nest_native
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
from layerscope.attribution.forward_ops import ForwardOps
from layerscope.attribution.nesting import Sweep, sweep
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
    native = nest_native.nest(table, order)  # the same, in one pass, when the kernels are built
    parent = native.parent if native is not None else parents(table, order)
    excl = native.excl if native is not None else exclusive(table, order, parent)
    no_calls = [0] * buckets.module_count
    found = Sweep(parent, excl, np.full(table.span_count, -1, dtype=np.int64), no_calls, list(no_calls))
    found.levels = native.levels if native is not None else None
    found.forward_op_of = ForwardOps.of(table, order)
    found.module_windows = order[role_in_order == ROLE_MODULE].tolist()
    found.backward_windows = order[role_in_order == ROLE_BACKWARD_NODE].tolist()
    found.step_spans = order[role_in_order == ROLE_STEP].tolist()
    anchor = _anchors(order, parent, span_role, found.levels)
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
    found.bucket[order] = chosen[index[anchor[order]]]
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


def _anchors(
    order: np.ndarray, parent: np.ndarray, span_role: np.ndarray, levels: list[np.ndarray] | None = None
) -> np.ndarray:
    """Per span, the span whose bucket it takes: itself, or for a plain span (or compiled graph
    call) inside anything but a step, its parent's anchor: level by level down from the top when
    the nesting ``levels`` are known (each span looked up once), else by pointer doubling."""
    anchor = np.arange(parent.size, dtype=np.int64)
    p = parent[order]
    role = span_role[order]
    inherits = ((role == ROLE_PLAIN) | (role == ROLE_COMPILED_GRAPH)) & (p >= 0)
    inherits[inherits] = span_role[p[inherits]] != ROLE_STEP
    anchor[order[inherits]] = p[inherits]
    if levels is not None:  # a parent's level comes before its children's: its anchor is final
        for level in levels[1:]:
            anchor[level] = anchor[anchor[level]]
        return anchor
    while True:
        up = anchor[anchor]
        if np.array_equal(up, anchor):
            return anchor
        anchor = up


_LABEL = -3  # an anchor whose bucket is a label's (numbered once all are known)
_OPEN = -2  # a backward node whose forward op's anchor is not settled yet


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
) -> np.ndarray:
    """The sweep's bucket rules for the anchors, one bucket per anchor, as the sweep would choose
    them in time order: module buckets first, then backward nodes from their forward ops' anchors,
    then the labels, numbered in order of first use."""
    role = span_role[anchors]
    name_of = table.array("span_name")[anchors]
    seq, fwd_tid = table.array("span_seq")[anchors], table.array("span_fwd_tid")[anchors]
    bucket = np.full(anchors.size, _LABEL, dtype=np.int64)
    # module calls: the forward bucket, or inside a backward node (checkpointing's recomputation,
    # recompute.py) the backward one, counted as a recomputation
    modules = np.flatnonzero(role == ROLE_MODULE)
    m = np.asarray(role_module, dtype=np.int64)[name_of[modules]]
    again = _recomputed(anchors[modules], parent, span_role)
    bucket[modules] = 2 * m + again  # Buckets.with_phase
    found.module_calls = np.bincount(m[~again], minlength=buckets.module_count).tolist()
    found.recompute_calls = np.bincount(m[again], minlength=buckets.module_count).tolist()
    # a backward node goes to its forward op's module, backward, when that op came first
    nodes = np.flatnonzero(role == ROLE_BACKWARD_NODE)
    owner = found.forward_op_of.lookup(fwd_tid[nodes], seq[nodes])
    first = owner >= 0
    first[first] = position[owner[first]] < position[anchors[nodes[first]]]
    owned = np.full(nodes.size, -1, dtype=np.int64)
    owned[first] = np.searchsorted(position[anchors], position[anchor[owner[first]]])
    bucket[nodes[first]] = _OPEN
    _settle_nodes(bucket, nodes[first], owned[first], buckets.module_bucket_count)
    return _number_labels(table, bucket, role, name_of, seq, fwd_tid, buckets, recorded_ops_are_forward)


def _recomputed(spans: np.ndarray, parent: np.ndarray, span_role: np.ndarray) -> np.ndarray:
    """Whether each module range is inside a backward node (checkpointing's recomputation)."""
    recomputed = np.zeros(spans.size, dtype=bool)
    at, up = np.arange(spans.size), parent[spans]
    while at.size:  # up the chain, one level per pass
        alive = up >= 0
        at, up = at[alive], up[alive]
        hit = span_role[up] == ROLE_BACKWARD_NODE
        recomputed[at[hit]] = True
        at, up = at[~hit], parent[up[~hit]]
    return recomputed


def _settle_nodes(bucket: np.ndarray, nodes: np.ndarray, owned: np.ndarray, module_buckets: int) -> None:
    """Backward nodes (``_OPEN``) take the backward bucket of the module their forward op's anchor
    went to, or a label. An owner that is itself an open node (a forward op run inside backward) is
    always earlier, so each pass settles at least the earliest open node."""
    while nodes.size:
        b = bucket[owned]
        settled = b != _OPEN
        is_module = settled & (b >= 0) & (b < module_buckets)
        bucket[nodes[is_module]] = b[is_module] | 1  # Buckets.backward_of_module
        bucket[nodes[settled & ~is_module]] = _LABEL
        nodes, owned = nodes[~settled], owned[~settled]


def _number_labels(
    table: EventTable,
    bucket: np.ndarray,
    role: np.ndarray,
    name_of: np.ndarray,
    seq: np.ndarray,
    fwd_tid: np.ndarray,
    buckets: Buckets,
    recorded_ops_are_forward: bool,
) -> np.ndarray:
    """Label buckets for the anchors marked ``_LABEL``, made in order of first use: a backward node's
    (named after the node), the steps' gaps, or an op's own name (forward work where modules are
    unknown and autograd recorded the op)."""
    picked = np.flatnonzero(bucket == _LABEL)
    if not picked.size:
        return bucket
    n = len(table.names)
    forward = recorded_ops_are_forward & (seq[picked] >= 0) & (fwd_tid[picked] == 0)
    r = role[picked]
    code = np.where(
        r == ROLE_BACKWARD_NODE,
        2 * n + name_of[picked],
        np.where(r == ROLE_STEP, 3 * n, 2 * name_of[picked] + forward),
    )
    codes, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    counts = np.bincount(inverse.reshape(-1), minlength=codes.size).tolist()
    made = np.zeros(codes.size, dtype=np.int64)
    names = table.names
    for k in np.argsort(first, kind="stable").tolist():  # in order of first use
        c = int(codes[k])
        if c == 3 * n:
            label, phase = LABEL_STEP_GAPS, Phase.OTHER
        elif c >= 2 * n:
            label, phase = backward_node_name(names[c - 2 * n]) or "", Phase.BACKWARD
        else:
            label, phase = names[c // 2], Phase.FORWARD if c & 1 else Phase.OTHER
        made[k] = buckets.unattributed(label, phase, counts[k])
    bucket[picked] = made[inverse.reshape(-1)]
    return bucket
