"""Attribution: turning an :class:`~layerscope.events.EventTable` into a :class:`~layerscope.Profile`."""

from layerscope.build.attribute import build_profile
from layerscope.build.catalog import ModuleInfo, module_range_name, parse_module_range

__all__ = ["ModuleInfo", "build_profile", "module_range_name", "parse_module_range"]
