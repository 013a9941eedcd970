"""The critical path's records (computed by ``analysis/critical_path.py``) and ``Profile.critical_path()``.

The path needs the trace's events, which a Profile does not keep: the method is served by what
render registers at ``import layerscope`` (render/profile_views.py), which reads the trace the
profile was built from (``meta.trace_file``). The model imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PathShare:
    """Time on the path of one op or kernel name, or one module call's phase (µs)."""

    name: str
    us: float
    phase: str | None = None  # modules: "forward" or "backward"
    rank: int | None = None  # paths through several ranks: the rank it ran on

    def to_json(self) -> dict[str, Any]:
        """``{name, us}`` (and ``phase`` for modules, ``rank`` on a path through ranks)."""
        found: dict[str, Any] = {"name": self.name, "us": self.us}
        if self.phase is not None:
            found["phase"] = self.phase
        if self.rank is not None:
            found["rank"] = self.rank
        return found


@dataclass(frozen=True)
class PathSegment:
    """A stretch of a path through several ranks spent on one rank, in path order: where it starts
    and ends (µs, on the first rank's clock), the time on the path in it and its nodes."""

    rank: int
    start_us: float
    end_us: float
    us: float
    nodes: int

    def to_json(self) -> dict[str, Any]:
        """``{rank, start_us, end_us, us, nodes}``."""
        return {
            "rank": self.rank,
            "start_us": self.start_us,
            "end_us": self.end_us,
            "us": self.us,
            "nodes": self.nodes,
        }


@dataclass(frozen=True)
class CriticalPath:
    """The critical path of one window: its length, where the time on it goes, how many nodes."""

    length_us: float
    by_type: dict[str, float]  # HTA's bound categories and ``idle`` (those with time), µs
    nodes: int
    top: tuple[PathShare, ...]  # ops and kernels by name, their own time on the path, largest first
    modules: tuple[PathShare, ...] | None  # None: the trace has no module ranges
    window_us: tuple[float, float]  # the window analysed, µs on the trace's clock
    #: paths through several ranks (else None / empty): µs on the path per rank, the path's
    #: stretches rank by rank in order, and each rank's clock offset from the first rank's (µs)
    ranks: dict[int, float] | None = None
    segments: tuple[PathSegment, ...] = ()
    clock_offsets_us: dict[int, float] | None = None
    collectives: int = 0  # paths through ranks: the collectives matched across ranks (joining them)

    def to_json(self) -> dict[str, Any]:
        """The ``critical_path`` object of ``analyze --json`` (with ``ranks``, ``segments``,
        ``clock_offsets_us`` and ``collectives`` for a path through several ranks)."""
        found: dict[str, Any] = {
            "length_us": self.length_us,
            "by_type": dict(self.by_type),
            "nodes": self.nodes,
            "top": [s.to_json() for s in self.top],
            "modules": None if self.modules is None else [s.to_json() for s in self.modules],
            "window_us": list(self.window_us),
        }
        if self.ranks is not None:
            found["ranks"] = {str(r): us for r, us in self.ranks.items()}
            found["segments"] = [s.to_json() for s in self.segments]
            found["clock_offsets_us"] = {str(r): us for r, us in (self.clock_offsets_us or {}).items()}
            found["collectives"] = self.collectives
        return found


@dataclass(frozen=True)
class PathWindow:
    """Which window to take the critical path of: the whole trace, step ``step``, or (Holistic
    Trace Analysis's way) the ``instance``-th span, 0-based in start order, named with
    ``annotation``. ``hta_compatible``: HTA's graph and figures, not ours (docs/compared.md)."""

    step: int | None = None
    annotation: str | None = None
    instance: int = 0
    hta_compatible: bool = False


_COMPUTE: list[Callable[[Any, PathWindow], CriticalPath]] = []


def register_critical_path(compute: Callable[[Any, PathWindow], CriticalPath]) -> None:
    """Serve ``Profile.critical_path`` (the higher layers call this once)."""
    _COMPUTE[:] = [compute]


class CriticalPathView:
    """Mixin of :class:`~layerscope.model.profile.Profile`: ``critical_path()``."""

    __slots__ = ()

    def critical_path(
        self,
        step: int | None = None,
        annotation: str | None = None,
        instance: int = 0,
        hta_compatible: bool = False,
    ) -> CriticalPath:
        """The critical path of the trace this profile was built from: the whole trace, step
        ``step``, or the ``instance``-th span whose name contains ``annotation``; with
        ``hta_compatible``, Holistic Trace Analysis's figures. Profiles of live captures keep no
        events: export the trace and use ``layerscope.critical_path(trace)``."""
        if not _COMPUTE:
            raise RuntimeError("layerscope's views are not registered: import layerscope first")
        return _COMPUTE[0](self, PathWindow(step, annotation, instance, hta_compatible))


__all__ = [
    "CriticalPath",
    "CriticalPathView",
    "PathSegment",
    "PathShare",
    "PathWindow",
    "register_critical_path",
]
