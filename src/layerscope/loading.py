"""``layerscope.load``: a saved profile or any torch.profiler trace file, as a Profile."""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerscope.analysis import critical_path as paths
from layerscope.analysis.advice import Advice, advise
from layerscope.analysis.critical_ranks import RankTable, rank_ids, ranks_critical_path
from layerscope.analysis.device import DeviceReport
from layerscope.analysis.device_summary import summarize_device
from layerscope.attribution import nest_native
from layerscope.attribution.attribute import build_profile
from layerscope.capture import native
from layerscope.errors import LayerscopeWarning, TraceFormatError, UsageError
from layerscope.events.chrome import FlopCounter, TraceTableBuilder
from layerscope.events.names import profiler_step_number
from layerscope.events.native_trace import read_native
from layerscope.events.stream import Progress, stream_trace
from layerscope.events.table import EventTable
from layerscope.filemap import FileResults, map_files, read_all
from layerscope.gcpause import gc_paused
from layerscope.model.meta import TRACE, ProfileMeta
from layerscope.model.profile import Profile
from layerscope.model.serialize import FORMAT_TAG, profile_from_dict

if TYPE_CHECKING:
    from distributed import Client


def _flop_counter() -> FlopCounter | None:
    """torch's FLOP formulas when torch is installed; otherwise traces keep their own ``flops``.

    torch is imported at the first op that needs a formula, not before: reading a saved profile,
    or a trace without shapes, never pays for it."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    calculator: list[Any] = []

    def count(name: str, dims: list[Any], concrete: list[Any]) -> int:
        if not calculator:
            from layerscope.capture.flops import FlopCalculator

            calculator.append(FlopCalculator())
        return calculator[0].count(name, dims, concrete) if calculator[0].needs(name) else 0

    return count


class MalformedEventsWarning(LayerscopeWarning):
    """A trace had malformed events; they were skipped and counted (``strict=True`` fails instead)."""


def _read(path: Path, progress: Progress | None = None, strict: bool = False) -> Profile | EventTable:
    """A saved profile, or a trace's EventTable (read in blocks; a cut file keeps what survives;
    malformed events are skipped and counted unless ``strict``). The native reader reads it when it
    is built and accepts the file; the Python path reads whatever it declines."""
    flops = _flop_counter()
    module = native.load_trace_reader()
    if module is not None:
        with gc_paused():
            found = read_native(path, module, flops, progress)
        if found is not None:
            found.meta["truncated"] = False
            found.meta["lost_bytes"] = 0
            if not found.span_count and not found.memory_count:
                raise TraceFormatError(f"{path}: the trace holds no profiler events")
            found.drop_clock_anchors()  # a trace torch wrote itself during a layerscope block
            return found
    builder = TraceTableBuilder(flops=flops, source=str(path), strict=strict)
    try:
        with gc_paused():
            result = stream_trace(path, builder, progress)
    except TraceFormatError as exc:
        message = str(exc)
        raise TraceFormatError(message if message.startswith(str(path)) else f"{path}: {message}") from None
    header: Any = result.header
    if result.whole_document is not None:
        data = result.whole_document
        if isinstance(data, dict) and data.get("format") == FORMAT_TAG:
            try:
                return _without_step_rows(profile_from_dict(data))
            except TraceFormatError as exc:
                raise TraceFormatError(f"{path}: {exc}") from None
        if isinstance(data, list):
            data = {"traceEvents": data}
        if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
            raise TraceFormatError(f"{path}: neither a layerscope profile nor a torch.profiler trace")
        builder.add_events(data["traceEvents"])
        header = data
    table = builder.finish(header)
    table.meta["truncated"] = result.truncated
    table.meta["lost_bytes"] = result.lost_bytes
    if not table.span_count and not table.memory_count:
        bad = sum(builder.malformed.values())
        detail = f" ({bad} malformed events skipped)" if bad else ""
        raise TraceFormatError(f"{path}: the trace holds no profiler events{detail}")
    if builder.malformed:
        count = sum(builder.malformed.values())
        worst = max(builder.malformed.items(), key=lambda kv: kv[1])[0]
        warnings.warn(
            f"{path}: skipped {count} malformed event{'s' if count > 1 else ''} (most: {worst}); "
            "strict=True / --strict fails on them instead",
            MalformedEventsWarning,
            stacklevel=3,
        )
    table.drop_clock_anchors()
    return table


def _without_step_rows(profile: Profile) -> Profile:
    """Profiles saved before 0.2.0 list torch's step ranges as ops (outside every module): they
    belong in the step table, not the op table."""
    kept = tuple(
        r for r in profile.op_rows if not (r.module is None and profiler_step_number(r.name) is not None)
    )
    return profile if len(kept) == len(profile.op_rows) else replace(profile, op_rows=kept)


def _profile_of_trace(path: Path, table: EventTable) -> tuple[Profile, DeviceReport | None]:
    """The profile of a trace, with its device report (summarized in ``meta.device``)."""
    # attribution's kernels come with the trace reader's module (attribution cannot import capture)
    nest_native.use(native.load_trace_reader())
    device, summary = summarize_device(table)
    return build_profile(table, None, ProfileMeta(source=TRACE, trace_file=str(path), device=summary)), device


def load(path: str | Path, progress: Progress | None = None, strict: bool = False) -> Profile:
    """Load a profile saved by :meth:`Profile.save`, or build one from a Chrome trace written by
    torch.profiler (``export_chrome_trace``, ``tensorboard_trace_handler``; .json or .json.gz). Big
    traces are read in blocks; a trace cut short keeps every complete event (``meta.trace``
    says ``truncated`` and how many bytes were lost). Malformed events are skipped, counted by reason
    in ``meta.trace.malformed_events`` and reported by a :class:`MalformedEventsWarning`;
    ``strict=True`` raises :class:`~layerscope.errors.TraceFormatError` on the first one instead."""
    path = Path(path)
    read = _read(path, progress, strict)
    if isinstance(read, Profile):
        return read
    with gc_paused():
        profile, _ = _profile_of_trace(path, read)
    return profile


@dataclass(frozen=True)
class Analysis:
    """A trace (or saved profile) analysed: its Profile, device report and advice, and the critical
    path when asked for (traces only: a saved profile keeps no events)."""

    source: str
    profile: Profile
    device: DeviceReport | None
    advice: tuple[Advice, ...]
    critical_path: paths.CriticalPath | None = None


TRACE_SUFFIXES = (".json", ".json.gz")


def trace_files(path: str | Path) -> list[Path]:
    """The files ``analyze`` reads for PATH: the file itself, or a folder's traces (TensorBoard logs
    ``*.pt.trace.json[.gz]`` first, else every ``.json``/``.json.gz``), sorted by name."""
    path = Path(path)
    if path.is_dir():
        tensorboard = sorted(p for p in path.rglob("*.pt.trace.json*") if p.name.endswith(TRACE_SUFFIXES))
        found = tensorboard or sorted(p for p in path.iterdir() if p.name.endswith(TRACE_SUFFIXES))
        if not found:
            raise TraceFormatError(f"{path}: no .json or .json.gz trace in this folder")
        return found
    return [path]


def analyze(
    path: str | Path,
    progress: Progress | None = None,
    strict: bool = False,
    critical_path: paths.PathWindow | None = None,
) -> Analysis:
    """Analyse one trace file (or saved profile): Profile + device report + advice, and the critical
    path of the window ``critical_path`` names when given."""
    path = Path(path)
    read = _read(path, progress, strict)
    if isinstance(read, Profile):
        return Analysis(str(path), read, None, tuple(advise(read, None)))
    with gc_paused():
        found = _window_path(read, critical_path) if critical_path is not None else None
        profile, device = _profile_of_trace(path, read)
    return Analysis(str(path), profile, device, tuple(advise(profile, device)), found)


def _window_path(table: EventTable, window: paths.PathWindow) -> paths.CriticalPath:
    return paths.critical_path(
        table, window.step, window.annotation, window.instance, hta_compatible=window.hta_compatible
    )


def trace_critical_path(
    path: str | Path | Sequence[str | Path],
    step: int | None = None,
    annotation: str | None = None,
    instance: int = 0,
    data_load: Sequence[str] = (),
    hta_compatible: bool = False,
) -> paths.CriticalPath:
    """``layerscope.critical_path``: the critical path of a trace file's window — the whole trace, step
    ``step``, or (Holistic Trace Analysis's way) the ``instance``-th span whose name contains
    ``annotation`` — with the time on it by bound type, the ops and kernels on it and, for traces
    with layerscope's module ranges, the modules. ``data_load``: name patterns of data loading.
    ``hta_compatible``: Holistic Trace Analysis's figures rather than ours (docs/compared.md).

    A folder of traces, or several files, are the ranks of one job: ONE path through all of them,
    joined by their collectives, clocks aligned by the collectives' ends
    (:mod:`layerscope.analysis.critical_ranks`); ranks from each trace's ``distributedInfo``, else
    the files' order."""
    files = trace_files(path) if isinstance(path, str | Path) else [f for p in path for f in trace_files(p)]
    if len(files) > 1:
        return rank_critical_path(files, step, annotation, instance, data_load, hta_compatible)
    read = _read(files[0], None, False)
    if isinstance(read, Profile):
        raise UsageError(f"{path} is a saved profile: the critical path needs the trace's events")
    with gc_paused():
        return paths.critical_path(
            read, step, annotation, instance, tuple(data_load), hta_compatible=hta_compatible
        )


def rank_critical_path(
    files: Sequence[str | Path],
    step: int | None = None,
    annotation: str | None = None,
    instance: int = 0,
    data_load: Sequence[str] = (),
    hta_compatible: bool = False,
    jobs: int | None = None,
) -> paths.CriticalPath:
    """The critical path through the ranks whose traces are ``files`` (all read here, ``jobs`` at a
    time in threads, default one per usable core: the path needs every rank's events at once);
    ``hta_compatible``: each rank's graph as Holistic Trace Analysis builds it."""
    tables = read_all(_events_of, [Path(f) for f in files], jobs)
    ranks = [RankTable(r, t) for r, t in zip(rank_ids(tables), tables, strict=True)]
    with gc_paused():
        return ranks_critical_path(
            ranks, step, annotation, instance, tuple(data_load), hta_compatible=hta_compatible
        )


def _events_of(file: Path) -> EventTable:
    """A trace's events (a saved profile keeps none: refused)."""
    read = _read(file, None, False)
    if isinstance(read, Profile):
        raise UsageError(f"{file} is a saved profile: the critical path needs the trace's events")
    return read


def load_many(
    paths: Sequence[Path],
    scheduler: str | Client | None = None,
    workers: int | None = None,
    jobs: int | None = None,
) -> FileResults[Profile]:
    """Load many profiles or traces (one per rank) into Profiles, a per-rank summary with no events:
    here, ``jobs`` at a time (default: one per usable core; ``workers`` is its former name), or on
    the Dask cluster at ``scheduler`` (see :mod:`layerscope.filemap`). A file that cannot be loaded
    is listed in ``failures``; the others still load. The results are the same whatever ``jobs``."""
    jobs = jobs if jobs is not None else workers
    return map_files(
        load, paths, scheduler=scheduler, jobs=jobs, what="loaded", prepare=partial(warm_for, paths)
    )


#: How much of the first trace :func:`warm_for` looks at for input shapes.
SHAPES_PEEK_BYTES = 1 << 20


def warm_for(paths: Sequence[Path]) -> None:
    """Before worker processes fork to read ``paths``: load the native trace reader here, and import
    torch's FLOP formulas when the first trace records input shapes (in its first MiB), so that the
    workers inherit them rather than each loading them (torch: ~1.5 s of CPU and ~150 MiB each).
    Traces without shapes never need torch, and import nothing of it."""
    import importlib.util

    native.load_trace_reader()
    if not paths or importlib.util.find_spec("torch") is None:
        return
    try:
        with Path(paths[0]).open("rb") as f:
            head = f.read(SHAPES_PEEK_BYTES)
        if head[:2] == b"\x1f\x8b":
            head = zlib.decompressobj(31).decompress(head, SHAPES_PEEK_BYTES)
    except (OSError, zlib.error):
        return  # the worker reading it reports the file's error
    if b'"Input Dims"' in head:
        from layerscope.capture.flops import FlopCalculator

        FlopCalculator()
