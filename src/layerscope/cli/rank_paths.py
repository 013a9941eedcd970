"""``layerscope analyze FOLDER --critical-path``: one critical path through a job's rank traces, or
each trace's own path when the traces are not one job's ranks."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerscope.errors import UsageError

if TYPE_CHECKING:
    from layerscope.analysis.critical_path import CriticalPath, PathWindow


def write_path_json(out: str | None, source: str, path: CriticalPath) -> list[Path]:
    """``--json OUT``: ``{"trace": ..., "critical_path": {...}}``; the files written."""
    if not out:
        return []
    import orjson

    target = Path(out)
    payload = {"trace": source, "critical_path": path.to_json()}
    target.write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2, default=str) + b"\n")
    return [target]


def are_ranks(infos: Sequence[Any]) -> bool:
    """Whether the traces are one job's ranks: each says its rank (``distributedInfo``), no two the
    same."""
    ranks = [getattr(info, "rank", None) for info in infos]
    return all(isinstance(r, int) for r in ranks) and len(set(ranks)) == len(ranks)


def show_rank_paths(
    console: Any,
    traces: Sequence[tuple[Path, Any]],
    window: PathWindow,
    args: argparse.Namespace,
    ascii_only: bool | None,
) -> list[Path]:
    """Print the path through the ranks of ``traces`` ((file, its distributed info) each), or,
    when they are not one job's ranks, each trace's own path; the files written."""
    from layerscope.loading import rank_critical_path, trace_critical_path
    from layerscope.render.critical_path import critical_path_section

    files = [path for path, _ in traces]
    if are_ranks([info for _, info in traces]) and len(files) > 1:
        path = rank_critical_path(
            files,
            window.step,
            window.annotation,
            window.instance,
            hta_compatible=window.hta_compatible,
            jobs=args.jobs,
        )
        console.print("\n== critical path through the ranks", style="bold")
        console.print(critical_path_section(path, top=args.top, ascii_only=ascii_only))
        return write_path_json(args.json, str(args.path), path)
    if args.json:
        raise UsageError(
            f"--json writes one trace's critical path, or one path through a job's ranks; the "
            f"{len(files)} traces in {args.path} are not one job's ranks (no distinct distributedInfo rank)"
        )
    for file in files:
        console.print(f"\n== critical path of {file}", style="bold")
        path = trace_critical_path(
            file, window.step, window.annotation, window.instance, hta_compatible=window.hta_compatible
        )
        console.print(critical_path_section(path, top=args.top, ascii_only=ascii_only))
    print("layerscope: the traces are not one job's ranks: each trace's own path", file=sys.stderr)
    return []
