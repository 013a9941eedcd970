"""Nesting: one sweep over CPU spans in time order gives each span its parent, exclusive time and bucket.

The rules (see docs/architecture.md):

* CPU spans nest per thread by time (torch's own rule: a child starts inside its parent and ends
  no later). A span's *exclusive* time is its duration minus its direct children's. Spans on one
  thread that overlap without nesting (ranges closed out of order) each own their instants once:
  the later one only the time after the earlier one ends, so no exclusive time is negative.
* Forward: a span inside a layerscope module range belongs to the innermost such range.
* Backward: an ``autograd::engine::evaluate_function: X`` span carries the sequence number and
  forward thread of the op that created its autograd node; it belongs to that op's module, in the
  backward phase. Its children inherit it. Nodes without a forward owner (gradient accumulation,
  the loss's backward) become unattributed backward entries named after the node.
* FLOPs: a span's FLOPs count only if no enclosing span already counted FLOPs (``aten::convolution``
  counts, the ``aten::_convolution`` inside it does not), which is what FlopCounterMode does.

The sweep is the one Python loop of attribution (a hot path); the helpers after it work a nesting
level at a time with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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
from layerscope.attribution.compiled import LABEL_COMPILING
from layerscope.attribution.forward_ops import ForwardOps
from layerscope.events.intervals import union_length
from layerscope.events.names import backward_node_name
from layerscope.events.table import CPU_KINDS, EventTable
from layerscope.model.profile import Phase


def time_order(table: EventTable) -> np.ndarray:
    """CPU spans by start time, the longest first among equal starts (parents before children)."""
    ts_arr, dur_arr = table.array("span_ts"), table.array("span_dur")
    cpu_idx = np.flatnonzero(np.isin(table.array("span_kind"), [int(k) for k in CPU_KINDS]))
    # A stable sort by start is fast on spans recorded nearly in time order; only runs of equal
    # starts are then sorted again, longest first (ties kept in table order: what lexsort gives).
    by_start = np.argsort(ts_arr[cpu_idx], kind="stable")
    starts = ts_arr[cpu_idx[by_start]]
    tied = np.flatnonzero(starts[1:] == starts[:-1])
    if tied.size:
        at = np.union1d(tied, tied + 1)  # positions in runs of equal starts
        run = np.cumsum(np.r_[True, starts[at[1:]] != starts[at[:-1]]])
        members = by_start[at]
        by_start[at] = members[np.lexsort((-dur_arr[cpu_idx[members]], run))]
    return cpu_idx[by_start]


@dataclass
class Sweep:
    """What the sweep over CPU spans finds: nesting, exclusive time, buckets, module calls."""

    parent: np.ndarray  # enclosing span, -1 at top level (int64, per span)
    excl: np.ndarray  # duration minus direct children's (overlaps counted once, never below 0), ns
    bucket: np.ndarray  # -1 for spans that are not CPU spans
    module_calls: list[int]  # forward calls per module
    #: calls per module made inside the backward pass: activation checkpointing's recomputation
    recompute_calls: list[int]
    module_windows: list[int] = field(default_factory=list)  # module-range spans, in time order
    backward_windows: list[int] = field(default_factory=list)  # backward-node spans
    #: Forward ops by (thread, sequence number): what backward nodes and saved tensors point at.
    forward_op_of: ForwardOps = field(default_factory=lambda: ForwardOps(*[np.zeros(0, np.int64)] * 3))
    #: Step ranges (``events/steps.py``; the step windows are ``step_windows``'s, not these)
    step_spans: list[int] = field(default_factory=list)
    # compiled graph call spans (their kernels are children)
    compiled_graph_spans: list[int] = field(default_factory=list)
    compiling_bucket: int = -1  # the bucket of torch.compile compiling, -1 if it never did
    #: Span indices by nesting depth when the sweep found them (the native pass), else None.
    levels: list[np.ndarray] | None = None

    @staticmethod
    def start(module_count: int) -> Sweep:
        """Nothing found yet (``parent``, ``excl`` and ``bucket`` are set when the sweep ends)."""
        empty = np.zeros(0, dtype=np.int64)
        return Sweep(empty, empty, empty, [0] * module_count, [0] * module_count)


def sweep(
    table: EventTable,
    order: np.ndarray,
    roles: list[int],
    role_module: list[int],
    buckets: Buckets,
    recorded_ops_are_forward: bool = False,
) -> Sweep:
    """One pass over CPU spans in time order: nesting by torch's rule with a stack per thread,
    exclusive time, and each span's bucket (module range, backward node, inherited, or a label)."""
    span_name, span_tid, span_ts, span_dur = table.span_name, table.span_tid, table.span_ts, table.span_dur
    span_seq, span_fwd_tid, names = table.span_seq, table.span_fwd_tid, table.names
    # lists while the loop runs (indexing them is what it does most), arrays once it is done
    parent, excl, bucket = [-1] * table.span_count, list(span_dur), [-1] * table.span_count
    found = Sweep.start(buckets.module_count)
    module_windows, backward_windows = found.module_windows, found.backward_windows
    found.forward_op_of = ForwardOps.of(table, order)
    forward_op_of = found.forward_op_of.mapping()
    # Bucket numbers from tables that Buckets makes once: no method call per event.
    forward_bucket, backward_of = buckets.forward_buckets(), buckets.backward_of_module()
    compiling = -1  # the bucket of compilation, once seen
    # Per thread: open spans, their ends, how far each one's time is claimed (the first: top level).
    stacks: dict[int, tuple[list[int], list[int], list[int]]] = {}
    current_tid = None

    # The hot loop (one iteration per CPU span): keep it to list indexing and local names.
    for i in order.tolist():
        tid = span_tid[i]
        if tid != current_tid:
            open_idx, open_end, claimed = stacks.get(tid) or stacks.setdefault(tid, ([], [], [-(2**62)]))
            current_tid = tid
        start = span_ts[i]
        end = start + span_dur[i]
        while open_end and not (start < open_end[-1] >= end):
            del open_idx[-1], open_end[-1], claimed[-1]
        # A span that starts inside an earlier sibling and ends after it owns only the time after it:
        # every instant of a thread is one span's, so no self time is negative and selves add up.
        own = claimed[-1] if claimed[-1] > start else start
        excl[i] = own_ns = end - own if end > own else 0
        claimed[-1] = own + own_ns  # raising a claim to a later start moves no time
        if open_idx:
            p = parent[i] = open_idx[-1]
            excl[p] -= own_ns
        else:
            p = -1
        open_idx.append(i)
        open_end.append(end)
        claimed.append(own)

        name_id = span_name[i]
        role = roles[name_id]
        if role == ROLE_PLAIN and p >= 0 and roles[span_name[p]] != ROLE_STEP:
            b = bucket[p]
        elif compiling >= 0 and p >= 0 and bucket[p] == compiling:
            b = compiling  # whatever torch.compile runs while compiling (autograd on fake tensors too)
        elif role == ROLE_MODULE:
            b = _module_call(found, parent, role_module[name_id], p, span_name, roles, forward_bucket)
            module_windows.append(i)
        elif role == ROLE_BACKWARD_NODE:
            owner = forward_op_of.get((span_fwd_tid[i], span_seq[i]), -1) if span_seq[i] >= 0 else -1
            b = backward_of.get(bucket[owner], -1) if owner >= 0 else -1  # the owner's module, backward
            if b < 0:
                b = buckets.unattributed(backward_node_name(names[name_id]) or "", Phase.BACKWARD)
            backward_windows.append(i)
        elif role == ROLE_STEP:
            b = buckets.unattributed(LABEL_STEP_GAPS, Phase.OTHER)
            found.step_spans.append(i)
        elif role == ROLE_COMPILING:
            # torch.compile compiling is its own entry, never a module's time (nested ranges join it)
            b = compiling = buckets.unattributed(LABEL_COMPILING, Phase.OTHER)
        elif role == ROLE_COMPILED_GRAPH and p >= 0 and roles[span_name[p]] != ROLE_STEP:
            b = bucket[p]
            found.compiled_graph_spans.append(i)
        else:
            # Without modules, an op autograd recorded (a backward node may point at it) is forward work.
            forward = recorded_ops_are_forward and span_seq[i] >= 0 and not span_fwd_tid[i]
            b = buckets.unattributed(names[name_id], Phase.FORWARD if forward else Phase.OTHER)
        bucket[i] = b
    found.parent, found.excl, found.bucket = (np.asarray(c, dtype=np.int64) for c in (parent, excl, bucket))
    return replace(found, compiling_bucket=compiling)


def _module_call(
    found: Sweep,
    parent: list[int],
    m: int,
    p: int,
    span_name: list[int],
    roles: list[int],
    forward_bucket: list[int],
) -> int:
    """Count a call of module ``m`` (its range's parent span is ``p``) and return its bucket: the
    forward's, or, inside a backward node (activation checkpointing re-running the module, see
    ``recompute.py``), the backward's, counted as a recomputation."""
    span = p
    while span >= 0:  # a walk up the open spans: module calls are few
        if roles[span_name[span]] == ROLE_BACKWARD_NODE:
            found.recompute_calls[m] += 1
            return forward_bucket[m] + 1
        span = parent[span]
    found.module_calls[m] += 1
    return forward_bucket[m]


def depths(parent: np.ndarray) -> np.ndarray:
    """Nesting depth of every span (0 = top level), one numpy step per level."""
    depth = np.zeros(parent.size, dtype=np.int64)
    up = parent.copy()
    while True:
        has = up >= 0
        if not has.any():
            return depth
        depth += has
        up = np.where(has, parent[np.maximum(up, 0)], -1)


def levels(order: np.ndarray, depth: np.ndarray) -> list[np.ndarray]:
    """Span indices grouped by nesting depth (level 0 = top-level spans)."""
    if not order.size:
        return []
    d = depth[order]
    return [order[d == k] for k in range(int(d.max()) + 1)]


def inclusive(own: np.ndarray, parent: np.ndarray, levels: list[np.ndarray]) -> np.ndarray:
    """Per-span totals including all nested spans: children added to parents, deepest level first."""
    total = np.asarray(own, dtype=np.float64)
    if not total.any():
        return total.copy()
    native = nest_native.inclusive(total, parent, levels)  # a new array: ``own`` is only read
    if native is not None:
        return native
    total = total.copy()
    for level in reversed(levels[1:]):
        total += np.bincount(parent[level], weights=total[level], minlength=total.size)
    return total


def outermost_flops(
    flops: list[int] | np.ndarray,
    parent: np.ndarray,
    levels: list[np.ndarray],
    not_counted: np.ndarray | None = None,
) -> np.ndarray:
    """FLOPs that count: a span's own FLOPs unless an enclosing span already counted FLOPs."""
    values = np.asarray(flops, dtype=np.int64)
    if not_counted is not None and not_counted.any():  # e.g. ops on fake tensors while compiling
        values = np.where(not_counted, 0, values)
    if not values.any():
        return values
    covered = np.zeros(values.size, dtype=bool)  # some ancestor has FLOPs
    for level in levels[1:]:
        p = parent[level]
        covered[level] = covered[p] | (values[p] > 0)
    return np.where(covered, 0, values)


def exact_sums(key: np.ndarray, values: np.ndarray, size: int) -> list[int]:
    """Per key in ``range(size)``, the sum of the int64 ``values`` with that key, as exact Python
    ints (FLOPs can pass 2**53 over a long run, so no float sums): in int64 where no sum can
    overflow, else one Python addition per nonzero value."""
    picked = np.flatnonzero(values)
    if float(np.abs(values[picked]).astype(np.float64).sum()) < 2.0**62:
        out = np.zeros(size, dtype=np.int64)
        np.add.at(out, key[picked], values[picked])
        return out.tolist()
    sums = [0] * size
    for k, v in zip(key[picked].tolist(), values[picked].tolist(), strict=True):
        sums[k] += v
    return sums


def covered_ns(table: EventTable, order: np.ndarray, parent: np.ndarray) -> int:
    """The run's CPU total from the spans alone: per thread, the time its top-level spans cover
    (overlaps once). Exclusive times add up to it; ``validate`` checks that they do."""
    top = order[parent[order] < 0]
    tid = table.array("span_tid")[top]
    start = table.array("span_ts")[top]
    end = start + table.array("span_dur")[top]
    return sum(union_length(start[tid == t], end[tid == t]) for t in np.unique(tid).tolist())
