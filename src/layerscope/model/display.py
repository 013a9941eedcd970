"""Notebook display without the data model drawing anything: the HTML of a record is registered by
the layer that draws it (render/profile_views.py, at ``import layerscope``).

A record that a notebook should show inherits :class:`NotebookDisplay`; its ``_repr_html_`` looks
up the drawing registered for its class (or a base class). Jupyter, VS Code and marimo all call
``_repr_html_``, so the hook stays on the record while the HTML lives in render.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_DRAWINGS: dict[type, Callable[[Any], str]] = {}


def register_html(cls: type, draw: Callable[[Any], str]) -> None:
    """Draw instances of ``cls`` (and of its subclasses) in notebooks with ``draw``."""
    _DRAWINGS[cls] = draw


class NotebookDisplay:
    """Mixin: the notebook shows the record as the HTML registered for its class."""

    __slots__ = ()

    def _repr_html_(self) -> str | None:
        """Jupyter's rich display; None (the plain ``repr``) when no drawing is registered."""
        for cls in type(self).__mro__:
            draw = _DRAWINGS.get(cls)
            if draw is not None:
                return draw(self)
        return None


__all__ = ["NotebookDisplay", "register_html"]
