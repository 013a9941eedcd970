"""Metrics: the numbers layerscope measures for one module in one phase, or for one op row.

Units are in the names: ``_us`` microseconds, ``_bytes`` bytes, ``flops`` floating-point operations.
Additive metrics come in pairs, ``self_X`` (work done directly in the scope) and ``X`` (the scope and
everything nested in it). Peaks are not additive, so only the inclusive figure exists.
Memory names follow the glossary (docs/usage.md): ``alloc`` allocated, ``net`` allocated minus freed,
``relative_peak`` the most added on top of what was live when the scope began.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

#: (self field, total field) for every additive metric, in display order.
ADDITIVE_PAIRS: tuple[tuple[str, str], ...] = (
    ("self_cpu_us", "cpu_us"),
    ("self_device_us", "device_us"),
    ("self_flops", "flops"),
    ("self_cpu_alloc_bytes", "cpu_alloc_bytes"),
    ("self_device_alloc_bytes", "device_alloc_bytes"),
    ("self_net_bytes", "net_bytes"),
)
#: Metric fields renamed in 0.3 (old name -> new): saved profiles that list the old names still load,
#: and the old attribute names still read, with a DeprecationWarning, for one release.
RENAMED_FIELDS: dict[str, str] = {
    "self_retained_bytes": "self_net_bytes",
    "retained_bytes": "net_bytes",
    "cpu_peak_bytes": "cpu_relative_peak_bytes",
    "device_peak_bytes": "device_relative_peak_bytes",
}


def metric_name(name: str) -> str:
    """``name``, or the current name of a metric renamed in 0.3 (with a DeprecationWarning)."""
    new = RENAMED_FIELDS.get(name)
    if new is None:
        return name
    warnings.warn(f"the metric {name!r} is now {new!r}", DeprecationWarning, stacklevel=3)
    return new


def renamed(new: str, old: str, owner: str) -> Any:
    """A read-only property under a public attribute's old name that warns and reads ``new``."""

    def read(self: Any) -> Any:
        warnings.warn(f"{owner}.{old} is now {owner}.{new}", DeprecationWarning, stacklevel=2)
        return getattr(self, new)

    return property(read, doc=f"Deprecated name of ``{new}`` (goes in the next release).")


#: Inclusive peak metrics (maximum over calls; a parent's peak covers its children's).
PEAK_FIELDS: tuple[str, ...] = ("cpu_relative_peak_bytes", "device_relative_peak_bytes")


@dataclass(frozen=True, slots=True)
class Metrics:
    """Time, FLOPs and memory of one scope (a module in one phase, an op row, an unattributed entry)."""

    self_cpu_us: float = 0.0
    cpu_us: float = 0.0
    self_device_us: float = 0.0
    device_us: float = 0.0
    self_flops: int = 0
    flops: int = 0
    self_cpu_alloc_bytes: int = 0
    cpu_alloc_bytes: int = 0
    self_device_alloc_bytes: int = 0
    device_alloc_bytes: int = 0
    self_net_bytes: int = 0
    net_bytes: int = 0
    cpu_relative_peak_bytes: int = 0
    device_relative_peak_bytes: int = 0

    self_retained_bytes = renamed("self_net_bytes", "self_retained_bytes", "Metrics")
    retained_bytes = renamed("net_bytes", "retained_bytes", "Metrics")
    cpu_peak_bytes = renamed("cpu_relative_peak_bytes", "cpu_peak_bytes", "Metrics")
    device_peak_bytes = renamed("device_relative_peak_bytes", "device_peak_bytes", "Metrics")

    def merged(self, other: Metrics) -> Metrics:
        """The metrics of two disjoint pieces of work together: sums, and the larger peak."""
        values = [getattr(self, f) + getattr(other, f) for f in FIELD_NAMES[:-2]]
        values += [
            max(self.cpu_relative_peak_bytes, other.cpu_relative_peak_bytes),
            max(self.device_relative_peak_bytes, other.device_relative_peak_bytes),
        ]
        return Metrics(*values)

    def folded(self) -> Metrics:
        """These metrics as the *self* work of a parent that absorbs this scope (self := total)."""
        values: dict[str, Any] = {}
        for self_name, total_name in ADDITIVE_PAIRS:
            values[self_name] = values[total_name] = getattr(self, total_name)
        for name in PEAK_FIELDS:
            values[name] = getattr(self, name)
        return Metrics(**values)

    def own(self) -> Metrics:
        """Only the scope's own work, as a whole (total := self), peaks dropped: the inverse of
        :meth:`folded`, for sums over scopes that must not count nested work twice."""
        values: dict[str, Any] = {}
        for self_name, total_name in ADDITIVE_PAIRS:
            values[self_name] = values[total_name] = getattr(self, self_name)
        return Metrics(**values)

    def scaled(self, factor: float) -> Metrics:
        """Additive metrics times ``factor`` (e.g. 1/steps for a per-step mean); peaks unchanged."""
        values: dict[str, Any] = {}
        for self_name, total_name in ADDITIVE_PAIRS:
            for name in (self_name, total_name):
                value = getattr(self, name)
                values[name] = value * factor if isinstance(value, float) else round(value * factor)
        for name in PEAK_FIELDS:
            values[name] = getattr(self, name)
        return Metrics(**values)

    def to_list(self) -> list[float | int]:
        """Field values in declaration order (the compact form used by saved profiles)."""
        return [getattr(self, f) for f in FIELD_NAMES]

    @classmethod
    def from_list(cls, values: list[Any]) -> Metrics:
        """Inverse of :meth:`to_list`."""
        if len(values) != len(FIELD_NAMES):
            raise ValueError(f"expected {len(FIELD_NAMES)} metric values, got {len(values)}")
        return cls(*values)


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Metrics))
ZERO = Metrics()


class PhaseTotals:
    """Both phases of a row that holds ``forward`` and ``backward`` Metrics (source lines, module
    types), as the inclusive figures of the two added up."""

    forward: Metrics
    backward: Metrics

    @property
    def cpu_us(self) -> float:
        """CPU time, forward and backward."""
        return self.forward.cpu_us + self.backward.cpu_us

    @property
    def device_us(self) -> float:
        """Device time, forward and backward."""
        return self.forward.device_us + self.backward.device_us

    @property
    def flops(self) -> int:
        """FLOPs, forward and backward."""
        return self.forward.flops + self.backward.flops


def sum_metrics(items: list[Metrics]) -> Metrics:
    """Merge many metrics (sums of additive fields, maximum of peaks)."""
    total = ZERO
    for item in items:
        total = total.merged(item)
    return total


def own_metrics(figures: Mapping[str, Any], k: int | None = None) -> Metrics:
    """Metrics of work that is all the scope's own, so that each self figure equals its inclusive one
    (a bucket before its children are added, or a whole run).

    ``figures`` maps inclusive field names (``cpu_us``, ``flops``, ``net_bytes``, the peaks) to a
    value or, with ``k``, to a per-scope array or list whose entry ``k`` is taken; fields left out are
    zero. ``_us`` figures come out as floats, all others as ints.
    """
    unknown = figures.keys() - OWN_FIGURES
    if unknown:
        raise ValueError(f"not inclusive metric fields: {sorted(unknown)}")
    values: dict[str, Any] = {}
    for self_name, total_name in ADDITIVE_PAIRS:
        values[self_name] = values[total_name] = _own_figure(figures, total_name, k)
    for name in PEAK_FIELDS:
        values[name] = _own_figure(figures, name, k)
    return Metrics(**values)


#: The figures :func:`own_metrics` reads: the inclusive field of each additive pair, and the peaks.
OWN_FIGURES: frozenset[str] = frozenset(total for _, total in ADDITIVE_PAIRS) | frozenset(PEAK_FIELDS)
_FLOAT_FIGURES = frozenset(name for name in OWN_FIGURES if name.endswith("_us"))


def _own_figure(figures: Mapping[str, Any], name: str, k: int | None) -> float | int:
    found = figures.get(name)
    value = 0 if found is None else found if k is None else found[k]
    return float(value) if name in _FLOAT_FIGURES else int(value)
