"""Module scopes by patching the forward of each module's class for the block (the fast path).

Per-module hooks go through torch's hook dispatch on every call; a class-level ``forward`` wrapper
is one Python call that opens the scope with ``with`` (docs/benchmarks.md has the costs).

Why the class and not the instance: an instance-level ``forward`` closes over one module, so a copy
of the module made during the block (``copy.deepcopy``, DataParallel's ``replicate``, which copies
``__dict__``) would call the *original* module's forward with the original's parameters. A class
wrapper is handed ``self``, so every instance runs its own forward; only registered instances get
a scope (one dict lookup for the rest).

Each wrapper belongs to the class that *defines* ``forward`` (the owner in the MRO,
``scope_plan.forward_owner``) and names only modules whose forward resolves to that owner, so
``super().forward(x)`` into a patched base class opens no second scope. ``with`` closes the range on
any exception, KeyboardInterrupt included. Restoring puts each class's own ``forward`` back; if
someone else patched the class on top of ours during the block, ours is left in their chain but
turned into a pass-through (its names cleared).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

_RecordFunctionFast = torch._C._profiler._RecordFunctionFast
_is_compiling = torch.compiler.is_compiling

#: A module's first call: (module, the scoped forward, args, kwargs) -> output. It records shapes and
#: runs the scoped forward, which opens the module's range (or marks) around the original.
FirstCall = Callable[[nn.Module, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]

#: Called after a marked call returns: (its positional arguments, its output). The flight recorder
#: hooks the output's autograd node there.
AfterCall = Callable[[tuple[Any, ...], Any], None]

#: The whole of a marked call in one native call: ``call(codes, original, module, args, kwargs)``
#: looks up ``module``'s code, marks, calls ``original(module, *args, **kwargs)``, marks again (also
#: when it raises) and calls the after-call (``native_flight.cpp``'s ``flight_call``).
NativeCall = Callable[[dict[int, int], Callable[..., Any], nn.Module, tuple[Any, ...], dict[str, Any]], Any]


class MarkSink(Protocol):
    """Where marks go: the native marks of a profile block (``ModuleMarks``) or the flight
    recorder's clock."""

    @property
    def mark(self) -> Callable[[int], None]:
        """The hot call: ``mark(code)`` opens a scope, ``mark(-code)`` closes it."""
        ...

    def code(self, name: str) -> int:
        """The positive code of a scope's name."""
        ...


class ForwardRanges:
    """The patched classes of one profiling block and the modules each one names.

    With ``marks`` (the native module's marks, ``module_marks.py``) a call is bracketed by two marks
    instead of a profiler range; the spans they make carry the same names.
    """

    def __init__(
        self,
        first_call: FirstCall,
        marks: MarkSink | None = None,
        after_call: AfterCall | None = None,
        native_call: NativeCall | None = None,
    ) -> None:
        self._first_call = first_call
        self._marks = marks
        self._after_call = after_call
        self._native_call = native_call  # with after_call: what marks and after_call do, in one C call
        self._seen: set[int] = set()  # modules whose first call already ran
        # owner class -> id(module) -> its range name, or its mark code when marks are on
        self._names: dict[type, dict[int, Any]] = {}
        self._patched: dict[type, tuple[Any, Callable[..., Any]]] = {}  # owner -> (original, wrapper)

    def add(self, module: nn.Module, name: str, owner: type) -> None:
        """Give ``module`` a scope named ``name`` by wrapping ``owner.forward`` (the class in its MRO
        whose forward runs: ``scope_plan.forward_owner``)."""
        names = self._names.get(owner)
        if names is None:
            names = self._names[owner] = {}
            original = owner.__dict__["forward"]
            wrapper = self._wrapper(original, names)
            type.__setattr__(owner, "forward", wrapper)
            self._patched[owner] = (original, wrapper)
        names[id(module)] = self._marks.code(name) if self._marks is not None else name

    def _wrapper(self, original: Callable[..., Any], names: dict[int, Any]) -> Callable[..., Any]:
        if self._marks is not None and self._native_call is not None:
            forward = self._native_wrapper(original, names, self._native_call)
        elif self._marks is not None and self._after_call is not None:
            forward = self._marks_after_wrapper(original, names, self._marks, self._after_call)
        elif self._marks is not None:
            forward = self._marks_wrapper(original, names, self._marks)
        else:
            forward = self._range_wrapper(original, names)
        # inspect.signature(module.forward) must still show the real parameters (transformers'
        # Trainer picks dataset columns by them): update_wrapper sets __wrapped__.
        functools.update_wrapper(forward, original)
        return forward

    def _range_wrapper(self, original: Callable[..., Any], names: dict[int, str]) -> Callable[..., Any]:
        seen, first_call = self._seen, self._first_call

        def ranged(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            with _RecordFunctionFast(names[id(module)]):
                return original(module, *args, **kwargs)

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            # Inside a region torch.compile traces, Dynamo folds this to True: no range, no graph break.
            if _is_compiling():
                return original(self, *args, **kwargs)
            key = id(self)
            name = names.get(key)
            if name is None:  # an instance outside the profiled model, or a super() call
                return original(self, *args, **kwargs)
            if key not in seen:
                seen.add(key)
                return first_call(self, ranged, args, kwargs)
            with _RecordFunctionFast(name):
                return original(self, *args, **kwargs)

        return forward

    def _marks_wrapper(
        self, original: Callable[..., Any], codes: dict[int, int], marks: MarkSink
    ) -> Callable[..., Any]:
        seen, first_call, mark = self._seen, self._first_call, marks.mark

        def marked(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            code = codes[id(module)]
            mark(code)
            try:
                return original(module, *args, **kwargs)
            finally:
                mark(-code)

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if _is_compiling():
                return original(self, *args, **kwargs)
            key = id(self)
            code = codes.get(key)
            if code is None:  # an instance outside the profiled model, or a super() call
                return original(self, *args, **kwargs)
            if key not in seen:
                seen.add(key)
                return first_call(self, marked, args, kwargs)
            mark(code)
            try:
                return original(self, *args, **kwargs)
            finally:
                mark(-code)

        return forward

    def _marks_after_wrapper(
        self, original: Callable[..., Any], codes: dict[int, int], marks: MarkSink, after: AfterCall
    ) -> Callable[..., Any]:
        """Marks, and ``after(args, output)`` when the call returns (not when it raises)."""
        mark = marks.mark

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if _is_compiling():
                return original(self, *args, **kwargs)
            code = codes.get(id(self))
            if code is None:  # an instance outside the recorded model, or a super() call
                return original(self, *args, **kwargs)
            mark(code)
            try:
                output = original(self, *args, **kwargs)
            finally:
                mark(-code)
            after(args, output)
            return output

        return forward

    @staticmethod
    def _native_wrapper(
        original: Callable[..., Any], codes: dict[int, int], call: NativeCall
    ) -> Callable[..., Any]:
        """What :meth:`_marks_after_wrapper` does, the call itself made from C: in a real model the
        kernels between two module calls evict this wrapper's code and objects from the caches, so
        each Python operation it saves is worth far more there than in a tight loop (see
        docs/benchmarks.md). torch.compiler's check stays here: Dynamo traces this frame and must
        see the original call, never the native one."""

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if _is_compiling():
                return original(self, *args, **kwargs)
            return call(codes, original, self, args, kwargs)

        return forward

    def remove(self) -> None:
        """Put every class's own ``forward`` back (or turn ours into a pass-through, see module doc)."""
        while self._patched:
            owner, (original, wrapper) = self._patched.popitem()
            self._names[owner].clear()
            if owner.__dict__.get("forward") is wrapper:
                type.__setattr__(owner, "forward", original)
        self._names.clear()
