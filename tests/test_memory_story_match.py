"""Snapshot entries matched to allocations (``memory/story.py``'s ``_last_at_or_before``): the path
for rows in time order (the story's allocations) and the general one both give what a plain search
gives."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.attribution.memory.story import _last_at_or_before


def _reference(
    addr: np.ndarray, ts: np.ndarray, at_addr: np.ndarray, at_ts: np.ndarray
) -> tuple[list[int], list[bool]]:
    """Per query, the last row (in (time, position) order) at its address starting at or before it."""
    hits, matched = [], []
    for a, t in zip(at_addr.tolist(), at_ts.tolist(), strict=True):
        rows = [k for k in range(addr.size) if addr[k] == a and ts[k] <= t]
        best = max(rows, key=lambda k: (int(ts[k]), k)) if rows else -1
        hits.append(best)
        matched.append(best >= 0)
    return hits, matched


@pytest.mark.parametrize("time_ordered", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_last_row_at_or_before_matches_a_plain_search(seed: int, time_ordered: bool) -> None:
    rng = np.random.default_rng(seed)
    n, queries = int(rng.integers(1, 60)), int(rng.integers(1, 40))
    addr = rng.integers(0, 8, n).astype(np.int64) * 4096  # few addresses: many rows share one
    ts = rng.integers(0, 30, n).astype(np.int64)  # ties in time too
    if time_ordered:
        ts = np.sort(ts)
    at_addr = rng.integers(0, 10, queries).astype(np.int64) * 4096  # some at no row's address
    at_ts = rng.integers(-5, 35, queries).astype(np.int64)
    at_addr[0], at_ts[0] = addr[-1], ts[-1]  # one query that a row answers
    hit, matched = _last_at_or_before(addr, ts, at_addr, at_ts)
    expected_hit, expected_matched = _reference(addr, ts, at_addr, at_ts)
    assert matched.tolist() == expected_matched
    assert [h if m else -1 for h, m in zip(hit.tolist(), matched.tolist(), strict=True)] == expected_hit
    assert expected_matched[0]  # the comparison has teeth
