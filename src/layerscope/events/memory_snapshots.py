"""The memory watch's snapshots as plain data (``capture/memory_watch.py`` takes them; attribution
reads them, without torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

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
