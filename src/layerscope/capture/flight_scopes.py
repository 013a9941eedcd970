"""The flight recorder's light record: module calls' wall times, forward and backward, every step.

Which modules and by what mechanism comes from the scope plan (``scope_plan.py``: a class wrapper
where one is safe, instance hooks where a library looks at ``forward``, the ``module.compile()``d
call), so the recorder takes the code paths a profile block takes. What runs per call is the clock's
(``flight_clock.py``): a mark at the forward's entry and exit and, when autograd records, one
pre-hook on the autograd node that made the call's output, which runs when the call's backward
starts (``attribution/flight_calls.py`` turns these into spans).

Without a model (``layerscope run --flight-recorder``), torch's global module hooks name modules as
they are first called, as a profile's global mode does: a module called with no recorded call open
is a top-level module named by its class, its children by their attribute paths under it, all under
a synthetic root.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from layerscope.attribution.catalog import GLOBAL_ROOT_TYPE
from layerscope.capture.compiled_modules import global_mode_paths
from layerscope.capture.flight_clock import FlightClock
from layerscope.capture.forward_ranges import ForwardRanges
from layerscope.capture.module_catalog import param_counts
from layerscope.capture.options import ModuleSelection
from layerscope.capture.scope_plan import CLASS_WRAPPER, COMPILED_CALL, HOOKS, plan_scopes
from layerscope.events.flight_records import FlightModule

_is_compiling = torch.compiler.is_compiling

#: Modules global mode names at most (modules made anew in every step would grow the list forever).
MAX_GLOBAL_MODULES = 10_000
#: The code of a module global mode does not record (past :data:`MAX_GLOBAL_MODULES`).
UNRECORDED = 0


class FlightScopes:
    """Installs and removes the light record's scopes on a model (see the module docstring)."""

    def __init__(self, model: nn.Module | None, clock: FlightClock) -> None:
        plan = plan_scopes(model, ModuleSelection(), "auto", "the flight recorder's clock")
        self.clock = clock
        self._model = model
        self.modules: list[FlightModule] = []
        self._codes: dict[int, int] = {}  # id(module) -> code, for hooked modules
        self._handles: list[RemovableHandle] = []
        self._compiled_calls: list[tuple[nn.Module, Any]] = []
        self._forward = ForwardRanges(_no_first_call, clock, clock.watch_output, clock.native_call)
        self._plan = plan
        self._open = threading.local()  # global mode: the codes of the calls open on this thread
        self._lock = threading.Lock()
        self._roots: set[str] = set()

    def install(self) -> None:
        """Install every scope (call :meth:`remove` in a ``finally``)."""
        if self._plan.global_mode:
            from torch.nn.modules import module as module_mod

            self._add(FlightModule("", GLOBAL_ROOT_TYPE))
            self._handles.append(module_mod.register_module_forward_pre_hook(self._global_pre))
            self._handles.append(module_mod.register_module_forward_hook(self._global_post, always_call=True))
            return
        counts = param_counts(planned.params_from for planned in self._plan if planned.in_catalog)
        for planned in self._plan:
            if not planned.in_catalog:
                continue
            scope, module = planned.scope, planned.module
            params = counts[id(planned.params_from)]
            if scope.mechanism == CLASS_WRAPPER:
                assert planned.owner is not None
                self.modules.append(FlightModule(scope.path, scope.type_name, *params))
                self._forward.add(module, f"{scope.path}:{scope.type_name}", planned.owner)
                continue
            code = self._add(FlightModule(scope.path, scope.type_name, *params))
            if scope.mechanism == HOOKS:
                self._codes[id(module)] = code
                self._handles.append(module.register_forward_pre_hook(self._pre))
                self._handles.append(module.register_forward_hook(self._post, always_call=True))
            elif scope.mechanism == COMPILED_CALL:
                self._wrap_compiled_call(module, code)

    def module_paths(self) -> dict[int, str]:
        """``id(module)`` -> path of every module met so far (the hooked ones, and in global mode
        those named; class-wrapped ones are read from the model)."""
        return {key: self.modules[code - 1].path for key, code in self._codes.items()}

    def _add(self, module: FlightModule) -> int:
        """List ``module`` and return its code."""
        self.modules.append(module)
        return self.clock.code(f"{module.path}:{module.type_name}")

    def remove(self) -> None:
        """Remove every hook and class wrapper."""
        self._forward.remove()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        while self._compiled_calls:
            module, compiled = self._compiled_calls.pop()
            module._compiled_call_impl = compiled

    def _pre(self, module: nn.Module, args: Any) -> None:
        if not _is_compiling():
            self.clock.mark(self._codes[id(module)])

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if not _is_compiling():
            self.clock.mark(-self._codes[id(module)])
            self.clock.watch_output(args, output)

    # ----- global mode ---------------------------------------------------------------------------------
    def _open_calls(self) -> list[int]:
        found: list[int] | None = getattr(self._open, "codes", None)
        if found is None:
            found = self._open.codes = []
        return found

    def _global_pre(self, module: nn.Module, args: Any) -> None:
        if _is_compiling():
            return
        code = self._codes.get(id(module))
        if code is None:
            with self._lock:
                code = self._codes.get(id(module))
                if code is None:
                    code = self._name_new_module(module)
        if code == UNRECORDED:
            return
        self._open_calls().append(code)
        self.clock.mark(code)

    def _global_post(self, module: nn.Module, args: Any, output: Any) -> None:
        if _is_compiling():
            return
        code = self._codes.get(id(module))
        open_calls = self._open_calls()
        if code is None or code == UNRECORDED or code not in open_calls:
            return  # called before the recorder started, or past the list's bound
        while open_calls.pop() != code:  # a child whose post hook never ran
            pass
        self.clock.mark(-code)
        self.clock.watch_output(args, output)

    def _name_new_module(self, module: nn.Module) -> int:
        """Name ``module`` and its children (see the module docstring); its code. A module that
        goes away takes its entry with it (``id()`` values are reused); past
        :data:`MAX_GLOBAL_MODULES` names (modules made anew in every step), new ones go unrecorded."""
        if len(self.modules) >= MAX_GLOBAL_MODULES:
            self._codes[id(module)] = UNRECORDED
            weakref.finalize(module, self._codes.pop, id(module), None)
            return UNRECORDED
        open_calls = self._open_calls()
        parent = self.modules[open_calls[-1] - 1].path if open_calls else None
        name, found = global_mode_paths(
            module, parent, self._roots.__contains__, lambda m: id(m) in self._codes
        )
        self._roots.add(name)
        for entry, path in found:
            listed = FlightModule(path, type(entry.inner).__name__, *_params(entry.inner))
            self._codes[id(entry.scoped)] = code = self._add(listed)
            weakref.finalize(entry.scoped, self._codes.pop, id(entry.scoped), None)
            if entry.is_wrapper:  # the module it compiles, were it run eagerly, is the same row
                self._codes[id(entry.inner)] = code
                weakref.finalize(entry.inner, self._codes.pop, id(entry.inner), None)
        return self._codes[id(module)]

    def _wrap_compiled_call(self, module: nn.Module, code: int) -> None:
        compiled: Callable[..., Any] = module._compiled_call_impl  # type: ignore[assignment]
        clock = self.clock

        def call(*args: Any, **kwargs: Any) -> Any:
            clock.mark(code)
            try:
                output = compiled(*args, **kwargs)
            finally:
                clock.mark(-code)
            clock.watch_output(args, output)
            return output

        module._compiled_call_impl = call
        self._compiled_calls.append((module, compiled))


def _no_first_call(
    module: nn.Module, scoped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    return scoped(module, *args, **kwargs)


def _params(module: nn.Module) -> tuple[int, int]:
    """Own and total parameters (each shared tensor once)."""
    return param_counts([module])[id(module)]
