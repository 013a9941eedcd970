"""``ls.merge``: per-rank profiles, or the files and folders that hold them, merged into one view."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from layerscope.analysis.ranks import RankMerge, merge_profiles
from layerscope.errors import LayerscopeWarning, TraceFormatError, UsageError
from layerscope.filemap import all_files
from layerscope.loading import load_many, rank_critical_path, trace_files
from layerscope.model.critical_path import CriticalPath
from layerscope.model.profile import Profile

if TYPE_CHECKING:
    from distributed import Client


def merge(
    sources: Sequence[Profile | str | Path] | str | Path,
    ranks: Sequence[int] | None = None,
    scheduler: str | Client | None = None,
    workers: int | None = None,
    critical_path: bool | None = None,
    jobs: int | None = None,
) -> RankMerge:
    """Merge one profile per rank: spread of every module across ranks, per-rank step split, straggler.

    ``sources`` are Profiles, or paths of saved profiles / torch.profiler traces / folders of them
    (a single path is a folder). Paths are loaded here, ``jobs`` files at a time (default: one per
    usable core; ``workers`` is its former name; see :func:`layerscope.filemap.each_file` for the
    memory bound), or on the Dask cluster at ``scheduler`` (``"tcp://host:8786"`` or a
    ``distributed.Client``; workers read the files by path, so they must see the same filesystem).
    The merge is the same whatever ``jobs``. Files that fail to load are listed in
    ``RankMerge.failed`` and the others still merge.

    ``critical_path``: when every source is a trace, also the critical path through all ranks
    (``RankMerge.critical_path``): the traces are read once more, ``jobs`` at a time, and held all
    at once (the path needs every rank's events together), here or, with ``scheduler``, on one
    worker. ``None``: when the traces hold about :data:`PATH_MAX_BYTES` or less (gzip counted 8x);
    ``True``: always; ``False``: never.
    """
    items: list[Profile | str | Path] = [sources] if isinstance(sources, str | Path) else list(sources)
    # in input order: a Profile stands for itself, a path for its files (each path expanded once)
    entries: list[Profile | Path] = [
        f for item in items for f in ([item] if isinstance(item, Profile) else trace_files(item))
    ]
    files = [e for e in entries if isinstance(e, Path)]
    jobs = jobs if jobs is not None else workers
    loaded = load_many(files, scheduler=scheduler, jobs=jobs) if files else None
    by_path = dict(zip(loaded.paths, loaded.results, strict=True)) if loaded else {}
    profiles = [
        by_path[e] if isinstance(e, Path) else e for e in entries if not isinstance(e, Path) or e in by_path
    ]
    if loaded and loaded.failures and len(profiles) < 2:
        path, why = loaded.failures[0]
        raise TraceFormatError(
            f"only {len(loaded.results)} of {len(files)} rank files could be loaded; {path}: {why}"
        )
    merged = merge_profiles(profiles, ranks)
    if loaded and loaded.failures:
        merged = dataclasses.replace(merged, failed=tuple((str(p), why) for p, why in loaded.failures))
    traces = [
        e for e in entries if isinstance(e, Path) and e in by_path and by_path[e].meta.trace_file == str(e)
    ]
    wanted = critical_path is not False and len(traces) == len(profiles) and ranks is None
    if wanted and (critical_path or _fits(traces)):
        merged = dataclasses.replace(merged, critical_path=_rank_path(traces, scheduler, jobs))
    return merged


#: Trace bytes (uncompressed, about) beyond which a merge leaves the critical path out unless asked
#: for it: one process holds every rank's events for it (~2x their size in memory).
PATH_MAX_BYTES = 4_000_000_000


def _fits(traces: list[Path]) -> bool:
    """Whether the traces are small enough for the path by default; a warning when not."""
    size = sum(p.stat().st_size * (8 if p.name.endswith(".gz") else 1) for p in traces if p.is_file())
    if size <= PATH_MAX_BYTES:
        return True
    warnings.warn(
        f"no critical path through the ranks: their traces hold about {size / 1e9:.0f} GB, more than "
        "one process should hold at once (ls.merge(..., critical_path=True) computes it anyway)",
        LayerscopeWarning,
        stacklevel=3,
    )
    return False


def _rank_path(traces: list[Path], scheduler: str | Client | None, jobs: int | None) -> CriticalPath | None:
    """The critical path through the ranks' traces (here, or on one worker of the cluster at
    ``scheduler``); None (with a warning) where it cannot be computed (no CPU op or device work in
    some trace, a window missing, a file gone)."""
    try:
        return all_files(partial(rank_critical_path, jobs=jobs), traces, scheduler)
    except (UsageError, TraceFormatError, ValueError, OSError) as exc:
        warnings.warn(f"no critical path through the ranks: {exc}", LayerscopeWarning, stacklevel=3)
        return None
