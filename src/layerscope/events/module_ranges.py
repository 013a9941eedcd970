"""Moved to :mod:`layerscope.events.names`, the one owner of event-name conventions.

Kept as a re-export so that imports written against the old place keep working while the branches
that still use it merge; nothing in the package imports it.
"""

from __future__ import annotations

from layerscope.events.names import MODULE_RANGE_PREFIX, module_range_name, parse_module_range

__all__ = ["MODULE_RANGE_PREFIX", "module_range_name", "parse_module_range"]
