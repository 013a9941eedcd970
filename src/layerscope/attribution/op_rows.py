"""Op rows: one row per (name, bucket, input shapes), summed with numpy over the spans in each group.

Like torch's tables, an op whose only child is an op of the same name (a dispatch to an overload)
counts as one call: the child's self figures join the parent's, so call counts match
``key_averages()`` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.attribution.buckets import LABEL_UNLINKED_DEVICE, Buckets
from layerscope.attribution.catalog import ModuleInfo
from layerscope.attribution.memory import SpanMemory
from layerscope.events.table import EventTable
from layerscope.model.metrics import Metrics
from layerscope.model.profile import OpStats, Phase


@dataclass(frozen=True)
class SpanFigures:
    """Per-span figures (indexed like the table's spans) that op rows sum."""

    excl: np.ndarray  # exclusive CPU time, ns
    device_self: np.ndarray  # device time of the work the span launched itself, ns
    device_total: np.ndarray  # the same, including nested spans
    flops: np.ndarray  # FLOPs that count (outermost only)
    memory: SpanMemory


def op_rows(
    table: EventTable,
    order: np.ndarray,
    parent: np.ndarray,
    bucket: np.ndarray,
    buckets: Buckets,
    catalog: list[ModuleInfo],
    module_ranges: dict[int, tuple[str, str]],
    figures: SpanFigures,
    unlinked_device: list[int],
    stacks: tuple[np.ndarray, list[tuple[str, ...]]] | None = None,
) -> tuple[OpStats, ...]:
    """One row per (name, bucket, input shapes, Python stack) over every CPU span but module ranges,
    plus one row per name of device work that no CPU op launched (so device totals reconcile).
    ``stacks`` is each span's stack id and the stacks (``attribution/stacks.py``), when recorded."""
    excl, device_self, flops = figures.excl, figures.device_self, figures.flops
    dev_total = figures.device_total
    mem = figures.memory
    self_cpu_alloc, cpu_alloc = mem.self_cpu_alloc, mem.cpu_alloc
    self_dev_alloc, dev_alloc = mem.self_device_alloc, mem.device_alloc
    self_net, net = mem.self_net, mem.net
    names = table.names
    is_module_name = np.zeros(len(names) + 1, dtype=bool)
    is_module_name[list(module_ranges)] = True
    all_names = table.array("span_name")
    merged = same_name_only_children(all_names, parent, order)
    if merged.size:
        target = parent[merged]
        while True:  # chains a -> a -> a fold into the outermost
            again = np.isin(target, merged)
            if not again.any():
                break
            target = np.where(again, parent[target], target)
        excl, device_self, self_cpu_alloc, self_dev_alloc, self_net = (
            fold_into(values, merged, target)
            for values in (excl, device_self, self_cpu_alloc, self_dev_alloc, self_net)
        )
        flops = np.asarray(flops, dtype=np.int64).copy()
        np.add.at(flops, target, flops[merged])
        flops[merged] = 0
        keep = np.ones(parent.size, dtype=bool)
        keep[merged] = False
        order = order[keep[order]]
    idx = order[~is_module_name[all_names[order]]] if order.size else order
    if not idx.size and not unlinked_device:
        return ()
    name_col = all_names[idx]
    bucket_col = bucket[idx]
    shape_col = table.array("span_shapes")[idx] + 1
    nb, ns = buckets.count + 1, len(names) + 1
    keys = (name_col * nb + bucket_col) * ns + shape_col
    uniq, row_of = np.unique(keys, return_inverse=True)
    row_of = row_of.reshape(-1)
    row_stack: list[int] = []
    if stacks is not None:
        # A second key on top of the first's dense row ids (a single key could overflow int64).
        stack_col = stacks[0][idx] + 1
        pairs = row_of.astype(np.int64) * (len(stacks[1]) + 1) + stack_col
        uniq_pairs, row_of = np.unique(pairs, return_inverse=True)
        row_of = row_of.reshape(-1)
        first_key_row = uniq_pairs // (len(stacks[1]) + 1)
        row_stack = (uniq_pairs % (len(stacks[1]) + 1) - 1).tolist()
        uniq = uniq[first_key_row]
    rows = len(uniq)

    def summed(values: np.ndarray | list[int]) -> np.ndarray:
        return np.bincount(row_of, weights=np.asarray(values)[idx], minlength=rows)

    calls = np.bincount(row_of, minlength=rows)
    cols = {
        "self_cpu_us": summed(excl) / 1000.0,
        "cpu_us": summed(table.array("span_dur")) / 1000.0,
        "self_device_us": summed(device_self) / 1000.0,
        "device_us": summed(dev_total) / 1000.0,
        "flops": summed(flops),
        "self_cpu_alloc_bytes": summed(self_cpu_alloc),
        "cpu_alloc_bytes": summed(cpu_alloc),
        "self_device_alloc_bytes": summed(self_dev_alloc),
        "device_alloc_bytes": summed(dev_alloc),
        "self_retained_bytes": summed(self_net),
        "retained_bytes": summed(net),
    }
    # FLOPs can exceed 2**53 over a long run: sum them exactly, as Python ints.
    exact_flops = [0] * rows
    for j in np.flatnonzero(flops[idx]).tolist():
        exact_flops[int(row_of[j])] += int(flops[idx[j]])
    result: list[OpStats] = []
    # Plain Python lists: indexing numpy arrays element by element is ~10x slower.
    col = {k: v.tolist() for k, v in cols.items()}
    calls_list = calls.tolist()
    # Per bucket, once: its phase, its module's path (None for a label) and its label ("" for a module).
    phases = [buckets.phase_of(b) for b in range(buckets.count)]
    modules = [buckets.where(b, catalog) if buckets.is_module(b) else None for b in range(buckets.count)]
    scopes = ["" if buckets.is_module(b) else buckets.where(b, catalog) for b in range(buckets.count)]
    all_stacks = stacks[1] if stacks is not None else []
    for r, key in enumerate(uniq.tolist()):
        stack_id = row_stack[r] if row_stack else -1
        shape_id = key % ns - 1
        rest = key // ns
        b = rest % nb
        name_id = rest // nb
        fl = exact_flops[r]
        result.append(
            OpStats(
                name=names[name_id],
                phase=phases[b],
                module=modules[b],
                input_shapes=names[shape_id] if shape_id >= 0 else None,
                calls=calls_list[r],
                metrics=Metrics(
                    col["self_cpu_us"][r],
                    col["cpu_us"][r],
                    col["self_device_us"][r],
                    col["device_us"][r],
                    fl,
                    fl,
                    int(col["self_cpu_alloc_bytes"][r]),
                    int(col["cpu_alloc_bytes"][r]),
                    int(col["self_device_alloc_bytes"][r]),
                    int(col["device_alloc_bytes"][r]),
                    int(col["self_retained_bytes"][r]),
                    int(col["retained_bytes"][r]),
                ),
                scope=scopes[b],
                stack=all_stacks[stack_id] if stack_id >= 0 else (),
            )
        )
    # Device work no CPU op launched gets rows of its own so device totals reconcile.
    unlinked: dict[int, list[int]] = {}
    for k in unlinked_device:
        unlinked.setdefault(table.span_name[k], []).append(table.span_dur[k])
    for name_id, durs in unlinked.items():
        us = sum(durs) / 1000.0
        result.append(
            OpStats(
                name=names[name_id],
                phase=Phase.OTHER,
                module=None,
                input_shapes=None,
                calls=len(durs),
                metrics=Metrics(self_device_us=us, device_us=us),
                scope=LABEL_UNLINKED_DEVICE,
            )
        )
    return tuple(result)


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
