"""Tensors saved for backward per keeping module (``MemoryReport.saved``), from the memory watch's
forward snapshots, as columns: no Python per entry.

The rules, applied in entry order (snapshots in order, then each one's entries):

* only activations count (storages an autograd node saved), each under the module of the op that
  saved it (its keeper; none: saved outside every module);
* a root call's walk also meets the graph of earlier calls it builds on (``h = model(h)``): a
  (sequence number, storage) pair counts in the first snapshot that meets it only;
* within one snapshot, a storage counts once per module;
* a storage that is a parameter counts as ``parameter``, once per module over the whole recording
  (a weight saved by every call is kept once); one the snapshot also lists as an input, as
  ``input``; the rest as ``activation``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from layerscope.attribution import nest_native
from layerscope.events.memory_snapshots import CATEGORIES, Snapshot

_ACTIVATION = CATEGORIES.index("activation")
_INPUT = CATEGORIES.index("input")
_KINDS = ("activation", "parameter", "input")


def saved_by_module(
    snapshots: list[Snapshot],
    keepers: Callable[[Snapshot], np.ndarray],
    paths: list[str],
    parameter_addrs: np.ndarray,
) -> dict[str, dict[str, int]]:
    """Bytes saved for backward per keeping module's path (in order of first saved), split into
    activation, parameter and input. ``keepers(snapshot)``: each entry's keeping module (an index
    into ``paths``; -1 none)."""
    forward = [s for s in snapshots if s.kind == "forward"]
    if not forward:
        return {}
    cols = [s.columns() for s in forward]
    snap = np.concatenate([np.full(c.addr.size, k, dtype=np.int64) for k, c in enumerate(cols)])
    addr = np.concatenate([c.addr for c in cols])
    seq = np.concatenate([c.seq for c in cols])
    nbytes = np.concatenate([c.nbytes for c in cols])
    category = np.concatenate([c.category for c in cols])
    module = np.concatenate([keepers(s) for s in forward])
    is_input = _pairs_in(snap, addr, category == _INPUT)
    picked = np.flatnonzero(category == _ACTIVATION)  # in entry order throughout
    # walked: the first snapshot that meets a (sequence number, storage) pair keeps it
    pair = _dense(seq[picked], addr[picked])
    first_snap = np.full(pair.size, np.iinfo(np.int64).max, dtype=np.int64)  # ids are below the count
    np.minimum.at(first_snap, pair, snap[picked])
    picked = picked[(snap[picked] == first_snap[pair]) & (module[picked] >= 0)]
    # once per (snapshot, module, storage)
    picked = picked[_first_of(_dense(_dense(snap[picked], module[picked]), addr[picked]))]
    kind = np.where(np.isin(addr[picked], parameter_addrs), 1, np.where(is_input[picked], 2, 0))
    # a parameter once per (module, storage) over the recording
    params = np.flatnonzero(kind == 1)
    drop = params[~_first_of(_dense(module[picked[params]], addr[picked[params]]))]
    keep = np.ones(picked.size, dtype=bool)
    keep[drop] = False
    picked, kind = picked[keep], kind[keep]
    if not picked.size:
        return {}
    owners, first, row = np.unique(module[picked], return_index=True, return_inverse=True)
    sums = np.zeros((owners.size, len(_KINDS)), dtype=np.int64)
    np.add.at(sums, (row.reshape(-1), kind), nbytes[picked])
    out: dict[str, dict[str, int]] = {}
    for k in np.argsort(first, kind="stable").tolist():
        out[paths[int(owners[k])]] = dict(zip(_KINDS, sums[k].tolist(), strict=True))
    return out


def _dense(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One id per distinct (a, b) pair, 0 up to the number of pairs, in the pairs' sorted order (no
    overflow: the pair is packed from ranks)."""
    if not a.size:
        return np.zeros(0, dtype=np.int64)
    rank_a = nest_native.unique(a)[2].astype(np.int64)
    values_b, _, rank_b = nest_native.unique(b)
    packed = rank_a * values_b.size + rank_b
    ids: np.ndarray = nest_native.unique(packed)[2].astype(np.int64)
    return ids


def _first_of(key: np.ndarray) -> np.ndarray:
    """Whether each row is the first (in row order) with its key."""
    first = np.zeros(key.size, dtype=bool)
    if key.size:
        first[nest_native.unique(key)[1]] = True
    return first


def _pairs_in(snap: np.ndarray, addr: np.ndarray, listed: np.ndarray) -> np.ndarray:
    """Whether each entry's storage is among the ``listed`` entries of its own snapshot."""
    if not listed.any():
        return np.zeros(snap.size, dtype=bool)
    key = _dense(snap, addr)
    return np.isin(key, key[listed])
