"""One recording: everything after torch stops, for the whole block or for one scheduled cycle.

A :class:`Recording` reads torch's events (``kineto.py``), merges the module marks, writes the meta,
builds the Profile and exports the Chrome trace. The block and each ``Cycle`` use the same class,
so every exported trace carries the marks, the backward module track and the compiled-graph header,
and reading it back (``ls.load``, ``layerscope analyze``) gives the tree the live profile has.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import torch

from layerscope.analysis.device_summary import summarize_device
from layerscope.attribution.attribute import build_profile
from layerscope.attribution.catalog import ModuleInfo
from layerscope.capture import native
from layerscope.capture.compile_watch import known_graphs
from layerscope.capture.environment import environment
from layerscope.capture.flops import FlopCalculator
from layerscope.capture.kineto import table_from_kineto
from layerscope.capture.module_marks import ModuleMarks
from layerscope.capture.options import CaptureOptions
from layerscope.capture.scope_plan import ScopePlan
from layerscope.errors import CaptureError, LayerscopeWarning
from layerscope.events.call_lines import CallLines
from layerscope.events.memory_snapshots import Snapshot
from layerscope.events.table import EventTable
from layerscope.gcpause import gc_paused
from layerscope.model.meta import BlockError, CaptureInfo, CompileReport, ProfileMeta
from layerscope.model.profile import Profile


class CompileInfoWarning(LayerscopeWarning):
    """Compiled code ran whose kernels layerscope cannot place in modules (it compiled unwatched,
    or its compiler named modules that are not the profiled model's)."""


@dataclass(frozen=True)
class RecordingContext:
    """What the session knew while recording: options, scope plan, modules, marks, the model's type."""

    options: CaptureOptions
    plan: ScopePlan
    catalog: list[ModuleInfo]
    called_modules: list[tuple[str, str]]
    model_type: str | None
    marks: ModuleMarks | None = None
    #: Call lines recorded during this recording (``lines=True``), else None.
    call_lines: CallLines | None = None
    #: The memory watch's snapshots of this recording (None without ``memory``).
    snapshots: list[Snapshot] | None = None
    watch_errors: list[str] = field(default_factory=list)
    #: The exception the block raised (type, message, module), if it did.
    block_error: BlockError | None = None


class Recording:
    """The results of one recording (torch's events in ``torch_profiler``), read once on demand.

    ``cycle`` is the cycle's index under a schedule (None for the whole block). A cycle's events are
    valid only until torch starts the next cycle: its session builds the Profile at once.
    """

    def __init__(
        self,
        torch_profiler: torch.profiler.profile,
        context: RecordingContext,
        block_us: float,
        cycle: int | None = None,
    ) -> None:
        #: torch's profiler holding the events; None once :meth:`keep_events_only` let it go.
        self.torch_profiler: torch.profiler.profile | None = torch_profiler
        self.context = context
        self.block_us = block_us
        self.cycle = cycle
        self._profile: Profile | None = None
        self._trace: dict[str, Any] | None = None
        self._events: tuple[EventTable, dict[str, int]] | None = None  # read, not yet built
        # the process as it was when the events were read (a build much later must not see the
        # graphs compiled or the environment changed since): set by keep_events_only
        self._graphs: list[dict[str, Any]] | None = None
        self._environment: Any = None
        #: Pause the cyclic GC while reading and building (False where that runs beside the
        #: program, as the flight recorder's writer thread: the pause would be the program's too).
        self.pause_gc = True
        #: The native reader's threads (0: as many as pay off; 1 where the read runs beside the
        #: program, as on the flight recorder's writer thread: more would take the program's cores).
        self.reader_threads = 0
        #: The input shapes recorded beside torch (``options.own_shapes``: ``flight_shapes.py``),
        #: read in place of torch's native reader; set by whoever recorded them, before the read.
        self.own_shapes: Any = None

    @property
    def profile(self) -> Profile:
        """The Profile, built on first access (the cyclic GC paused while it is)."""
        return self.build()

    def build(self) -> Profile:
        """Build the Profile now (once; later calls return it)."""
        if self._profile is None:
            with gc_paused() if self.pause_gc else nullcontext():
                self._profile = self._build()
        return self._profile

    def keep_events_only(self, sole_owner: bool = False) -> None:
        """Read torch's events into a table now and let torch's profiler go: its results hold ~3 kB
        per event (84 MB for a 26,000-event training step), the table ~130 B (3.5 MB). The profile
        can still be built; the Chrome trace can no longer be exported. The flight recorder keeps
        its latest detailed step this way until a dump needs it. ``sole_owner``: nothing else reads
        this torch profiler's events (the flight recorder's own), so they are freed here with the
        GIL released (the native module's ``discard_events``): destroying them with the profiler
        holds the GIL ~2 µs an event, on the recorder's writer thread while the training loop waits."""
        if self._profile is None and self._events is None:
            with gc_paused() if self.pause_gc else nullcontext():
                self._events = self._read()
            self._graphs, self._environment = known_graphs(), environment()
        tp, module = self.torch_profiler, native.load()
        if sole_owner and module is not None and tp is not None and tp.profiler is not None:
            results = tp.profiler.kineto_results
            if results is not None:
                module.discard_events(results)
        self.torch_profiler = None

    def _read(self) -> tuple[EventTable, dict[str, int]]:
        """torch's events with the marks' spans and the call lines: the table, and the FLOP
        formulas' failures."""
        tp = self.torch_profiler
        results = tp.profiler.kineto_results if tp is not None and tp.profiler is not None else None
        if results is None:
            raise CaptureError("torch.profiler recorded no results")
        options, marks = self.context.options, self.context.marks
        calculator = FlopCalculator() if options.flops else None
        table = table_from_kineto(
            results,
            calculator,
            shapes=options.shapes,
            cpu_only=options.cpu_only,
            reader=self.own_shapes,
            threads=self.reader_threads,
        )
        if marks is not None:
            marks.add_to(table)
        table.call_lines = self.context.call_lines
        if table.call_lines is not None and table.op_handles is None:
            # the native reader failed: only it reads the ops' ids
            warnings.warn(
                "call lines were recorded but cannot be matched: the Python reader read this "
                "profile (the native reader failed); lines are missing from it",
                LayerscopeWarning,
                stacklevel=4,
            )
        return table, calculator.failures if calculator is not None else {}

    def _build(self) -> Profile:
        table, failures = self._events if self._events is not None else self._read()
        marks = self.context.marks
        meta = ProfileMeta(
            model=self.context.model_type,
            environment=self._environment if self._environment is not None else environment(),
            capture=self._capture_info(table, marks.unmatched if marks is not None else 0, failures),
            device=summarize_device(table)[1],
        )
        profile = build_profile(
            table,
            self.context.catalog,
            meta,
            compiled_graphs=self._graphs if self._graphs is not None else known_graphs(),
            snapshots=self.context.snapshots,
        )
        self._events = None  # built: a failed build can be tried again from the same table
        compiled = profile.meta.compiled
        note = _unplaced_compiled_kernels(profile, compiled, self.context.plan) if compiled else None
        if compiled is None or note is None:
            return profile
        warnings.warn(note, CompileInfoWarning, stacklevel=_first_frame_outside_layerscope())
        return replace(profile, meta=replace(profile.meta, compiled=replace(compiled, note=note)))

    def _capture_info(self, table: EventTable, unmatched_marks: int, failures: dict[str, int]) -> CaptureInfo:
        """What this block recorded beside its events (``ProfileMeta.capture``)."""
        context = self.context
        return CaptureInfo(
            options=context.options.saved(),
            block_us=self.block_us,
            reader=str(table.meta["reader"]),
            scope_plan=context.plan.record(context.called_modules),
            cycle=self.cycle,
            unmatched_module_marks=unmatched_marks,  # calls still running at the end
            undecodable_names=int(table.meta.get("undecodable_names", 0)),
            flop_formula_failures=dict(sorted(failures.items())),
            block_error=context.block_error,
            memory_watch_errors=tuple(context.watch_errors[:20]),
        )

    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write the Chrome/Perfetto trace (``.json`` or ``.json.gz``): torch's events, the module
        calls marks recorded (as the ranges torch would have written), a "modules (backward)" track
        showing where each module's backward ran, and the compiled-graph header ``analyze`` needs to
        place compiled kernels. Can be called again (the trace is kept)."""
        from layerscope.render.chrome import write_trace

        if self._trace is None:
            self._trace = self._trace_with_modules(self._torch_or_raise())
        return write_trace(self._trace, Path(path))

    def _torch_or_raise(self) -> torch.profiler.profile:
        """torch's profiler, or a CaptureError once :meth:`keep_events_only` let it go."""
        if self.torch_profiler is None:
            raise CaptureError("this recording kept only its events table: torch's trace is gone")
        return self.torch_profiler

    def _trace_with_modules(self, tp: torch.profiler.profile) -> dict[str, Any]:
        from layerscope.render.chrome import with_backward_tracks

        handle, tmp = tempfile.mkstemp(suffix=".json")
        os.close(handle)
        try:
            tp.export_chrome_trace(tmp)
            trace: dict[str, Any] = orjson.loads(Path(tmp).read_bytes())
        finally:
            os.unlink(tmp)
        marks = self.context.marks
        if marks is not None:  # module calls as the ranges torch would have written
            base = int(trace.get("baseTimeNanoseconds", 0))
            cpu_kinds = ("cpu_op", "user_annotation")
            events, stamped = marks.stamped_in_trace(trace["traceEvents"], base)
            threads = {e.get("tid") for e in events if e.get("cat") in cpu_kinds}
            marked = marks.trace_events(base, {t for t in threads if isinstance(t, int)}, stamped)
            trace["traceEvents"] = [*events, *marked]
        trace = with_backward_tracks(trace)
        # What `analyze` needs beyond torch's events, first in the file, where the block reader
        # reads the header (before traceEvents): the modules compiled kernels belong to, and the
        # call lines (matched to ops by their "Record function id").
        own: dict[str, Any] = {}
        graphs = known_graphs()
        if graphs and self.context.catalog:
            own["compiled_graphs"] = graphs
            own["modules"] = [[info.path, info.type_name] for info in self.context.catalog]
        if self.context.call_lines is not None:
            own["call_lines"] = self.context.call_lines.to_saved()
        return {"layerscope": own, **trace} if own else trace


def _unplaced_compiled_kernels(profile: Profile, compiled: CompileReport, plan: ScopePlan) -> str | None:
    """The warning (kept as ``meta.compiled.note``) for compiled kernels left with the compiled
    module: graph calls of code compiled unwatched, and kernels whose module paths are not the
    model's (paths that ``depth``/``paths`` fold are meant to go to their ancestors); None: all placed."""
    notes = []
    unmapped = compiled.graph_calls - compiled.mapped_graph_calls
    if unmapped > 0:
        notes.append(
            f"{unmapped} of {compiled.graph_calls} compiled graph calls ran code compiled before "
            "layerscope could watch, so their kernels stay with the compiled module: call "
            "layerscope.watch_compiles() before the first call of the compiled model (or set "
            "LAYERSCOPE_WATCH_COMPILES=1), or run the script under `layerscope run`; in a process "
            "that already ran it (a notebook), call torch._dynamo.reset() first so that it compiles again"
        )
    unknown = {p: n for p, n in compiled.paths_not_in_tree.items() if not plan.why_folded(p)}
    if unknown:
        named = ", ".join(f"'{p}'" for p in list(unknown)[:3]) + (", ..." if len(unknown) > 3 else "")
        notes.append(
            f"{sum(unknown.values())} compiled kernel calls name modules that are not in "
            f"{profile.root.type_name} ({named}), so they stay with the nearest module the tree "
            "has: torch.compile named the model in a way layerscope does not read "
            "(a wrapper around forward it does not know). Totals are right; only their place below "
            "that module is lost. To see the tree, compile the blocks instead (block.compile(): "
            "each is scoped by its own call) or profile uncompiled; and please report this message "
            "to layerscope with how the model's forward is wrapped"
        )
    return "; also, ".join(notes) if notes else None


def _first_frame_outside_layerscope() -> int:
    """The ``stacklevel`` (for a warning issued by the caller) of the nearest frame outside
    layerscope: the user's line that asked for the profile, however deep our own calls go."""
    own = str(Path(__file__).resolve().parents[1])
    level, frame = 1, sys._getframe(1)  # the frame that calls warnings.warn is stacklevel 1
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


@dataclass
class Cycle:
    """One finished profiling cycle (a schedule's active steps), as handed to ``on_trace_ready``."""

    index: int
    recording: Recording

    @property
    def profile(self) -> Profile:
        """This cycle's Profile."""
        return self.recording.profile

    @property
    def torch_profiler(self) -> torch.profiler.profile:
        """torch's profiler, holding this cycle's events while the handler runs."""
        return self.recording._torch_or_raise()

    @property
    def steps(self) -> tuple[int, int] | None:
        """(first, last) step number recorded in this cycle, or None without steps."""
        if not self.profile.steps:
            return None
        return self.profile.steps[0].step, self.profile.steps[-1].step

    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write this cycle's Chrome trace (``.json`` or ``.json.gz``) with the backward module track
        and the compiled-graph header, as the block's. Valid inside the handler only: torch reuses
        its profiler for the next cycle."""
        return self.recording.export_chrome_trace(path)
