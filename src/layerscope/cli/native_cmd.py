"""``layerscope native build|status``: the native module for the installed torch."""

from __future__ import annotations

import argparse
import sys

from layerscope.capture import native

HELP = "build or check the native module (faster post-processing, cheaper module scopes)"
DESCRIPTION = (
    "The native module reads torch's profiler results into layerscope's tables in C++ "
    "and marks module calls on torch's clock instead of opening profiler ranges. "
    "It is compiled once for the installed torch (about 15 s, needs a C++ compiler) into "
    f"{native.cache_dir()} (LAYERSCOPE_CACHE moves it). Without it, the same results are read "
    "through torch's Python bindings and module calls get profiler ranges. LAYERSCOPE_NATIVE=0 turns "
    "it off."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``native`` command's arguments."""
    parser.add_argument(
        "action", choices=("build", "status"), help="build: compile it; status: say whether it is in use"
    )
    parser.add_argument("--force", action="store_true", help="build: compile again even when built")


def run(args: argparse.Namespace) -> int:
    """Build the reader, or report its status; status exits 1 when it is not in use."""
    if args.action == "build":
        path, seconds = native.build(force=args.force)
        if seconds:
            print(f"layerscope: built the native module in {seconds:.1f}s: {path}", file=sys.stderr)
        else:
            print(f"layerscope: native module already built: {path}", file=sys.stderr)
        state = native.status()
        if state.reason is not None:
            print(f"layerscope: warning: built, but not in use: {state.reason}", file=sys.stderr)
            return 1
        return 0
    state = native.status()
    print(f"path     {state.path}")
    print(f"built    {'yes' if state.built else 'no'}")
    print(f"in use   {'yes' if state.reason is None else 'no: ' + state.reason}")
    return 0 if state.reason is None else 1
