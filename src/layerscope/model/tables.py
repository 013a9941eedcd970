"""The typed tables a Profile's views return besides op rows (``OpTable``, beside ``OpStats`` in
model/profile.py): ``p.lines()`` (:class:`LineTable` of :class:`LineStats`) and ``p.by_type()``
(:class:`TypeTable` of :class:`TypeStats`).

They are records of the data model, so ``Profile``'s methods are typed without the model importing
the analysis that fills them (analysis/ops.py, lines.py, types.py) or the renderers that draw them
(a notebook's HTML is registered by render, see model/views.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from layerscope.model.display import NotebookDisplay
from layerscope.model.metrics import Metrics, PhaseTotals

#: The row of ops no line of the user's called (C++ only, or recorded without stacks).
NO_LINE = "(no Python line)"


@dataclass(frozen=True)
class LineStats(PhaseTotals):
    """One source line: the ops it called (``forward``: forward work, or work outside every module
    such as the loss and the optimizer) and the backward of the ops it created (``backward``).

    ``line`` is None for the row of ops that no line of the user's called. ``modules`` are the
    modules (or unattributed entries) the line's work ran in, heaviest first. The metrics hold the ops'
    own work (every total equals its self: nested ops are never counted twice)."""

    file: str
    line: int | None
    function: str
    forward: Metrics
    backward: Metrics
    calls: int
    modules: tuple[str, ...]

    @property
    def location(self) -> str:
        """``file:line`` (or the no-line label)."""
        return f"{self.file}:{self.line}" if self.line is not None else NO_LINE

    @property
    def alloc_bytes(self) -> int:
        """Bytes the line's ops allocated (CPU and device), forward and backward."""
        f, b = self.forward, self.backward
        return (
            f.self_cpu_alloc_bytes
            + f.self_device_alloc_bytes
            + b.self_cpu_alloc_bytes
            + b.self_device_alloc_bytes
        )


class LineTable(NotebookDisplay, list[LineStats]):
    """The rows ``Profile.lines()`` returns, heaviest first; ``call_lines`` says whether the lines are
    exact call lines (``lines=True``) or torch's function definition lines (``with_stack``)."""

    call_lines: bool = False
    #: The time the table ranks by: ``device`` when the profile has device time, else ``cpu``.
    time_kind: str = "cpu"


@dataclass(frozen=True)
class TypeStats(PhaseTotals):
    """One module type: its instances (``modules``), their calls, forward and backward figures
    (self figures without a depth; inclusive at one depth, see analysis/types.py), and their own
    parameters (all parameters of the subtree at one depth)."""

    type_name: str
    modules: int
    calls: int
    forward: Metrics
    backward: Metrics
    params: int


class TypeTable(list[TypeStats]):
    """The rows ``Profile.by_type()`` returns, heaviest first; ``time_kind`` is ``device`` when the
    profile has device time, else ``cpu``; ``depth`` is the depth asked for (None: every module)."""

    time_kind: str = "cpu"
    depth: int | None = None

    def time_of(self, row: TypeStats) -> float:
        """The time the table ranks and shares by."""
        return row.device_us if self.time_kind == "device" else row.cpu_us

    def share(self, row: TypeStats) -> float:
        """``row``'s fraction of the whole table's time (0 when there is none)."""
        whole = sum(self.time_of(r) for r in self)
        return self.time_of(row) / whole if whole > 0 else 0.0


__all__ = ["NO_LINE", "LineStats", "LineTable", "TypeStats", "TypeTable"]
