"""The flight recorder's clock: each step's forward marks and backward starts (``flight_scopes.py``
installs the scopes that call it).

A mark is ``(time ns, code, thread)``: ``+code`` when a call of module ``code`` opens, ``-code`` when
it closes. When a call returns, the autograd node that made its output gets a pre-hook: it runs
when the call's backward starts, recording ``(time ns, call)`` (``call``: the row of the call's
closing mark); the first of those in a backward pass queues an engine callback that marks the pass's
end. With the native module all of it is C++ (``native_flight.cpp``): the engine calls no Python per
node, which costs more than the rest of the record together, and a mark is one C call into a
buffer, not a Python tuple; without it, Python does the same. Nothing is paired or converted while
the job runs: :meth:`FlightClock.take_step` hands the records over as two arrays.

Node hooks left on a graph that outlives the recorder (``retain_graph``) do nothing: each knows the
step it was made in and the clock's state.
"""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from layerscope.capture import native
from layerscope.errors import LayerscopeWarning
from layerscope.events.flight_records import PASS_END, PASS_START, Int64Array, backward_rows, forward_rows

_now = time.perf_counter_ns
_AfterCall = Callable[[tuple[Any, ...], Any], None]
_thread = threading.get_ident
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
        self._native: Any = None  # the native module while this clock owns its marks and hooks
        self._native_taken: list[bytes] = []  # native events taken before the step ended
        # the native module's hot calls from start() to stop() (mark, after-call, whole call):
        # builtins, so no reference cycle
        self._native_calls: tuple[Callable[[int], None], _AfterCall, Any] | None = None

    @property
    def mark(self) -> Callable[[int], None]:
        """``MarkSink.mark``: the native module's mark from :meth:`start` to :meth:`stop`, else the
        Python one. Scopes read it when installed, so they are installed after :meth:`start`."""
        return self._native_calls[0] if self._native_calls is not None else self._mark

    @property
    def watch_output(self) -> Callable[[tuple[Any, ...], Any], None]:
        """What runs when a call returns (``watch_output(args, output)``, see :meth:`_watch_output`):
        native or Python, as :attr:`mark`."""
        return self._native_calls[1] if self._native_calls is not None else self._watch_output

    @property
    def native_call(self) -> Any:
        """``forward_ranges.NativeCall``: a class-wrapped module's whole call (marks, the call, the
        output's node hook) in one C call, from :meth:`start` to :meth:`stop` with the native
        module; None otherwise (the wrapper then calls :attr:`mark` and :attr:`watch_output`)."""
        return self._native_calls[2] if self._native_calls is not None else None

    def start(self) -> None:
        """Start recording; the native marks and hooks when the module is built and free."""
        global _native_owner
        module = native.load()
        if module is not None and hasattr(module, "flight_mark") and _native_owner is None:
            _native_owner, self._native = self, module
            module.flight_take()  # anything a previous recorder's late hooks left
            module.flight_clear_forward()
            module.flight_serial(self.serial)
            self._native_calls = (module.flight_mark, module.flight_after, module.flight_call)
        elif module is None:
            _warn_python_record()
        self.active = True

    def stop(self) -> None:
        """Stop recording (hooks left on live graphs, and native marks, do nothing)."""
        global _native_owner
        self.active = False
        self._native_calls = None
        if self._native is not None:
            self._native.flight_serial(-1)
            self._native.flight_take()
            self._native.flight_clear_forward()
            self._native = None
            _native_owner = None

    # ----- MarkSink (forward_ranges.py) --------------------------------------------------------------
    def code(self, name: str) -> int:
        """The code of a module's scope name: its 1-based place in the recorder's module list."""
        self._names.append(name)
        return len(self._names)

    def _mark(self, code: int) -> None:
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
    def _watch_output(self, args: tuple[Any, ...], output: Any) -> None:
        """Hook the autograd node of a call's output that has just ended (its last mark): the
        call's backward starts when that node runs. A call that made no node of its own (it returned
        an input, or autograd is off) has no backward."""
        if not _grad_enabled() or not self.active:
            return
        tensor = _output_tensor(output)
        if tensor is None:
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
        if self._native is None:
            return forward_rows(forward), _with_native(backward_rows(backward), native_events)
        marks = self._native.flight_take_forward()
        self._native.flight_serial(self.serial)
        return _native_rows(marks), _with_native(backward_rows(backward), native_events)

    def peek_step(self) -> tuple[Int64Array, Int64Array]:
        """The running step's records so far, as arrays (the records stay in place)."""
        if self._native is not None:
            self._native_taken.append(self._native.flight_take())
            forward = _native_rows(self._native.flight_take_forward(keep=True))
        else:
            forward = forward_rows(list(self.forward))
        native_events = b"".join(self._native_taken)
        return forward, _with_native(backward_rows(list(self.backward)), native_events)

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


def _native_rows(marks: bytes) -> Int64Array:
    """The ``forward`` array of a step from the native module's marks (a writable copy)."""
    return np.frombuffer(marks, dtype=np.int64).reshape(-1, 3).copy()


def _with_native(backward: Int64Array, native_events: bytes) -> Int64Array:
    """The Python hooks' backward rows and the native ones together, in time order."""
    if not native_events:
        return backward
    rows = np.frombuffer(native_events, dtype=np.int64).reshape(-1, 2)
    if len(backward):
        rows = np.concatenate([backward, rows])
    # events of several autograd threads meet in one buffer: put them in time order
    return rows[np.argsort(rows[:, 0], kind="stable")]


def _warn_python_record() -> None:
    """Say once per process that the light record runs in Python, where the native module is not
    built or does not load (not where ``LAYERSCOPE_NATIVE=0`` turned it off on purpose)."""
    global _warned_python
    if _warned_python or not native.enabled():
        return
    _warned_python = True
    why = native.status().reason or "it did not load"
    warnings.warn(
        f"flight recorder: the native module is not in use ({why}); the light "
        "record runs in Python at several times its cost (~5% of a small model's step instead of "
        "~1%); run `layerscope native build`",
        LayerscopeWarning,
        stacklevel=4,
    )


_warned_python = False

#: Step serials, unique in the process: a graph a hook was made in is never taken for a later step's.
_serials = itertools.count()

#: The clock whose native backward hooks are live (one per process: the hooks' state is global).
_native_owner: FlightClock | None = None
