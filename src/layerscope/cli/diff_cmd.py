"""``layerscope diff A B``: what changed between two runs; a CI gate with ``--fail-over``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from layerscope.analysis.diff import DIFF_METRICS, ProfileDiff, diff
from layerscope.errors import UsageError
from layerscope.loading import load

HELP = "compare two profiles or traces (A = baseline, B = new)"
DESCRIPTION = (
    "Compare B against baseline A: total change, then the modules and ops that changed "
    "most. A and B are saved profiles or torch.profiler traces (mixed is fine)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``diff`` command's arguments."""
    parser.add_argument("a", metavar="A")
    parser.add_argument("b", metavar="B")
    parser.add_argument(
        "--metric",
        default="cpu_us",
        choices=DIFF_METRICS,
        metavar="METRIC",
        help=f"what to compare (default cpu_us; one of {', '.join(DIFF_METRICS)})",
    )
    parser.add_argument("--format", default="console", choices=("console", "markdown", "json"))
    parser.add_argument("--top", type=int, default=15, metavar="N", help="rows per table (default 15)")
    parser.add_argument(
        "--fail-over",
        default=None,
        metavar="PCT",
        help="exit with code 1 when B's total exceeds A's by more than PCT (e.g. 5%%)",
    )
    parser.add_argument("--ascii", action="store_true", help="ASCII tables")
    parser.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="PATH",
        help="also write the diff to PATH: .html (both trees side by side, the gate's verdict on top), "
        ".md or .json",
    )
    parser.add_argument(
        "--html", action="store_true", help="also write the HTML page (beside -o, else diff.html)"
    )


def parse_percent(text: str) -> float:
    """``"5%"`` or ``"5"`` -> 5.0."""
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise UsageError(f"--fail-over wants a percentage such as 5%, not {text!r}") from None
    if value < 0:
        raise UsageError(f"--fail-over must not be negative, not {text!r}")
    return value


DIFF_SUFFIXES = (".html", ".md", ".json")


def _diff_outputs(args: argparse.Namespace) -> list[Path]:
    """The files asked for: ``-o PATH`` (by suffix) and, with ``--html``, the page beside it."""
    paths = []
    if args.output is not None:
        path = Path(args.output)
        if path.suffix not in DIFF_SUFFIXES:
            raise UsageError(f"-o {args.output}: a diff is written as {', '.join(DIFF_SUFFIXES)}")
        paths.append(path)
    if args.html:
        beside = paths[0].with_suffix(".html") if paths else Path("diff.html")
        if beside not in paths:
            paths.append(beside)
    return paths


def _write_files(result: ProfileDiff, args: argparse.Namespace, threshold: float | None) -> None:
    """Render every requested file, then write them (atomically)."""
    from layerscope.cli.views import report_written
    from layerscope.render.diff import diff_json, diff_markdown
    from layerscope.render.diff_html import diff_html
    from layerscope.render.writers import commit_files

    rendered = {
        ".html": lambda: diff_html(result, args.a, args.b, threshold, top=max(args.top, 30)),
        ".md": lambda: diff_markdown(result, top=args.top),
        ".json": lambda: diff_json(result),
    }
    files = [(path, rendered[path.suffix]().encode()) for path in _diff_outputs(args)]
    report_written(commit_files(files))


def run(args: argparse.Namespace) -> int:
    """Print the diff; 1 when --fail-over is exceeded."""
    threshold = parse_percent(args.fail_over) if args.fail_over is not None else None
    if args.top < 0:
        raise UsageError(f"--top must be >= 0, not {args.top}")
    _diff_outputs(args)  # a bad -o fails before the profiles are read
    result = diff(load(args.a), load(args.b), metric=args.metric)
    if args.format == "json":
        from layerscope.render.diff import diff_json

        sys.stdout.write(diff_json(result))
    elif args.format == "markdown":
        from layerscope.render.diff import diff_markdown

        sys.stdout.write(diff_markdown(result, top=args.top))
    else:
        from layerscope.render.console import make_console
        from layerscope.render.diff import diff_table

        make_console(sys.stdout).print(
            diff_table(result, top=args.top, ascii_only=True if args.ascii else None)
        )
    _write_files(result, args, threshold)
    if threshold is not None and result.regressed(threshold):
        from layerscope.render.diff import summary_line

        print(
            f"layerscope: B is slower than A beyond {threshold:g}%: {summary_line(result)}", file=sys.stderr
        )
        return 1
    return 0
