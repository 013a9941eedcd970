"""The memory report's native kernels (``native_nesting.cpp``: pairing frees, the allocation live at a
snapshot, range maxima, the innermost span of a time) give exactly what their numpy paths give, which
stay the path without the native module: random columns, each way."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from layerscope.attribution import nest_native
from layerscope.attribution.memory.story import _last_at_or_before
from layerscope.attribution.memory.sums import innermost_spans, range_max
from layerscope.attribution.nest_columns import parents
from layerscope.attribution.nesting import time_order
from layerscope.capture import native
from tests.test_attribution_columns import random_table


@pytest.fixture(scope="module")
def module() -> Iterator[Any]:
    found = native.load_trace_reader()
    if found is None or not hasattr(found, "pair_frees"):
        pytest.skip("the native module is not built here (`layerscope native build`)")
    with nest_native.using(None):  # each test picks its way
        yield found


def memory_events(rng: np.random.Generator, size: int, addresses: int) -> tuple[np.ndarray, np.ndarray]:
    """Addresses reused many times, allocations and frees mixed (some frees of nothing, some
    allocations never freed, two allocations in a row at one address)."""
    addr = rng.integers(1, addresses + 1, size, dtype=np.int64) * 512
    nbytes = rng.integers(1, 1 << 20, size, dtype=np.int64) * rng.choice([-1, 1], size)
    return addr, nbytes


def numpy_pairs(addr: np.ndarray, nbytes: np.ndarray) -> list[int]:
    """The pairing as story.py's numpy path makes it (by a stable sort on the address)."""
    free_at = np.full(addr.size, -1, dtype=np.int64)
    by_addr = np.argsort(addr, kind="stable")
    same_next = addr[by_addr[1:]] == addr[by_addr[:-1]]
    pairs = np.flatnonzero(same_next & (nbytes[by_addr[:-1]] > 0) & (nbytes[by_addr[1:]] < 0))
    free_at[by_addr[pairs]] = by_addr[pairs + 1]
    return free_at.tolist()


@pytest.mark.parametrize("seed", range(20))
def test_frees_pair_as_numpys(seed: int, module: Any) -> None:
    rng = np.random.default_rng(seed)
    addr, nbytes = memory_events(rng, int(rng.integers(0, 4000)), int(rng.choice([3, 40, 5000])))
    with nest_native.using(module):
        found = nest_native.pair_frees(addr, nbytes)
    assert found is not None and found.dtype == np.int64
    assert found.tolist() == numpy_pairs(addr, nbytes)
    if found.size:  # the check has something to find: every pair is an allocation then a free
        paired = np.flatnonzero(found >= 0)
        assert (nbytes[paired] > 0).all() and (nbytes[found[paired]] < 0).all()


@pytest.mark.parametrize("seed", range(20))
def test_the_allocation_live_at_a_time_is_numpys(seed: int, module: Any) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(200, 3000))
    addr = rng.integers(1, int(rng.choice([4, 60, 4000])), size, dtype=np.int64)
    ts = np.sort(rng.integers(0, 5000, size, dtype=np.int64))  # ties too: rows in time order
    queries = int(rng.integers(200, 2000))
    at_addr = rng.integers(0, int(addr.max(initial=1)) + 3, queries, dtype=np.int64)  # some unknown
    at_ts = rng.integers(-10, 5100, queries, dtype=np.int64)
    expected = _last_at_or_before(addr, ts, at_addr, at_ts)  # numpy: no kernels in use
    with nest_native.using(module):
        found = nest_native.last_at_or_before(addr, ts, at_addr, at_ts)
        via_story = _last_at_or_before(addr, ts, at_addr, at_ts)
    assert found is not None
    for mine in (found, via_story):
        assert mine[0].tolist() == expected[0].tolist() and mine[1].tolist() == expected[1].tolist()
    assert 0 < int(expected[1].sum()) < queries  # the draw tests both outcomes


def test_rows_out_of_time_order_stay_with_numpy(module: Any) -> None:
    addr = np.array([8, 8, 16], dtype=np.int64)
    ts = np.array([50, 10, 20], dtype=np.int64)
    with nest_native.using(module):
        assert nest_native.last_at_or_before(addr, ts, addr, ts) is None
        hit, matched = _last_at_or_before(addr, ts, np.array([8, 8]), np.array([30, 60]))
    assert hit.tolist() == [1, 0] and matched.tolist() == [True, True]  # the latest by time, not by row


@pytest.mark.parametrize("seed", range(20))
def test_range_maxima_are_numpys(seed: int, module: Any) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 5000))
    values = np.cumsum(rng.integers(-(1 << 30), 1 << 30, size, dtype=np.int64))
    lo = rng.integers(0, size, 3000, dtype=np.int64)
    hi = np.minimum(lo + rng.integers(1, int(rng.choice([2, 30, size + 1])) + 1, lo.size), size)
    expected = range_max(values, lo, hi)
    assert expected.tolist() == [
        int(values[a:b].max()) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)
    ]
    with nest_native.using(module):
        assert range_max(values, lo, hi).tolist() == expected.tolist()
        assert nest_native.range_max(values.astype(np.float64), lo, hi) is None  # int64 only


@pytest.mark.parametrize("seed", range(20))
def test_innermost_spans_are_numpys(seed: int, module: Any) -> None:
    rng = random.Random(seed)
    draws = np.random.default_rng(seed)
    for _ in range(10):
        table = random_table(rng)
        order = time_order(table)
        parent = parents(table, order)
        ts = table.array("span_ts")
        tids = draws.choice(np.unique(np.r_[table.array("span_tid"), 999]), 500)  # 999: no spans
        times = draws.integers(int(ts.min(initial=0)) - 5, int(ts.max(initial=0)) + 50, 500, dtype=np.int64)
        expected = innermost_spans(table, order, parent, tids, times)
        with nest_native.using(module):
            assert innermost_spans(table, order, parent, tids, times).tolist() == expected.tolist()


def test_addresses_past_the_tables_first_room(module: Any) -> None:
    """More distinct addresses than the kernels' tables hold up front (32k): they grow, and pairing
    and lookups stay numpy's."""
    rng = np.random.default_rng(7)
    addr, nbytes = memory_events(rng, 150_000, 90_000)
    assert np.unique(addr).size > 70_000
    with nest_native.using(module):
        found = nest_native.pair_frees(addr, nbytes)
    assert found is not None and found.tolist() == numpy_pairs(addr, nbytes)
    ts = np.arange(addr.size, dtype=np.int64) // 3
    at_addr, at_ts = addr[::7] + 512 * (np.arange(addr[::7].size) % 2), ts[::7] + 1
    expected = _last_at_or_before(addr, ts, at_addr, at_ts)
    with nest_native.using(module):
        hit, matched = _last_at_or_before(addr, ts, at_addr, at_ts)
    assert hit.tolist() == expected[0].tolist() and matched.tolist() == expected[1].tolist()
    assert 0 < int(matched.sum()) < matched.size
