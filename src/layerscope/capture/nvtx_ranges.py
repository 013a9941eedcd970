"""NVTX ranges by module (``ls.profile(..., nvtx=True)``, ``layerscope run --nvtx``) for Nsight Systems.

Forward: a range pushed before each module's ``forward`` and popped after it (a forward hook with
``always_call``, so a raising forward still pops), named by module path (the root by its class).

Backward: autograd runs a module's backward from C++, with no module call to hook. When a module's
forward returns, the autograd nodes it created are known: those reachable from its outputs, down to
its inputs' nodes (and not the parameters' gradient accumulators). A range starts at the first of
those nodes to run and ends when the last has run (node pre- and post-hooks; ``range_start`` /
``range_end``, which need not nest, since sibling branches' backward can interleave), named
``<path> (backward)``. Ranges a backward leaves open (nodes that never ran: no gradient was needed)
end with the backward pass (an autograd engine callback). Hooks left on a graph that outlives the
profile do nothing.

Modules inside a ``torch.compile``d model get no hooks (Dynamo would trace them): only the compiled
model's own call gets its forward range.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from layerscope.capture import native
from layerscope.capture.compiled_modules import is_compiled, unwrap_compiled
from layerscope.errors import UsageError


class NvtxApi:
    """The NVTX calls used (torch's ``torch.cuda.nvtx``); a test stands in its own recorder."""

    def push(self, name: str) -> None:
        """Open a nested range on this thread."""
        torch.cuda.nvtx.range_push(name)  # type: ignore[no-untyped-call]

    def pop(self) -> None:
        """Close this thread's innermost range."""
        torch.cuda.nvtx.range_pop()  # type: ignore[no-untyped-call]

    def start(self, name: str) -> int:
        """Start a range that may end anywhere; returns its handle."""
        return int(torch.cuda.nvtx.range_start(name))

    def end(self, handle: int) -> None:
        """End a range :meth:`start` returned."""
        torch.cuda.nvtx.range_end(handle)


def check_nvtx_available() -> None:
    """A one-line :class:`UsageError` when this torch cannot emit NVTX (a CPU-only build)."""
    if torch.version.cuda is None:
        raise UsageError(
            f"nvtx=True needs a CUDA build of torch (this one, {torch.__version__}, is CPU-only): "
            "NVTX ranges are read by Nsight Systems"
        )


@dataclass
class _BackwardRange:
    """One module call's backward: its nodes, those still to run, and the range while open."""

    name: str
    nodes: int
    remaining: int = 0
    handle: int | None = None  # set while the range is open


@dataclass
class _Entry:
    """An open forward call: its inputs' nodes, and the first sequence number it could create
    (-1 when the native module cannot tell)."""

    stop: set[int]
    first_sequence_nr: int


class NvtxRanges:
    """Installs and removes the NVTX hooks of one profile session (see the module's docstring)."""

    def __init__(self, model: nn.Module | None, api: NvtxApi | None = None) -> None:
        self.model = model
        self.api = api if api is not None else NvtxApi()
        self.active = False
        self._handles: list[RemovableHandle] = []
        self._names: dict[int, str] = {}
        self._calls = threading.local()  # per thread: the open forward calls (a list of _Entry)
        self._open: list[_BackwardRange] = []  # backward ranges started, not ended
        self._lock = threading.Lock()  # backward can run on several device threads at once
        module = native.load()
        self._peek: Callable[[], int] | None = getattr(module, "sequence_peek", None)

    def install(self) -> None:
        """Hook the model's modules (all modules called, in global mode)."""
        self.active = True
        if self.model is None:
            pre = nn.modules.module.register_module_forward_pre_hook(self._global_pre)
            post = nn.modules.module.register_module_forward_hook(self._post, always_call=True)
            self._handles += [pre, post]
            return
        root = self.model
        inner = unwrap_compiled(root)
        # a compiled model: its own call only (hooks inside would be traced by Dynamo)
        hooked = [("", root)] if is_compiled(root) else list(inner.named_modules())
        for path, module in hooked:
            self._names[id(module)] = path or type(inner).__name__
            self._handles.append(module.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post, always_call=True))

    def remove(self) -> None:
        """Remove every module hook and end the backward ranges still open; node hooks left on live
        graphs turn into no-ops."""
        self.active = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for call in list(self._open):
            self._end(call)

    # ----- forward -----------------------------------------------------------------------------------
    def _entries(self) -> list[_Entry]:
        found: list[_Entry] | None = getattr(self._calls, "entries", None)
        if found is None:
            found = self._calls.entries = []
        return found

    def _global_pre(self, module: nn.Module, args: Any) -> None:
        if id(module) not in self._names:
            if not self._entries():  # called with no module open: a top-level module, named by class
                root = type(module).__name__
                for path, child in module.named_modules():
                    self._names.setdefault(id(child), f"{root}.{path}" if path else root)
            else:
                self._names[id(module)] = type(module).__name__
        self._pre(module, args, {})

    def _pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        if not self.active:
            return
        self.api.push(self._names.get(id(module), type(module).__name__))
        stop = {id(t.grad_fn) for t in _tensors((args, kwargs)) if t.grad_fn is not None}
        self._entries().append(_Entry(stop, self._peek() if self._peek is not None else -1))

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        entries = self._entries()
        if not self.active or not entries:
            return
        self.api.pop()
        entry = entries.pop()
        if torch.is_grad_enabled():
            nodes = _nodes_between(output, entry.stop, entry.first_sequence_nr)
            if nodes:
                name = self._names.get(id(module), type(module).__name__) + " (backward)"
                self._watch_backward(_BackwardRange(name, len(nodes)), nodes)

    # ----- backward ----------------------------------------------------------------------------------
    def _watch_backward(self, call: _BackwardRange, nodes: list[Any]) -> None:
        def before(grad_outputs: Any) -> None:
            if not self.active:
                return
            with self._lock:
                if call.handle is not None:
                    return
                # a graph kept with retain_graph can run again: each run is a range of its own
                call.remaining = call.nodes
                call.handle = self.api.start(call.name)
                self._open.append(call)
            # nodes that never run (no gradient needed from them) leave it open: end it with the pass
            torch.autograd.Variable._execution_engine.queue_callback(lambda: self._end(call))

        def after(grad_inputs: Any, grad_outputs: Any) -> None:
            with self._lock:
                call.remaining -= 1
                done = call.remaining == 0
            if done:
                self._end(call)

        for node in nodes:
            node.register_prehook(before)
            node.register_hook(after)

    def _end(self, call: _BackwardRange) -> None:
        with self._lock:
            handle, call.handle = call.handle, None
            if handle is None:
                return
            self._open.remove(call)
        self.api.end(handle)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a module's arguments or output (tensors, lists, tuples, dicts, one level deep
    inside each container)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _nodes_between(output: Any, stop: set[int], first_sequence_nr: int) -> list[Any]:
    """The autograd nodes reachable from ``output`` down to the nodes in ``stop`` (the inputs') and
    to nodes numbered before ``first_sequence_nr`` (made before the call: a tensor captured from
    outside), gradient accumulators left out: what the module's forward created."""
    pending = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
    seen: set[int] = set()
    found: list[Any] = []
    while pending:
        node = pending.pop()
        key = id(node)
        if key in seen or key in stop or type(node).__name__ == "AccumulateGrad":
            continue
        if first_sequence_nr >= 0 and node._sequence_nr() < first_sequence_nr:
            continue
        seen.add(key)
        found.append(node)
        pending.extend(n for n, _ in node.next_functions if n is not None)
    return found


def start_nvtx_ranges(model: nn.Module | None, stack: ExitStack) -> NvtxRanges:
    """Install the NVTX hooks for a profile session; ``stack`` removes them."""
    ranges = NvtxRanges(model)
    stack.callback(ranges.remove)
    ranges.install()
    return ranges
