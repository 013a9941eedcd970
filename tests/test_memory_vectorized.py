"""The memory story's column-at-a-time steps give what the per-entry loops they replaced gave: the
storages from before the block chosen from the snapshots' unmatched entries (``_before_block``: the
same dict, in the same order), and the placements of a column of spans (``Placements.many``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from layerscope.attribution.buckets import Buckets
from layerscope.attribution.catalog import ModuleInfo
from layerscope.attribution.memory.story import _CODE, CATEGORIES, Placement, Placements, _before_block
from layerscope.events import EventKind, EventTable
from layerscope.model.profile import Phase


def loop_before_block(addr: np.ndarray, nbytes: np.ndarray, codes: np.ndarray) -> dict[int, tuple[int, str]]:
    """The loop ``_categorise`` ran before (the reference)."""
    unmatched: dict[int, tuple[int, str]] = {}
    for a, size, code in zip(addr.tolist(), nbytes.tolist(), codes.tolist(), strict=True):
        category_name = "other" if code == _CODE["activation"] else CATEGORIES[code]
        known = unmatched.get(a)
        if known is None or _CODE[category_name] < _CODE[known[1]]:
            unmatched[a] = (size, category_name)
    return unmatched


@pytest.mark.parametrize("seed", range(30))
def test_storages_from_before_the_block_are_the_loops(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(0, 400))
    spread = int(rng.choice([2, 20, 1000]))
    addr = rng.integers(-spread, spread, size, dtype=np.int64) * 64  # repeats, zero and negatives
    nbytes = rng.integers(1, 1 << 40, size, dtype=np.int64)
    codes = rng.integers(0, len(CATEGORIES), size, dtype=np.int64)  # ties in code, activations
    found = _before_block(addr, nbytes, codes)
    expected = loop_before_block(addr, nbytes, codes)
    assert list(found.items()) == list(expected.items())  # the same entries in the same order
    if size > 50 and spread < size:
        assert len(expected) < size  # the draw repeats addresses: the choice is tested


def placements_table(
    rng: np.random.Generator, spans: int
) -> tuple[EventTable, np.ndarray, Buckets, list[ModuleInfo]]:
    table = EventTable()
    names = [f"aten::op{k}" for k in range(5)]
    for k in range(spans):
        table.add_span(names[int(rng.integers(0, 5))], EventKind.CPU_OP, 1, k * 10, 5)
    catalog = [ModuleInfo(path="", type_name="Net", parent=None), ModuleInfo("fc", "Linear", "")]
    buckets = Buckets(len(catalog))
    label = buckets.unattributed("(between ops)", Phase.OTHER)
    choices = np.array([-1, 0, 1, 2, 3, label], dtype=np.int64)  # -1: a span in no bucket
    return table, choices[rng.integers(0, choices.size, spans)], buckets, catalog


@pytest.mark.parametrize("seed", range(20))
def test_placements_of_a_column_are_each_spans_own(seed: int) -> None:
    rng = np.random.default_rng(seed)
    table, bucket, buckets, catalog = placements_table(rng, int(rng.integers(1, 60)))
    owned = np.flatnonzero(bucket >= 0)
    if not owned.size:
        pytest.skip("the draw gave no span a bucket")
    spans = np.where(rng.random(200) < 0.2, -1, rng.choice(owned, 200))
    place = Placements(table, bucket, buckets, catalog)
    found = place.many(spans)
    expected: list[Any] = [Placements(table, bucket, buckets, catalog)(s) if s >= 0 else None for s in spans]
    assert found == expected
    assert all(isinstance(p, Placement) for p in found if p is not None) and None in found
    assert place.many(np.full(3, -1, dtype=np.int64)) == [None, None, None]
