"""What a profiling block that raised leaves in the profile: the exception and where it passed."""

from __future__ import annotations

from torch import nn

from layerscope.model.meta import BlockError


def block_error(
    exc: BaseException, model: nn.Module | None, paths: dict[int, str] | None = None
) -> BlockError:
    """The exception's type and first line, and the innermost module of ``model`` whose ``forward``
    it passed through (from the traceback's finished frames; None when it passed through none).
    Without a model, ``paths`` (``id(module)`` -> path) names the modules known. Never raises:
    describing the user's exception must not replace it."""
    try:
        if model is not None:
            paths = {id(m): path for path, m in model.named_modules()}
        return BlockError(type(exc).__name__, _first_line(exc), _module_of(exc, paths))
    except Exception:  # an exception whose str() fails, a module whose named_modules() does
        return BlockError(type(exc).__name__)


def _first_line(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = repr(exc)
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else ""


def _module_of(exc: BaseException, paths: dict[int, str] | None) -> str | None:
    if not paths:
        return None
    module = None
    # The first frame is the user's, still running: its locals are never read (on Python < 3.13
    # reading f_locals of a running frame copies them into it, keeping them alive).
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "forward":
            owner = frame.f_locals.get("self")
            if isinstance(owner, nn.Module) and id(owner) in paths:
                module = paths[id(owner)]
        tb = tb.tb_next
    return module
