"""Figures of many windows at once: the length intervals cover in each window, intervals cut to
each window, and float sums per window equal bit for bit to numpy's ``ndarray.sum()`` of each
window alone (so figures computed for all steps at once are the very ones a loop over the steps
gave).

A window's pieces are a *segment*: rows ``bounds[k]:bounds[k + 1]`` of arrays laid out window
after window."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

#: numpy's pairwise summation sums arrays up to this long with eight running sums.
_BLOCK = 128
_LANES = 8
#: Segments summed at a time (a grid of 1 MB per 1024).
_ROWS = 4096
#: Pieces cut at a time: bounds the memory of many windows over a long trace.
_CHUNK = 1 << 18


def segment_sums(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Per segment, ``values[bounds[k]:bounds[k + 1]].sum()`` of non-negative float64 ``values``,
    bit for bit. numpy sums a contiguous array of n < 8 in order from 0.0; n ≤ 128 in eight
    running sums (element i into sum i % 8, up to the last multiple of 8), combined pairwise, then
    the rest in order; longer ones as two halves, recursively: those are few (a window with over
    128 pieces of one kind) and summed by numpy itself."""
    sizes = np.diff(bounds)
    out = np.zeros(sizes.size)
    for k in np.flatnonzero(sizes > _BLOCK).tolist():
        out[k] = values[bounds[k] : bounds[k + 1]].sum()
    small = np.flatnonzero((sizes > 0) & (sizes <= _BLOCK))
    for at in range(0, small.size, _ROWS):  # a few MB of grid at a time
        rows = small[at : at + _ROWS]
        out[rows] = _lane_sums(values, bounds[:-1][rows], sizes[rows])
    return out


def _lane_sums(values: np.ndarray, first: np.ndarray, size: np.ndarray) -> np.ndarray:
    """numpy's sums of ``values[first[k]:first[k] + size[k]]``, each 1 to 128 long."""
    # one row per segment, zero-padded: adding 0.0 leaves a non-negative sum as it is
    column = np.arange(_BLOCK)
    grid = np.zeros((size.size, _BLOCK))
    inside = column < size[:, None]
    grid[inside] = values[(first[:, None] + column)[inside]]
    short = np.zeros(size.size)
    for i in range(_LANES - 1):
        short = short + grid[:, i]
    whole = size - size % _LANES
    lanes = np.where(column < whole[:, None], grid, 0.0).reshape(size.size, _BLOCK // _LANES, _LANES)
    running = lanes[:, 0, :].copy()
    for row in range(1, _BLOCK // _LANES):
        running = running + lanes[:, row, :]
    r = [running[:, j] for j in range(_LANES)]
    total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    rows = np.arange(size.size)
    for extra in range(_LANES - 1):
        at = whole + extra
        total = total + np.where(at < size, grid[rows, np.minimum(at, _BLOCK - 1)], 0.0)
    found: np.ndarray = np.where(size < _LANES, short, total)
    return found


def covered_in_windows(start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window ``[lo, hi)``, the length of it that intervals ``[start, end)`` (sorted by start)
    cover, overlaps once (int64): the covered length before ``hi`` less that before ``lo``, from the
    union's blocks and their running total (no interval is cut per window)."""
    if not start.size:
        return np.zeros(lo.size, dtype=np.int64)
    reach = np.maximum.accumulate(end)
    opens = np.flatnonzero(start[1:] > reach[:-1]) + 1
    block_start = np.concatenate([start[:1], start[opens]])
    block_end = np.concatenate([reach[opens - 1], reach[-1:]])
    before = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(block_end - block_start)])

    def covered_before(t: np.ndarray) -> np.ndarray:
        at = np.searchsorted(block_start, t, side="right") - 1
        inside = np.minimum(t, block_end[np.maximum(at, 0)]) - block_start[np.maximum(at, 0)]
        return np.where(at >= 0, before[np.maximum(at, 0)] + inside, 0)

    found: np.ndarray = np.maximum(covered_before(hi) - covered_before(lo), 0)
    return found


@dataclass(frozen=True)
class Pieces:
    """Intervals cut to windows ``first:first + bounds.size - 1``: the rows they come from, and the
    pieces' starts and ends; each window's pieces a segment."""

    first: int
    bounds: np.ndarray
    rows: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @property
    def windows(self) -> slice:
        """The windows these pieces cut, as a slice of all windows."""
        return slice(self.first, self.first + self.bounds.size - 1)


def window_pieces(
    start: np.ndarray, end: np.ndarray, reach: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> Iterator[Pieces]:
    """Intervals ``[start, end)`` (sorted by start; ``reach`` the running maximum of ``end``) cut to
    each window ``[lo, hi)``, empty pieces dropped, a chunk of windows at a time. A window's pieces
    are the intervals from the first that reaches past ``lo`` to the last that starts before ``hi``,
    clipped: found in O(log n) each."""
    first = np.searchsorted(reach, lo, side="right")
    count = np.maximum(first, np.searchsorted(start, hi, side="left")) - first
    w0 = 0
    while w0 < lo.size:
        w1 = w0 + max(1, int(np.searchsorted(np.cumsum(count[w0:]), _CHUNK, side="right")))
        yield _cut(start, end, first[w0:w1], count[w0:w1], lo[w0:w1], hi[w0:w1], w0)
        w0 = w1


def _cut(
    start: np.ndarray,
    end: np.ndarray,
    first: np.ndarray,
    count: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    w0: int,
) -> Pieces:
    seg = np.repeat(np.arange(count.size), count)
    rows = np.arange(seg.size) + np.repeat(first - (np.cumsum(count) - count), count)
    s = np.minimum(np.maximum(start[rows], lo[seg]), hi[seg])
    e = np.minimum(np.maximum(end[rows], lo[seg]), hi[seg])
    keep = e > s
    bounds = np.concatenate(
        [np.zeros(1, dtype=np.int64), np.cumsum(np.bincount(seg[keep], minlength=count.size))]
    )
    return Pieces(w0, bounds, rows[keep], s[keep], e[keep])
