"""Tensors saved for backward per module, in numpy (``attribution/memory/saved.py``), give what the
loop over snapshot entries they replaced gave (kept here as the reference), on random snapshots with
repeated walks, shared storages, parameters and inputs."""

from __future__ import annotations

import random

import numpy as np
import pytest

from layerscope.attribution.forward_ops import ForwardOps
from layerscope.attribution.memory.saved import saved_by_module
from layerscope.events.memory_snapshots import CATEGORIES, Snapshot, StorageEntry


def reference(
    snapshots: list[Snapshot], keeper_of: dict[tuple[int, int], str | None], parameter_addrs: set[int]
) -> dict[str, dict[str, int]]:
    """The loop over entries (layerscope 0.2's ``saved_by_module``)."""
    out: dict[str, dict[str, int]] = {}
    walked: set[tuple[int, int]] = set()
    kept_parameters: set[tuple[str, int]] = set()
    for snapshot in snapshots:
        if snapshot.kind != "forward":
            continue
        inputs = {e.addr for e in snapshot.entries if e.category == "input"}
        seen: set[tuple[str, int]] = set()
        here: set[tuple[int, int]] = set()
        for entry in snapshot.entries:
            if entry.category != "activation" or (entry.seq, entry.addr) in walked:
                continue
            here.add((entry.seq, entry.addr))
            module = keeper_of.get((snapshot.tid, entry.seq))
            if module is None or (module, entry.addr) in seen:
                continue
            seen.add((module, entry.addr))
            kind = (
                "parameter"
                if entry.addr in parameter_addrs
                else "input"
                if entry.addr in inputs
                else "activation"
            )
            if kind == "parameter":
                if (module, entry.addr) in kept_parameters:
                    continue
                kept_parameters.add((module, entry.addr))
            figures = out.setdefault(module, {"activation": 0, "parameter": 0, "input": 0})
            figures[kind] += entry.nbytes
        walked |= here
    return out


@pytest.mark.parametrize("seed", range(30))
def test_saved_by_module_matches_the_loop(seed: int) -> None:
    rng = random.Random(seed)
    paths = [f"m{k}" for k in range(rng.randint(1, 5))]
    keeper: dict[tuple[int, int], str | None] = {}
    for tid in (1, 2):
        for seq in range(12):
            keeper[(tid, seq)] = rng.choice([*paths, None])
    parameters = {rng.randrange(0, 40) for _ in range(rng.randint(0, 6))}
    snapshots = []
    for _ in range(rng.randint(0, 6)):
        entries = [
            StorageEntry(
                rng.randrange(0, 40),
                rng.randint(1, 1000),
                rng.choice(["activation", "activation", "input", "parameter", "other"]),
                False,
                rng.randrange(-1, 14),
            )
            for _ in range(rng.randint(0, 30))
        ]
        snapshots.append(
            Snapshot(rng.choice(["forward", "forward", "start"]), entries, tid=rng.choice([1, 2]))
        )
    keys = [k for k, v in keeper.items() if v is not None]
    index = {p: k for k, p in enumerate(paths)}
    # the keepers: each (thread, sequence number) pair's module, through ForwardOps as in use
    ops = ForwardOps(
        np.array([t for t, _ in keys], dtype=np.int64),
        np.array([s for _, s in keys], dtype=np.int64),
        np.array([index[keeper[k]] for k in keys], dtype=np.int64),  # type: ignore[index]
    )

    def keepers(snapshot: Snapshot) -> np.ndarray:
        seq = snapshot.columns().seq
        return ops.lookup(np.full(seq.size, snapshot.tid, dtype=np.int64), seq)

    found = saved_by_module(snapshots, keepers, paths, np.array(sorted(parameters), dtype=np.int64))
    expected = reference(snapshots, keeper, parameters)
    assert found == expected
    assert list(found) == list(expected)  # modules in order of first saved


def test_entry_columns_follow_the_entries() -> None:
    entries = [StorageEntry(8, 16, "activation", True, 3), StorageEntry(24, 8, "mystery", False)]
    columns = Snapshot("forward", entries).columns()
    assert columns.addr.tolist() == [8, 24]
    assert columns.nbytes.tolist() == [16, 8]
    assert columns.category.tolist() == [CATEGORIES.index("activation"), len(CATEGORIES)]
    assert columns.on_device.tolist() == [True, False]
    assert columns.seq.tolist() == [3, -1]
    empty = Snapshot("start", []).columns()
    assert empty.addr.size == 0 and empty.addr.dtype == np.int64
