"""layerscope: a layer-by-layer PyTorch profiler for the forward and the backward pass.

>>> import layerscope as ls
>>> with ls.profile(model, memory=True) as prof:
...     model(x).sum().backward()
>>> print(prof.profile)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from layerscope.analysis.diff import diff
from layerscope.errors import CaptureError, LayerscopeError, TraceFormatError, UsageError, ValidationError
from layerscope.handlers import print_summary, save_to
from layerscope.loading import load
from layerscope.loading import trace_critical_path as critical_path
from layerscope.merging import merge
from layerscope.model.profile import Phase, Profile
from layerscope.render.profile_views import install as _install_views
from layerscope.version import __version__

if TYPE_CHECKING:
    from layerscope.capture.compile_watch import watch_compiles
    from layerscope.capture.flight_recorder import FlightRecorder, flight_recorder
    from layerscope.capture.schedule import schedule
    from layerscope.capture.session import CompileInfoWarning, Cycle, profile
    from layerscope.estimates import estimate, fit, max_batch_size

# Profile.ops()/lines()/to_pandas()/print(p)/notebook display are served by analysis and render,
# registered here so the data model imports nothing above it (render/profile_views.py).
_install_views()

#: Names that left the top level (and ``__all__``) in 0.2: where they live now. Still served here for
#: one release, with a DeprecationWarning.
_MOVED = {
    "Metrics": "layerscope.model.metrics",
    "ModuleNode": "layerscope.model.profile",
    "OpStats": "layerscope.model.profile",
    "StepStats": "layerscope.model.profile",
    "UnattributedEntry": "layerscope.model.profile",
    "ProfileDiff": "layerscope.analysis.diff",
    "RankMerge": "layerscope.analysis.ranks",
}


def _deprecated(old: str, new: str) -> None:
    import warnings

    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use {new}",
        DeprecationWarning,
        stacklevel=3,
    )


def __getattr__(name: str) -> Any:
    # torch is imported only when capture is used: analysis and rendering work without it.
    import importlib

    if name in ("profile", "Cycle", "CompileInfoWarning"):
        return getattr(importlib.import_module("layerscope.capture.session"), name)
    if name in ("flight_recorder", "FlightRecorder"):
        return getattr(importlib.import_module("layerscope.capture.flight_recorder"), name)
    if name in ("estimate", "max_batch_size", "fit"):
        return getattr(importlib.import_module("layerscope.estimates"), name)
    if name == "watch_compiles":
        return importlib.import_module("layerscope.capture.compile_watch").watch_compiles
    if name == "compile_info":
        _deprecated(
            "layerscope.compile_info()", "layerscope.watch_compiles() (once, before the model compiles)"
        )
        return importlib.import_module("layerscope.capture.compile_watch").compile_info
    if name == "schedule":
        return importlib.import_module("layerscope.capture.schedule").schedule
    if name in _MOVED:
        _deprecated(f"layerscope.{name}", f"from {_MOVED[name]} import {name}")
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module 'layerscope' has no attribute {name!r}")


__all__ = [
    "CaptureError",
    "CompileInfoWarning",
    "Cycle",
    "FlightRecorder",
    "LayerscopeError",
    "Phase",
    "Profile",
    "TraceFormatError",
    "UsageError",
    "ValidationError",
    "__version__",
    "critical_path",
    "diff",
    "estimate",
    "fit",
    "flight_recorder",
    "load",
    "max_batch_size",
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
