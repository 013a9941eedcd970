"""``layerscope run script.py [args]`` / ``layerscope run -m module [args]``: profile an unmodified script.

Every module the script calls gets a row (torch's global module hooks; top-level modules are named
by class, their children by attribute path), and every ``optimizer.step()`` ends a training step
(torch's global optimizer hooks), so a schedule needs no change to the script. What was captured is
saved even when the script raises or is interrupted, and the script's own exit code is returned.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from layerscope.cli.flight_cmd import add_flight_options, check_flight_options, run_flight_recorder
from layerscope.cli.outputs import DeprecatedAlias, deprecated
from layerscope.cli.quiet import ProfilerNotices
from layerscope.cli.script_runner import run_script
from layerscope.cli.views import (
    add_recording_options,
    add_view_options,
    check_view_options,
    main_tables,
)
from layerscope.errors import UsageError

EXAMPLES = """\
examples:
  layerscope run train.py --epochs 1                  # the whole run as one cycle
  layerscope run --steps 3 train.py                   # warm up 1 step, record 3, then run on unprofiled
  layerscope run --wait 5 --warmup 1 --active 2 --repeat 3 --trace --html -o runs/ train.py
  layerscope run --steps 5 -o profile.json.gz -m mypkg.train
  torchrun --nproc-per-node 2 -m layerscope run --steps 3 train_ddp.py
  layerscope run --flight-recorder --keep 200 -o flight/ train.py  # dumps: slow step, error, SIGUSR1"""


HELP = "profile an unmodified Python script or module"
#: ``-q`` leaves the script's own warnings alone (they are its output, not ours).
RUNS_USER_SCRIPT = True
DESCRIPTION = (
    "Run a script (or -m module) under layerscope. Steps end at every optimizer.step(); "
    "choose which steps to record with --steps or --wait/--warmup/--active/--repeat/--skip-first "
    "(without them the whole run is one cycle). Each cycle is saved into --output; after a "
    "finite schedule's last cycle the script goes on unprofiled. torch.compile is watched from the "
    "script's start, so a model compiled before the recorded steps shows its modules; while it "
    "is, Inductor's FX-graph and AOTAutograd caches are bypassed (each compile takes its full "
    "time) and C++ kernels carry profiler ranges."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``run``'s own options; what follows the script or ``-m MODULE`` is never among them."""
    parser.add_argument(
        "-m",
        dest="module",
        metavar="MODULE",
        help="run a library module as a script (what follows goes to it, as with python -m)",
    )
    parser.add_argument(
        "target",
        nargs=argparse.REMAINDER,
        metavar="script.py [args ...]",
        help="the script and its own arguments, as for python (with -m: the module's arguments)",
    )
    group = parser.add_argument_group("schedule (steps end at optimizer.step())")
    group.add_argument("--steps", type=int, metavar="N", help="shortcut: warm up 1 step, record N, once")
    group.add_argument(
        "--wait", type=int, default=None, metavar="N", help="idle steps at the start of each cycle (0)"
    )
    group.add_argument(
        "--warmup", type=int, default=None, metavar="N", help="profiled but dropped steps next (0)"
    )
    group.add_argument(
        "--active", type=int, default=None, metavar="N", help="recorded steps ending each cycle (1)"
    )
    group.add_argument(
        "--repeat", type=int, default=None, metavar="N", help="cycles, then stop profiling (0: until the end)"
    )
    group.add_argument(
        "--skip-first",
        type=int,
        default=None,
        metavar="N",
        help="steps skipped once, before the first cycle (0)",
    )
    add_recording_options(parser)
    parser.add_argument(
        "--activities",
        default=None,
        metavar="LIST",
        help="comma-separated, e.g. cpu,cuda (default: CPU plus available accelerators)",
    )
    parser.add_argument(
        "-o",
        "--output",
        "--output-dir",
        dest="output",
        action=DeprecatedAlias,
        old=("--output-dir",),
        default=None,
        metavar="PATH",
        help="a folder or a file: a folder gets each cycle's profile (default ./layerscope_runs); a file "
        "(its suffix names the format: .json, .json.gz, .html, .txt...) gets the one cycle, several as "
        "NAME.c0.json, NAME.c1.json... beside it. With --flight-recorder: the dumps' folder (./flight)",
    )
    parser.add_argument(
        "--record-depth",
        type=int,
        metavar="N",
        help="record modules down to depth N only (the root is 0; deeper work counts in its ancestor)",
    )
    parser.add_argument("--trace", action="store_true", help="also save each cycle's Chrome trace")
    parser.add_argument("--html", action="store_true", help="also save each cycle's HTML report")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress line and no summary")
    add_flight_options(parser)
    add_view_options(parser)
    parser.set_defaults(top=10)


def _schedule_arguments(args: argparse.Namespace) -> dict[str, int] | None:
    explicit = {k: getattr(args, k) for k in ("wait", "warmup", "active", "repeat", "skip_first")}
    given = {k: v for k, v in explicit.items() if v is not None}
    if args.steps is not None:
        if given:
            raise UsageError("--steps is a shortcut; use it alone or use --wait/--warmup/--active/--repeat")
        if args.steps < 1:
            raise UsageError(f"--steps must be >= 1, not {args.steps}")
        return {"wait": 0, "warmup": 1, "active": args.steps, "repeat": 1, "skip_first": 0}
    if not given:
        return None
    values = {"wait": 0, "warmup": 0, "active": 1, "repeat": 0, "skip_first": 0}
    values.update(given)
    return values


class _Progress:
    """One live line on stderr: step, schedule phase, cycles saved. When stderr is not a terminal
    (CI logs, ``2>log``) a line per cycle instead: the first, each cycle saved, the end."""

    def __init__(self, stream: TextIO, quiet: bool) -> None:
        self.stream = stream
        self.quiet = quiet
        self.live = stream.isatty()
        self.last = ""
        self.last_milestone: object = None

    def update(self, text: str, milestone: object) -> None:
        """Show ``text``; without a terminal only when ``milestone`` (cycles saved) changed."""
        if self.quiet or text == self.last:
            return
        if not self.live and milestone == self.last_milestone:
            return
        self.last, self.last_milestone = text, milestone
        if self.live:
            self.stream.write("\r\x1b[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.live and self.last and not self.quiet:
            self.stream.write("\n")
            self.last = ""


class _Steps:
    """Ends a step at every ``optimizer.step()`` and, once a finite schedule's last cycle is saved,
    stops the session: nothing of layerscope's stays in the script, which goes on unprofiled."""

    def __init__(
        self, session: Any, progress: _Progress, cycles: int | None, notices: ProfilerNotices
    ) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.session = session
        self.progress = progress
        self.notices = notices
        self.cycles = cycles  # how many cycles the schedule records (None: until the script ends)
        self.finished = False
        self.closing = False
        self.hook = register_optimizer_step_post_hook(self.on_optimizer_step)

    def on_optimizer_step(self, *_: Any) -> None:
        # The post-hook runs inside torch's Optimizer.step range; the step ends at the next
        # top-level module call instead, so no range straddles two steps.
        self.session.step_before_next_top_level_call(then=self.after_step)

    def after_step(self) -> None:
        """Right after a step ended, outside every range: the place where stopping cuts nothing."""
        self.show()
        if self.cycles is not None and len(self.session.cycles) >= self.cycles:
            self.finish()

    def finish(self) -> None:
        """The schedule is done: remove the optimizer hook and stop the session (its hooks go)."""
        self.hook.remove()
        if self.session.is_running:
            self.session.stop()
        if not self.finished and not self.closing:
            self.finished = True
            saved = len(self.session.cycles)
            text = f"layerscope: step {self.session.step_count} · done · {saved} saved"
            self.progress.update(text + "; the script goes on unprofiled", "done")
            self.progress.done()

    def close(self) -> None:
        """At the script's end: its last optimizer step ends the last step, then everything stops."""
        self.closing = True
        self.hook.remove()
        try:
            if self.session.is_running:
                self.session.flush_pending_step()  # shows the progress as any step end does
        finally:
            if self.session.is_running:
                self.session.stop()

    def show(self) -> None:
        from torch.profiler import ProfilerAction

        from layerscope.capture.schedule import action_label

        session = self.session
        action = session.action()
        phase = action_label(action)
        if action != ProfilerAction.NONE:
            phase = f"{phase} (cycle {len(session.cycles) + 1})"
            self.notices.read()  # torch has prepared a trace: kineto read its log level
        saved = len(session.cycles)
        self.progress.update(f"layerscope: step {session.step_count} · {phase} · {saved} saved", saved)


def _target_argv(args: argparse.Namespace) -> list[str]:
    """The script's (or module's) argv, checked."""
    if args.module:
        return [args.module, *args.target]
    if args.target:
        script = Path(args.target[0])
        if not script.is_file():
            raise UsageError(f"script {script} does not exist")
        return list(args.target)
    raise UsageError("give a script to run (layerscope run train.py [args]) or -m module")


def run(args: argparse.Namespace) -> int:
    """Run the script under layerscope; returns the script's exit code."""
    check_view_options(args)
    schedule_args = _schedule_arguments(args)
    target_argv = _target_argv(args)
    if args.flight_recorder:
        if schedule_args is not None:
            raise UsageError("--flight-recorder records every step: give no schedule (--steps, --active...)")
        return run_flight_recorder(args, lambda: run_script(args.module, target_argv))
    check_flight_options(args)
    args.output = args.output if args.output is not None else "layerscope_runs"
    activities = [a.strip() for a in args.activities.split(",")] if args.activities else None

    import layerscope as ls
    from layerscope.cli.outputs import is_file_path
    from layerscope.handlers import FileSaver, save_to

    file_saver = (
        FileSaver(args.output, trace=args.trace, html=args.html) if is_file_path(args.output) else None
    )
    saver = file_saver if file_saver is not None else save_to(args.output, trace=args.trace, html=args.html)
    progress = _Progress(sys.stderr, args.quiet)
    session = ls.profile(
        None,
        activities=activities,
        memory=args.memory,
        with_stack=args.with_stack,
        lines=args.lines,
        nvtx=args.nvtx,
        depth=_record_depth(args),
        schedule=ls.schedule(**schedule_args) if schedule_args is not None else None,
        on_trace_ready=saver,
    )
    repeat = schedule_args["repeat"] if schedule_args is not None else 0
    # -q: kineto's log level, set until torch first prepares a trace (the step it records or warms up)
    with ProfilerNotices(args.quiet) as notices:
        session.start()
        # From the script's first line: a model compiled before the recorded steps still gets its modules.
        watch = ls.watch_compiles()
        steps = _Steps(session, progress, repeat if repeat > 0 else None, notices)
        steps.show()
        exit_code, outcome = 0, ""
        try:
            end = run_script(args.module, target_argv, progress.done)
            exit_code, outcome = end.code, end.outcome
        finally:
            steps.close()
            watch.stop()
    progress.done()
    if file_saver is not None:
        file_saver.finish()
    written: list[Path] = getattr(saver, "written", [])
    _report(session, written, args, outcome, exit_code)
    return exit_code


def _record_depth(args: argparse.Namespace) -> int | None:
    """The depth recorded: ``--record-depth``; ``--depth`` alone (a view option everywhere else) kept
    its old second meaning here for one release, with a deprecation line."""
    if args.record_depth is not None:
        return int(args.record_depth)
    if args.depth is not None:
        deprecated("run --depth N as the recorded depth", "--record-depth N (--depth only folds the view)")
    return None if args.depth is None else int(args.depth)


def _report(session: Any, written: list[Path], args: argparse.Namespace, outcome: str, code: int) -> None:
    stream = sys.stderr
    if outcome:
        print(f"layerscope: {outcome} (exit code {code}); saving what was captured", file=stream)
    if not session.cycles:
        print(
            "layerscope: no profiling cycle completed (did the script call optimizer.step() enough "
            "times for the schedule?)",
            file=stream,
        )
        return
    if not args.quiet:
        from layerscope.render.console import make_console

        console = make_console(stream)
        profile = session.cycles[-1].profile
        by = args.by if _has_main_table(profile, args.by) else "module"
        for table in main_tables(profile, args, by=by):
            console.print(table)
    for path in [] if args.quiet else written:
        print(f"layerscope: saved {path}", file=stream)


def _has_main_table(profile: Any, by: str) -> bool:
    """Whether the profile has what ``--by`` asks for (after a whole script ran, a run without lines
    prints its tree rather than fail)."""
    return by != "line" or bool(profile.has_stacks or profile.meta.call_lines is not None)
