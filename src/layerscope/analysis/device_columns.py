"""Columns the device analyses share, each made with numpy over the event table (no Python object
per event): the runtime call that launched each piece of device work, a property of each distinct
name, and a value of each distinct thread (its device, its stream)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

import numpy as np

from layerscope.events.table import EventKind, EventTable

K = TypeVar("K", bound=Hashable)


def launch_calls(table: EventTable, spans: np.ndarray) -> np.ndarray:
    """For each span at ``spans``, the runtime call that holds its correlation id (-1: none). Ids
    are positive; where one repeats, the last call with it wins (as a dict built in span order)."""
    corr = table.array("span_corr")
    runtime = np.flatnonzero((table.array("span_kind") == EventKind.RUNTIME) & (corr > 0))
    ids = corr[runtime]
    # runtime calls usually come in correlation order: no sort needed then
    if ids.size > 1 and not bool((ids[1:] > ids[:-1]).all()):
        order = np.argsort(ids, kind="stable")
        ids, runtime = ids[order], runtime[order]
        last = np.ones(ids.size, dtype=bool)
        last[:-1] = ids[1:] != ids[:-1]
        ids, runtime = ids[last], runtime[last]
    wanted = corr[spans]
    if not ids.size:
        return np.full(wanted.size, -1, dtype=np.int64)
    at = np.minimum(np.searchsorted(ids, wanted), ids.size - 1)
    return np.where(ids[at] == wanted, runtime[at], -1).astype(np.int64)


def name_flags(table: EventTable, spans: np.ndarray, test: Callable[[str], bool]) -> np.ndarray:
    """``test(name)`` for each span at ``spans`` (a bool column), asked once per distinct name."""
    ids = table.array("span_name")[spans]
    present = np.zeros(len(table.names), dtype=bool)
    present[ids] = True
    flags = np.zeros(len(table.names), dtype=bool)
    names = table.names
    for n in np.flatnonzero(present).tolist():
        flags[n] = test(names[n])
    found: np.ndarray = flags[ids]
    return found


def first_seen(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``keys`` in the order each first occurs, and for each key the index
    of its value among them. Small non-negative keys (thread ids, name ids) are counted into a table
    of their own size; others are sorted (a stable sort of a long column costs far more)."""
    if not keys.size:
        return keys[:0], np.zeros(0, dtype=np.int64)
    low, high = int(keys.min()), int(keys.max())
    if low >= 0 and high < keys.size + (1 << 16):
        first = np.full(high + 1, keys.size, dtype=np.int64)
        np.minimum.at(first, keys, np.arange(keys.size))
        present = np.flatnonzero(first < keys.size)
        distinct = present[np.argsort(first[present], kind="stable")]
        rank = np.zeros(high + 1, dtype=np.int64)
        rank[distinct] = np.arange(distinct.size)
        return distinct, rank[keys]
    values, at, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(at, kind="stable")
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    return values[order], rank[inverse.reshape(-1)]


def group_sums(group: np.ndarray, values: np.ndarray, groups: int) -> np.ndarray:
    """Per group index, the sum of its ``values`` (int64: exact, as Python's sum)."""
    found = np.zeros(groups, dtype=np.int64)
    np.add.at(found, group, values)
    return found


def thread_groups(
    table: EventTable, spans: np.ndarray, key: Callable[[int], K]
) -> tuple[list[K], np.ndarray]:
    """The distinct ``key(tid)`` of the threads of ``spans``, in the order each first occurs among
    them, and for each span the index of its key: ``key`` is asked once per distinct thread."""
    distinct, thread = first_seen(table.array("span_tid")[spans])
    index: dict[K, int] = {}
    of_thread = np.asarray([index.setdefault(key(t), len(index)) for t in distinct.tolist()], dtype=np.int64)
    return list(index), of_thread[thread] if distinct.size else np.zeros(0, dtype=np.int64)
