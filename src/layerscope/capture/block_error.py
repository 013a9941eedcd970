"""What a profiling block that raised leaves in the profile: the exception and where it passed."""

from __future__ import annotations

from typing import Any

from torch import nn


def block_error(exc: BaseException, model: nn.Module | None) -> dict[str, Any]:
    """The exception's type and first line, and the innermost module of ``model`` whose ``forward``
    it passed through (from the traceback's frames; None when it passed through none)."""
    paths = {id(m): path for path, m in model.named_modules()} if model is not None else {}
    module = None
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in paths and tb.tb_frame.f_code.co_name == "forward":
            module = paths[id(owner)]
        tb = tb.tb_next
    message = str(exc).strip().splitlines()
    return {
        "type": type(exc).__name__,
        "message": message[0][:300] if message else "",
        "module": module,
    }
