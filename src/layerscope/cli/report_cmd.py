"""``layerscope report run.json -o OUT``: a saved profile (or trace) as CSV, collapsed stacks or JSON."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from layerscope.errors import UsageError
from layerscope.model.profile import Profile
from layerscope.render.exports import FRAME_KINDS

FORMATS = ("html", "csv", "collapsed", "svg", "json", "chrome")


def register(sub: Any) -> None:
    """Add the ``report`` subcommand."""
    parser = sub.add_parser(
        "report",
        help="export a profile: HTML report, csv, collapsed stacks, SVG flame graph, json",
        description="Export a saved profile or a trace. The format comes from --format or the output's "
        "suffix: .html (a self-contained report), .csv (two files: NAME.modules.csv and NAME.ops.csv), "
        ".collapsed or .folded (flame-graph stacks), .svg (a flame graph), .json / .json.gz (a layerscope "
        "profile); --format chrome re-writes a torch.profiler trace with a 'modules (backward)' track.",
    )
    parser.add_argument("path", help="a saved layerscope profile or a torch.profiler trace")
    parser.add_argument("-o", "--output", required=True, metavar="OUT")
    parser.add_argument("--format", choices=FORMATS, help="default: from the output's suffix")
    parser.add_argument(
        "--metric",
        default="cpu_us",
        metavar="METRIC",
        help="collapsed stacks: cpu_us, device_us, cpu_alloc_bytes, device_alloc_bytes or flops",
    )
    parser.add_argument(
        "--frames",
        default="modules",
        choices=FRAME_KINDS,
        help="collapsed stacks and SVG: module frames (default) or the ops' Python source frames "
        "(profiles recorded with_stack)",
    )
    parser.add_argument(
        "--internal-frames",
        action="store_true",
        help="with --frames source: keep torch's and layerscope's frames",
    )
    parser.set_defaults(run=run)


def format_of(output: Path, given: str | None) -> str:
    """The export format: given, or from the file's suffix."""
    if given:
        return given
    name = output.name.lower()
    if name.endswith(".csv"):
        return "csv"
    if name.endswith((".collapsed", ".folded", ".txt")):
        return "collapsed"
    if name.endswith(".svg"):
        return "svg"
    if name.endswith((".html", ".htm")):
        return "html"
    if name.endswith((".json", ".json.gz")):
        return "json"
    raise UsageError(f"cannot tell the format of {output.name}; use --format {'|'.join(FORMATS)}")


def run(args: argparse.Namespace) -> int:
    """Load and export."""
    from layerscope.cli.views import report_written
    from layerscope.loading import load
    from layerscope.model.serialize import write_atomic
    from layerscope.render.exports import collapsed_stacks, modules_csv, ops_csv

    output = Path(args.output)
    fmt = format_of(output, args.format)
    if fmt == "chrome":
        _export_chrome(Path(args.path), output)
        report_written([output])
        return 0
    profile = load(args.path)
    written = [output]
    if fmt == "csv":
        stem = output.name[: -len(".csv")] if output.name.lower().endswith(".csv") else output.name
        written = [output.with_name(f"{stem}.modules.csv"), output.with_name(f"{stem}.ops.csv")]
        write_atomic(written[0], modules_csv(profile).encode())
        write_atomic(written[1], ops_csv(profile).encode())
    elif fmt == "collapsed":
        _check_source_frames(profile, args.frames)
        write_atomic(
            output, collapsed_stacks(profile, args.metric, args.frames, args.internal_frames).encode()
        )
    elif fmt == "html":
        from layerscope.render.html import write_html_report

        write_html_report(profile, output)
    elif fmt == "svg":
        from layerscope.render.flamegraph import flamegraph_svg

        _check_source_frames(profile, args.frames)
        svg = flamegraph_svg(
            profile, args.metric, frames_of=args.frames, internal_frames=args.internal_frames
        )
        write_atomic(output, svg.encode())
    else:
        written = [profile.save(output)]
    report_written(written)
    return 0


def _check_source_frames(profile: Profile, frames: str) -> None:
    if frames == "source" and not profile.has_stacks:
        raise UsageError(
            "--frames source needs Python stacks: record with --with-stack (ls.profile(..., "
            "with_stack=True)) or analyze a trace torch wrote with with_stack=True"
        )


def _export_chrome(source: Path, output: Path) -> None:
    """A torch.profiler trace, re-written with layerscope's "modules (backward)" track added."""
    from layerscope.model.serialize import read_json
    from layerscope.render.chrome import with_backward_tracks, write_trace

    trace = read_json(source)
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise UsageError(
            f"{source}: --format chrome needs a torch.profiler trace as input "
            "(a saved layerscope profile holds no events)"
        )
    write_trace(with_backward_tracks(trace), output)
