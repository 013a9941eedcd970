"""The dispatch mode that sees every aten op of a fake step and adds up what it costs.

Per op row (name, phase, module, label, shapes), as a measured profile's op rows: calls, FLOPs,
bytes, predicted µs, bytes allocated and net. Per module and phase, and per unattributed label,
the same sums; FLOPs per dtype class per module. The predicted times add up to a clock, which
places the memory peak in the step as a measured profile's timestamps would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from layerscope.estimates.op_costs import OpCoster
from layerscope.estimates.scopes import ScopeTracker
from layerscope.estimates.storages import StorageLedger

_ENTER = "profiler::_record_function_enter_new"
_EXIT = "profiler::_record_function_exit"


@dataclass
class Sums:
    """Additive figures of a group of calls."""

    calls: int = 0
    flops: int = 0
    bytes: int = 0
    time_us: float = 0.0
    alloc_bytes: int = 0
    net_bytes: int = 0

    def add(self, flops: int, moved: int, time_us: float, alloc: int, net: int) -> None:
        """One more call."""
        self.calls += 1
        self.flops += flops
        self.bytes += moved
        self.time_us += time_us
        self.alloc_bytes += alloc
        self.net_bytes += net


#: (op name, phase, module or None, unattributed label, input shapes)
OpKey = tuple[str, str, str | None, str, str]


@dataclass
class StepRecord:
    """What the recorder found: op rows, per (module, phase) and per (label, phase) sums, FLOPs
    by module and dtype class, and the predicted clock (µs)."""

    ops: dict[OpKey, Sums] = field(default_factory=dict)
    modules: dict[tuple[str, str], Sums] = field(default_factory=dict)
    unattributed: dict[tuple[str, str], Sums] = field(default_factory=dict)
    flops_by_dtype: dict[str | None, dict[str, int]] = field(default_factory=dict)
    clock_us: float = 0.0
    #: how many times each ``record_function`` range was entered (an entry's calls, as measured)
    label_calls: dict[str, int] = field(default_factory=dict)

    def charge_module_calls(self, calls: dict[str, int], phase: str, us_per_call: float) -> None:
        """Each module call's own cost beyond its ops (``nn.Module.__call__``), booked to the
        module's own time in ``phase`` (no op row: a measured profile shows it as the module's
        self time outside its ops) and to the clock."""
        for path, count in calls.items():
            if count and us_per_call:
                self.modules.setdefault((path, phase), Sums()).time_us += count * us_per_call
                self.clock_us += count * us_per_call


class StepRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Costs every aten op run under it and books it where the scope tracker says it runs."""

    def __init__(self, coster: OpCoster, ledger: StorageLedger, scopes: ScopeTracker) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.coster = coster
        self.ledger = ledger
        self.scopes = scopes
        self.record = StepRecord()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        schema = getattr(func, "_schema", None)
        if schema is None:  # not an operator with a schema (a higher-order op): run it, cost nothing
            return func(*args, **kwargs)
        name = schema.name
        if name.startswith("profiler::"):
            out = func(*args, **kwargs)
            if name == _ENTER and args and isinstance(args[0], str):
                self.scopes.labels.append(args[0])
                self.record.label_calls[args[0]] = self.record.label_calls.get(args[0], 0) + 1
            elif name == _EXIT and self.scopes.labels:
                self.scopes.labels.pop()
            return out
        freed = self.ledger.sweep()  # what the program dropped since the last op
        out = func(*args, **kwargs)
        if not name.startswith("aten::"):
            return out
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        module, phase, label = self.scopes.where(name)
        alloc = self.ledger.born(outputs, module or label, phase)
        cost = self.coster.cost(func, name, args, kwargs, outputs)
        rec = self.record
        rec.clock_us += cost.time_us
        net = alloc - freed
        figures = (cost.flops, cost.bytes, cost.time_us, alloc, net)
        key: OpKey = (name, phase, module, label, cost.shapes)
        rec.ops.setdefault(key, Sums()).add(*figures)
        if module is not None:
            rec.modules.setdefault((module, phase), Sums()).add(*figures)
        else:
            rec.unattributed.setdefault((label, phase), Sums()).add(*figures)
        if cost.flops:
            mix = rec.flops_by_dtype.setdefault(module, {})
            mix[cost.dtype] = mix.get(cost.dtype, 0) + cost.flops
        self.scopes.note_live()
        self.ledger.check_peak({"module": module or label, "phase": phase, "op": name}, rec.clock_us)
        return out
