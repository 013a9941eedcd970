"""The immutable result of a profiling run: a module tree, op rows and an unattributed bucket."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from layerscope.model.critical_path import CriticalPathView
from layerscope.model.display import NotebookDisplay
from layerscope.model.meta import SCHEMA_VERSION, FlightTrigger, ProfileMeta
from layerscope.model.meta_json import as_profile_meta
from layerscope.model.metrics import ZERO, Metrics
from layerscope.model.roofline import RooflineView
from layerscope.model.step_stats import StepStats
from layerscope.model.tables import LineTable, TypeTable

if TYPE_CHECKING:
    import pandas
    from rich.console import RenderableType

    from layerscope.model.memory_view import MemoryAtPeak


class Phase(str, Enum):
    """Which pass a piece of work belongs to."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OTHER = "other"  # outside every module and outside backward: loss, optimizer, data, glue

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class ModuleNode:
    """One ``nn.Module`` instance, identified by its qualified path (``""`` is the root)."""

    path: str
    type_name: str
    calls: int
    params: int
    params_total: int
    input_shapes: str | None
    output_shapes: str | None
    forward: Metrics
    backward: Metrics
    children: tuple[ModuleNode, ...] = ()
    #: Where the module's class defines ``forward`` (``path/file.py:LINE``, the path relative to its
    #: sys.path entry); None when unknown (modules read from a trace, builtins, scripted modules).
    source: str | None = None
    #: Calls made inside the backward pass: activation checkpointing re-running the module. Their
    #: work is in ``backward``; ``calls`` counts forward calls only.
    recompute_calls: int = 0

    @property
    def name(self) -> str:
        """The last component of the path (the attribute name in the parent)."""
        return self.path.rsplit(".", 1)[-1] if self.path else ""

    @property
    def total(self) -> Metrics:
        """Forward and backward together."""
        return self.forward.merged(self.backward)

    def phase(self, phase: Phase | str) -> Metrics:
        """The metrics of one phase (``"forward"``, ``"backward"``, or ``"both"``)."""
        if str(phase) == "both":
            return self.total
        return self.backward if Phase(phase) is Phase.BACKWARD else self.forward

    def walk(self) -> Iterator[ModuleNode]:
        """This node and all its descendants, depth first, parents before children."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


@dataclass(frozen=True, slots=True)
class OpStats:
    """Operator statistics: one row per (name, phase, module, input shapes) in a saved profile.

    ``module`` is the qualified path of the owning module, or ``None`` for work outside every module
    (then ``scope`` names the unattributed entry it belongs to) and for aggregates over several
    modules (then ``scope`` is empty). ``input_shapes`` is ``None`` when shapes were not recorded or
    the row aggregates several shapes; ``phase`` is ``None`` for aggregates over several phases.
    ``stack`` is the Python call stack the op ran under (``with_stack``), frames innermost first as
    ``path/to/file.py(LINE): function``; empty when stacks were not recorded. In a grouped table it
    holds the frames the grouping kept (the user's, ``stack_depth`` deep). ``bytes``: what the calls
    read and wrote (None: unknown), ``dtype`` their first tensor input's (``model/roofline.py``).
    """

    name: str
    phase: Phase | None  # None: an aggregate over several phases
    module: str | None
    input_shapes: str | None
    calls: int
    metrics: Metrics
    scope: str = ""
    stack: tuple[str, ...] = ()
    bytes: int | None = None
    dtype: str | None = None


@dataclass(frozen=True, slots=True)
class UnattributedEntry:
    """Work that belongs to no module (loss, optimizer step, gradient accumulation...), by label."""

    label: str
    phase: Phase
    calls: int
    metrics: Metrics


class OpTable(NotebookDisplay, list[OpStats]):
    """The rows ``Profile.ops()`` returns: a plain list that a notebook shows as a table."""

    __slots__ = ()


class ProfileViews(Protocol):
    """What a Profile's convenience methods delegate to: computed by analysis and drawn by render,
    registered once at ``import layerscope`` (render/profile_views.py), so the data model imports
    nothing above it. The arguments are those of the Profile methods of the same names."""

    def ops(
        self,
        profile: Profile,
        sort_by: str,
        group_by: Sequence[str],
        phase: Phase | str | None,
        module: str | None,
        limit: int | None,
        stack_depth: int | None,
        internal_frames: bool,
    ) -> OpTable:
        """``Profile.ops``."""

    def lines(self, profile: Profile, sort_by: str, limit: int | None, module: str | None) -> LineTable:
        """``Profile.lines``."""

    def by_type(self, profile: Profile, depth: int | None, sort_by: str) -> TypeTable:
        """``Profile.by_type``."""

    def to_pandas(self, profile: Profile, table: str) -> pandas.DataFrame:
        """``Profile.to_pandas``."""

    def console(self, profile: Profile) -> RenderableType:
        """The console tree (``rich``), what ``print(profile)`` shows."""

    def text(self, profile: Profile) -> str:
        """The console tree as plain text (``str(profile)``)."""

    def write(
        self, profile: Profile, path: Path, *, metric: str, frames: str, internal_frames: bool
    ) -> list[Path]:
        """``Profile.save``: the file(s) the suffix names, every path written."""


_VIEWS: list[ProfileViews] = []


def register_views(views: ProfileViews) -> None:
    """Serve the Profile methods that compute or draw (the higher layers call this once)."""
    _VIEWS[:] = [views]


def _views() -> ProfileViews:
    if not _VIEWS:  # importing any layerscope module runs layerscope/__init__.py, which registers
        raise RuntimeError("layerscope's views are not registered: import layerscope first")
    return _VIEWS[0]


@dataclass(frozen=True)
class Profile(NotebookDisplay, CriticalPathView, RooflineView):
    """The result of a profiling run or of a trace file; every view reads one.

    Profiles are immutable: transformations (folding, pruning) return new objects.
    ``totals`` holds the independently computed whole-run totals that ``validate`` reconciles against.
    """

    meta: ProfileMeta
    root: ModuleNode
    op_rows: tuple[OpStats, ...]
    unattributed: tuple[UnattributedEntry, ...]
    totals: Metrics = ZERO
    steps: tuple[StepStats, ...] = ()
    _index: dict[str, ModuleNode] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "meta", as_profile_meta(self.meta))
        index = {node.path: node for node in self.root.walk()}
        object.__setattr__(self, "_index", index)

    # ----- lookup -------------------------------------------------------------------------------
    def find(self, path: str) -> ModuleNode:
        """The module node with this qualified path (``""`` is the root); KeyError if absent."""
        try:
            return self._index[path]
        except KeyError:
            raise KeyError(f"no module with path {path!r} in this profile") from None

    @property
    def has_stacks(self) -> bool:
        """Whether op rows carry Python call stacks (recorded with ``lines`` or ``with_stack``)."""
        return any(r.stack for r in self.op_rows)

    def modules(self) -> Iterator[ModuleNode]:
        """All module nodes, parents before children, in tree order."""
        return self.root.walk()

    @property
    def trigger(self) -> FlightTrigger | None:
        """What made a flight recorder write this profile (a dump); None for any other profile."""
        return self.meta.flight.trigger if self.meta.flight is not None else None

    @property
    def has_device_time(self) -> bool:
        """True when any device (GPU/accelerator) time was captured."""
        return self.totals.device_us > 0

    @property
    def has_memory(self) -> bool:
        """True when memory events were captured."""
        return self.meta.memory_recorded or self.totals.cpu_alloc_bytes > 0

    # ----- analysis -----------------------------------------------------------------------------
    def ops(
        self,
        sort_by: str = "self_cpu_us",
        group_by: Sequence[str] = ("name",),
        phase: Phase | str | None = None,
        module: str | None = None,
        limit: int | None = None,
        stack_depth: int | None = 5,
        internal_frames: bool = False,
    ) -> OpTable:
        """Op rows aggregated by ``group_by`` (any of name, input_shapes, module, phase, stack), sorted
        descending by a metric field, optionally filtered by phase and module subtree.

        ``"stack"`` groups by source location (``with_stack`` profiles): the ``stack_depth`` innermost
        frames of the user's code; ``internal_frames`` keeps frames inside torch and layerscope."""
        return _views().ops(self, sort_by, group_by, phase, module, limit, stack_depth, internal_frames)

    def lines(self, sort_by: str = "time", limit: int | None = None, module: str | None = None) -> LineTable:
        """Source lines ranked by forward + backward time (a ``LineTable`` of ``LineStats``): per line
        of the user's code that called ops (``lines=True``; with only ``with_stack``, per function),
        the ops' forward and backward self figures and the modules it ran in. ``sort_by``: time,
        cpu, device, flops, alloc, location; ``module`` keeps one subtree's work."""
        return _views().lines(self, sort_by, limit, module)

    def by_type(self, depth: int | None = None, sort_by: str = "time") -> TypeTable:
        """Modules summed per type (a ``TypeTable`` of ``TypeStats``, heaviest first): calls,
        forward and backward figures, FLOPs, parameters. Without ``depth`` every module's self
        figures (the types add up to the tree); with it, the modules at that depth, inclusive."""
        return _views().by_type(self, depth, sort_by)

    def to_pandas(self, table: str = "modules") -> pandas.DataFrame:
        """One table as a ``pandas.DataFrame``: ``"modules"`` (one row per module, ``{phase}_{metric}``
        columns such as ``forward_self_cpu_us`` and achieved ``{phase}_flops_per_s``), ``"ops"``,
        ``"lines"`` (see :meth:`lines`), ``"types"`` (see :meth:`by_type`),
        ``"unattributed"``, ``"steps"``, ``"memory_peak"`` (what was live at the peak, see
        :meth:`memory_at_peak`), ``"roofline"`` (:meth:`roofline` on the profile's own device), or
        from a trace's device report ``"streams"``,
        ``"device_steps"``, ``"copies"``. Needs pandas (imported here, not before)."""
        return _views().to_pandas(self, table)

    def memory_at_peak(self, device: str | bool | None = None) -> MemoryAtPeak:
        """What was live at the highest point of memory: ``absolute_peak_bytes`` (, what was live
        before the block included), ``baseline_bytes``, ``time_us``, ``where`` (module, phase, op)
        and ``rows`` (category, module, phase, bytes). ``device`` None picks the accelerator's when
        it recorded memory, else the CPU's."""
        from layerscope.model.memory_view import memory_at_peak

        return memory_at_peak(self.meta.memory, device)

    def validate(self) -> None:
        """Raise :class:`layerscope.errors.ValidationError` if any invariant is broken."""
        from layerscope.model.validate import validate_profile

        validate_profile(self)

    # ----- persistence --------------------------------------------------------------------------
    def save(
        self,
        path: str | Path,
        *,
        metric: str = "cpu_us",
        frames: str = "modules",
        internal_frames: bool = False,
    ) -> Path:
        """Write the profile in the format its suffix names, atomically (temp file, then rename):
        ``.json``/``.json.gz`` (the profile, for ``ls.load``), ``.html`` (the report), ``.txt`` (the
        console view), ``.csv``/``.parquet`` (``NAME.modules.*`` and ``NAME.ops.*``; the first is
        returned), ``.collapsed``/``.folded`` (flame-graph stacks), ``.svg`` (a flame graph).

        ``metric``, ``frames`` and ``internal_frames`` choose the stacks of ``.collapsed`` and
        ``.svg`` (see :func:`layerscope.render.exports.stack_values`). An unknown suffix raises
        :class:`layerscope.errors.UsageError` naming the known ones."""
        return self._write(path, metric, frames, internal_frames)[0]

    def export(
        self,
        path: str | Path,
        *,
        metric: str = "cpu_us",
        frames: str = "modules",
        internal_frames: bool = False,
    ) -> list[Path]:
        """Deprecated: :meth:`save` writes every format. Returns every path written."""
        import warnings

        warnings.warn(
            "Profile.export() is deprecated and will be removed in the next release; use "
            "Profile.save(), which writes every format by the path's suffix",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._write(path, metric, frames, internal_frames)

    def _write(self, path: str | Path, metric: str, frames: str, internal_frames: bool) -> list[Path]:
        return _views().write(self, Path(path), metric=metric, frames=frames, internal_frames=internal_frames)

    # ----- display ------------------------------------------------------------------------------
    # A notebook's ``_repr_html_`` comes from NotebookDisplay: the report, drawn by render.
    def __rich__(self) -> RenderableType:
        return _views().console(self)

    def __str__(self) -> str:
        return _views().text(self)


def __getattr__(name: str) -> Any:
    """``STEP_PREFIX``, deprecated: event names belong to ``layerscope.events.names``."""
    if name == "STEP_PREFIX":
        import warnings

        warnings.warn(
            "layerscope.model.profile.STEP_PREFIX is deprecated; use "
            "layerscope.events.names.PROFILER_STEP_PREFIX (removed in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        # spelled out here, not imported: the data model sits below the events layer
        return "ProfilerStep#"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCHEMA_VERSION",
    "ModuleNode",
    "OpStats",
    "OpTable",
    "Phase",
    "Profile",
    "ProfileViews",
    "StepStats",
    "UnattributedEntry",
    "register_views",
]
