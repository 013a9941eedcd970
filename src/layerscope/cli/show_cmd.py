"""``layerscope show run.json``: render a saved profile."""

from __future__ import annotations

import argparse
from pathlib import Path

from layerscope.cli.outputs import add_output_options, deprecated, requested_outputs, stem_of
from layerscope.cli.views import (
    add_strict_option,
    add_view_options,
    check_view_options,
    note_missing_modules,
    print_profile,
    report_written,
)
from layerscope.errors import UsageError
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
        dest="memory_device",
        choices=("cpu", "device"),
        help="with --memory-peak: the CPU's or the accelerator's memory (default: the accelerator's "
        "when it recorded any)",
    )
    parser.add_argument(
        "--roofline",
        action="store_true",
        help="print each module (forward, backward) and the slowest ops against a device's roofs: "
        "FLOPs, bytes, intensity, achieved rates, what bounds them; instead of the tree",
    )
    parser.add_argument(
        "--device",
        metavar="KEY",
        help="with --roofline: the device spec (h100-sxm, a100-80gb, ...; default: the device the "
        "profile ran on); with --memory-peak, the deprecated spelling of --memory-device",
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
    _old_device_option(args)
    profile = load(args.path, strict=args.strict)
    if args.roofline:
        from layerscope.render.console import make_console
        from layerscope.render.roofline import roofline_table

        roofline = profile.roofline(args.device)
        make_console().print(roofline_table(roofline, ascii_only=bool(args.ascii)))
        return 0
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


def _old_device_option(args: argparse.Namespace) -> None:
    """``--device cpu|device`` without ``--roofline``: the old spelling of ``--memory-device``."""
    if args.device is None or args.roofline:
        return
    if args.device not in ("cpu", "device"):
        raise UsageError(f"--device {args.device} needs --roofline (--memory-device takes cpu or device)")
    deprecated("--device", "--memory-device")
    args.memory_device = args.device
