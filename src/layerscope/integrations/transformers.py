"""Hugging Face Transformers: ``Trainer(..., callbacks=[LayerscopeCallback(active=3)])``.

Profiles chosen steps of ``Trainer.train()`` with a schedule and saves, per cycle, the profile, a
text report and optionally the Chrome trace into ``<output_dir>/layerscope`` (names carry the rank);
the main process says on stderr, one line per cycle, which files it wrote where.

``torch.compile`` is watched from ``on_train_begin`` (before the first forward, where a model the
Trainer compiles with ``torch_compile=True`` is compiled), and with ``torch_compile=True`` the
compiled wrapper the Trainer runs is the one profiled, so compiled models show their modules.

``LayerscopeCallback(flight_recorder=True)`` runs the flight recorder instead (``ls.flight_recorder``:
every step recorded lightly, the last ``keep`` dumped into the same folder on a slow step or
SIGUSR1). The Trainer calls no callback when ``train()`` raises, so while it trains the recorder's
callback chains ``sys.excepthook`` (:mod:`layerscope.integrations.uncaught`): an exception that ends the
process is dumped (naming the module it passed, as ``ls.flight_recorder`` would) and every hook comes
off before Python prints it. One caught by the program (a notebook, a retry loop) is seen when the
next ``train()`` starts: its recorder, still installed, dumps the steps it kept (the exception itself
when the program still holds it: inside its ``except``, or a notebook's last error; else
:class:`TrainAbandoned`, which names no module) and everything comes off.
:meth:`LayerscopeCallback.close` ends it all without a dump.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any

from transformers import TrainerCallback

from layerscope.integrations._common import FlightOptions, save_with_report, start_flight_recorder
from layerscope.integrations.uncaught import UncaughtHook


class TrainAbandoned(Exception):
    """What a flight dump names when a ``train()`` raised, the program caught the exception and it is
    gone by the next ``train()`` (the dump still holds the steps and the module left open)."""


class LayerscopeCallback(TrainerCallback):
    """A TrainerCallback profiling ``skip_first``/``wait``/``warmup``/``active`` steps, ``repeat``
    times (layerscope.schedule's semantics; a step is one optimizer step of the Trainer)."""

    def __init__(
        self,
        *,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        skip_first: int = 0,
        memory: bool = False,
        trace: bool = False,
        output_dir: str | None = None,
        depth: int | None = None,
        flight_recorder: bool = False,
        keep: int = 100,
        detail_every: int = 0,
        slow: float | None = 3.0,
    ) -> None:
        import layerscope as ls

        self.schedule = ls.schedule(
            wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first
        )
        self.memory = memory
        self.trace = trace
        self.output_dir = output_dir
        self.depth = depth
        self.session: Any = None
        self.handler: Any = None
        self.compile_watch: Any = None
        self.flight = FlightOptions(keep, detail_every, slow) if flight_recorder else None
        #: the running flight recorder (with ``flight_recorder=True``); its ``dumps`` list the files
        self.recorder: Any = None
        self._uncaught = UncaughtHook(self._ended_by)

    @property
    def cycles(self) -> list[Any]:
        """The finished cycles (each with its Profile)."""
        return list(self.session.cycles) if self.session is not None else []

    @property
    def written(self) -> list[Any]:
        """Files written so far."""
        return list(getattr(self.handler, "written", []))

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        import layerscope as ls
        from layerscope.capture.compile_watch import CompileWatch
        from layerscope.capture.compiled_modules import compiled_wrapper_of

        # a train() that raised never reached on_train_end: end what it left before starting anew
        self._end_failed_train()
        self.compile_watch = CompileWatch().start()
        if model is not None and getattr(args, "torch_compile", False):
            # The Trainer runs a torch.compile wrapper of the model it hands us: scope the wrapper
            # (patching modules inside compiled code would make Dynamo recompile, and never run).
            wrapper = compiled_wrapper_of(model)
            model = model if wrapper is None else wrapper
        folder = self.output_dir or os.path.join(args.output_dir, "layerscope")
        if self.flight is not None:
            self.recorder = start_flight_recorder(model, folder, self.flight)
            self._uncaught.install()
            return
        rank = int(getattr(args, "process_index", 0) or 0)
        # every rank writes its files; the main process says where they went
        self.handler = save_with_report(folder, trace=self.trace, rank=rank, announce=rank == 0)
        self.session = ls.profile(
            model, memory=self.memory, depth=self.depth, schedule=self.schedule, on_trace_ready=self.handler
        )
        self.session.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.recorder is not None:
            self.recorder.step()
        if self.session is not None:
            self.session.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop profiling and remove every hook (on_train_end does this; call it if training died)."""
        self._uncaught.remove()
        if self.session is not None and self.session.is_running:
            self.session.stop()
        if self.recorder is not None and self.recorder.clock.active:
            self.recorder.__exit__(None, None, None)
        if self.compile_watch is not None:
            self.compile_watch.stop()
            self.compile_watch = None

    def _end_failed_train(self) -> None:
        """End what a ``train()`` that raised left installed; its recorder dumps the steps it kept."""
        if self.recorder is not None and self.recorder.clock.active:
            exc = _failed_train_exception()
            if exc is None:
                exc = TrainAbandoned("the previous train() raised; the program caught the exception")
            self.recorder.__exit__(type(exc), exc, exc.__traceback__)
        self.close()

    def _ended_by(self, exc: BaseException) -> None:
        """An exception is ending the process inside ``train()`` (flight recorder only: a profiling
        session would build and save a partial cycle in the hook): the recorder dumps it (waiting
        for the file), then everything comes off."""
        if self.recorder is not None and self.recorder.clock.active:
            self.recorder.__exit__(type(exc), exc, exc.__traceback__)
        self.close()


def _failed_train_exception() -> BaseException | None:
    """The exception a ``train()`` raised, if the program still holds it: the one being handled
    (a retry inside ``except``) or the interpreter's last error (a notebook's previous cell); only
    one whose traceback passes through the Trainer's ``train``."""
    for found in (sys.exc_info()[1], getattr(sys, "last_exc", None), getattr(sys, "last_value", None)):
        if isinstance(found, BaseException) and _through_train(found.__traceback__):
            return found
    return None


def _through_train(tb: TracebackType | None) -> bool:
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "train" and code.co_filename.replace("\\", "/").endswith(
            "transformers/trainer.py"
        ):
            return True
        tb = tb.tb_next
    return False
