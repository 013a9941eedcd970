"""Op rows: one row per (name, bucket, input shapes), summed with numpy over the spans in each group.

Like torch's tables, an op whose only child is an op of the same name (a dispatch to an overload)
counts as one call: the child's self figures join the parent's, so call counts match
``key_averages()`` exactly.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from layerscope.attribution import nest_native
from layerscope.attribution.buckets import LABEL_UNLINKED_DEVICE, Buckets
from layerscope.attribution.catalog import ModuleInfo
from layerscope.attribution.memory.sums import SpanMemory
from layerscope.attribution.nesting import exact_sums
from layerscope.attribution.span_bytes import SpanBytes
from layerscope.events.table import EventTable
from layerscope.model.metrics import Metrics
from layerscope.model.profile import OpStats, Phase

T = TypeVar("T")


@dataclass(frozen=True)
class SpanFigures:
    """Per-span figures (indexed like the table's spans) that op rows sum."""

    excl: np.ndarray  # exclusive CPU time, ns
    device_self: np.ndarray  # device time of the work the span launched itself, ns
    device_total: np.ndarray  # the same, including nested spans
    flops: np.ndarray  # FLOPs that count (outermost only)
    memory: SpanMemory
    bytes: SpanBytes | None = None  # bytes that count, per span (span_bytes.py)


def op_rows(
    table: EventTable,
    order: np.ndarray,
    parent: np.ndarray,
    bucket: np.ndarray,
    buckets: Buckets,
    catalog: list[ModuleInfo],
    not_ops: Collection[int],
    figures: SpanFigures,
    unlinked_device: list[int],
    stacks: tuple[np.ndarray, list[tuple[str, ...]]] | None = None,
) -> tuple[OpStats, ...]:
    """One row per (name, bucket, input shapes, Python stack) over every CPU span but those whose
    name id is in ``not_ops`` (module ranges, ``ProfilerStep#N`` ranges), plus one row per name of
    device work that no CPU op launched (so device totals reconcile). ``stacks`` is each span's
    stack id and the stacks (``attribution/stacks.py``), when recorded."""
    names = table.names
    all_names = table.array("span_name")
    figures, order = _fold_same_name_children(figures, all_names, parent, order)
    is_not_op = np.zeros(len(names) + 1, dtype=bool)
    is_not_op[list(not_ops)] = True
    idx = order[~is_not_op[all_names[order]]] if order.size else order
    if not idx.size and not unlinked_device:
        return ()
    row_of, row_keys = _group(table, idx, bucket, buckets, stacks)
    sums, exact_flops, calls = _row_sums(table, idx, row_of, len(row_keys[0]), figures)
    row_bytes, row_dtypes = _row_bytes(table, idx, row_of, len(row_keys[0]), figures.bytes)
    # Per bucket, once: its phase, its module's path (None for a label) and its label ("" for a module).
    phases = [buckets.phase_of(b) for b in range(buckets.count)]
    modules = [buckets.where(b, catalog) if buckets.is_module(b) else None for b in range(buckets.count)]
    scopes = ["" if buckets.is_module(b) else buckets.where(b, catalog) for b in range(buckets.count)]
    all_stacks = stacks[1] if stacks is not None else []
    name_ids, row_buckets, shape_ids, stack_ids = row_keys
    zeros = [0] * len(name_ids)  # the peaks: op rows have none
    metrics = make_objects(Metrics, [*sums[:4], exact_flops, exact_flops, *sums[4:], zeros, zeros])
    result = make_objects(
        OpStats,
        [
            [names[i] for i in name_ids],
            [phases[b] for b in row_buckets],
            [modules[b] for b in row_buckets],
            [names[i] if i >= 0 else None for i in shape_ids],
            calls,
            metrics,
            [scopes[b] for b in row_buckets],
            [all_stacks[i] if i >= 0 else () for i in stack_ids],
            row_bytes,
            row_dtypes,
        ],
    )
    return (*result, *_unlinked_rows(table, unlinked_device))


#: The native module whose ``slot_objects`` makes rows (``capture/native_reader.cpp``), or None.
_native: Any = None


def use(module: Any) -> None:
    """Make rows with ``module``'s ``slot_objects`` from now on (None, or a module without it: their
    ``__init__``). Handed over where a live capture is read (``capture/kineto.py``), as attribution
    cannot import capture."""
    global _native
    _native = module if module is not None and hasattr(module, "slot_objects") else None


def make_objects(cls: type[T], columns: list[list[Any]]) -> list[T]:
    """``[cls(*row) for row in zip(*columns)]`` for a frozen slots dataclass without ``__post_init__``
    (``Metrics``, ``OpStats``), one column per field in order: with the native module, each object's
    slots are filled directly (a frozen ``__init__`` sets every field through ``object.__setattr__``:
    ~5 µs an op row, most of the rows' cost), else by ``__init__``. The same objects either way
    (``tests/test_op_rows_fast.py``)."""
    if _native is not None:
        found: list[T] = _native.slot_objects(cls, cls.__slots__, columns)  # type: ignore[attr-defined]
        return found
    return [cls(*row) for row in zip(*columns, strict=True)]


def _fold_same_name_children(
    figures: SpanFigures, names: np.ndarray, parent: np.ndarray, order: np.ndarray
) -> tuple[SpanFigures, np.ndarray]:
    """Spans that are the only child of a span of the same name fold into it, as torch counts them:
    their self figures join the outermost such parent's, and they leave ``order``."""
    merged = same_name_only_children(names, parent, order)
    if not merged.size:
        return figures, order
    target = parent[merged]
    while True:  # chains a -> a -> a fold into the outermost
        again = np.isin(target, merged)
        if not again.any():
            break
        target = np.where(again, parent[target], target)
    mem = figures.memory
    excl, device_self, self_cpu_alloc, self_dev_alloc, self_net = (
        fold_into(values, merged, target)
        for values in (
            figures.excl,
            figures.device_self,
            mem.self_cpu_alloc,
            mem.self_device_alloc,
            mem.self_net,
        )
    )
    flops = np.asarray(figures.flops, dtype=np.int64).copy()
    np.add.at(flops, target, flops[merged])
    flops[merged] = 0
    keep = np.ones(parent.size, dtype=bool)
    keep[merged] = False
    memory = replace(mem, self_cpu_alloc=self_cpu_alloc, self_device_alloc=self_dev_alloc, self_net=self_net)
    moved = figures.bytes
    if moved is not None:  # a folded child's bytes (and its unknown work) are its parent's
        counted, unknown = moved.counted.copy(), moved.unknown.copy()
        np.add.at(counted, target, counted[merged])
        np.logical_or.at(unknown, target, unknown[merged])
        counted[merged], unknown[merged] = 0, False
        moved = replace(moved, counted=counted, unknown=unknown)
    folded = replace(figures, excl=excl, device_self=device_self, flops=flops, memory=memory, bytes=moved)
    return folded, order[keep[order]]


def _group(
    table: EventTable,
    idx: np.ndarray,
    bucket: np.ndarray,
    buckets: Buckets,
    stacks: tuple[np.ndarray, list[tuple[str, ...]]] | None,
) -> tuple[np.ndarray, tuple[list[int], list[int], list[int], list[int]]]:
    """Each span of ``idx``'s row, and per row its name id, bucket, shape id and stack id (-1: none)."""
    nb, ns = buckets.count + 1, len(table.names) + 1
    keys = (table.array("span_name")[idx] * nb + bucket[idx]) * ns + table.array("span_shapes")[idx] + 1
    uniq, _, row_of = nest_native.unique(keys)
    row_stack = np.full(uniq.size, -1, dtype=np.int64)
    if stacks is not None:
        # A second key on top of the first's dense row ids (a single key could overflow int64).
        stack_col = stacks[0][idx] + 1
        pairs = row_of.astype(np.int64) * (len(stacks[1]) + 1) + stack_col
        uniq_pairs, _, row_of = nest_native.unique(pairs)
        first_key_row = uniq_pairs // (len(stacks[1]) + 1)
        row_stack = uniq_pairs % (len(stacks[1]) + 1) - 1
        uniq = uniq[first_key_row]
    rest = uniq // ns
    return row_of, ((rest // nb).tolist(), (rest % nb).tolist(), (uniq % ns - 1).tolist(), row_stack.tolist())


def _row_sums(
    table: EventTable, idx: np.ndarray, row_of: np.ndarray, rows: int, figures: SpanFigures
) -> tuple[list[list[Any]], list[int], list[int]]:
    """Per row: its spans' figures summed (in Metrics' order, FLOPs left out), their FLOPs and their
    count."""

    def summed(values: np.ndarray) -> np.ndarray:
        values = np.asarray(values)
        if not values.any():  # memory figures of a trace without such memory: zeros, as summed
            return np.zeros(rows)
        return np.bincount(row_of, weights=values[idx], minlength=rows)

    mem = figures.memory
    times = [summed(values) / 1000.0 for values in (figures.excl, table.array("span_dur"))]
    times += [summed(values) / 1000.0 for values in (figures.device_self, figures.device_total)]
    memory: tuple[np.ndarray, ...] = (
        mem.self_cpu_alloc,
        mem.cpu_alloc,
        mem.self_device_alloc,
        mem.device_alloc,
    )
    memory += (mem.self_net, mem.net)
    # FLOPs can exceed 2**53 over a long run: sum them exactly, as Python ints.
    exact_flops = exact_sums(row_of, np.asarray(figures.flops, dtype=np.int64)[idx], rows)
    # Plain Python lists: the rows are built one element at a time, which numpy scalars make slow.
    # Metrics' order: self and total CPU time, self and total device time, then (after the FLOPs) the
    # allocations, self and total, CPU, device and net; bytes as ints, as int() of the float sum.
    sums = [t.tolist() for t in times] + [summed(values).astype(np.int64).tolist() for values in memory]
    return sums, exact_flops, np.bincount(row_of, minlength=rows).tolist()


def _row_bytes(
    table: EventTable, idx: np.ndarray, row_of: np.ndarray, rows: int, moved: SpanBytes | None
) -> tuple[list[int | None], list[str | None]]:
    """Per row: the bytes its calls moved (None when any call's are unknown, or none were derived)
    and its first tensor input's dtype (None when its calls differ)."""
    if moved is None:
        return [None] * rows, [None] * rows
    total = np.zeros(rows, dtype=np.int64)
    np.add.at(total, row_of, moved.counted[idx])
    unknown = np.bincount(row_of, weights=moved.unknown[idx].astype(np.float64), minlength=rows) > 0
    low = np.full(rows, np.iinfo(np.int64).max, dtype=np.int64)
    high = np.full(rows, -1, dtype=np.int64)
    np.minimum.at(low, row_of, moved.dtype[idx])
    np.maximum.at(high, row_of, moved.dtype[idx])
    names = table.names
    return (
        [None if u else b for b, u in zip(total.tolist(), unknown.tolist(), strict=True)],
        [names[h] if h >= 0 and h == lo else None for lo, h in zip(low.tolist(), high.tolist(), strict=True)],
    )


def _unlinked_rows(table: EventTable, unlinked_device: list[int]) -> list[OpStats]:
    """Device work no CPU op launched: one row per name, so that device totals reconcile."""
    unlinked: dict[int, list[int]] = {}
    span_name, span_dur = table.array("span_name")[unlinked_device], table.array("span_dur")[unlinked_device]
    for name_id, dur in zip(span_name.tolist(), span_dur.tolist(), strict=True):
        unlinked.setdefault(name_id, []).append(dur)
    result = []
    for name_id, durs in unlinked.items():
        us = sum(durs) / 1000.0
        result.append(
            OpStats(
                name=table.names[name_id],
                phase=Phase.OTHER,
                module=None,
                input_shapes=None,
                calls=len(durs),
                metrics=Metrics(self_device_us=us, device_us=us),
                scope=LABEL_UNLINKED_DEVICE,
            )
        )
    return result


def same_name_only_children(names: np.ndarray, parent: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Spans that are the only child of a span with the same name (torch folds them away)."""
    if not order.size:
        return order
    nested = order[parent[order] >= 0]
    child_count = np.bincount(parent[nested], minlength=parent.size)
    p = parent[nested]
    merged: np.ndarray = nested[(names[nested] == names[p]) & (child_count[p] == 1)]
    return merged


def fold_into(values: np.ndarray, merged: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``values`` with each merged span's value added to its target and zeroed."""
    out = np.asarray(values, dtype=np.float64).copy()
    np.add.at(out, target, out[merged])
    out[merged] = 0
    return out
