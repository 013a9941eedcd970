"""Collective kernels across ranks: who arrives late.

A collective (all-reduce, all-to-all, send/recv...) ends on every rank at about the same moment: it
cannot finish before the last rank joins. So the same collective is found on each rank as the
communication kernel of the same name ending within a tolerance of the others (each kernel in one
collective at most), and a rank that *started* it later than the others is the one they waited
for. Summed over a run, the rank with the most lateness is the straggler, named with its worst
collective and the step it ran in.

Kernels are matched by end time, not by order: traces start at different moments on each rank, so
the n-th kernel of one rank need not be the n-th of another. Clocks are the trace's own (Kineto
writes wall-clock microseconds on every rank); skew between hosts larger than the matching
tolerance leaves collectives unmatched rather than misread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    matched: int  # collectives of this rank found on at least one other rank
    worst_us: float
    worst_name: str
    worst_step: int | None


def _instances(kernels: Sequence[Sequence[CollectiveKernel]]) -> list[dict[int, CollectiveKernel]]:
    """The collectives found on two ranks or more: kernels of one name, one per rank, whose ends lie
    within the tolerance of the group's first end (each kernel in one group at most)."""
    flat = sorted(
        ((c.end_us, k, c) for k, found in enumerate(kernels) for c in found), key=lambda item: item[0]
    )
    used = [False] * len(flat)
    groups = []
    for i, (end, rank, kernel) in enumerate(flat):
        if used[i]:
            continue
        used[i] = True
        group = {rank: kernel}
        tolerance = max(MATCH_US, MATCH_SHARE * (kernel.end_us - kernel.start_us))
        j = i + 1
        while j < len(flat) and flat[j][0] - end <= tolerance:
            _, other_rank, other = flat[j]
            if not used[j] and other_rank not in group and other.name == kernel.name:
                group[other_rank] = other
                used[j] = True
            j += 1
        if len(group) >= 2:
            groups.append(group)
    return groups


def late_collectives(
    ranks: Sequence[int], kernels: Sequence[Sequence[CollectiveKernel]]
) -> LateCollective | None:
    """The latest-joining rank over the collectives matched across ``ranks`` (None: no collective
    found on two ranks, or no rank ever joined one late)."""
    groups = _instances(kernels)
    late = [0.0] * len(kernels)
    worst: dict[int, tuple[float, CollectiveKernel]] = {}
    for group in groups:
        first = min(c.start_us for c in group.values())
        for k, c in group.items():
            late[k] += c.start_us - first
            if c.start_us - first > worst.get(k, (0.0, c))[0]:
                worst[k] = (c.start_us - first, c)
    if not groups or max(late) <= 0:
        return None
    slow = max(range(len(late)), key=lambda k: late[k])
    worst_us, kernel = worst[slow]
    matched = sum(1 for g in groups if slow in g)
    return LateCollective(ranks[slow], late[slow], matched, worst_us, kernel.name, kernel.step)
