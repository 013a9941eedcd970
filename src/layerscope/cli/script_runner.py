"""Running a user's script or ``-m`` module as ``python`` would, for ``layerscope run``: its argv and
``sys.path[0]``, its exit code, its error reported as Python reports it."""

from __future__ import annotations

import runpy
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ScriptEnd:
    """How a script ended: its exit code, what ended it (``""``: it returned or exited) and the
    exception that did, if one did."""

    code: int
    outcome: str = ""
    error: BaseException | None = None


@contextmanager
def script_environment(argv: list[str], path_entry: str) -> Any:
    """sys.argv and sys.path[0] as ``python script.py`` would set them, restored afterwards."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = argv
    sys.path.insert(0, path_entry)
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def run_script(
    module: str | None, argv: list[str], before_traceback: Callable[[], None] = lambda: None
) -> ScriptEnd:
    """Run the script: its exit code, what ended it (``""``: it returned or exited) and the exception
    that did (an interrupt or an error; the error's traceback printed as Python would)."""
    try:
        with _quiet_global_hook_warning():
            return ScriptEnd(_run_target(module, argv))
    except SystemExit as exc:
        return ScriptEnd(_exit_code(exc))
    except KeyboardInterrupt as exc:
        return ScriptEnd(130, "interrupted", exc)
    except BaseException as exc:
        before_traceback()
        traceback.print_exc()
        return ScriptEnd(1, "the script raised", exc)


@contextmanager
def _quiet_global_hook_warning() -> Iterator[None]:
    """Torch warns at every call of a ``torch.compile(module)`` wrapper while global module hooks
    exist; those hooks are ours, and they handle the wrapper (named as the module it compiles)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks"
        )
        yield


def _run_target(module: str | None, argv: list[str]) -> int:
    if module:
        with script_environment(argv, ""):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script = Path(argv[0])
        with script_environment(argv, str(script.resolve().parent)):
            runpy.run_path(str(script), run_name="__main__")
    return 0


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1
