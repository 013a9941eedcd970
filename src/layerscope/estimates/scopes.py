"""Where each op of a fake step runs: module, phase, unattributed label, as a measured profile says.

Forward: the innermost module whose ``forward`` is running (pre- and post-hooks on every module,
removed when the step ends). Backward: the module whose forward made the autograd node running the
op (``torch._C._current_autograd_node()``), found by the node's sequence number: every node a
module's call creates has a number between the counter's value at the call's start and at its end,
the innermost call claiming it, as the profiler's sequence numbers link a measured profile's
backward ops to their forward. Work outside every module takes the label a measured profile gives
it: the ``record_function`` range around it (``Optimizer.step#AdamW.step``), the autograd node's
name in backward (``torch::autograd::AccumulateGrad``), else the op's own name (``aten::sum``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from layerscope.capture.module_catalog import RawShapes, shapes_of
from layerscope.estimates.storages import StorageLedger

FORWARD, BACKWARD, OTHER = "forward", "backward", "other"


@dataclass
class _Open:
    path: str
    seq_start: int
    live_at_entry: int
    max_live: int


@dataclass
class ScopeTracker:
    """The module stack, the backward's owners, the labels, and per module its calls, first
    shapes and forward peak (bytes added on top of what was live when a call began)."""

    ledger: StorageLedger
    stack: list[_Open] = field(default_factory=list)
    owner: dict[int, str] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    recompute_calls: dict[str, int] = field(default_factory=dict)
    first_call: dict[str, int] = field(default_factory=dict)
    first_shapes: dict[str, tuple[RawShapes, RawShapes]] = field(default_factory=dict)
    forward_peaks: dict[str, int] = field(default_factory=dict)

    def where(self, op_name: str) -> tuple[str | None, str, str]:
        """(module path or None, phase, unattributed label) of an op running now."""
        node = torch._C._current_autograd_node()
        if node is not None:
            if self.stack:  # a module recomputed in backward (activation checkpointing)
                return self.stack[-1].path, BACKWARD, ""
            path = self.owner.get(node._sequence_nr())
            if path is not None:
                return path, BACKWARD, ""
            return None, BACKWARD, self.labels[-1] if self.labels else node.name()
        if self.stack:
            return self.stack[-1].path, FORWARD, ""
        return None, OTHER, self.labels[-1] if self.labels else op_name

    def note_live(self) -> None:
        """After each op: the open call's highest live total so far."""
        if self.stack:
            top = self.stack[-1]
            top.max_live = max(top.max_live, self.ledger.live_bytes)

    def enter(self, path: str, args: Any) -> None:
        """A module's forward begins."""
        in_backward = torch._C._current_autograd_node() is not None
        counts = self.recompute_calls if in_backward else self.calls
        counts[path] = counts.get(path, 0) + 1
        self.first_call.setdefault(path, len(self.first_call))
        live = self.ledger.live_bytes
        self.stack.append(_Open(path, torch._C._autograd._get_sequence_nr(), live, live))
        if path not in self.first_shapes:
            self.first_shapes[path] = (shapes_of(args), None)

    def leave(self, path: str, output: Any) -> None:
        """A module's forward returns: its nodes are claimed, its peak kept."""
        if not self.stack or self.stack[-1].path != path:
            return  # a forward that raised left its call open; the step fails anyway
        done = self.stack.pop()
        for seq in range(done.seq_start, torch._C._autograd._get_sequence_nr()):
            self.owner.setdefault(seq, path)
        peak = done.max_live - done.live_at_entry
        self.forward_peaks[path] = max(self.forward_peaks.get(path, 0), peak)
        if self.stack:
            self.stack[-1].max_live = max(self.stack[-1].max_live, done.max_live)
        shapes = self.first_shapes.get(path)
        if shapes is not None and shapes[1] is None:
            self.first_shapes[path] = (shapes[0], shapes_of(output))

    def hooks(self, modules: dict[str, nn.Module], stack: ExitStack) -> None:
        """Install the pre- and post-hooks on ``modules`` (path -> module); ``stack`` removes them."""
        for path, module in modules.items():
            pre = module.register_forward_pre_hook(_pre(self, path))
            post = module.register_forward_hook(_post(self, path), always_call=True)
            stack.callback(pre.remove)
            stack.callback(post.remove)


def _pre(tracker: ScopeTracker, path: str) -> Callable[[nn.Module, Any], None]:
    def hook(module: nn.Module, args: Any) -> None:
        tracker.enter(path, args)

    return hook


def _post(tracker: ScopeTracker, path: str) -> Callable[[nn.Module, Any, Any], None]:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        tracker.leave(path, output)

    return hook
