"""What was alive when a recording began: one pass over the garbage collector's objects finds every
tensor (its storage's address and size) and the optimizers over the model's parameters.

torch's events show only what the block allocates and frees. A tensor made before the block (a plain
tensor attribute of a module, a loss target, a cache) shows in no event unless it is freed there, so
without this scan it is missing from the absolute baseline. Each storage counts once, however many
tensors view it; a storage that lies inside another one (``torch.from_numpy`` of views of one array)
counts once too, as the part of memory it covers.

The scan keeps addresses and sizes only, never a tensor; it pauses the cyclic collector while it
runs (so the objects it makes cannot trigger a collection the program would not have had) and
restores its state; it calls no tensor method through a subclass's ``__torch_function__`` and
allocates nothing on any device. Its limit: tensors with no Python object (gradients autograd made
in C++ and never read from Python, tensors an autograd graph saved before the block) are not in the
collector's list: the watch's state entries name gradients, and on CUDA the allocator's own figure
(``torch.cuda.memory_allocated()``) covers the rest. Its cost: docs/benchmarks.md (baseline scan;
the incremental walk). Between scans the native module keeps weak references to the tensors and
optimizers the last one found (never a strong one) and two empty lists of its own in the
collector's oldest generation (Python 3.10-3.13; two more stay frozen after each ``gc.freeze()``
that took them between scans).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from layerscope.capture import native
from layerscope.events.memory_snapshots import StorageEntry
from layerscope.gcpause import gc_paused

#: The category of a storage the scan found and nothing else named.
OTHER = "other"


@dataclass
class LiveScan:
    """One scan's findings: each live storage once (category ``other``), the optimizers found
    (only when asked), how many tensor objects were seen and what the scan cost."""

    entries: list[StorageEntry] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    tensors: int = 0
    seconds: float = 0.0


def scan_live(model: nn.Module | None = None, optimizers: bool = False) -> LiveScan:
    """Every storage held by a live tensor object, each once; with ``optimizers``, also those over
    ``model``'s parameters (every optimizer without a model: global mode), from the same pass."""
    started = time.perf_counter()
    scan = LiveScan()
    tensor_types = _subclasses(torch.Tensor)
    wanted = tensor_types | _subclasses(torch.optim.Optimizer) if optimizers else tensor_types
    found: dict[tuple[bool, int], int] = {}  # (on a device, address) -> bytes
    with gc_paused(), torch._C.DisableTorchFunctionSubclass():
        hits = _tracked_of_types(wanted)
        tensors = [obj for obj in hits if type(obj) in tensor_types]
        scan.optimizers = [obj for obj in hits if type(obj) not in tensor_types]
        del hits
        scan.tensors = len(tensors)
        for addr, nbytes, on_device in _storage_spans(tensors):
            if found.get((on_device, addr), -1) < nbytes:
                found[(on_device, addr)] = nbytes
        del tensors
    if optimizers:
        scan.optimizers = _over_model(scan.optimizers, model)
    scan.entries = list(_distinct(found))
    scan.seconds = time.perf_counter() - started
    return scan


def _tracked_of_types(wanted: set[type]) -> list[Any]:
    """Every object the collector tracks whose exact type is in ``wanted``: the native module walks
    the collector's lists in place when it can (no list of every object made; from the second scan
    on only the objects tracked or moved since the previous one, where that provably finds the same:
    ``native_objects.cpp``), else ``gc.get_objects()`` filtered by the native module (a pointer
    lookup per object) or by a set lookup per object in Python."""
    module = native.load()
    if module is not None:
        walked: list[Any] | None = module.tracked_of_types(wanted)
        if walked is not None:
            return walked
    objects = gc.get_objects()
    try:
        if module is not None:
            found: list[Any] = module.objects_of_types(objects, wanted)
            return found
        # type(), not isinstance: some objects warn or compute on __class__ (docs/benchmarks.md)
        return [obj for obj in objects if type(obj) in wanted]
    finally:
        del objects  # the list holds every object of the process: it must not outlive the pass


def _storage_spans(tensors: list[Any]) -> Iterator[tuple[int, int, bool]]:
    """(address, bytes, on a device) of each tensor's storage that holds memory (as
    :func:`storage_entry` decides): read in C++ when the native module is built."""
    module = native.load()
    if module is not None:
        spans: list[tuple[int, int, bool] | None] = module.storage_spans(tensors)
        yield from (span for span in spans if span is not None)
        return
    for tensor in tensors:
        entry = storage_entry(tensor, OTHER)
        if entry is not None:
            yield entry.addr, entry.nbytes, entry.on_device


def _subclasses(root: type) -> set[type]:
    """``root`` and every class derived from it, at any depth."""
    found, pending = {root}, [root]
    while pending:
        derived: list[type] = type.__subclasses__(pending.pop())
        for cls in derived:
            if cls not in found:
                found.add(cls)
                pending.append(cls)
    return found


def _distinct(found: dict[tuple[bool, int], int]) -> Iterator[StorageEntry]:
    """The storages in address order, per device class, each byte once: a storage inside one
    already counted is dropped; one that overlaps its end counts only past it."""
    end = {False: -1, True: -1}
    for (on_device, addr), nbytes in sorted(found.items()):
        stop = addr + nbytes
        if stop <= end[on_device]:
            continue
        start = max(addr, end[on_device])
        end[on_device] = stop
        yield StorageEntry(addr, stop - start, OTHER, on_device)


def storage_entries(tensors: Iterable[Any], category: str, seq: int = -1) -> list[StorageEntry]:
    """The entries of those of ``tensors`` whose storage holds memory, in order (as
    :func:`storage_entry` decides; anything else, None included, is skipped): read in C++ when the
    native module is built (no storage object made per tensor)."""
    module = native.load()
    if module is None:
        return [entry for entry in (storage_entry(t, category, seq) for t in tensors) if entry is not None]
    spans: list[tuple[int, int, bool] | None] = module.storage_spans(list(tensors))
    return [StorageEntry(span[0], span[1], category, span[2], seq) for span in spans if span is not None]


def storage_entry(tensor: Any, category: str, seq: int = -1) -> StorageEntry | None:
    """The entry of ``tensor``'s storage (its address and whole size; views share it), or None
    where it has none that holds memory (sparse, meta, empty, wrapper subclasses)."""
    if not isinstance(tensor, torch.Tensor) or tensor.is_sparse:
        return None
    try:
        storage = tensor.untyped_storage()
        # meta storages hold no memory; asking a FakeTensor's (torch.compile keeps some alive) for
        # its address warns in the user's program
        if storage.device.type == "meta":
            return None
        addr = storage.data_ptr()
    except Exception:  # subclasses and wrappers without a storage, or whose storage refuses access
        return None
    if not addr:  # empty storages hold no memory
        return None
    return StorageEntry(addr, storage.nbytes(), category, not tensor.is_cpu, seq)


def _over_model(found: Iterable[Any], model: nn.Module | None) -> list[torch.optim.Optimizer]:
    """The optimizers over ``model``'s parameters (all of them without a model: global mode)."""
    params = {id(p) for p in model.parameters()} if model is not None else None
    if params is not None and not params:
        return []
    kept = []
    for optimizer in found:
        try:  # a subclass instance half built (its __init__ failed) has no param_groups
            if params is None or any(
                id(p) in params for group in optimizer.param_groups for p in group["params"]
            ):
                kept.append(optimizer)
        except Exception:
            continue
    return kept
