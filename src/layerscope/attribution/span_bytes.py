"""Which spans' bytes count, once per piece of work, as FLOPs are counted once (``outermost_flops``).

Each op's bytes come from ``op_bytes.py``. Ops nest (``aten::linear`` calls ``aten::t`` and
``aten::addmm``, which calls ``aten::copy_`` for the bias), so only one span on each path counts:

* an op whose FLOPs count counts its bytes too (so an op row's intensity is its own work's), and
  everything inside it is covered;
* elsewhere, the outermost op whose bytes are known counts, unless an op below it carries FLOPs
  (then it descends, as ``aten::linear`` does into ``aten::addmm``);
* wrappers (``op_bytes.WRAPPER``) and spans without recorded inputs (ranges, runtime calls) never
  count themselves; an op whose bytes are unknown, with nothing counted inside it, is *unknown*.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

from layerscope.attribution import nest_native
from layerscope.attribution.op_bytes import WRAPPER, first_dtype, op_bytes
from layerscope.events.table import EventTable

_UNKNOWN = -1


@dataclass(frozen=True)
class SpanBytes:
    """Per span (indexed like the table's spans): the bytes that count, whether its work is unknown,
    and the name id of its first tensor input's dtype (-1 none)."""

    counted: np.ndarray  # int64
    unknown: np.ndarray  # bool
    dtype: np.ndarray  # int64 name ids


def span_bytes(
    table: EventTable,
    parent: np.ndarray,
    levels: list[np.ndarray],
    counted_flops: np.ndarray,
    not_run: np.ndarray | None,
) -> SpanBytes | None:
    """The bytes that count per span; None when the source recorded no dtypes (then no op has
    bytes). ``not_run`` spans (ops on fake tensors while compiling, stopped recomputation) move none."""
    if table.span_dtypes is None:
        return None
    own, dtype = _own_bytes(table)
    n = own.size
    carrier = np.asarray(counted_flops) > 0
    below = np.zeros(n, dtype=bool)  # an op carrying FLOPs lies strictly inside
    for level in reversed(levels[1:]):
        below |= _any_child(parent[level], below[level] | carrier[level], n)
    covered = np.zeros(n, dtype=bool) if not_run is None else not_run.copy()
    counted = np.zeros(n, dtype=bool)
    for k, level in enumerate(levels):
        if k:
            p = parent[level]
            covered[level] |= covered[p] | counted[p]
        mine = carrier[level] | (~below[level] & (own[level] >= 0))
        counted[level] = ~covered[level] & mine
    counted_below = np.zeros(n, dtype=bool)
    for level in reversed(levels[1:]):
        counted_below |= _any_child(parent[level], counted_below[level] | counted[level], n)
    unknown = (own == _UNKNOWN) & ((counted) | (~covered & ~counted_below))
    return SpanBytes(np.where(counted & (own >= 0), own, 0), unknown, dtype)


def _any_child(parents: np.ndarray, flags: np.ndarray, n: int) -> np.ndarray:
    """Per span, whether any of the given children (``parents``, one level) has its flag set."""
    found = np.zeros(n, dtype=bool)
    found[parents[flags]] = True
    return found


def _own_bytes(table: EventTable) -> tuple[np.ndarray, np.ndarray]:
    """Each span's own bytes (``op_bytes``: -1 unknown, WRAPPER), computed once per distinct
    (name, shapes, dtypes, FLOPs), and its first tensor input's dtype."""
    n = table.span_count
    shapes = table.array("span_shapes")
    dtypes = np.full(n, -1, dtype=np.int64)
    recorded = table.span_dtypes if table.span_dtypes is not None else dtypes
    dtypes[: min(n, recorded.size)] = recorded[:n]
    own = np.full(n, WRAPPER, dtype=np.int64)  # nothing recorded: a range, a runtime call
    first = np.full(n, -1, dtype=np.int64)
    ops = np.flatnonzero((shapes >= 0) & (dtypes >= 0))
    if not ops.size:
        return own, first
    flops = table.array("span_flops")[ops]
    # One key per distinct (name, shapes, dtypes), in two 1-D steps (a 3-column key could overflow);
    # FLOPs are part of the key only where a rule reads them (convolutions): spans with FLOPs.
    size = len(table.names) + 1
    pair = nest_native.unique(table.array("span_name")[ops] * size + shapes[ops])[2]
    keys = pair.astype(np.int64) * size + dtypes[ops]
    counted = np.flatnonzero(flops > 0)
    if counted.size:  # FLOP spans keyed apart, by (key, FLOPs) in that order: negative keys
        by_key = nest_native.unique(keys[counted])[2]
        values, _, by_flops = nest_native.unique(flops[counted])
        pairs = by_key.astype(np.int64) * values.size + by_flops
        keys[counted] = -1 - nest_native.unique(pairs)[2]
    distinct, _, index = nest_native.unique(keys)
    one_of = np.zeros(len(distinct), dtype=np.int64)
    one_of[index[::-1]] = ops[::-1]  # a span of each key
    values = np.empty(len(distinct), dtype=np.int64)
    firsts = np.empty(len(distinct), dtype=np.int64)
    span_names, all_flops = table.array("span_name"), table.array("span_flops")
    for k, j in enumerate(one_of.tolist()):
        values[k], firsts[k] = _bytes_of(table, span_names[j], shapes[j], dtypes[j], all_flops[j])
    own[ops] = values[index]
    first[ops] = firsts[index]
    return own, first


def _bytes_of(table: EventTable, name: int, shapes: int, dtypes: int, flops: int) -> tuple[int, int]:
    """``op_bytes`` of one (name, shapes, dtypes, FLOPs) and the name id of its first tensor dtype."""
    names = table.names
    try:
        shape_list, type_list = orjson.loads(names[shapes]), orjson.loads(names[dtypes])
    except orjson.JSONDecodeError:  # a trace's own spelling we do not read: unknown
        return _UNKNOWN, -1
    found = first_dtype(type_list)
    return op_bytes(names[name], shape_list, type_list, int(flops)), table.intern(found) if found else -1


__all__ = ["SpanBytes", "span_bytes"]
