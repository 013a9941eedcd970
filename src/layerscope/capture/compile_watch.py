"""When compilation is watched: inside ``layerscope.profile``, inside ``layerscope.compile_info()``,
and process-wide from ``layerscope.watch_compiles()`` (also ``LAYERSCOPE_WATCH_COMPILES=1``,
``layerscope run`` and the framework integrations).

Each of these holds the one installation of ``compiled.install`` (Inductor's provenance hook wrapped,
its flags set): the first to open installs it, the last to close undoes it, so they nest in any
order. The graphs learnt join a per-process registry that profiles read when they are built.

A process-wide watch is lazy: until ``torch.compile`` is first called it only stands in front of
that function (importing Inductor takes seconds, and most scripts never compile); compilation
happens at a compiled model's first call, after ``torch.compile`` has returned, so starting there
sees every graph.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from layerscope.capture.compiled import MAX_GRAPHS, Collector, install

#: Set to 1 (true, yes, on) to watch compiles from the moment layerscope is imported.
ENV_VARIABLE = "LAYERSCOPE_WATCH_COMPILES"

#: Why watching compilation failed on this torch, once per attempt (empty: it works).
_unsupported: list[str] = []


class _Installation:
    """The provenance wrapper and flags, installed while at least one watcher holds them."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.holders = 0
        self.undo: ExitStack | None = None
        self.collector: Collector | None = None
        self.registry: list[dict[str, Any]] = []  # graphs of collectors already closed

    def acquire(self) -> None:
        with self.lock:
            self.holders += 1
            if self.holders > 1:
                return
            undo, collector = ExitStack(), Collector()
            try:
                install(undo, collector)
            except (AttributeError, ImportError, KeyError, RuntimeError) as exc:
                # An older or newer torch without what this needs: profiling goes on; compiled
                # regions then stay whole (their kernels with the compiled module).
                undo.close()
                _unsupported.append(f"{type(exc).__name__}: {exc}")
                del _unsupported[:-10]
                return
            self.undo, self.collector = undo, collector

    def release(self) -> None:
        with self.lock:
            self.holders -= 1
            if self.holders > 0 or self.undo is None:
                return
            undo, collector = self.undo, self.collector
            self.undo = self.collector = None
            undo.close()
            if collector is not None:
                self.registry.extend(collector.finished())
                del self.registry[: max(0, len(self.registry) - MAX_GRAPHS)]

    def graphs(self) -> list[dict[str, Any]]:
        with self.lock:
            live = self.collector.finished() if self.collector is not None else []
            return (self.registry + live)[-MAX_GRAPHS:]

    @property
    def watching(self) -> bool:
        return self.collector is not None


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


class CompileWatch:
    """The process-wide watch (:func:`watch_compiles`): on until :meth:`stop`, or the process ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._undo: ExitStack | None = None
        self._collecting = False

    @property
    def on(self) -> bool:
        """Whether the watch is on (waiting for ``torch.compile``, or collecting)."""
        return self._undo is not None

    @property
    def collecting(self) -> bool:
        """Whether compilation is being watched now (not only waiting for ``torch.compile``)."""
        return self._collecting

    def start(self, *, lazy: bool = True) -> CompileWatch:
        """Turn the watch on: collect now when ``torch.compile`` was already used in this process
        (or ``lazy`` is false), else from the first call of ``torch.compile``. Idempotent."""
        with self._lock:
            if self._undo is None:
                self._undo = ExitStack()
                if lazy and not should_collect():
                    self._wait_for_torch_compile(self._undo)
                    return self
            if not self._collecting:
                self._begin_collecting()
        return self

    def stop(self) -> None:
        """Turn the watch off: flags and functions as they were (graphs learnt stay known)."""
        with self._lock:
            undo, self._undo = self._undo, None
            self._collecting = False
        if undo is not None:
            undo.close()

    def __enter__(self) -> CompileWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _begin_collecting(self) -> None:
        assert self._undo is not None
        self._undo.enter_context(collecting_compile_info())
        self._collecting = True

    def _wait_for_torch_compile(self, undo: ExitStack) -> None:
        import torch

        original: Callable[..., Any] = torch.compile

        @functools.wraps(original)
        def compile_watched(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                if self._undo is not None and not self._collecting:
                    if torch.compile is compile_watched:
                        torch.compile = original  # only the first call passes through here
                    self._begin_collecting()
            return original(*args, **kwargs)

        torch.compile = compile_watched

        def restore() -> None:
            if torch.compile is compile_watched:
                torch.compile = original

        undo.callback(restore)


_watch = CompileWatch()


def watch_compiles(on: bool = True) -> CompileWatch:
    """Watch every ``torch.compile`` of this process from now on, so that profiles taken later place
    compiled kernels in their modules: one line at the top of a script, before the compiled model's
    first call (``layerscope run`` and the integrations do it themselves). While it watches,
    Inductor's FX-graph and AOTAutograd caches are bypassed (compiles take their full time) and C++
    kernels carry profiler ranges. ``watch_compiles(False)`` turns it off. Also as a context manager:
    ``with layerscope.watch_compiles(): ...``."""
    if on:
        return _watch.start()
    _watch.stop()
    return _watch


def watch_from_environment() -> None:
    """Start :func:`watch_compiles` when ``LAYERSCOPE_WATCH_COMPILES`` is set to a true value."""
    if os.environ.get(ENV_VARIABLE, "").strip().lower() in {"1", "true", "yes", "on"}:
        watch_compiles()
