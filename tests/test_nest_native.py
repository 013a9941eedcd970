"""Attribution's native kernels (``attribution/nest_native.py`` over ``capture/native_nesting.cpp``)
give exactly what the numpy path gives: nesting (parents, exclusive time, levels) on random tables
that nest, overlap, share starts and last no time or less than none, and whole saved profiles of
live captures and trace files built both ways. Without the native module built, skipped (CI builds
it with ``make``); the numpy path is tested everywhere else.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import layerscope as ls
from layerscope.attribution import nest_native
from layerscope.attribution.nest_columns import _anchors, exclusive, parents
from layerscope.attribution.nesting import depths, inclusive, levels, time_order
from layerscope.capture import native
from layerscope.events import EventKind, EventTable
from layerscope.model.serialize import profile_to_dict
from tests.test_attribution_columns import CASES, TRACES, random_table, recorded


@pytest.fixture(scope="module")
def module() -> Iterator[Any]:
    found = native.load_trace_reader()
    if found is None or not hasattr(found, "nest"):
        pytest.skip("the native module is not built here (`layerscope native build`)")
    with nest_native.using(None):  # each test picks its way
        yield found


def numpy_nesting(table: EventTable, order: np.ndarray) -> tuple[list[int], list[int], list[list[int]]]:
    parent = parents(table, order)
    excl = exclusive(table, order, parent)
    return parent.tolist(), excl.tolist(), [level.tolist() for level in levels(order, depths(parent))]


@pytest.mark.parametrize("seed", range(40))
def test_nesting_is_numpys_on_random_tables(seed: int, module: Any) -> None:
    rng = random.Random(seed)
    for _ in range(25):
        table = random_table(rng)
        order = time_order(table)
        with nest_native.using(module):
            found = nest_native.nest(table, order)
        assert found is not None
        assert found.parent.dtype == np.int64 and found.excl.dtype == np.int64
        made = (found.parent.tolist(), found.excl.tolist(), [level.tolist() for level in found.levels])
        assert made == numpy_nesting(table, order)


def test_nesting_of_an_empty_table(module: Any) -> None:
    table = EventTable()
    table.add_span("kernel", EventKind.KERNEL, 1, 0, 5)  # no CPU span at all
    order = time_order(table)
    with nest_native.using(module):
        found = nest_native.nest(table, order)
    assert found is not None
    assert (found.parent.tolist(), found.excl.tolist(), found.levels) == ([-1], [5], [])


def test_without_the_kernels_it_is_numpy(module: Any) -> None:
    table = random_table(random.Random(1))
    with nest_native.using(None):
        assert not nest_native.active() and nest_native.nest(table, time_order(table)) is None
    with nest_native.using(object()):  # a module built before the kernels existed
        assert not nest_native.active()


@pytest.mark.parametrize("seed", range(20))
def test_unique_is_numpys(seed: int, module: Any) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(0, 3000))
    spread = int(rng.choice([3, 50, 1 << 40]))
    keys = rng.integers(-spread, spread, size, dtype=np.int64)
    expected = np.unique(keys, return_index=True, return_inverse=True)
    for way in (module, None):
        with nest_native.using(way):
            found = nest_native.unique(keys)
        for mine, theirs in zip(found, expected, strict=True):
            assert mine.dtype == np.int64 and mine.tolist() == theirs.reshape(-1).tolist()


@pytest.mark.parametrize("seed", range(20))
def test_inclusive_sums_are_numpys_to_the_bit(seed: int, module: Any) -> None:
    rng = random.Random(seed)
    values = np.random.default_rng(seed)
    for _ in range(10):
        table = random_table(rng)
        order = time_order(table)
        parent = parents(table, order)
        by_level = levels(order, depths(parent))
        own = values.integers(0, 1 << 40, parent.size).astype(np.float64) / 7.0  # inexact sums
        expected = inclusive(own, parent, by_level)
        with nest_native.using(module):
            found = nest_native.inclusive(own, parent, by_level)
            assert inclusive(own, parent, by_level).tobytes() == expected.tobytes()
        if found is not None:  # None: nothing nested
            assert found.tobytes() == expected.tobytes()


def both_ways(
    build: Callable[[], ls.Profile], module: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Any]:
    """The saved form of ``build()`` with the native kernels, then with numpy; both validate. The
    hand-overs inside the build (``loading.py``, ``capture/kineto.py``) must not undo the way chosen."""
    made = []
    for way in (module, None):
        with nest_native.using(way), monkeypatch.context() as patch:
            patch.setattr(nest_native, "use", lambda _module: None)
            profile = build()
        profile.validate()
        made.append(profile_to_dict(profile))
    return made[0], made[1]


@pytest.mark.parametrize("case", list(CASES))
def test_a_capture_builds_the_same_profile_both_ways(
    case: str, module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model, x, options = CASES[case]()
    new, old = both_ways(recorded(model, x, monkeypatch, **options), module, monkeypatch)
    assert new["root"]["children"], "the tree has modules"
    assert new == old


@pytest.mark.parametrize("trace", TRACES, ids=[path.name for path in TRACES])
def test_a_trace_file_builds_the_same_profile_both_ways(
    trace: Path, module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    new, old = both_ways(lambda: ls.load(trace), module, monkeypatch)
    assert new["ops"]["name"]
    assert new == old


def test_a_live_capture_hands_the_kernels_over(module: Any) -> None:
    model = torch.nn.Linear(4, 4)
    with ls.profile(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    prof.profile.validate()
    assert nest_native.active()


def test_a_trace_file_hands_the_kernels_over(module: Any) -> None:
    nest_native.use(None)  # not left over from a live capture's hand-over
    ls.load(TRACES[0])
    assert nest_native.active()


def test_unique_is_numpys_past_many_table_growths(module: Any) -> None:
    # the native table starts small and doubles with the distinct keys: many doublings, keys that
    # share their low bits, and repeats seen before and after each growth
    rng = np.random.default_rng(7)
    keys = np.concatenate([rng.integers(0, 40_000, 60_000) << 20, np.arange(-500, 500)]).astype(np.int64)
    keys = np.concatenate([keys, keys[::-3]])
    expected = np.unique(keys, return_index=True, return_inverse=True)
    with nest_native.using(module):
        found = nest_native.unique(keys)
    for mine, theirs in zip(found, expected, strict=True):
        assert mine.tolist() == theirs.reshape(-1).tolist()


@pytest.mark.parametrize("seed", range(10))
def test_anchors_by_level_are_pointer_doublings(seed: int, module: Any) -> None:
    # sweep_columns finds anchors level by level when the native pass gave the levels
    table = random_table(random.Random(seed))
    order = time_order(table)
    with nest_native.using(module):
        found = nest_native.nest(table, order)
    assert found is not None
    span_role = np.random.default_rng(seed).integers(0, 6, table.span_count)
    by_level = _anchors(order, found.parent, span_role, found.levels)
    assert by_level.tolist() == _anchors(order, found.parent, span_role).tolist()
