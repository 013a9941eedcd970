"""The memory watch's snapshots as plain data (``capture/memory_watch.py`` takes them; attribution
reads them, without torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

#: What live memory holds, as the memory-at-peak view reports it.
CATEGORIES = ("parameter", "gradient", "optimizer_state", "activation", "input", "temporary", "other")


class StorageEntry(NamedTuple):
    """One storage in a snapshot. ``seq`` is the sequence number of the autograd node that saved it
    (activations), else -1. A named tuple: the memory watch makes thousands per step."""

    addr: int
    nbytes: int
    category: str
    on_device: bool
    seq: int = -1


@dataclass(frozen=True)
class EntryColumns:
    """A snapshot's entries as columns, in entry order: what attribution matches by address."""

    addr: np.ndarray  # int64
    nbytes: np.ndarray  # int64
    #: the category's index in :data:`CATEGORIES`; ``len(CATEGORIES)`` for any other name
    category: np.ndarray
    on_device: np.ndarray  # bool
    seq: np.ndarray  # int64


_CATEGORY_INDEX = {name: k for k, name in enumerate(CATEGORIES)}


@dataclass
class Snapshot:
    """Storages seen at one point: ``kind`` is start, forward, optimizer_pre, optimizer_post or end;
    ``tid`` torch's thread id there (-1 when unknown), ``ts`` Unix ns on torch's clock."""

    kind: str
    entries: list[StorageEntry]
    tid: int = -1
    ts: int = 0
    os_tid: int = 0
    #: torch.cuda.memory_allocated() summed over devices, at start snapshots on CUDA (else None).
    device_allocated: int | None = None
    _columns: EntryColumns | None = field(default=None, repr=False, compare=False)

    def columns(self) -> EntryColumns:
        """The entries as columns, made once (the entries are not changed after a snapshot is taken)."""
        if self._columns is None:
            addr, nbytes, category, on_device, seq = (
                zip(*self.entries, strict=True) if self.entries else ((),) * 5
            )
            other = len(CATEGORIES)
            self._columns = EntryColumns(
                _signed_addresses(addr),
                np.asarray(nbytes, dtype=np.int64),
                np.asarray([_CATEGORY_INDEX.get(c, other) for c in category], dtype=np.int64),
                np.asarray(on_device, dtype=bool),
                np.asarray(seq, dtype=np.int64),
            )
        return self._columns


def _signed_addresses(addresses: tuple[int, ...]) -> np.ndarray:
    """Addresses as int64, the way torch hands its memory events' addresses over (a pointer read as
    a signed integer): one at or above 2**63 (a tagged pointer's top bit, as on ARM) wraps below 0
    instead of overflowing the column."""
    try:
        return np.asarray(addresses, dtype=np.int64)
    except OverflowError:
        return np.asarray([a - (1 << 64) if a >= 1 << 63 else a for a in addresses], dtype=np.int64)
