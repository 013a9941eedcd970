"""layerscope: a layer-by-layer PyTorch profiler for the forward and the backward pass.

>>> import layerscope as ls
>>> with ls.profile(model, memory=True) as prof:
...     model(x).sum().backward()
>>> print(prof.profile)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from layerscope.errors import CaptureError, LayerscopeError, TraceFormatError, UsageError, ValidationError
from layerscope.loading import load
from layerscope.model.metrics import Metrics
from layerscope.model.profile import ModuleNode, OpStats, Phase, Profile, StepStats, UnattributedEntry

__version__ = "0.1.0"

if TYPE_CHECKING:
    from layerscope.capture.session import profile


def __getattr__(name: str) -> Any:
    # torch is imported only when capture is used: analysis and rendering work without it.
    if name == "profile":
        from layerscope.capture.session import profile

        return profile
    raise AttributeError(f"module 'layerscope' has no attribute {name!r}")


__all__ = [
    "CaptureError",
    "LayerscopeError",
    "Metrics",
    "ModuleNode",
    "OpStats",
    "Phase",
    "Profile",
    "StepStats",
    "TraceFormatError",
    "UnattributedEntry",
    "UsageError",
    "ValidationError",
    "__version__",
    "load",
    "profile",
]
