"""When compilation is watched: inside ``layerscope.profile``, inside ``layerscope.compile_info()``,
and process-wide from ``layerscope.watch_compiles()`` (also ``LAYERSCOPE_WATCH_COMPILES=1``,
``layerscope run`` and the framework integrations).

Each of these holds the one installation of ``compiled.install`` (Inductor's provenance hook
wrapped, its flags set around every compilation, in the compiling thread): the first to open
installs it, the last to close undoes it, so they nest in any order. Where Dynamo is loaded, the
installation itself waits for the start of the next compilation (Dynamo's start callback), since it
imports Inductor's code generators, and libraries such as transformers load Dynamo without ever
compiling. The graphs learnt join a per-process registry that profiles read when they are built.

A process-wide watch is lazy: until ``torch.compile`` is first called, one stand-in shared by every
waiting watch stands in front of that function (importing Inductor takes seconds, and most scripts
never compile); compilation happens at a compiled model's first call, after ``torch.compile`` has
returned, so starting there sees every graph.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import Any

from layerscope.capture.compiled import MAX_GRAPHS, Collector, CompileFlags, install

#: Set to 1 (true, yes, on) to watch compiles from the moment layerscope is imported.
ENV_VARIABLE = "LAYERSCOPE_WATCH_COMPILES"

#: Why watching compilation failed on this torch, once per attempt (empty: it works).
_unsupported: list[str] = []


def _note_unsupported(exc: BaseException) -> None:
    _unsupported.append(f"{type(exc).__name__}: {exc}")
    del _unsupported[:-10]


class _Installation:
    """The provenance wrapper and flags, installed while at least one watcher holds them.

    Installing imports Inductor's code generators (about 1 s), which a process that never compiles
    should not pay, and Dynamo is imported by many libraries (transformers) that never compile. So
    where Dynamo's compile callbacks exist, the first holder only arms a start callback (a few µs)
    and the installation happens at the start of the next compilation, before any code is generated:
    a compilation, even of a model wrapped by ``torch.compile`` long before, always passes there.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.holders = 0
        self.undo: ExitStack | None = None
        self.collector: Collector | None = None
        self.flags = CompileFlags()
        self.registry: list[dict[str, Any]] = []  # graphs of collectors already closed
        self.armed: Any = None  # Dynamo's callback handler while the trigger is registered there
        self.failed = False  # installing failed on this torch (reset when the last holder leaves)

    @property
    def installed(self) -> bool:
        """Whether the provenance wrapper and flags are in place (not only armed)."""
        return self.undo is not None

    def acquire(self) -> None:
        with self.lock:
            self.holders += 1
            if self.undo is not None:
                if self.holders > 1:
                    self.flags.ensure()  # a torch._dynamo.reset() may have dropped the callbacks
                return
            if self._arm():  # again for a later holder: a reset may have dropped the trigger
                return
            if self.holders == 1:
                try:
                    self._install()
                except BaseException:
                    self.holders -= 1
                    raise

    def _arm(self) -> bool:
        """Install at the next compilation's start; False where Dynamo (or its callbacks) is not
        loaded, in which case importing it would cost what arming saves."""
        if "torch._dynamo" not in sys.modules:
            return False
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            return False
        if self._on_compile_start not in callback_handler.start_callbacks:
            callback_handler.register_start_callback(self._on_compile_start)
        self.armed = callback_handler
        return True

    def _on_compile_start(self, _args: object) -> None:
        """Dynamo's start callback: install now (its own flag callbacks, appended to the list being
        run, then run for this compilation too). Stays registered until the last holder leaves:
        removing it from inside the loop over the callbacks would skip the next one."""
        with self.lock:
            if self.holders > 0 and self.undo is None and not self.failed:
                try:
                    self._install()
                except Exception as exc:  # never let watching break the user's compilation
                    _note_unsupported(exc)

    def _install(self) -> None:
        """Install now (on a torch without what it needs, note why and go on without)."""
        undo, collector = ExitStack(), Collector()
        try:
            install(undo, collector, self.flags)
        except (AttributeError, ImportError, KeyError, RuntimeError) as exc:
            # An older or newer torch without what this needs: profiling goes on; compiled
            # regions then stay whole (their kernels with the compiled module).
            undo.close()
            _note_unsupported(exc)
            self.failed = True  # not again at every compilation while this holding lasts
            return
        except BaseException:
            undo.close()
            raise
        self.undo, self.collector = undo, collector

    def release(self) -> None:
        with self.lock:
            self.holders = max(0, self.holders - 1)
            if self.holders > 0:
                return
            armed, self.armed, self.failed = self.armed, None, False
            if armed is not None:
                with suppress(ValueError):  # already cleared by torch._dynamo.reset()
                    armed.remove_start_callback(self._on_compile_start)
            if self.undo is None:
                return
            undo, collector = self.undo, self.collector
            self.undo = self.collector = None
            try:
                undo.close()
            finally:
                if collector is not None:
                    self.registry.extend(collector.finished())
                    del self.registry[: max(0, len(self.registry) - MAX_GRAPHS)]

    def graphs(self) -> list[dict[str, Any]]:
        with self.lock:
            live = self.collector.finished() if self.collector is not None else []
            return (self.registry + live)[-MAX_GRAPHS:]


_installation = _Installation()


def known_graphs() -> list[dict[str, Any]]:
    """Every graph whose kernels' modules layerscope learnt in this process (oldest first), those
    still being collected included (a schedule's cycle ends inside the block)."""
    return _installation.graphs()


def forget_graphs() -> None:
    """Drop the graphs learnt so far (tests: a process as if nothing had been compiled watched)."""
    with _installation.lock:
        _installation.registry.clear()
        if _installation.collector is not None:
            _installation.collector.clear()


def should_collect() -> bool:
    """Collect only when torch.compile is in use in this process (importing Inductor takes seconds)."""
    return "torch._dynamo" in sys.modules


@contextmanager
def collecting_compile_info() -> Iterator[None]:
    """While open, compilation records which module each kernel comes from (see ``compiled.py``).
    Flags and functions are restored when the last watcher closes, exceptions included."""
    _installation.acquire()
    try:
        yield
    finally:
        _installation.release()


def compile_info() -> Any:
    """``with layerscope.compile_info(): model(x)``: learn the modules of the kernels of graphs that
    compile in this block (e.g. a warm-up before a long job), for profiles taken later. Compilation
    inside ``layerscope.profile`` is covered without it."""
    return collecting_compile_info()


class _FirstCompile:
    """The one stand-in for ``torch.compile`` while watches wait for its first call: it starts every
    waiting watch, then puts torch's function back (also when the last waiting watch stops)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: list[CompileWatch] = []
        self.original: Callable[..., Any] | None = None
        self.stand_in: Callable[..., Any] | None = None

    def wait(self, watch: CompileWatch) -> None:
        import torch

        with self.lock:
            self.waiting.append(watch)
            if self.stand_in is not None:
                return
            original: Callable[..., Any] = torch.compile

            @functools.wraps(original)
            def compile_watched(*args: Any, **kwargs: Any) -> Any:
                self.fire()
                return original(*args, **kwargs)

            self.original, self.stand_in = original, compile_watched
            torch.compile = compile_watched

    def forget(self, watch: CompileWatch) -> None:
        with self.lock:
            if watch in self.waiting:
                self.waiting.remove(watch)
            if not self.waiting:
                self._restore()

    def fire(self) -> None:
        with self.lock:
            waiting, self.waiting = self.waiting, []
            self._restore()
        for watch in waiting:
            try:
                watch.begin_collecting()
            except Exception as exc:  # never let watching break the user's torch.compile
                _note_unsupported(exc)

    def _restore(self) -> None:
        import torch

        if self.stand_in is not None and torch.compile is self.stand_in:
            torch.compile = self.original  # type: ignore[assignment]
        self.original = self.stand_in = None


_first_compile = _FirstCompile()


class CompileWatch:
    """A process-wide watch (:func:`watch_compiles`, ``layerscope run``, the integrations each hold
    one): on until :meth:`stop`, or the process ends; ``with CompileWatch(): ...`` for a block (a
    watch of its own, so it never stops another's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._on = False
        self._collecting: ExitStack | None = None

    @property
    def on(self) -> bool:
        """Whether the watch is on (waiting for ``torch.compile``, or collecting)."""
        return self._on

    @property
    def collecting(self) -> bool:
        """Whether compilation is being watched now (not only waiting for ``torch.compile``)."""
        return self._collecting is not None

    def start(self, *, lazy: bool = True) -> CompileWatch:
        """Turn the watch on: collect now when ``torch.compile`` was already used in this process
        (or ``lazy`` is false), else from the first call of ``torch.compile``. Idempotent."""
        with self._lock:
            if self._on:
                return self
            self._on = True
        if lazy and not should_collect():
            _first_compile.wait(self)
        else:
            self.begin_collecting()
        return self

    def stop(self) -> None:
        """Turn the watch off: flags and functions as they were (graphs learnt stay known)."""
        _first_compile.forget(self)
        with self._lock:
            self._on = False
            collecting, self._collecting = self._collecting, None
        if collecting is not None:
            collecting.close()

    def __enter__(self) -> CompileWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def begin_collecting(self) -> None:
        """Collect from now on (the watch is on)."""
        with self._lock:
            if not self._on or self._collecting is not None:
                return
            stack = ExitStack()
            stack.enter_context(collecting_compile_info())
            self._collecting = stack


_watch = CompileWatch()


def watch_compiles(on: bool = True) -> CompileWatch:
    """Watch every ``torch.compile`` of this process from now on, so that profiles taken later place
    compiled kernels in their modules: one line at the top of a script, before the compiled model's
    first call (``layerscope run`` and the integrations do it themselves). While it watches,
    Inductor's FX-graph and AOTAutograd caches are bypassed around each compilation (compiles take
    their full time) and C++ kernels carry profiler ranges. ``watch_compiles(False)`` turns it off.
    For one block only, use ``with layerscope.compile_info():``."""
    if on:
        return _watch.start()
    _watch.stop()
    return _watch


def watch_from_environment() -> None:
    """Start :func:`watch_compiles` when ``LAYERSCOPE_WATCH_COMPILES`` is set to a true value."""
    if os.environ.get(ENV_VARIABLE, "").strip().lower() in {"1", "true", "yes", "on"}:
        watch_compiles()
