"""The ``layerscope`` command line: ``main(argv) -> exit code``, one module per subcommand."""

from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

from layerscope.cli import (
    analyze_cmd,
    diff_cmd,
    estimate_cmd,
    merge_cmd,
    native_cmd,
    profile_cmd,
    report_cmd,
    run_cmd,
    show_cmd,
    views,
)
from layerscope.cli.outputs import legacy_argv
from layerscope.cli.quiet import quiet_warnings
from layerscope.cli.run_argv import split_run_command_line
from layerscope.errors import LayerscopeError, LayerscopeWarning

EPILOG = """\
"layerscope COMMAND -h" shows a command's options and examples.

In your own code: "with layerscope.profile(model) as prof: ..." (docs/usage.md). Inside a training
framework, no script change beyond one argument: Hugging Face Trainer
(layerscope.integrations.transformers.LayerscopeCallback), Lightning
(layerscope.integrations.lightning.LayerscopeProfiler), Accelerate
(layerscope.integrations.accelerate.profile), torchprof (layerscope.compat.torchprof):
see docs/integrations/."""


#: The subcommands in the order ``layerscope -h`` lists them. Each module holds its ``HELP`` (the
#: line in that list), ``DESCRIPTION``, optional ``EXAMPLES`` (the epilog), ``add_arguments(parser)``
#: and ``run(args) -> exit code``; the parser is built for all of them here, the same way.
COMMANDS: dict[str, Any] = {
    "profile": profile_cmd,
    "run": run_cmd,
    "show": show_cmd,
    "analyze": analyze_cmd,
    "diff": diff_cmd,
    "merge": merge_cmd,
    "report": report_cmd,
    "estimate": estimate_cmd,
    "native": native_cmd,
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    from layerscope import __version__

    parser = argparse.ArgumentParser(
        prog="layerscope",
        description="Layer-by-layer PyTorch profiler: time, memory and FLOPs per module, "
        "forward and backward.",
        epilog=EPILOG,
        formatter_class=views.HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"layerscope {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        command_parser = sub.add_parser(
            name,
            help=command.HELP,
            description=command.DESCRIPTION,
            epilog=getattr(command, "EXAMPLES", None),
            formatter_class=views.HelpFormatter,
        )
        command.add_arguments(command_parser)
        command_parser.set_defaults(run=command.run)
    return parser


def _our_warnings_on_one_line() -> None:
    """layerscope's own warnings as one ``layerscope: warning: ...`` line each; others as Python shows
    them (a script run by ``layerscope run`` keeps its warnings' usual form)."""
    shown = warnings.showwarning

    def show(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        if isinstance(category, type) and issubclass(category, LayerscopeWarning):
            print(f"layerscope: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (2 for bad input, 1 for other failures)."""
    parser = build_parser()
    # What follows run's script or -m module is the script's, whatever it looks like.
    args_list, target = split_run_command_line(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(legacy_argv(args_list))
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return int(exc.code) if isinstance(exc.code, int) else 2
    if target is not None:
        args.target = target
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 2
    verbose = bool(args.verbose or getattr(args, "verbose_sub", False))
    try:
        with warnings.catch_warnings():
            _our_warnings_on_one_line()
            if getattr(args, "quiet", False):
                quiet_warnings(getattr(COMMANDS[args.command], "RUNS_USER_SCRIPT", False))
            return int(args.run(args))
    except LayerscopeError as exc:
        if verbose:
            traceback.print_exc()
        print(f"layerscope: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("layerscope: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if verbose:
            traceback.print_exc()
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(
            f"layerscope: error: {type(exc).__name__}: {message} (run with -v for the traceback)",
            file=sys.stderr,
        )
        return 1
