"""``-q`` beyond our own lines: torch's profiler notices and warnings.

Kineto (torch's profiler library) prints its log records from C++ to stderr: ``USDT: ...
profiler_start``/``profiler_stop`` at every profiler start and stop. Python's ``sys.stderr`` never
sees them; kineto's own switch, ``KINETO_LOG_LEVEL`` (libkineto/src/init.cpp), does. Kineto reads it once
per process, when torch first prepares a trace (``libkineto_init``, then ``suppressLibkinetoLogMessages``),
and the level it sets lasts for the process. Only the CLI sets it: ``ls.profile`` in the user's own
process leaves kineto's logging alone.
"""

from __future__ import annotations

import os
import warnings
from types import TracebackType

from layerscope.errors import LayerscopeWarning

KINETO_LOG_LEVEL = "KINETO_LOG_LEVEL"

#: Kineto prints records of this level and above. Its USDT notices are level 5, the highest
#: (libkineto/include/ILoggerObserver.h: VERBOSE 0, INFO 1, WARNING 2, ERROR 3, STAGE 4, USDT 5), so
#: hiding them hides kineto's own ERROR lines too: there is no level between. Torch's exceptions
#: still end the command with its one-line error.
QUIET_KINETO_LOG_LEVEL = "6"


class ProfilerNotices:
    """With ``-q``, ``KINETO_LOG_LEVEL`` set (unless the user set it) from entry until kineto has read
    it (``read()``, once torch prepared its first trace) or the exit, whichever comes first; then
    the environment is as it was, so a script under ``run -q`` does not find the variable in its
    environment (nor pass it to its subprocesses) once recording began."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.set_here = False

    def __enter__(self) -> ProfilerNotices:
        if self.quiet and KINETO_LOG_LEVEL not in os.environ:
            os.environ[KINETO_LOG_LEVEL] = QUIET_KINETO_LOG_LEVEL
            self.set_here = True
        return self

    def read(self) -> None:
        """Torch has prepared a trace, so kineto has read its level: take the variable away again."""
        if self.set_here:
            self.set_here = False
            if os.environ.get(KINETO_LOG_LEVEL) == QUIET_KINETO_LOG_LEVEL:
                del os.environ[KINETO_LOG_LEVEL]

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.read()


def quiet_warnings(runs_user_script: bool) -> None:
    """``-q`` in the current ``warnings.catch_warnings()``: our warnings and the profiler's go. A
    command that runs no script of the user's (``profile``) prints no warning at all; under ``run``
    the script's own warnings are its output, as they would be without layerscope."""
    if not runs_user_script:
        warnings.simplefilter("ignore")
        return
    warnings.simplefilter("ignore", LayerscopeWarning)
    warnings.filterwarnings("ignore", module=r"torch\.(autograd\.)?profiler")
