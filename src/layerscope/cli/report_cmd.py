"""``layerscope report run.json -o OUT``: a saved profile (or trace) as CSV, collapsed stacks or JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from layerscope.errors import UsageError
from layerscope.render.exports import FRAME_KINDS
from layerscope.render.writers import FORMATS as WRITER_FORMATS
from layerscope.render.writers import ExportOptions, Output, find_writer, write_outputs

#: The writers' formats, and "chrome": it re-writes a torch.profiler trace, not a Profile.
FORMATS = (*WRITER_FORMATS, "chrome")


HELP = "export a profile: HTML report, text, csv, parquet, collapsed stacks, SVG flame graph, json"
DESCRIPTION = (
    "Export a saved profile or a trace. The format comes from --format or the output's "
    "suffix: .html (a self-contained report), .txt (the console view), .csv and .parquet (two files "
    "each: NAME.modules.* and NAME.ops.*), "
    ".collapsed or .folded (flame-graph stacks), .svg (a flame graph), .json / .json.gz (a layerscope "
    "profile); --format chrome re-writes a torch.profiler trace with a 'modules (backward)' track."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``report`` command's arguments."""
    parser.add_argument("path", help="a saved layerscope profile or a torch.profiler trace")
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="PATH",
        help="the file to write (its suffix names the format)",
    )
    parser.add_argument("--html", action="store_true", help="also write the HTML report, beside -o")
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


def format_of(output: Path, given: str | None) -> str:
    """The export format: given, or from the file's suffix (see ``render.writers.WRITERS``)."""
    if given:
        return given
    writer = find_writer(output)
    if writer is None:
        raise UsageError(f"cannot tell the format of {output.name}; use --format {'|'.join(FORMATS)}")
    return writer.format


def run(args: argparse.Namespace) -> int:
    """Load and export."""
    from layerscope.cli.outputs import stem_of
    from layerscope.cli.views import report_written
    from layerscope.loading import load

    output = Path(args.output)
    fmt = format_of(output, args.format)
    if fmt == "chrome":
        if args.html:
            raise UsageError("--html needs a profile to report on; --format chrome re-writes a trace")
        _export_chrome(Path(args.path), output)
        report_written([output])
        return 0
    profile = load(args.path)
    options = ExportOptions(metric=args.metric, frames=args.frames, internal_frames=args.internal_frames)
    requested = [Output(output, fmt)]
    if args.html and fmt != "html":
        requested.append(Output(stem_of(output).with_name(stem_of(output).name + ".html"), "html"))
    report_written(write_outputs(profile, requested, options))
    return 0


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
