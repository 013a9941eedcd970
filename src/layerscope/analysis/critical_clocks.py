"""Rank clocks aligned by the collectives themselves, and the collectives matched across ranks,
for the critical path through all ranks (``critical_ranks.py``).

A collective ends on every rank at about the same moment: no rank's kernel can finish before the
last participant has joined. So the same collective's ends, read on two ranks' clocks, differ by
the two clocks' offset. Each rank's offset from the reference rank (the first) is estimated from
the communication kernels of the same name on both (or on a rank already aligned, when the two
share no collective): every pair's end difference is a candidate,
the candidates vote (each counts the others within :data:`~layerscope.analysis.collectives.MATCH_US`
of it), and the offset is the median of the largest cluster (ties: the one nearest zero, since
Kineto already writes wall-clock time on every host). A cluster of one pair is no evidence:
that rank keeps its own clock (offset 0) and :class:`RankClocks` says so. A limit: collectives
repeating at a steady period make clusters one period apart almost as large (the true one wins by
the collectives at the window's edges), so clocks further apart than that period are not reliably
aligned; hosts synchronised by NTP are far closer than a training step.

Once aligned, the collectives are matched as ``collectives.py`` matches them for the straggler
report: kernels of one name, one per rank, whose ends lie within the tolerance of each other.
The traces we have carry no process group or sequence number on their kernels (Kineto writes
``Process Group Name`` only on ``record_param_comms``, and no sequence number), so name and end
time are what identify a collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layerscope.analysis.collectives import MATCH_US, CollectiveKernel, _instances

#: Candidate pairs per rank and kernel name, about at most (beyond: a sample of the reference's
#: kernels, each paired with every kernel of the other rank).
_MAX_PAIRS = 200_000


@dataclass(frozen=True)
class RankKernels:
    """One rank's communication kernels in the path's window: their spans (table indices), names,
    and start and end (ns, the rank's own clock)."""

    spans: np.ndarray
    names: tuple[str, ...]
    start: np.ndarray
    end: np.ndarray


@dataclass(frozen=True)
class RankClocks:
    """Each rank's clock offset from the reference rank (ns; subtract it to read the reference
    clock) and how many collectives voted for it (0: none agreed, the rank's own clock kept)."""

    offset_ns: tuple[int, ...]
    votes: tuple[int, ...]


def _end_differences(ref: RankKernels, other: RankKernels) -> np.ndarray:
    """End differences (ns, other minus reference) of every pair of same-named kernels."""
    found = []
    for name in sorted(set(ref.names) & set(other.names)):
        a = ref.end[np.asarray([n == name for n in ref.names], dtype=bool)]
        b = other.end[np.asarray([n == name for n in other.names], dtype=bool)]
        if a.size * b.size > _MAX_PAIRS:  # many kernels: a sample of the reference's, evenly spread
            keep = max(20, _MAX_PAIRS // b.size)
            a = a[np.unique(np.linspace(0, a.size - 1, min(keep, a.size)).astype(np.int64))]
        found.append((b[None, :] - a[:, None]).reshape(-1))
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def clock_offset(ref: RankKernels, other: RankKernels) -> tuple[int, int]:
    """``other``'s clock offset from ``ref``'s (ns) and the votes for it (see the module's text)."""
    diffs = np.sort(_end_differences(ref, other))
    if not diffs.size:
        return 0, 0
    tolerance = int(MATCH_US * 1000)
    votes = np.searchsorted(diffs, diffs + tolerance, side="right") - np.searchsorted(
        diffs, diffs - tolerance, side="left"
    )
    best = np.flatnonzero(votes == votes.max())
    centre = int(diffs[best[np.argmin(np.abs(diffs[best]))]])
    cluster = diffs[np.abs(diffs - centre) <= tolerance]
    if cluster.size < 2:
        return 0, int(cluster.size)
    return int(np.median(cluster)), int(cluster.size)


def align_clocks(kernels: Sequence[RankKernels]) -> RankClocks:
    """Every rank's offset from the first rank's clock (see the module's text): from the first rank
    where they share collectives, else through a rank already aligned (subgroups: ranks 0-1 share
    collectives, 1-2 others)."""
    offsets, votes = [0] * len(kernels), [0] * len(kernels)
    aligned = [0]
    pending = list(range(1, len(kernels)))
    while pending:
        found = False
        for r in list(pending):
            for a in aligned:
                offset, vote = clock_offset(kernels[a], kernels[r])
                if vote >= 2:
                    offsets[r], votes[r] = offsets[a] + offset, vote
                    aligned.append(r)
                    pending.remove(r)
                    found = True
                    break
        if not found:
            break  # the rest share no collectives with the aligned ranks: their own clocks
    return RankClocks(tuple(offsets), tuple(votes))


def match_collectives(kernels: Sequence[RankKernels], clocks: RankClocks) -> list[dict[int, int]]:
    """The collectives found on two ranks or more, on aligned clocks: per collective, rank index
    -> the kernel's position in that rank's :class:`RankKernels`."""
    where: dict[int, tuple[int, int]] = {}
    lists: list[list[CollectiveKernel]] = []
    for r, found in enumerate(kernels):
        shift = clocks.offset_ns[r]
        mine = []
        for k, name in enumerate(found.names):
            kernel = CollectiveKernel(
                name, (int(found.start[k]) - shift) / 1000.0, (int(found.end[k]) - shift) / 1000.0, None
            )
            where[id(kernel)] = (r, k)
            mine.append(kernel)
        lists.append(mine)
    return [{r: where[id(c)][1] for r, c in group.items()} for group in _instances(lists)]


__all__ = ["RankClocks", "RankKernels", "align_clocks", "clock_offset", "match_collectives"]
