"""The memory events of one device class paired into allocations (by address), each named after
the snapshot entries seen at its address while it was live, and the baseline: what was live when the
recording began.

The baseline comes from the memory watch's snapshots (``capture/memory_watch.py``: parameters,
buffers, gradients, optimizer state and every other live tensor's storage at the start; storages
seen later that no allocation of the recording holds), from ``torch.cuda.memory_allocated()`` on
CUDA (the larger of the two: the allocator also counts tensors with no Python object and its
rounding), and from frees of memory allocated before the block (which only the CUDA allocator
reports, and those of memory allocated while an earlier profiler recorded).
On the CPU torch records no free of memory allocated before profiling began, so a baseline storage
counts as freed when an allocation inside the block reuses any of its bytes (before that, it is
live).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from layerscope.attribution import nest_native
from layerscope.attribution.buckets import Buckets
from layerscope.attribution.catalog import ModuleInfo
from layerscope.events.memory_snapshots import CATEGORIES as SNAPSHOT_CATEGORIES
from layerscope.events.memory_snapshots import Snapshot
from layerscope.events.table import EventTable
from layerscope.model.memory import BEFORE_BLOCK, UNPAIRED

_NEVER = np.iinfo(np.int64).max


class Placement(NamedTuple):
    """Where an event ran: its owner span's module path (or label), phase and op name (a tuple:
    hundreds are made per profile)."""

    module: str
    phase: str
    op: str


#: Category codes, in priority order: when one storage is seen as several (a parameter saved for
#: backward), the lowest code wins. Allocations start as temporary or other.
CATEGORIES = ("parameter", "gradient", "optimizer_state", "input", "activation", "temporary", "other")
_CODE = {name: code for code, name in enumerate(CATEGORIES)}
#: A snapshot entry's category (its index in ``memory_snapshots.CATEGORIES``, and one more for any
#: other name) as a code here.
_SNAPSHOT_CODE = np.array([_CODE[name] for name in SNAPSHOT_CATEGORIES] + [_CODE["other"]], dtype=np.int64)


def _last_at_or_before(
    addr: np.ndarray, ts: np.ndarray, at_addr: np.ndarray, at_ts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each query (address, time), the last of the rows (``addr``, ``ts``) at that address
    that starts at or before that time: its index (any, where there is none) and whether there is one."""
    hit = np.zeros(at_addr.size, dtype=np.int64)
    matched = np.zeros(at_addr.size, dtype=bool)
    if not addr.size or not at_addr.size:
        return hit, matched
    native = nest_native.last_at_or_before(addr, ts, at_addr, at_ts)
    if native is not None:
        return native
    addrs = nest_native.unique(addr)[0]
    rank = np.searchsorted(addrs, at_addr)
    known = rank < addrs.size
    known[known] = addrs[rank[known]] == at_addr[known]
    asked = np.flatnonzero(known)
    # (address, time) as one int64: dense ranks of both, so the product cannot overflow
    if bool((ts[1:] >= ts[:-1]).all()):
        # rows in time order (the story's allocations): a row's position is its time's rank, ties
        # by position as the stable sort breaks them, and a query's is that of the last row at or
        # before it; one stable sort by address instead of two, no ranking of the times
        order = np.argsort(addr, kind="stable")
        width = addr.size + 1
        key = np.searchsorted(addrs, addr[order]) * width + order
        query = rank[asked] * width + np.searchsorted(ts, at_ts[asked], side="right") - 1
    else:
        order = np.lexsort((ts, addr))
        times = nest_native.unique(np.concatenate([ts, at_ts]))[0]
        width = times.size + 1
        key = np.searchsorted(addrs, addr[order]) * width + np.searchsorted(times, ts[order])
        query = rank[asked] * width + np.searchsorted(times, at_ts[asked])
    pos = np.searchsorted(key, query, side="right") - 1
    found = pos >= 0
    found[found] = addr[order[pos[found]]] == at_addr[asked[found]]
    hit[asked[found]] = order[pos[found]]
    matched[asked[found]] = True
    return hit, matched


class MemoryStory:
    """The memory events of one device class, in time order, paired into allocations, with the
    snapshots' categories placed on them; columns over the allocations (``alloc``: their event
    indices), so that no Python runs per event.

    ``place(span)`` gives the Placement of a span index (-1: outside every op).
    """

    def __init__(
        self,
        table: EventTable,
        owners: np.ndarray,
        on_device: bool,
        snapshots: list[Snapshot],
        place: Placements,
        bucket: np.ndarray,
    ) -> None:
        picked = np.flatnonzero(table.array("mem_on_device") == on_device)
        by_time = picked[np.argsort(table.array("mem_ts")[picked], kind="stable")]
        self.ts = table.array("mem_ts")[by_time]
        self.nbytes = table.array("mem_bytes")[by_time]
        self.addr = table.array("mem_addr")[by_time]
        self.owner = owners[by_time] if owners.size else np.full(by_time.size, -1)
        self.owner_bucket = np.full(self.owner.size, -1, dtype=np.int64)
        owned = self.owner >= 0
        self.owner_bucket[owned] = bucket[self.owner[owned]]
        self.on_device = on_device
        self.place = place
        before = table.meta.get("allocated_before_bytes") or {}
        #: What the allocator held before the first event, where the source says (traces).
        self.allocated_before: int | None = before.get("device" if on_device else "cpu")
        #: Whether every event has an address (else nothing is paired: see ``live_at``).
        self.addressed = bool(self.addr.size) and bool((self.addr != 0).all())
        self.free_at = self._pair_frees()
        empty = np.zeros(0, dtype=np.int64)
        self.alloc = np.flatnonzero(self.nbytes > 0) if self.addressed else empty
        freed = self.free_at[self.alloc]
        self.t_free = np.where(freed >= 0, self.ts[np.maximum(freed, 0)], _NEVER)
        # Freed by the work that allocated it (the same module and phase, or unattributed entry).
        ob = self.owner_bucket
        temporary = (freed >= 0) & (ob[self.alloc] >= 0) & (ob[self.alloc] == ob[np.maximum(freed, 0)])
        self.code = np.where(temporary, _CODE["temporary"], _CODE["other"]).astype(np.int64)
        unmatched = self._categorise(snapshots) if self.addressed else _start_entries(snapshots, on_device)
        self.baseline = _baseline(snapshots, unmatched, on_device, self)
        #: Live bytes just after each event (the baseline included).
        self.running = self.baseline.running(self)

    def _pair_frees(self) -> np.ndarray:
        """For each allocation (positive bytes), the index of the free of its address that follows
        it (-1: never freed in the recording); frees map to -1."""
        n = self.ts.size
        free_at = np.full(n, -1, dtype=np.int64)
        if not n or not self.addressed:
            return free_at
        found = nest_native.pair_frees(self.addr, self.nbytes)
        if found is not None:
            return found
        by_addr = np.argsort(self.addr, kind="stable")  # by address, then time (index) order
        same_next = self.addr[by_addr[1:]] == self.addr[by_addr[:-1]]
        is_alloc = self.nbytes[by_addr[:-1]] > 0
        next_is_free = self.nbytes[by_addr[1:]] < 0
        pairs = np.flatnonzero(same_next & is_alloc & next_is_free)
        free_at[by_addr[pairs]] = by_addr[pairs + 1]
        return free_at

    def _categorise(self, snapshots: list[Snapshot]) -> dict[int, tuple[int, str]]:
        """Name each allocation after the snapshot entries at its address while it was live (one
        sorted search for all entries); return the entries no allocation of the recording holds
        (storages from before it), by address."""
        usable = [s for s in snapshots if s.ts > 0 or s.kind == "start"]  # without a watch point: no time
        picked = [(s.columns(), s.ts) for s in usable]
        mine = [c.on_device == self.on_device for c, _ in picked]
        if not any(m.any() for m in mine):
            return {}
        addr = np.concatenate([c.addr[m] for (c, _), m in zip(picked, mine, strict=True)])
        at = np.concatenate(
            [np.full(int(m.sum()), ts, dtype=np.int64) for (_, ts), m in zip(picked, mine, strict=True)]
        )
        category = np.concatenate([c.category[m] for (c, _), m in zip(picked, mine, strict=True)])
        nbytes = np.concatenate([c.nbytes[m] for (c, _), m in zip(picked, mine, strict=True)])
        # The allocation at the entry's address that began last at or before the snapshot, if it
        # was still live then: allocations at one address never overlap in time.
        hit, matched = _last_at_or_before(self.addr[self.alloc], self.ts[self.alloc], addr, at)
        matched &= at < self.t_free[hit]
        codes = _SNAPSHOT_CODE[category]
        np.minimum.at(self.code, hit[matched], codes[matched])
        return _before_block(addr[~matched], nbytes[~matched], codes[~matched])

    def peak(self) -> tuple[int, int]:
        """(absolute peak bytes, index of the event that reached it; -1: before any event)."""
        if not self.ts.size:
            return self.baseline.total, -1
        k = int(np.argmax(self.running))
        if self.running[k] <= self.baseline.total:
            return self.baseline.total, -1
        return int(self.running[k]), k

    def live_at(self, k: int, peak: int) -> list[tuple[str, str, str, int]]:
        """(category, module, phase, bytes) of what was live just after event ``k`` (-1: before the
        first), grouped; they add up to ``peak``, the live total then."""
        rows: list[tuple[str, str, str, int]] = []
        freed = self.free_at[self.alloc]
        live = (self.alloc <= k) & ((freed < 0) | (freed > k))
        if live.any():
            owner = self.owner[self.alloc][live]
            # one row per (category, owner bucket); the bucket's first owner span places it
            key = (
                self.code[live] * (int(self.owner_bucket.max()) + 2) + self.owner_bucket[self.alloc][live] + 1
            )
            groups, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            sums = np.bincount(inverse, weights=self.nbytes[self.alloc][live]).astype(np.int64)
            codes = self.code[live][first]
            for g in range(groups.size):
                where = self.place(int(owner[first[g]]))
                rows.append((CATEGORIES[int(codes[g])], where.module, where.phase, int(sums[g])))
        t = int(self.ts[k]) if k >= 0 else -1
        for addr, (nbytes, category) in self.baseline.entries.items():
            if self.baseline.freed_at.get(addr, _NEVER) > t:
                rows.append((category, BEFORE_BLOCK, "", nbytes))
        unknown = self.baseline.unknown_live(t)
        if unknown > 0:
            rows.append(("other", BEFORE_BLOCK, "", unknown))
        rest = peak - sum(row[3] for row in rows)
        if rest:  # events without addresses (a trace that lacks them) cannot be told apart
            rows.append(("other", UNPAIRED, "", rest))
        return rows


@dataclass
class _Baseline:
    """What was live when the recording began: known storages by address (bytes, category), bytes
    the watch did not see (``unknown``), when each stopped being live (``freed_at``; ``silent``:
    the frees no event shows, found by reuse of the address) and the frees of unknown bytes."""

    entries: dict[int, tuple[int, str]]
    unknown: int
    freed_at: dict[int, int]
    silent: set[int]
    unknown_frees: list[tuple[int, int]]  # (time, bytes)
    #: The allocator's own figure where it gave one (CUDA, traces): it and :attr:`seen` check each other.
    held: int | None = None

    @property
    def seen(self) -> int:
        """The bytes the watch's entries name (its scan of live tensors included)."""
        return sum(nbytes for nbytes, _ in self.entries.values())

    @property
    def total(self) -> int:
        """Everything live when recording began: what the watch named and what it did not."""
        return self.seen + self.unknown

    def running(self, story: MemoryStory) -> np.ndarray:
        """Live bytes just after each event: the baseline, plus the events, less silent frees."""
        silent = np.zeros(story.ts.size, dtype=np.int64)
        for addr in self.silent:
            k = int(np.searchsorted(story.ts, self.freed_at[addr], side="left"))
            if k < silent.size:
                silent[k] += self.entries[addr][0]
        return self.total + np.cumsum(story.nbytes) - np.cumsum(silent)

    def unknown_live(self, t: int) -> int:
        return self.unknown - sum(nbytes for ts, nbytes in self.unknown_frees if ts <= t)


def _before_block(addr: np.ndarray, nbytes: np.ndarray, codes: np.ndarray) -> dict[int, tuple[int, str]]:
    """Snapshot entries no allocation holds (storages from before the block), one per address in
    order of first sight: its bytes and category from the first entry of the address's best code.
    A storage from before the block that an op saves is not an activation the block made: it keeps
    its own category, else other (Saved says who keeps it)."""
    if not addr.size:
        return {}
    named = np.where(codes == _CODE["activation"], _CODE["other"], codes)
    # by address, then code, then entry order: each address's first row is its best entry
    by = np.lexsort((np.arange(addr.size), named, addr))
    first = np.flatnonzero(np.r_[True, addr[by][1:] != addr[by][:-1]])
    best = by[first]
    # the rank of each address's first sighting orders the dict as the entries came
    first_seen = np.minimum.reduceat(by, first)
    keep = best[np.argsort(first_seen, kind="stable")]
    return {
        a: (size, CATEGORIES[code])
        for a, size, code in zip(
            addr[keep].tolist(), nbytes[keep].tolist(), named[keep].tolist(), strict=True
        )
    }


def _start_entries(snapshots: list[Snapshot], on_device: bool) -> dict[int, tuple[int, str]]:
    """Without addresses nothing can be matched: only the start snapshot is known to predate the
    recording (later snapshots see storages the recording made)."""
    start = next((s for s in snapshots if s.kind == "start"), None)
    entries = [] if start is None else [e for e in start.entries if e.on_device == on_device]
    return {e.addr: (e.nbytes, e.category) for e in entries}


def _baseline(
    snapshots: list[Snapshot], unmatched: dict[int, tuple[int, str]], on_device: bool, story: MemoryStory
) -> _Baseline:
    """Storages seen in snapshots that no allocation of the recording holds were live before it (the
    start snapshot's, and inputs made before the block), plus what only frees reveal."""
    start = next((s for s in snapshots if s.kind == "start"), None)
    entries = dict(unmatched)
    # Frees with no allocation before them: memory from before the block (the CUDA allocator
    # reports these; the CPU one does not).
    has_alloc = np.zeros(story.ts.size, dtype=bool)
    has_alloc[story.free_at[story.free_at >= 0]] = True
    freed_at: dict[int, int] = {}
    unknown_frees: list[tuple[int, int]] = []
    orphans = np.flatnonzero((story.nbytes < 0) & ~has_alloc) if story.addressed else np.zeros(0, np.int64)
    for k in orphans.tolist():
        addr, t = int(story.addr[k]), int(story.ts[k])
        if addr in entries:
            freed_at.setdefault(addr, t)
            # the allocator frees whole blocks (CUDA rounds to 512 B): the block is what was live
            entries[addr] = (-int(story.nbytes[k]), entries[addr][1])
        else:
            unknown_frees.append((t, -int(story.nbytes[k])))
    silent = _silent_frees(entries, freed_at, story) if story.addressed and entries else set()
    baseline = _Baseline(entries, sum(b for _, b in unknown_frees), freed_at, silent, unknown_frees)
    # What the allocator itself says it held: torch.cuda.memory_allocated() at the start snapshot,
    # or a trace's "Total Allocated" before its first event.
    held = start.device_allocated if start is not None and on_device else None
    if held is None:
        held = story.allocated_before
    baseline.held = held
    if held is not None and held > baseline.total:
        baseline.unknown += held - baseline.total
    return baseline


def _silent_frees(
    entries: dict[int, tuple[int, str]], freed_at: dict[int, int], story: MemoryStory
) -> set[int]:
    """Baseline storages freed with no event (the CPU allocator reports no free of memory allocated
    before profiling): an allocation anywhere inside one's bytes means it was freed by then (live
    storages never overlap). Sets their ``freed_at`` to that first allocation's time."""
    starts = np.fromiter(sorted(entries), dtype=np.int64)
    ends = starts + np.array([entries[addr][0] for addr in starts.tolist()], dtype=np.int64)
    addrs = story.addr[story.alloc]  # allocations in time order
    pos = np.searchsorted(starts, addrs, side="right") - 1
    inside = (pos >= 0) & (addrs < ends[np.maximum(pos, 0)])
    silent: set[int] = set()
    for k, p in zip(np.flatnonzero(inside).tolist(), pos[inside].tolist(), strict=True):
        addr = int(starts[p])
        if addr not in freed_at:  # the first reuse, in time order
            freed_at[addr] = int(story.ts[story.alloc[k]])
            silent.add(addr)
    return silent


class Placements:
    """Span index -> its Placement (module path or label, phase, op name); spans of one (bucket,
    name) share one. ``placements(span)`` for one span (-1: outside every op), :meth:`many` for a
    column of them."""

    def __init__(
        self, table: EventTable, bucket: np.ndarray, buckets: Buckets, catalog: list[ModuleInfo]
    ) -> None:
        self._table, self._bucket, self._buckets, self._catalog = table, bucket, buckets, catalog
        self._names = table.array("span_name")
        self._cache: dict[tuple[int, int], Placement] = {}  # by (bucket, name)
        self._where: dict[int, tuple[str, str]] = {}  # by bucket: (module path or label, phase)

    def __call__(self, span: int) -> Placement:
        if span < 0:
            return Placement("(outside ops)", "", "")
        return self._of((int(self._bucket[span]), int(self._names[span])))

    def many(self, spans: np.ndarray) -> list[Placement | None]:
        """The Placement of each span (None for -1), each distinct (bucket, name) placed once."""
        found: list[Placement | None] = [None] * len(spans)
        inside = np.flatnonzero(spans >= 0)
        if not inside.size:  # no span at all: every event is outside the ops
            return found
        owned = spans[inside]
        keys = self._bucket[owned] * (len(self._table.names) + 1) + self._names[owned]
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        placed = [
            self._of((int(self._bucket[span]), int(self._names[span]))) for span in owned[first].tolist()
        ]
        for at, k in zip(inside.tolist(), inverse.reshape(-1).tolist(), strict=True):
            found[at] = placed[k]
        return found

    def _of(self, key: tuple[int, int]) -> Placement:
        found = self._cache.get(key)
        if found is None:
            b = key[0]
            where = self._where.get(b)
            if where is None:
                where = self._where[b] = (
                    self._buckets.where(b, self._catalog),
                    str(self._buckets.phase_of(b)),
                )
            found = self._cache[key] = Placement(where[0], where[1], self._table.names[key[1]])
        return found


def placement_of(
    table: EventTable, bucket: np.ndarray, buckets: Buckets, catalog: list[ModuleInfo]
) -> Placements:
    """The placements of the spans of ``table`` (module path or label, phase, op name)."""
    return Placements(table, bucket, buckets, catalog)
