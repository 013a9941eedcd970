"""Attribution's native kernels (``capture/native_nesting.cpp``, in the torch-free trace reader's
module), when present.

The nesting of CPU spans (parents, exclusive time, depths and levels) is one pass over the spans in
C++, where numpy needs a few dozen passes (``nest_columns.py``, ``nesting.py``); :func:`unique` numbers
the distinct keys of a column (``np.unique`` with index and inverse) with a hash table instead of a
sort; :func:`inclusive` adds children into parents in one pass. All give exactly what the numpy code
gives, which stays the path without the native module and the cross-check
(``tests/test_nest_native.py``).

Attribution sits below capture, which builds and loads the module: it is handed over with :func:`use`
where a live capture is read (``capture/kineto.py``) and where a trace file's profile is built
(``loading.py``); without it attribution runs numpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from layerscope.events.table import EventTable

#: The native module whose kernels attribution uses, or None (numpy).
_module: Any = None


def use(module: Any) -> None:
    """Use ``module``'s kernels from now on (None, or a module without them: numpy)."""
    global _module
    _module = module if module is not None and hasattr(module, "nest") else None


def active() -> bool:
    """Whether the native kernels are in use."""
    return _module is not None


@contextmanager
def using(module: Any) -> Iterator[None]:
    """Use ``module``'s kernels (None: numpy) inside the block, then what was used before."""
    before = _module
    use(module)
    try:
        yield
    finally:
        use(before)


@dataclass(frozen=True)
class Nesting:
    """Nesting of the CPU spans, indexed like the table's spans."""

    parent: np.ndarray  # enclosing span, -1 at top level and for spans not nested
    excl: np.ndarray  # exclusive time, ns (as ``nest_columns.exclusive`` counts it)
    levels: list[np.ndarray]  # span indices by nesting depth, each in time order


def nest(table: EventTable, order: np.ndarray) -> Nesting | None:
    """Parents, exclusive time and levels of the spans in ``order`` (time order) in one native pass,
    or None without the native kernels."""
    if _module is None:
        return None
    parent, excl, _depth, by_level, starts = _module.nest(
        np.ascontiguousarray(order, dtype=np.int64),
        table.array("span_tid"),
        table.array("span_ts"),
        table.array("span_dur"),
    )
    bounds = starts.tolist()
    return Nesting(parent, excl, [by_level[a:b] for a, b in pairwise(bounds)])


def unique(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(keys, return_index=True, return_inverse=True)`` of a 1-D int64 column (the inverse
    flat): by hashing with the native kernels, else numpy's sort."""
    if _module is not None and keys.dtype == np.int64 and keys.ndim == 1:
        found: tuple[np.ndarray, np.ndarray, np.ndarray] = _module.group(keys)
        return found
    distinct, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return distinct, first, inverse.reshape(-1)


def inclusive(own: np.ndarray, parent: np.ndarray, levels: list[np.ndarray]) -> np.ndarray | None:
    """``nesting.inclusive`` (float64 ``own`` plus every nested span's, the same sums to the bit) in
    one native pass, or None without the native kernels."""
    if _module is None or len(levels) < 2:
        return None
    inner = levels[1:]
    bounds = np.cumsum([0, *(level.size for level in inner)], dtype=np.int64)
    found: np.ndarray = _module.inclusive(own, parent, np.concatenate(inner).astype(np.int64), bounds)
    return found


def innermost(
    table: EventTable, order: np.ndarray, parent: np.ndarray, tids: np.ndarray, times: np.ndarray
) -> np.ndarray | None:
    """``memory.sums.innermost_spans`` (for each (thread, time), the innermost span of ``order``
    containing it, -1 none) in one native pass, or None without the native kernels."""
    if _module is None or not hasattr(_module, "innermost"):  # a module built before it had one
        return None
    found: np.ndarray = _module.innermost(
        _int64(order),
        table.array("span_tid"),
        table.array("span_ts"),
        table.array("span_dur"),
        _int64(parent),
        _int64(tids),
        _int64(times),
    )
    return found


def pair_frees(addr: np.ndarray, nbytes: np.ndarray) -> np.ndarray | None:
    """``memory.story``'s pairing (each allocation's next free at its address, -1 none) in one
    native pass, or None without the native kernels."""
    if _module is None or not hasattr(_module, "pair_frees"):
        return None
    found: np.ndarray = _module.pair_frees(_int64(addr), _int64(nbytes))
    return found


def last_at_or_before(
    addr: np.ndarray, ts: np.ndarray, at_addr: np.ndarray, at_ts: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """``memory.story._last_at_or_before`` natively for rows in time order, or None (rows out of
    order, or without the native kernels)."""
    if _module is None or not hasattr(_module, "last_at_or_before") or bool((ts[1:] < ts[:-1]).any()):
        return None
    found: tuple[np.ndarray, np.ndarray] = _module.last_at_or_before(
        _int64(addr), _int64(ts), _int64(at_addr), _int64(at_ts)
    )
    return found


def range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray | None:
    """``memory.sums.range_max`` of an int64 column natively, or None without the native kernels
    (or for other dtypes)."""
    if _module is None or not hasattr(_module, "range_max") or values.dtype != np.int64:
        return None
    found: np.ndarray = _module.range_max(_int64(values), _int64(lo), _int64(hi))
    return found


def _int64(column: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(column, dtype=np.int64)
