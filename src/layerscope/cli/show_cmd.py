"""``layerscope show run.json``: render a saved profile."""

from __future__ import annotations

import argparse
from pathlib import Path

from layerscope.cli.outputs import DeprecatedAlias, add_output_options, requested_outputs, stem_of
from layerscope.cli.views import (
    add_strict_option,
    add_view_options,
    check_view_options,
    note_missing_modules,
    print_profile,
    report_written,
)
from layerscope.loading import load
from layerscope.render.writers import write_outputs

HELP = "render a saved profile or a torch.profiler trace (.json or .json.gz)"
DESCRIPTION = (
    "Render a profile saved with `layerscope profile -o` or Profile.save, or a Chrome "
    "trace written by torch.profiler (export_chrome_trace, tensorboard_trace_handler)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``show`` command's arguments."""
    parser.add_argument(
        "path", help="a saved layerscope profile or a torch.profiler trace (.json or .json.gz)"
    )
    add_view_options(parser)
    add_strict_option(parser)
    parser.add_argument(
        "--scopes",
        action="store_true",
        help="print how each module's calls were scoped (mechanism, clock, reason) instead of the tree",
    )
    parser.add_argument(
        "--memory-peak",
        action="store_true",
        help="print what was live at the peak of memory (by category and module) and what each "
        "module saved for backward, instead of the tree",
    )
    parser.add_argument(
        "--memory-device",
        "--device",
        dest="memory_device",
        action=DeprecatedAlias,
        old=("--device",),
        choices=("cpu", "device"),
        help="with --memory-peak: the CPU's or the accelerator's memory (default: the accelerator's "
        "when it recorded any)",
    )
    add_output_options(
        parser,
        output_help="also save the profile to PATH: a file whose suffix names the format (.json.gz, "
        ".html, .txt, .csv, .svg, .collapsed, .parquet), or a folder (NAME.json.gz in it)",
        html_help="also write the HTML report, beside -o (without -o: beside the input)",
    )


def run(args: argparse.Namespace) -> int:
    """Load and print."""
    check_view_options(args)
    profile = load(args.path, strict=args.strict)
    if args.scopes:
        from layerscope.render.console import make_console
        from layerscope.render.scope_table import scope_table

        make_console().print(scope_table(profile, ascii_only=True if args.ascii else None))
        return 0
    if args.memory_peak:
        from layerscope.render.console import make_console
        from layerscope.render.memory_table import memory_peak_table

        table = memory_peak_table(profile.memory_at_peak(args.memory_device), ascii_only=bool(args.ascii))
        make_console().print(table)
        return 0
    note_missing_modules(profile)
    print_profile(profile, args)
    source = Path(args.path)
    requested = requested_outputs(args, stem_of(source).name, default_folder=source.parent)
    report_written(write_outputs(profile, requested))
    return 0
