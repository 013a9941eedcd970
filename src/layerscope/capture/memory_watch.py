"""What ``memory=True`` watches while the block runs, beyond torch's allocation events: which storages
hold parameters, gradients, optimizer state, inputs and tensors saved for backward.

torch's events say when bytes were allocated and freed, and inside which op; not what they hold. The
watch takes snapshots, lists of (storage address, bytes, category), at points on torch's clock (a
watch point in the block's marks, ``module_marks.py``, when the native module is built, else
``time.time_ns()``, which can sit far from torch's clock: see docs/usage.md), and attribution
matches each entry to the allocation live at that address then (``attribution/memory_peak.py``).

Snapshots are taken at the start of each recording (what was live before torch saw anything: the
baseline: the model's state, and every other live tensor's storage, found by one scan of the
garbage collector's objects in ``live_tensors.py``, taken before the profiler starts or at the end
of the warmup step before a scheduled cycle, so that its cost lands outside what is recorded),
after each call of the root module (the tensors its autograd graph saved for backward, each with
the sequence number of the op that saved it, and the call's inputs), before each optimizer step
(its gradients), after it (its state), and at the end of each recording. Nothing here keeps a
tensor alive: snapshots hold addresses, and the graph walk reads saved tensors in place (torch's
saved-tensor hooks would have to hold every saved output, which leaks graphs never run backward).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.profiler import ProfilerAction

from layerscope.capture.live_tensors import scan_live, storage_entries, storage_entry
from layerscope.capture.module_marks import ModuleMarks
from layerscope.capture.schedule import RECORDING
from layerscope.events.memory_snapshots import Snapshot, StorageEntry


@dataclass
class MemoryWatch:
    """Snapshots of the model's storages during one profiling block (see the module docstring)."""

    model: nn.Module | None
    marks: ModuleMarks | None = None  # the block's marks: snapshots' times on torch's clock
    snapshots: list[Snapshot] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    #: Whether the profiler records now (a schedule's wait and warmup steps take no snapshots).
    recording: bool = True
    #: Every live storage, scanned ahead of the next start snapshot (addresses and sizes only).
    pending_scan: list[StorageEntry] | None = None

    @classmethod
    def prepare(cls, model: nn.Module | None) -> MemoryWatch:
        """A watch for ``model``, with every live tensor's storage and the optimizers that already
        exist over its parameters found now (one scan of every live object: done before the
        profiler starts, so it is not recorded)."""
        try:
            scan = scan_live(model, optimizers=True)
        except Exception as exc:  # the watch must never break the block it watches
            watch = cls(model)
            watch.errors.append(f"scan: {type(exc).__name__}: {exc}")
            return watch
        return cls(model, optimizers=scan.optimizers, pending_scan=scan.entries)

    def start(self, marks: ModuleMarks | None, stack: ExitStack, action: ProfilerAction) -> None:
        """Start watching (inside the running profiler, at the schedule's ``action``): the block's
        marks, when it has them, give snapshots their time."""
        self.marks = marks
        self.recording = action in RECORDING
        self.install(stack)
        self.snapshot_state("start")

    def before_step(self, action: ProfilerAction) -> None:
        """Before a schedule's step: a cycle that ends with it gets its end snapshot; at the end of
        a warmup step (a recording may follow) live tensors are scanned, outside what is recorded."""
        if action == ProfilerAction.RECORD_AND_SAVE:
            self.snapshot_state("end")
        elif action == ProfilerAction.WARMUP:
            self._guarded_scan()

    def after_step(self, before: ProfilerAction, after: ProfilerAction) -> None:
        """After a schedule's step: a cycle that starts recording gets its start snapshot (with
        the warmup step's scan; without a warmup step, a scan now)."""
        self.recording = after in RECORDING
        if before != ProfilerAction.RECORD and self.recording:
            self.snapshot_state("start")
        elif not self.recording:
            self.pending_scan = None  # describes a moment before this step: stale for a later one

    def install(self, stack: ExitStack) -> None:
        """Hook the root module's calls and every optimizer step; undone by ``stack``."""
        if self.model is not None:
            handle = self.model.register_forward_hook(self._after_root_call, with_kwargs=True)
            stack.callback(handle.remove)
        pre = register_optimizer_step_pre_hook(self._before_step)
        stack.callback(pre.remove)
        post = register_optimizer_step_post_hook(self._after_step)
        stack.callback(post.remove)

    # ----- snapshot points ---------------------------------------------------------------------------
    def snapshot_state(self, kind: str) -> None:
        """Parameters, buffers, gradients and optimizer state as they are now (start and end); a
        start snapshot adds every other live storage (the pending scan, else one taken now)."""
        if kind != "start":
            self._guarded(kind, lambda: list(self._state_entries()))
            return
        if self.pending_scan is None:
            self._guarded_scan()
        scanned, self.pending_scan = self.pending_scan or [], None
        self._guarded(kind, lambda: _with_scan(list(self._state_entries()), scanned), device=True)

    def _guarded_scan(self) -> None:
        """Scan live tensors for the next start snapshot; a failure is recorded, never raised."""
        try:
            scan = scan_live()
        except Exception as exc:  # the watch must never break the block it watches
            self.errors.append(f"scan: {type(exc).__name__}: {exc}")
            self.pending_scan = None
            return
        self.pending_scan = scan.entries

    def _after_root_call(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if not self.recording:
            return
        self._guarded("forward", lambda: [*_saved_entries(output), *_input_entries(args, kwargs)])

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if optimizer not in self.optimizers:
            self.optimizers.append(optimizer)
        if not self.recording:
            return
        self._guarded(
            "optimizer_pre",
            lambda: [
                *_entries(_params_of(optimizer), "parameter"),
                *_entries((p.grad for p in _params_of(optimizer)), "gradient"),
            ],
        )

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.recording:
            return
        self._guarded("optimizer_post", lambda: list(_entries(_state_tensors(optimizer), "optimizer_state")))

    def _guarded(self, kind: str, take: Any, device: bool = False) -> None:
        """Take one snapshot; a failure is recorded, never raised into the user's program."""
        try:
            snapshot = Snapshot(kind, take(), os_tid=threading.get_native_id())
            if device and _cuda_in_use():
                snapshot.device_allocated = sum(
                    torch.cuda.memory_allocated(d) for d in range(torch.cuda.device_count())
                )
            if self.marks is not None:
                self.marks.watch_point()
            else:
                snapshot.ts = time.time_ns()
            self.snapshots.append(snapshot)
        except Exception as exc:  # the watch must never break the block it watches
            self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")

    def _state_entries(self) -> Iterator[StorageEntry]:
        if self.model is not None:
            yield from _entries(self.model.parameters(), "parameter")
            yield from _entries(self.model.buffers(), "parameter")
            yield from _entries((p.grad for p in self.model.parameters()), "gradient")
        for optimizer in self.optimizers:
            yield from _entries(_params_of(optimizer), "parameter")  # global mode knows no model
            yield from _entries((p.grad for p in _params_of(optimizer)), "gradient")
            yield from _entries(_state_tensors(optimizer), "optimizer_state")

    # ----- results -----------------------------------------------------------------------------------
    def take(self) -> list[Snapshot]:
        """The snapshots of the recording that just ended (from its start snapshot on), with
        torch-clock times from the marks' watch points."""
        if self.marks is not None:
            _place_on_marks(self.snapshots, self.marks.take_watch_points())
        taken, self.snapshots = self.snapshots, []
        # Snapshots of steps a schedule did not record describe memory this recording never saw:
        # the recording's own begin with its last start snapshot.
        starts = [k for k, snapshot in enumerate(taken) if snapshot.kind == "start"]
        return taken[starts[-1] :] if starts else taken


def _with_scan(state: list[StorageEntry], scanned: list[StorageEntry]) -> list[StorageEntry]:
    """The state entries, then each scanned storage no state entry names (category ``other``)."""
    named = {(entry.on_device, entry.addr) for entry in state}
    return state + [entry for entry in scanned if (entry.on_device, entry.addr) not in named]


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def _place_on_marks(snapshots: list[Snapshot], points: dict[int, list[tuple[int, int]]]) -> None:
    """Give each snapshot its watch point's time: the k-th snapshot of an OS thread is its k-th point."""
    taken: dict[int, int] = {}
    for snapshot in snapshots:
        k = taken.get(snapshot.os_tid, 0)
        found = points.get(snapshot.os_tid, [])
        if k < len(found):
            snapshot.tid, snapshot.ts = found[k]
        taken[snapshot.os_tid] = k + 1


def _entries(tensors: Iterable[Any], category: str, seq: int = -1) -> Iterator[StorageEntry]:
    yield from storage_entries(tensors, category, seq)


def _params_of(optimizer: torch.optim.Optimizer) -> list[Any]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[Any]:
    for state in optimizer.state.values():
        if isinstance(state, dict):
            yield from state.values()


def _input_entries(args: Any, kwargs: Any) -> Iterator[StorageEntry]:
    leaves, _ = torch.utils._pytree.tree_flatten((args, kwargs))
    yield from _entries(leaves, "input")


def _saved_entries(output: Any) -> Iterator[StorageEntry]:
    """The tensors the autograd graph behind ``output`` saved for backward, read in place through
    each node's ``_raw_saved_*`` attributes: the packed value as stored, never unpacked, so no
    saved-tensor hook of the user's runs (an unpack can recompute a checkpointed region or copy an
    offloaded tensor back). A value a hook packed into something other than a tensor is skipped."""
    leaves, _ = torch.utils._pytree.tree_flatten(output)
    pending: list[Any] = [t.grad_fn for t in leaves if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: dict[int, Any] = {}  # holding the nodes keeps their ids unique during the walk
    kinds = _NODE_KINDS
    while pending:
        node = pending.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        kind = kinds.get(type(node)) or _learn_node_kind(node)
        if kind.saved:
            seq = node._sequence_nr() if kind.has_seq else -1
            for value in _saved_values(node, kind):
                entry = storage_entry(value, "activation", seq)
                if entry is not None:
                    yield entry
        if not kind.leaf:
            pending.extend([next_node for next_node, _ in node.next_functions])


@dataclass(frozen=True)
class _NodeKind:
    """What a node type holds: the names of its raw saved-tensor attributes (``_raw_saved_*``, one
    per tensor or tensor list it saved; custom Functions have ``_raw_saved_tensors``), whether it
    has a sequence number, whether the graph ends there."""

    saved: tuple[str, ...]
    has_seq: bool
    leaf: bool  # AccumulateGrad: the graph ends there


_NODE_KINDS: dict[type, _NodeKind] = {}


def _learn_node_kind(node: Any) -> _NodeKind:
    kind = _NodeKind(
        tuple(name for name in dir(node) if name.startswith("_raw_saved_")),
        hasattr(node, "_sequence_nr"),
        type(node).__name__ == "AccumulateGrad",
    )
    _NODE_KINDS[type(node)] = kind
    return kind


def _saved_values(node: Any, kind: _NodeKind) -> Iterator[Any]:
    for name in kind.saved:
        try:
            raw = getattr(node, name)
        except RuntimeError:  # already freed (a graph run backward before)
            continue
        for saved in raw if isinstance(raw, tuple | list) else (raw,):
            try:
                yield saved.data
            except RuntimeError:  # released
                continue
