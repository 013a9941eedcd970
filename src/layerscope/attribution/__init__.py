"""Attribution: turning an :class:`~layerscope.events.EventTable` into a :class:`~layerscope.Profile`.

``build_profile`` (in ``attribute.py``) is the one entry point; the modules beside it each do one
step of its recipe: ``buckets`` (what a name means, where work can go), ``nesting`` (the sweep over
CPU spans), ``devices`` (kernels to their launching op), ``memory`` (owners, peaks, timeline),
``op_rows`` (the op table), ``tree``, ``steps`` and ``catalog``.
"""

# numpy 2.x imports numpy.ma on a process's first np.unique (np.isin too), ~10 ms: paid with this
# package's import rather than inside the first profile's build, where it was 0.13-0.2 us per event.
import numpy.ma  # noqa: F401

from layerscope.attribution.attribute import build_profile
from layerscope.attribution.catalog import ModuleInfo
from layerscope.events.names import module_range_name, parse_module_range

__all__ = ["ModuleInfo", "build_profile", "module_range_name", "parse_module_range"]
