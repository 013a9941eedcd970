"""Module marks aligned with torch's events through clock anchors.

Marks are converted to Unix ns by our own clock converter, torch's events by torch's; the two are
made and finished at different moments and, rarely, disagree by more than the gap between a mark
and the op beside it (~2 µs in 1 session of 600 on the project's VM: ``benchmarks/clock_marks.py
--sessions``), which nests boundary ops into the parent module. An anchor is a profiler range of
ours (``ANCHOR_NAME``) between two raw clock reads, taken when a marks session starts (twice: the
thread's first profiler range is slow to record, ~12 µs, and brackets loosely) and stops
(``native_reader.cpp``): torch's stamps of the range must lie inside our bracket. Where they do not,
the marks are shifted by the offset nearest zero that puts every anchor inside; where every anchor
agrees, nothing moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from layerscope.events.table import CLOCK_ANCHOR_NAME

#: The anchors' profiler range (``native_reader.cpp``'s ``kAnchorName``): dropped from the tables
#: and traces layerscope makes.
ANCHOR_NAME = CLOCK_ANCHOR_NAME
#: How far (ns) torch's stamps of an anchor may lie from our bracket and still be its stamps.
_MATCH_WINDOW_NS = 100_000


class Anchor(NamedTuple):
    """One anchor as we converted it: the thread (torch's id) and the two raw reads, Unix ns."""

    tid: int
    before: int
    after: int


class Stamped(NamedTuple):
    """An anchor range as torch recorded it: thread (torch's id), start and end, Unix ns."""

    tid: int
    start: int
    end: int


class Alignment(NamedTuple):
    """Shifts (ns, to add to a mark) at points in time (ns, increasing), interpolated between them."""

    at: np.ndarray
    shift: np.ndarray

    def apply(self, times: np.ndarray) -> np.ndarray:
        """``times`` (Unix ns, int64) shifted."""
        shifted: np.ndarray = times + np.rint(np.interp(times, self.at, self.shift)).astype(np.int64)
        return shifted


def alignment(anchors: Sequence[Anchor], stamped: Sequence[Stamped]) -> Alignment | None:
    """How to shift marks so that every anchor torch recorded lies inside our bracket of it, or None
    when each already does (or torch recorded none: a schedule's step it did not record).

    Over one session the two converters differ by an offset (their rates agree far better than their
    origins): one shift is looked for that puts every anchor inside its bracket, the one nearest
    zero. Only when none does (a rate that drifted) is each anchor's own least shift taken,
    interpolated between them in time."""
    fits = [_fit(anchor, found) for anchor, found in _matched(anchors, stamped)]
    if not fits:
        return None
    low, high = max(f[0] for f in fits), min(f[1] for f in fits)
    if low <= high:
        shift = _nearest_zero(low, high)
        return Alignment(np.zeros(1, dtype=np.int64), np.array([float(shift)])) if shift else None
    points = sorted((middle, _nearest_zero(lo, hi)) for lo, hi, middle in fits)
    return Alignment(
        np.array([p[0] for p in points], dtype=np.int64), np.array([float(p[1]) for p in points])
    )


def _fit(anchor: Anchor, found: Stamped) -> tuple[int, int, int]:
    """The shifts ``d`` that put ``found`` inside ``anchor``'s bracket (``before + d <= start`` and
    ``end <= after + d``), as (least, most), and the bracket's middle."""
    return found.end - anchor.after, found.start - anchor.before, (anchor.before + anchor.after) // 2


def _nearest_zero(low: int, high: int) -> int:
    if low > high:  # torch's range wider than our bracket: only a rate error does that
        return (low + high) // 2
    return min(max(0, low), high)


def _matched(anchors: Sequence[Anchor], stamped: Sequence[Stamped]) -> list[tuple[Anchor, Stamped]]:
    """Our anchors paired with torch's stamps of them, per thread: in order when torch recorded every
    one, else each with the stamp nearest it (a schedule records only some)."""
    pairs: list[tuple[Anchor, Stamped]] = []
    for tid in sorted({a.tid for a in anchors}):
        mine = [a for a in anchors if a.tid == tid]
        theirs = sorted((s for s in stamped if s.tid == tid), key=lambda s: s.start)
        if len(mine) == len(theirs):
            pairs += [(a, s) for a, s in zip(mine, theirs, strict=True) if _near(a, s)]
            continue
        for anchor in mine:
            near = [s for s in theirs if _near(anchor, s)]
            if near:
                middle = (anchor.before + anchor.after) // 2
                pairs.append((anchor, min(near, key=lambda s: abs((s.start + s.end) // 2 - middle))))
    return pairs


def _near(anchor: Anchor, stamped: Stamped) -> bool:
    return (
        stamped.start >= anchor.before - _MATCH_WINDOW_NS and stamped.end <= anchor.after + _MATCH_WINDOW_NS
    )
