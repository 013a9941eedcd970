"""``layerscope merge DIR_OR_FILES``: one view of a distributed job from its per-rank files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from layerscope.cli.outputs import add_output_options, is_file_path, requested_outputs
from layerscope.cli.views import add_scheduler_options, report_written, scheduler_of
from layerscope.errors import UsageError
from layerscope.model.serialize import encode_json
from layerscope.render.writers import commit_files

#: What a merge can be saved as.
MERGE_SUFFIXES = (".json", ".json.gz", ".html", ".htm")


HELP = "merge per-rank profiles or traces: spread across ranks, straggler"
DESCRIPTION = (
    "Merge one profile or trace per rank (files, or folders of them): the per-rank split of "
    "a step, the modules that differ most across ranks, and the straggler."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``merge`` command's arguments."""
    parser.add_argument("paths", nargs="+", metavar="DIR_OR_FILE")
    add_output_options(
        parser,
        output_help="save the merge: a .json/.json.gz file, an .html page, or a folder (merge.json in it)",
        html_help="also write the HTML page (step split per rank, modules x ranks heatmap), beside -o "
        "(or merge.html here)",
    )
    add_scheduler_options(parser)
    parser.add_argument("--top", type=int, default=10, metavar="N")
    parser.add_argument("--ascii", action="store_true")


def run(args: argparse.Namespace) -> int:
    """Load every rank, merge, print, save."""
    from layerscope.loading import trace_files
    from layerscope.merging import merge
    from layerscope.render.console import make_console
    from layerscope.render.ranks import ranks_view

    outputs = _merge_outputs(args)  # a bad -o fails before the ranks are read
    files = [f for path in args.paths for f in trace_files(path)]
    if len(files) < 2:
        raise UsageError(f"merge needs at least two rank files, found {len(files)}")
    merged = merge(files, scheduler=scheduler_of(args), jobs=args.jobs)
    for path, why in merged.failed:
        print(f"layerscope: warning: {path} left out: {why}", file=sys.stderr)
    make_console(sys.stdout).print(ranks_view(merged, top=args.top, ascii_only=True if args.ascii else None))
    written = commit_files([(path, _render(merged, path)) for path in outputs])
    report_written(written)
    return 0


def _merge_outputs(args: argparse.Namespace) -> list[Path]:
    """The files asked for: ``-o`` (a folder gets ``merge.json``) and ``--html``."""
    paths = requested_outputs(args, "merge")
    if args.output and not is_file_path(args.output):
        paths[0] = paths[0].with_name("merge.json")
    for path in paths:
        if not path.name.lower().endswith(MERGE_SUFFIXES):
            raise UsageError(f"a merge is saved as {', '.join(MERGE_SUFFIXES)}, not {path.name}")
    return paths


def _render(merged: Any, path: Path) -> bytes:
    """The bytes of one merge output: JSON (gzipped for .gz) or the HTML page."""
    name = path.name.lower()
    if name.endswith((".html", ".htm")):
        from layerscope.render.ranks_html import ranks_html

        return ranks_html(merged).encode()
    if name.endswith(".json"):
        return orjson.dumps(_to_dict(merged), option=orjson.OPT_INDENT_2)
    return encode_json(path, _to_dict(merged))


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
        "critical_path": None if merged.critical_path is None else merged.critical_path.to_json(),
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
