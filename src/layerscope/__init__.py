"""layerscope: a layer-by-layer PyTorch profiler for the forward and the backward pass.

>>> import layerscope as ls
>>> with ls.profile(model, memory=True) as prof:
...     model(x).sum().backward()
>>> print(prof.profile)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from layerscope.analysis.diff import ProfileDiff, diff
from layerscope.analysis.ranks import RankMerge
from layerscope.errors import CaptureError, LayerscopeError, TraceFormatError, UsageError, ValidationError
from layerscope.handlers import print_summary, save_to
from layerscope.loading import load
from layerscope.merging import merge
from layerscope.model.metrics import Metrics
from layerscope.model.profile import ModuleNode, OpStats, Phase, Profile, StepStats, UnattributedEntry
from layerscope.version import __version__

if TYPE_CHECKING:
    from layerscope.capture.compile_watch import compile_info, watch_compiles
    from layerscope.capture.schedule import schedule
    from layerscope.capture.session import CompileInfoWarning, Cycle, profile


def __getattr__(name: str) -> Any:
    # torch is imported only when capture is used: analysis and rendering work without it.
    if name in ("profile", "Cycle", "CompileInfoWarning"):
        from layerscope.capture import session

        return getattr(session, name)
    if name in ("compile_info", "watch_compiles"):
        from layerscope.capture import compile_watch

        return getattr(compile_watch, name)
    if name == "schedule":
        from layerscope.capture.schedule import schedule

        return schedule
    raise AttributeError(f"module 'layerscope' has no attribute {name!r}")


__all__ = [
    "CaptureError",
    "CompileInfoWarning",
    "Cycle",
    "LayerscopeError",
    "Metrics",
    "ModuleNode",
    "OpStats",
    "Phase",
    "Profile",
    "ProfileDiff",
    "RankMerge",
    "StepStats",
    "TraceFormatError",
    "UnattributedEntry",
    "UsageError",
    "ValidationError",
    "__version__",
    "compile_info",
    "diff",
    "load",
    "merge",
    "print_summary",
    "profile",
    "save_to",
    "schedule",
    "watch_compiles",
]


def _watch_compiles_when_asked() -> None:
    # LAYERSCOPE_WATCH_COMPILES=1: the opt-in of watch_compiles() for scripts one cannot edit. Checked
    # here so that torch is imported only when it is set.
    import os

    if os.environ.get("LAYERSCOPE_WATCH_COMPILES"):
        from layerscope.capture.compile_watch import watch_from_environment

        watch_from_environment()


_watch_compiles_when_asked()
