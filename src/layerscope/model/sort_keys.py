"""One ``sort_by`` vocabulary for every view (module tree, ops, source lines, module types, the CLI's
``--sort``/``--op-sort``): a word means the same figure in each, and each view takes the words that
apply to its rows. Kept in the data model, the lowest layer the views share.

Words: ``time`` (device time where the profile has any, else CPU time), ``cpu``, ``device``,
``flops``, ``alloc`` (bytes allocated, CPU and device), their ``self_`` forms (the row's own work,
children left out), ``calls``, ``params``, ``name`` (the row's name, A to Z: path, op, source
location or type) and ``execution`` (the tree's run order). A metric field's own name
(``self_cpu_us``, ``device_relative_peak_bytes``...) sorts by that field, in every view. Every other key is
larger first.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

from layerscope.errors import UsageError
from layerscope.model.metrics import FIELD_NAMES, RENAMED_FIELDS, Metrics

#: The words, each with what it sorts by.
SORT_WORDS: dict[str, str] = {
    "time": "device time where the profile has any, else CPU time",
    "cpu": "CPU time",
    "device": "device time",
    "flops": "FLOPs",
    "alloc": "bytes allocated, CPU and device",
    "self_time": "own device time where the profile has any, else own CPU time",
    "self_cpu": "own CPU time",
    "self_device": "own device time",
    "self_flops": "own FLOPs",
    "self_alloc": "own bytes allocated, CPU and device",
    "calls": "calls",
    "params": "parameters",
    "name": "the row's name, A to Z",
    "execution": "the order modules ran (the module tree)",
}

#: Keys that sort by a metric: the words' figures, then every metric field by its name.
METRIC_SORT_KEYS: tuple[str, ...] = (
    *(word for word in SORT_WORDS if word not in ("calls", "params", "name", "execution")),
    *FIELD_NAMES,
)

#: The keys each view takes.
TREE_SORT_KEYS: tuple[str, ...] = ("execution", *METRIC_SORT_KEYS, "calls", "params", "name")
OP_SORT_KEYS: tuple[str, ...] = (*METRIC_SORT_KEYS, "calls", "name")
LINE_SORT_KEYS: tuple[str, ...] = (*METRIC_SORT_KEYS, "calls", "name")
TYPE_SORT_KEYS: tuple[str, ...] = (*METRIC_SORT_KEYS, "calls", "params", "name")

#: Old spellings -> the word that replaced them (accepted for one release, with a DeprecationWarning).
OLD_SORT_KEYS: dict[str, str] = {"location": "name", "type": "name", **RENAMED_FIELDS}

_FIGURES: dict[str, tuple[str, ...]] = {
    "cpu": ("cpu_us",),
    "device": ("device_us",),
    "flops": ("flops",),
    "alloc": ("cpu_alloc_bytes", "device_alloc_bytes"),
    "self_cpu": ("self_cpu_us",),
    "self_device": ("self_device_us",),
    "self_flops": ("self_flops",),
    "self_alloc": ("self_cpu_alloc_bytes", "self_device_alloc_bytes"),
}


def check_sort_key(key: str, allowed: Sequence[str], what: str) -> str:
    """``key`` as a word of the vocabulary, checked once at a view's boundary: an old spelling warns
    and becomes its word; a key the view does not take is a one-line UsageError listing the choices."""
    if key in OLD_SORT_KEYS:
        warnings.warn(
            f"sort_by={key!r} is deprecated and will be removed in the next release; use "
            f"{OLD_SORT_KEYS[key]!r}",
            DeprecationWarning,
            stacklevel=3,
        )
        key = OLD_SORT_KEYS[key]
    if key not in allowed:
        raise UsageError(f"cannot sort {what} by {key!r}; choose from {', '.join(allowed)}")
    return key


def metric_sort_value(key: str, has_device_time: bool) -> Callable[[Metrics], float]:
    """The figure of ``metrics`` a metric key sorts by (``time`` picks device or CPU time)."""
    if key in ("time", "self_time"):
        key = key.replace("time", "device" if has_device_time else "cpu")
    fields = _FIGURES.get(key, (key,))
    if len(fields) == 1:
        field = fields[0]
        return lambda metrics: float(getattr(metrics, field))
    return lambda metrics: float(sum(getattr(metrics, f) for f in fields))
