"""The flight recorder's light record: module calls' wall times, forward and backward, every step.

Which modules and by what mechanism comes from the scope plan (``scope_plan.py``: a class wrapper
where one is safe, instance hooks where a library looks at ``forward``, the ``module.compile()``d
call), so the recorder takes the code paths a profile block takes. What runs per call is a mark
(``time.perf_counter_ns()`` and a code appended to the step's list) at the forward's entry and exit
and, when autograd records, one pre-hook on the autograd node that made the call's output: it runs
when the call's backward starts (``attribution/flight_calls.py`` turns these into spans). The first
of those in a backward pass queues an engine callback that marks the pass's end. With the native
module the pre-hook is C++ (``native_flight.cpp``: the engine calls no Python per node, which costs
more than the rest of the record together); without it, a Python pre-hook does the same. Nothing is
paired or converted while the job runs: :meth:`FlightClock.take_step` hands the records over as two
arrays.

Without a model (``layerscope run --flight-recorder``), torch's global module hooks name modules as
they are first called, as a profile's global mode does: a module called with no recorded call open
is a top-level module named by its class, its children by their attribute paths under it, all under
a synthetic root.

Node hooks left on a graph that outlives the recorder (``retain_graph``) do nothing: each knows the
step it was made in and the clock's state.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from layerscope.attribution.catalog import GLOBAL_ROOT_TYPE
from layerscope.capture import native
from layerscope.capture.compiled_modules import global_mode_paths
from layerscope.capture.forward_ranges import ForwardRanges
from layerscope.capture.options import ModuleSelection
from layerscope.capture.scope_plan import CLASS_WRAPPER, COMPILED_CALL, HOOKS, plan_scopes
from layerscope.events.flight_records import (
    PASS_END,
    PASS_START,
    FlightModule,
    Int64Array,
    backward_rows,
    forward_rows,
)

_now = time.perf_counter_ns
_thread = threading.get_ident
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
#: The autograd graph task running on this thread (-1: none, i.e. not inside a backward pass).
_graph_task: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)


class FlightClock:
    """The current step's marks and backward events (appended by the hooks, taken each step)."""

    def __init__(self) -> None:
        self.forward: list[tuple[int, int, int]] = []
        self.backward: list[tuple[int, int]] = []
        self.serial = next(_serials)  # which step hooks made now belong to (unique in the process)
        self.active = False
        self._pass_open = False
        self._names: list[str] = []
        self._native: Any = None  # the native module while this clock owns its backward hooks
        self._native_taken: list[bytes] = []  # native events taken before the step ended

    def start(self) -> None:
        """Start recording; the native backward hooks when the module is built and free."""
        global _native_owner
        module = native.load()
        if module is not None and hasattr(module, "flight_hook") and _native_owner is None:
            _native_owner, self._native = self, module
            module.flight_take()  # anything a previous recorder's late hooks left
            module.flight_serial(self.serial)
        self.active = True

    def stop(self) -> None:
        """Stop recording (hooks left on live graphs do nothing)."""
        global _native_owner
        self.active = False
        if self._native is not None:
            self._native.flight_serial(-1)
            self._native.flight_take()
            self._native = None
            _native_owner = None

    # ----- MarkSink (forward_ranges.py) --------------------------------------------------------------
    def code(self, name: str) -> int:
        """The code of a module's scope name: its 1-based place in the recorder's module list."""
        self._names.append(name)
        return len(self._names)

    def mark(self, code: int) -> None:
        """A call of module ``code`` opens (``+code``) or closes (``-code``) on this thread. A call
        that opens inside a backward pass none of our node hooks has seen yet (reentrant
        checkpointing re-running a whole model before any hooked node) opens the pass itself, so
        it is counted as recomputation."""
        if code > 0 and not self._pass_open and _graph_task() != -1:
            self.backward.append((_now(), PASS_START))
            self._pass_open = True
            _queue_callback(self._pass_ended)
        self.forward.append((_now(), code, _thread()))

    # ----- backward ----------------------------------------------------------------------------------
    def watch_output(self, args: tuple[Any, ...], output: Any) -> None:
        """Hook the autograd node of a call's output that has just ended (its last mark): the
        call's backward starts when that node runs. A call that made no node of its own (it returned
        an input, or autograd is off) has no backward."""
        if not _grad_enabled() or not self.active:
            return
        tensor = _output_tensor(output)
        if tensor is None:
            return
        if self._native is not None:  # the same checks, in C++
            self._native.flight_hook(tensor, args, self.serial, len(self.forward) - 1)
            return
        node: Any = tensor.grad_fn
        if node is None or any(isinstance(a, torch.Tensor) and a.grad_fn is node for a in args):
            return
        node.register_prehook(_BackwardStart(self, self.serial, len(self.forward) - 1))

    def backward_started(self, serial: int, call: int) -> None:
        """A hooked node is about to run (see :class:`_BackwardStart`)."""
        if serial != self.serial or not self.active:
            return
        self.backward.append((_now(), call))
        if not self._pass_open:
            self._pass_open = True
            _queue_callback(self._pass_ended)

    def _pass_ended(self) -> None:
        self._pass_open = False
        if self.active:
            self.backward.append((_now(), PASS_END))

    # ----- steps -------------------------------------------------------------------------------------
    def take_step(self) -> tuple[Int64Array, Int64Array]:
        """The step's marks and backward events as arrays; the next step starts empty."""
        forward, backward = self.forward, self.backward
        self.forward, self.backward = [], []
        self.serial = next(_serials)
        self._pass_open = False  # a pass whose end never came (its backward raised) is forgotten
        native_events = self._take_native()
        if self._native is not None:
            self._native.flight_serial(self.serial)
        return forward_rows(forward), _with_native(backward_rows(backward), native_events)

    def peek_step(self) -> tuple[Int64Array, Int64Array]:
        """The running step's records so far, as arrays (the records stay in place)."""
        if self._native is not None:
            self._native_taken.append(self._native.flight_take())
        native_events = b"".join(self._native_taken)
        return forward_rows(list(self.forward)), _with_native(
            backward_rows(list(self.backward)), native_events
        )

    def _take_native(self) -> bytes:
        taken = self._native_taken
        if self._native is not None:
            taken.append(self._native.flight_take())
        self._native_taken = []
        return b"".join(taken)


class _BackwardStart:
    """A node pre-hook: tells the clock that call ``call`` of step ``serial`` starts its backward.
    It returns None, so the node's gradients are left as they are."""

    __slots__ = ("_call", "_clock", "_serial")

    def __init__(self, clock: FlightClock, serial: int, call: int) -> None:
        self._clock = clock
        self._serial = serial
        self._call = call

    def __call__(self, grad_outputs: Any) -> None:
        self._clock.backward_started(self._serial, self._call)


def _output_tensor(output: Any) -> torch.Tensor | None:
    """The first tensor of ``output`` that autograd tracks (a tensor, or one level into a tuple,
    list or dict: transformers' outputs put the hidden states first). ``requires_grad`` is read,
    not ``grad_fn``, which makes a Python object for the node at each read."""
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, dict):
        output = list(output.values())
    for item in output if isinstance(output, list | tuple) else ():
        if isinstance(item, torch.Tensor) and item.requires_grad:
            return item
    return None


def _with_native(backward: Int64Array, native_events: bytes) -> Int64Array:
    """The Python hooks' backward rows and the native ones together, in time order."""
    if not native_events:
        return backward
    rows = np.frombuffer(native_events, dtype=np.int64).reshape(-1, 2)
    if len(backward):
        rows = np.concatenate([backward, rows])
    # events of several autograd threads meet in one buffer: put them in time order
    return rows[np.argsort(rows[:, 0], kind="stable")]


#: Modules global mode names at most (modules made anew in every step would grow the list forever).
MAX_GLOBAL_MODULES = 10_000
#: The code of a module global mode does not record (past :data:`MAX_GLOBAL_MODULES`).
UNRECORDED = 0

#: Step serials, unique in the process: a graph a hook was made in is never taken for a later step's.
_serials = itertools.count()

#: The clock whose native backward hooks are live (one per process: the hooks' state is global).
_native_owner: FlightClock | None = None


class FlightScopes:
    """Installs and removes the light record's scopes on a model (see the module docstring)."""

    def __init__(self, model: nn.Module | None, clock: FlightClock) -> None:
        plan = plan_scopes(model, ModuleSelection(), "auto", "the flight recorder's clock")
        self.clock = clock
        self.modules: list[FlightModule] = []
        self._codes: dict[int, int] = {}  # id(module) -> code, for hooked modules
        self._handles: list[RemovableHandle] = []
        self._compiled_calls: list[tuple[nn.Module, Any]] = []
        self._forward = ForwardRanges(_no_first_call, clock, clock.watch_output)
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
        for planned in self._plan:
            if not planned.in_catalog:
                continue
            scope, module = planned.scope, planned.module
            if scope.mechanism == CLASS_WRAPPER:
                assert planned.owner is not None
                self.modules.append(FlightModule(scope.path, scope.type_name, *_params(planned.params_from)))
                self._forward.add(module, f"{scope.path}:{scope.type_name}", planned.owner)
                continue
            code = self._add(FlightModule(scope.path, scope.type_name, *_params(planned.params_from)))
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
    own = sum(p.numel() for p in module.parameters(recurse=False))
    total = sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
    return own, total
