"""``layerscope merge DIR_OR_FILES``: one view of a distributed job from its per-rank files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from layerscope.cli.views import add_scheduler_options, report_written, scheduler_of
from layerscope.errors import UsageError


def register(sub: Any) -> None:
    """Add the ``merge`` subcommand."""
    parser = sub.add_parser(
        "merge",
        help="merge per-rank profiles or traces: spread across ranks, straggler",
        description="Merge one profile or trace per rank (files, or folders of them): the per-rank split of "
        "a step, the modules that differ most across ranks, and the straggler.",
    )
    parser.add_argument("paths", nargs="+", metavar="DIR_OR_FILE")
    parser.add_argument("-o", "--output", metavar="PATH", help="save the merge as JSON")
    parser.add_argument(
        "--html", metavar="PATH", help="also write an HTML page: step split per rank, modules x ranks heatmap"
    )
    add_scheduler_options(parser)
    parser.add_argument("--top", type=int, default=10, metavar="N")
    parser.add_argument("--ascii", action="store_true")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Load every rank, merge, print, save."""
    from layerscope.loading import trace_files
    from layerscope.merging import merge
    from layerscope.model.serialize import write_atomic
    from layerscope.render.console import make_console
    from layerscope.render.ranks import ranks_view

    files = [f for path in args.paths for f in trace_files(path)]
    if len(files) < 2:
        raise UsageError(f"merge needs at least two rank files, found {len(files)}")
    merged = merge(files, scheduler=scheduler_of(args), workers=args.workers)
    for path, why in merged.failed:
        print(f"layerscope: warning: {path} left out: {why}", file=sys.stderr)
    make_console(sys.stdout).print(ranks_view(merged, top=args.top, ascii_only=True if args.ascii else None))
    written: list[Path] = []
    if args.output:
        written.append(
            write_atomic(Path(args.output), orjson.dumps(_to_dict(merged), option=orjson.OPT_INDENT_2))
        )
    if args.html:
        from layerscope.render.ranks_html import ranks_html

        written.append(write_atomic(Path(args.html), ranks_html(merged).encode()))
    report_written(written)
    return 0


def _to_dict(merged: Any) -> dict[str, Any]:
    s = merged.straggler
    return {
        "format": "layerscope.merge",
        "ranks": list(merged.ranks),
        "metric": merged.metric,
        "summaries": [
            {
                "rank": x.rank,
                "step_us": x.wall_us,
                "module_us": x.module_us,
                "communication_us": x.communication_us,
                "communication_source": x.comm_source,
                "comm_compute_overlap": x.comm_overlap,
                "other_us": x.other_us,
            }
            for x in merged.summaries
        ],
        "modules": [
            {
                "path": m.path,
                "phase": m.phase,
                "values": list(m.values),
                "mean": m.mean,
                "skew": m.skew,
                "slowest_rank": merged.slowest_rank(m),
            }
            for m in merged.modules
        ],
        "gaps": list(merged.gaps),
        "failed": [{"path": path, "reason": why} for path, why in merged.failed],
        "straggler": None
        if s is None
        else {
            "rank": s.rank,
            "is_straggler": s.is_straggler,
            "module": s.module,
            "phase": s.phase,
            "module_excess_us": s.module_excess_us,
            "others_wait_us": s.others_wait_us,
            "late_collectives": None
            if s.late is None
            else {
                "rank": s.late.rank,
                "late_us": s.late.late_us,
                "matched": s.late.matched,
                "worst_us": s.late.worst_us,
                "worst_collective": s.late.worst_name,
                "worst_step": s.late.worst_step,
            },
        },
    }
