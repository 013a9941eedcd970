"""One training step's figures in a Profile (``Profile.steps``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from layerscope.model.metrics import renamed


@dataclass(frozen=True, slots=True)
class StepStats:
    """One training step: a ``ProfilerStep#N`` range (marked by ``prof.step()``) or a user step
    annotation (``record_function("step N")``), over its window (``layerscope.events.steps``).

    ``wall_us`` is the window's length (the range's duration) and ``device_us`` the device time run
    inside it: every kernel, copy and set on any stream, launched from any thread, clipped to the
    window (overlapping
    streams count each; the device section's busy time counts overlaps once).
    ``cpu_us`` is the CPU time of all work that started inside the step's time window (any thread),
    split into ``modules`` (path -> (forward µs, backward µs), inclusive of children) and
    ``unattributed`` (label -> µs, e.g. the optimizer step or the data loader).
    With memory recorded (the device's when it has any, else the CPU's): ``absolute_peak_bytes`` is
    the step's absolute peak of live memory (what was live before the block included),
    ``alloc_bytes`` what it allocated and ``net_bytes`` the change it left (None without memory).
    """

    step: int
    wall_us: float
    device_us: float
    cpu_us: float = 0.0
    modules: dict[str, tuple[float, float]] = field(default_factory=dict)
    unattributed: dict[str, float] = field(default_factory=dict)
    absolute_peak_bytes: int | None = None
    alloc_bytes: int | None = None
    net_bytes: int | None = None

    peak_bytes = renamed("absolute_peak_bytes", "peak_bytes", "StepStats")

    @property
    def forward_us(self) -> float:
        """CPU time of the root module's forward in this step."""
        return self.modules.get("", (0.0, 0.0))[0]

    @property
    def backward_us(self) -> float:
        """CPU time of the root module's backward in this step."""
        return self.modules.get("", (0.0, 0.0))[1]


__all__ = ["StepStats"]
