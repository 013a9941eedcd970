"""The last word on an exception that ends the process, for integrations whose framework never tells a
callback that training died (transformers' ``Trainer`` calls no callback when ``train()`` raises).

:class:`UncaughtHook` chains ``sys.excepthook`` while an integration runs: an exception nobody caught
reaches it before the interpreter prints it, so the flight recorder can dump the step it ended (its
traceback still names the module) and every hook comes off; then the previous hook prints it as
before. It is put back on removal unless someone chained over it since, in which case it stays in
their chain and passes everything through.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from types import TracebackType

ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]


class UncaughtHook:
    """A chained ``sys.excepthook`` calling ``on_exception`` once, for the first uncaught exception
    while installed."""

    def __init__(self, on_exception: Callable[[BaseException], None]) -> None:
        self._on_exception = on_exception
        self._previous: ExceptHook | None = None
        self._active = False
        # the bound method made once: ``sys.excepthook is self.hook`` must hold for removal
        self.hook = self._hook

    def install(self) -> None:
        """Put the hook in front of the current ``sys.excepthook`` (once: installed again while a
        hook chained over ours, it only becomes active again; re-chaining could call itself)."""
        if self._previous is None:
            self._previous = sys.excepthook
            sys.excepthook = self.hook
        self._active = True

    def remove(self) -> None:
        """Stop acting; put the previous hook back if ours is still the one installed."""
        self._active = False
        if self._previous is not None and sys.excepthook is self.hook:
            sys.excepthook = self._previous
            self._previous = None

    def _hook(self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        # taken first: ``on_exception`` usually ends the integration, which removes this hook
        previous = self._previous if self._previous is not None else sys.__excepthook__
        if self._active:
            self._active = False
            try:
                self._on_exception(exc)
            except BaseException as failure:  # even a second Ctrl-C: the program's hook still runs
                message = f"layerscope: {type(failure).__name__}: {failure}"
                warnings.warn(message, RuntimeWarning, stacklevel=1)
        previous(exc_type, exc, tb)
