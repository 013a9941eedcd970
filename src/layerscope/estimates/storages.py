"""Which storages a fake step holds, by category, and the highest point of their sum.

Fake tensors allocate nothing, but each has a storage with a size, and views and in-place ops share
their input's: a storage is counted once however many tensors (tied weights, views) point at it.
A storage is born when an op returns a tensor on a storage not seen before, and dies when torch
frees it, which is polled after every op (``StorageWeakRef.expired``, ~0.2 µs) for the storages
that can die mid-step; the model's state, the inputs and the gradients live through the step.
Nothing here holds a tensor: only weak references to storages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from layerscope.model.memory import BEFORE_BLOCK

#: Categories as a measured profile's memory watch names them (``capture/memory_watch.py``).
PARAMETER, GRADIENT, OPTIMIZER_STATE = "parameter", "gradient", "optimizer_state"
ACTIVATION, INPUT, TEMPORARY = "activation", "input", "temporary"


@dataclass(slots=True)
class StorageInfo:
    """One storage: its size, its category (the last one it was given) and the module, phase and
    op whose work allocated it (``(before the block)`` for the state the step starts with)."""

    ref: StorageWeakRef
    nbytes: int
    category: str
    module: str
    phase: str
    baseline: bool


@dataclass(frozen=True)
class PeakPoint:
    """The highest live total, the storages live there, and the module, phase and op that reached it."""

    live_bytes: int
    storages: tuple[StorageInfo, ...]
    where: dict[str, str] | None
    #: when, on the estimate's predicted clock (µs since the step began)
    t_us: float = 0.0


class StorageLedger:
    """The live storages of one fake step and its peak."""

    def __init__(self) -> None:
        self.live: dict[int, StorageInfo] = {}
        #: storages that may die during the step (polled after each op)
        self.mortal: dict[int, StorageInfo] = {}
        self.live_bytes = 0
        self.baseline_bytes = 0
        self.peak = PeakPoint(0, (), None)

    @staticmethod
    def _storage(tensor: torch.Tensor) -> tuple[int, StorageWeakRef, int] | None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less tensors
            return None
        ref = StorageWeakRef(storage)  # type: ignore[no-untyped-call]
        return ref.cdata, ref, int(storage.nbytes())

    def adopt(self, tensor: torch.Tensor, category: str) -> None:
        """A storage the step starts with (parameters, buffers, optimizer state, inputs)."""
        found = self._storage(tensor)
        if found is None or found[0] in self.live:
            return
        key, ref, nbytes = found
        self.live[key] = StorageInfo(ref, nbytes, category, BEFORE_BLOCK, "", True)
        self.live_bytes += nbytes
        self.baseline_bytes += nbytes
        self.peak = PeakPoint(self.live_bytes, tuple(self.live.values()), None)

    def born(self, tensors: list[torch.Tensor], module: str, phase: str) -> int:
        """Count the new storages among an op's outputs; the bytes they hold."""
        added = 0
        for tensor in tensors:
            found = self._storage(tensor)
            if found is None or found[0] in self.live:
                continue
            key, ref, nbytes = found
            info = StorageInfo(ref, nbytes, TEMPORARY, module, phase, False)
            self.live[key] = self.mortal[key] = info
            added += nbytes
        self.live_bytes += added
        return added

    def mark(self, tensor: torch.Tensor, category: str, *, keep: bool = False) -> int:
        """Give a live storage its category (saved for backward, a gradient); ``keep``: it lives
        through the step, so it is no longer polled. Returns its bytes (0 if not live)."""
        found = self._storage(tensor)
        info = self.live.get(found[0]) if found is not None else None
        if info is None or found is None:
            return 0
        if not info.baseline:
            info.category = category
        if keep:
            self.mortal.pop(found[0], None)
        return info.nbytes

    def key_of(self, tensor: torch.Tensor) -> int | None:
        """The key of a tensor's storage (None: a tensor without one)."""
        found = self._storage(tensor)
        return found[0] if found is not None else None

    def nbytes_of(self, tensor: torch.Tensor) -> int:
        """The bytes of a tensor's storage."""
        found = self._storage(tensor)
        return found[2] if found is not None else 0

    def category_of(self, tensor: torch.Tensor) -> str | None:
        """The category of a tensor's storage, None when it is not one this step tracks."""
        found = self._storage(tensor)
        info = self.live.get(found[0]) if found is not None else None
        return info.category if info is not None else None

    def sweep(self) -> int:
        """Forget the storages torch freed; the bytes they held."""
        dead = [key for key, info in self.mortal.items() if info.ref.expired()]  # type: ignore[no-untyped-call]
        freed = 0
        for key in dead:
            freed += self.live.pop(key).nbytes
            del self.mortal[key]
        self.live_bytes -= freed
        return freed

    def live_by_category(self) -> dict[str, int]:
        """Bytes live now per category."""
        out: dict[str, int] = {}
        for info in self.live.values():
            out[info.category] = out.get(info.category, 0) + info.nbytes
        return out

    def check_peak(self, where: dict[str, str], t_us: float) -> None:
        """Keep the live storages when the total is the highest yet (what was live at the peak)."""
        if self.live_bytes > self.peak.live_bytes:
            self.peak = PeakPoint(self.live_bytes, tuple(self.live.values()), where, t_us)
