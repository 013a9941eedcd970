"""The roofline's records (computed by ``analysis/roofline.py``) and ``Profile.roofline()``.

Each module in each phase, and each op row that did measurable work, is placed against a device's
two roofs: its arithmetic intensity (FLOPs per byte moved) against the device's ridge point (peak
FLOP/s over memory bandwidth) says which roof bounds it, and how close it came (``roof_fraction``)
says whether it is bound at all or lost in overhead. Bytes are those of the op rows
(``OpStats.bytes``: a lower bound, see ``attribution/op_bytes.py``). The model imports nothing above
it: the method is served by what render registers at ``import layerscope``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

#: The columns of ``to_pandas("roofline")``, in order.
COLUMNS = (
    "module",
    "phase",
    "op",
    "flops",
    "bytes",
    "intensity",
    "achieved_flops_per_s",
    "achieved_bytes_per_s",
    "bound",
    "roof_fraction",
    "time_us",
    "calls",
    "peak_flops_per_s",
    "unknown_bytes_share",
    "dtype",
    "input_shapes",
)


@dataclass(frozen=True)
class RooflineRow:
    """One module in one phase (``op`` None, figures of its subtree) or one op row (``op`` its name).

    ``bytes`` is None when unknown (an op, or all of a module's ops, whose bytes could not be
    derived); ``intensity`` FLOPs per byte; ``bound`` ``compute`` or ``memory`` (which roof the
    intensity puts it under), ``overhead`` (the roofs account for less than ``overhead_below`` of
    its time: launches, dispatch, Python) or ``unknown`` (no bytes); ``roof_fraction`` the
    achieved share of the attainable rate (roofline time over measured time). ``time_us`` is device
    time where the profile has it, else CPU time (op rows: inclusive; modules: their ops' self
    time); ``unknown_bytes_share`` the share of that time in ops whose bytes are unknown."""

    module: str
    phase: str
    op: str | None
    flops: int
    bytes: int | None
    intensity: float | None
    achieved_flops_per_s: float | None
    achieved_bytes_per_s: float | None
    bound: str
    roof_fraction: float | None
    time_us: float
    calls: int
    peak_flops_per_s: float
    unknown_bytes_share: float = 0.0
    dtype: str | None = None
    input_shapes: str | None = None


@dataclass(frozen=True)
class Roofline:
    """The roofline of a profile against one device: the device's roofs, the time used, and the rows
    (``modules``: every module, forward and backward; ``ops``: op rows with FLOPs or bytes)."""

    device: str
    bandwidth_bytes_per_s: float
    #: The roof of the run's FLOP mix (dtype classes weighted by FLOPs); rows carry their own.
    peak_flops_per_s: float
    time_source: str  # "device" or "cpu"
    overhead_below: float
    modules: tuple[RooflineRow, ...]
    ops: tuple[RooflineRow, ...]

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte where the run's compute roof meets the memory roof."""
        return self.peak_flops_per_s / self.bandwidth_bytes_per_s

    def rows(self) -> tuple[RooflineRow, ...]:
        """Module rows, then op rows."""
        return (*self.modules, *self.ops)

    def to_pandas(self) -> Any:
        """Every row as a ``pandas.DataFrame`` (:data:`COLUMNS`); needs pandas."""
        import pandas

        return pandas.DataFrame([asdict(r) for r in self.rows()], columns=list(COLUMNS))


_COMPUTE: list[Callable[[Any, Any, float], Roofline]] = []


def register_roofline(compute: Callable[[Any, Any, float], Roofline]) -> None:
    """Serve ``Profile.roofline`` (the higher layers call this once)."""
    _COMPUTE[:] = [compute]


#: Below this share of its time explained by the roofs, a row is ``overhead``-bound.
OVERHEAD_BELOW = 0.1


class RooflineView:
    """Mixin of :class:`~layerscope.model.profile.Profile`: ``roofline()``."""

    __slots__ = ()

    def roofline(self, device: Any = None, overhead_below: float = OVERHEAD_BELOW) -> Roofline:
        """Each module (forward, backward) and op against a device's roofs. ``device``: a
        ``DeviceSpec``, a spec key (``h100-sxm``) or torch's device name; None takes the device the
        profile ran on when the spec table knows it (a CPU profile needs one given: a
        ``DeviceSpec`` describing the CPU). ``overhead_below``: see :class:`RooflineRow`."""
        if not _COMPUTE:
            raise RuntimeError("layerscope's views are not registered: import layerscope first")
        return _COMPUTE[0](self, device, overhead_below)


__all__ = ["COLUMNS", "OVERHEAD_BELOW", "Roofline", "RooflineRow", "RooflineView", "register_roofline"]
