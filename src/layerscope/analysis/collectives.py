"""Collective kernels across ranks: who arrives late.

A collective (all-reduce, all-to-all, send/recv...) ends on every rank at about the same moment: it
cannot finish before the last rank joins. So the same collective is found on each rank as the
communication kernel ending nearest the reference rank's, and a rank that *started* it later than
the others is the one they waited for. Summed over a run, the rank with the most lateness is the
straggler, named with its worst collective and the step it ran in.

Kernels are matched by end time, not by order: traces start at different moments on each rank, so
the n-th kernel of one rank need not be the n-th of another. Clocks are the trace's own (Kineto
writes wall-clock microseconds on every rank); skew between hosts larger than the matching
tolerance leaves collectives unmatched rather than misread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Ends closer than this (µs), or than this share of the kernel's duration, are the same collective.
MATCH_US = 50.0
MATCH_SHARE = 0.02


@dataclass(frozen=True, slots=True)
class CollectiveKernel:
    """One communication kernel: name (without parameters), start and end (µs, the trace's clock),
    and the ProfilerStep it started in (None outside steps)."""

    name: str
    start_us: float
    end_us: float
    step: int | None


@dataclass(frozen=True, slots=True)
class LateCollective:
    """The rank that joined collectives last: total lateness over the matched collectives, and its
    worst one (how late, which collective, in which step)."""

    rank: int
    late_us: float  # summed over matched collectives
    matched: int  # collectives found on at least two ranks
    worst_us: float
    worst_name: str
    worst_step: int | None


def _nearest(ends: np.ndarray, target: float) -> int:
    k = int(np.searchsorted(ends, target))
    candidates = [j for j in (k - 1, k) if 0 <= j < ends.size]
    return min(candidates, key=lambda j: abs(ends[j] - target))


def late_collectives(
    ranks: Sequence[int], kernels: Sequence[Sequence[CollectiveKernel]]
) -> LateCollective | None:
    """The latest-joining rank over the collectives matched across ``ranks`` (None: fewer than two
    ranks with communication kernels, or nothing matched)."""
    have = [k for k, found in enumerate(kernels) if found]
    if len(have) < 2:
        return None
    ref = max(have, key=lambda k: len(kernels[k]))
    by_end = {k: sorted(kernels[k], key=lambda c: c.end_us) for k in have}
    ends = {k: np.asarray([c.end_us for c in by_end[k]]) for k in have}
    late = dict.fromkeys(have, 0.0)
    worst: dict[int, tuple[float, CollectiveKernel]] = {}
    matched = 0
    for own in by_end[ref]:
        group = {ref: own}
        for k in have:
            if k == ref:
                continue
            other = by_end[k][_nearest(ends[k], own.end_us)]
            tolerance = max(
                MATCH_US, MATCH_SHARE * min(own.end_us - own.start_us, other.end_us - other.start_us)
            )
            if abs(other.end_us - own.end_us) <= tolerance:
                group[k] = other
        if len(group) < 2:
            continue
        matched += 1
        first = min(c.start_us for c in group.values())
        for k, c in group.items():
            late[k] += c.start_us - first
            if c.start_us - first > worst.get(k, (0.0, c))[0]:
                worst[k] = (c.start_us - first, c)
    if not matched:
        return None
    slow = max(have, key=lambda k: late[k])
    worst_us, kernel = worst.get(slow, (0.0, by_end[slow][0]))
    return LateCollective(ranks[slow], late[slow], matched, worst_us, kernel.name, kernel.step)
