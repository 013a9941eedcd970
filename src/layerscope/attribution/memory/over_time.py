"""Absolute memory over time, stacked by category (:class:`~layerscope.model.memory.MemoryOverTime`,
the HTML report's memory chart): the story's allocations, each in its category from its allocation to
its free, on top of what was live before the block (each storage in its category until it is freed).

The categories add up to the story's running total at every event, so the chart's peak is the
report's absolute peak and its stack there is the live-at-peak breakdown by category.
"""

from __future__ import annotations

import numpy as np

from layerscope.attribution.memory.story import CATEGORIES, MemoryStory
from layerscope.attribution.memory.timeline import first_maxima
from layerscope.model.memory import MemoryOverTime

_OTHER = CATEGORIES.index("other")


def category_deltas(story: MemoryStory) -> tuple[np.ndarray, np.ndarray]:
    """(bytes live per category before the first event, change per category at each event): the
    latter's cumulative sum on top of the former is the live bytes by category after each event."""
    n, codes = story.ts.size, len(CATEGORIES)
    code_of = {name: k for k, name in enumerate(CATEGORIES)}
    initial = np.zeros(codes, dtype=np.int64)
    for nbytes, category in story.baseline.entries.values():
        initial[code_of[category]] += nbytes
    initial[_OTHER] += story.baseline.unknown
    delta = np.zeros((codes, n), dtype=np.int64)
    freed = story.free_at[story.alloc]
    paired = freed >= 0
    # Each event lands in one cell (an allocation, its free and the rest are different events), so
    # plain assignment does what np.add.at would, without its cost.
    delta[story.code, story.alloc] = story.nbytes[story.alloc]
    delta[story.code[paired], freed[paired]] = story.nbytes[freed[paired]]
    covered = np.zeros(n, dtype=bool)
    covered[story.alloc] = True
    covered[freed[paired]] = True
    # The rest: frees of memory from before the block (from a known storage's category, else other)
    # and every event of a trace without addresses (other); no Python per event.
    rest = np.flatnonzero(~covered)
    code = np.full(rest.size, _OTHER, dtype=np.int64)
    known = story.baseline.entries
    if known and rest.size:
        addrs = np.fromiter(known, dtype=np.int64, count=len(known))
        known_codes = np.array([code_of[category] for _, category in known.values()], dtype=np.int64)
        order = np.argsort(addrs)
        pos = np.minimum(np.searchsorted(addrs[order], story.addr[rest]), addrs.size - 1)
        hit = (addrs[order][pos] == story.addr[rest]) & (story.nbytes[rest] < 0)
        code[hit] = known_codes[order][pos[hit]]
    delta[code, rest] = story.nbytes[rest]
    for addr in story.baseline.silent:  # storages from before the block whose reuse freed them
        k = int(np.searchsorted(story.ts, story.baseline.freed_at[addr], side="left"))
        if k < n:
            nbytes, category = story.baseline.entries[addr]
            delta[code_of[category], k] -= nbytes
    return initial, delta


def memory_over_time(story: MemoryStory, start_ns: int, points: int = 800) -> MemoryOverTime | None:
    """The story's live memory by category, sampled to at most ``points`` points: the start (what
    was live before the first event: the peak when nothing later exceeds it, as ``story.peak()``
    says), then each slice's highest total, the last event and the peak; None without events."""
    n = story.ts.size
    if not n:
        return None
    initial, delta = category_deltas(story)
    # in place: categories x events of int64 is tens of MiB at 1 GB of trace, each copy fresh pages
    live = np.cumsum(delta, axis=1, out=delta)
    live += initial[:, None]
    total = story.running
    edges = np.linspace(0, n, num=min(points - 3, n) + 1).astype(np.int64)  # and the start, last, peak
    keep = sorted({*first_maxima(total, edges).tolist(), 0, n - 1, int(np.argmax(total))})
    used = [c for c in range(len(CATEGORIES)) if initial[c] or live[c].any()]
    where = story.place.many(story.owner[keep])
    start = min(start_ns, int(story.ts[0]))
    return MemoryOverTime(
        # ns to µs: int / 1000.0 is already the double nearest the 3-decimal value (exact below 2**53
        # ns), so it needs no round(..., 3)
        t_us=((start - start_ns) / 1000.0, *((story.ts[keep] - start_ns) / 1000.0).tolist()),
        categories=tuple(CATEGORIES[c] for c in used),
        bytes_by_category=tuple((int(initial[c]), *live[c, keep].tolist()) for c in used),
        phases=("", *(w.phase if w is not None else "" for w in where)),
        modules=("", *(w.module if w is not None else "" for w in where)),
    )
