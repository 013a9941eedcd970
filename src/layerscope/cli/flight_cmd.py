"""``layerscope run --flight-recorder script.py``: the flight recorder around a whole script.

Every module the script calls is recorded (torch's global module hooks), every ``optimizer.step()``
ends a step, and dumps go to ``-o`` (``./flight``) when a step is slow, the script raises or is
interrupted, or SIGUSR1 arrives. The script's own exit code is returned.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from layerscope.cli.script_runner import ScriptEnd
from layerscope.errors import UsageError
from layerscope.render.writers import find_writer

#: Where dumps go without ``-o``.
DEFAULT_FOLDER = "flight"


def add_flight_options(parser: argparse.ArgumentParser) -> None:
    """``--flight-recorder`` and its settings."""
    group = parser.add_argument_group("flight recorder (instead of a profile: every step, dumps on trouble)")
    group.add_argument(
        "--flight-recorder",
        action="store_true",
        help="record every step lightly and dump the last steps (to -o, default ./flight) on a slow "
        "step, an error, an interrupt or SIGUSR1",
    )
    group.add_argument("--keep", type=int, default=None, metavar="N", help="steps kept (100)")
    group.add_argument(
        "--detail-every", type=int, default=None, metavar="N", help="a full profile every N steps (0: never)"
    )
    group.add_argument(
        "--detail-budget",
        type=float,
        default=None,
        metavar="F",
        help="space the full profiles so that they cost at most this share of the run (e.g. 0.01)",
    )
    group.add_argument(
        "--slow",
        type=float,
        default=None,
        metavar="X",
        help="dump a step that takes X times the median step (3; 0: never)",
    )


def check_flight_options(args: argparse.Namespace) -> None:
    """The flight recorder's settings given without ``--flight-recorder``: a one-line error."""
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("keep", "detail_every", "detail_budget", "slow")
        if getattr(args, name) is not None
    ]
    if given:
        raise UsageError(f"{', '.join(given)} set(s) the flight recorder: add --flight-recorder")


#: ``run``'s profile options, which a flight recorder does not take.
PROFILE_ONLY = ("memory", "with_stack", "lines", "nvtx", "trace", "html", "activities", "record_depth")


def check_recorder_arguments(args: argparse.Namespace) -> None:
    """``--flight-recorder`` with a profile's options, or ``-o`` naming a file: a one-line error."""
    given = [f"--{name.replace('_', '-')}" for name in PROFILE_ONLY if getattr(args, name, None)]
    if given:
        raise UsageError(f"{', '.join(given)} belong(s) to a profile, not to --flight-recorder")
    if args.output is not None and find_writer(args.output) is not None:
        raise UsageError(f"with --flight-recorder, -o is the dumps' folder, not a file: {args.output}")


def run_flight_recorder(args: argparse.Namespace, run_script: Callable[[], ScriptEnd]) -> int:
    """Run the script under the flight recorder; the script's exit code."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from layerscope.capture.flight_recorder import flight_recorder

    check_recorder_arguments(args)
    slow = 3.0 if args.slow is None else args.slow or None
    recorder = flight_recorder(
        None,
        keep=100 if args.keep is None else args.keep,
        detail_every=args.detail_every or 0,
        detail_budget=args.detail_budget,
        out=args.output if args.output is not None else DEFAULT_FOLDER,
        slow=slow,
    )
    end = ScriptEnd(0)
    recorder.__enter__()
    hook = register_optimizer_step_post_hook(lambda *_: recorder.step())
    try:
        end = run_script()
    finally:
        hook.remove()
        error = end.error
        recorder.__exit__(type(error) if error is not None else None, error, None)
    _report(recorder, end, args.quiet)
    return end.code


def _report(recorder: Any, end: ScriptEnd, quiet: bool) -> None:
    stream = sys.stderr
    if end.outcome:
        print(f"layerscope: {end.outcome} (exit code {end.code})", file=stream)
    dumps = recorder.dumps
    if quiet:
        return
    steps = recorder.steps_seen
    if not dumps:
        print(
            f"layerscope: flight recorder: {steps} steps, nothing triggered a dump (send SIGUSR1 to "
            "dump while it runs)",
            file=stream,
        )
    for path in dumps:
        print(f"layerscope: saved {path}", file=stream)
