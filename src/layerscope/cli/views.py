"""View options shared by the commands that print a profile (``profile`` and ``show``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import RenderableType

from layerscope.analysis.flight import trigger_line
from layerscope.analysis.ops import GROUP_KEYS
from layerscope.analysis.steps import step_rows
from layerscope.cli.outputs import deprecated
from layerscope.errors import UsageError
from layerscope.model.profile import Profile
from layerscope.model.sort_keys import (
    LINE_SORT_KEYS,
    OLD_SORT_KEYS,
    OP_SORT_KEYS,
    TREE_SORT_KEYS,
    TYPE_SORT_KEYS,
)
from layerscope.render.console import make_console, ops_table, steps_table, tree_table
from layerscope.render.lines import lines_table
from layerscope.render.types import types_table

_GROUP_ALIASES = {
    "name": ("name",),
    "shapes": ("name", "input_shapes"),
    "module": ("name", "module"),
    "phase": ("name", "phase"),
    "stack": ("name", "stack"),
}


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that text written on several lines (an examples epilog) keeps
    its lines: a one-line description is still wrapped to the terminal."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def add_recording_options(parser: argparse.ArgumentParser) -> None:
    """What a capture records beside modules (``profile`` and ``run``): --memory, --with-stack,
    --lines, --nvtx."""
    parser.add_argument("--memory", action="store_true", help="record allocations")
    parser.add_argument(
        "--with-stack", action="store_true", help="record Python stacks (for --group-by stack)"
    )
    parser.add_argument(
        "--lines",
        action="store_true",
        help="record the line of your code that called each op (for --by line, the HTML source view)",
    )
    parser.add_argument(
        "--nvtx",
        action="store_true",
        help="NVTX ranges named by module path, forward and backward, for Nsight Systems (CUDA torch)",
    )


def add_view_options(parser: argparse.ArgumentParser) -> None:
    """--depth, --min-share, --sort, --top, --group-by, --ascii."""
    group = parser.add_argument_group("view")
    group.add_argument(
        "--by",
        default="module",
        choices=("module", "line", "type"),
        help="the main table: the module tree (default); source lines ranked by forward + backward "
        "time (profiles recorded with --lines, or --with-stack for function lines); module types "
        "(with --depth N: the types at depth N)",
    )
    group.add_argument("--depth", type=int, metavar="N", help="fold modules deeper than N levels")
    group.add_argument(
        "--min-share",
        type=float,
        default=0.0,
        metavar="PCT",
        help="fold modules under PCT%% of the total into their parents",
    )
    group.add_argument(
        "--sort",
        default=None,
        metavar="KEY",
        help="order the main table: time, cpu, device, flops, alloc (self_... for own figures), calls, "
        "params, name, or a metric field such as device_relative_peak_bytes (default: the tree in execution "
        "order, lines and types by time)",
    )
    group.add_argument(
        "--per-step",
        action="store_true",
        help="tree rows as means per step (default: totals over the steps, as the op table and HTML)",
    )
    group.add_argument(
        "--top", type=int, default=15, metavar="N", help="rows of the op table (0 hides it; default 15)"
    )
    group.add_argument(
        "--group-by",
        default="name",
        choices=sorted(_GROUP_ALIASES),
        help="op table grouping: name, shapes (name + input shapes), module, phase, "
        "stack (name + source location; profiles recorded with --with-stack)",
    )
    group.add_argument(
        "--stack-depth",
        type=int,
        default=5,
        metavar="N",
        help="frames of the source location to group by with --group-by stack (default 5)",
    )
    group.add_argument(
        "--internal-frames",
        action="store_true",
        help="keep frames inside torch and layerscope in source locations",
    )
    group.add_argument(
        "--op-sort",
        default=None,
        metavar="KEY",
        help="order the op table, by the same keys as --sort (default self_cpu_us; self_device_us "
        "for a profile with device time and no CPU time, such as an estimate for a GPU)",
    )
    group.add_argument("--ascii", action="store_true", help="ASCII table borders and tree guides")
    group.add_argument(
        "--peak-tflops",
        type=float,
        metavar="X",
        help="the device's peak TFLOP/s for an MFU column (default: known accelerators by name)",
    )


def default_op_sort(profile: Profile) -> str:
    """The op table's order when none is asked for: self CPU time, or self device time where the
    profile has device time and no CPU time (an estimate for an accelerator)."""
    totals = profile.totals
    return "self_device_us" if not totals.cpu_us and totals.device_us else "self_cpu_us"


def check_view_options(args: argparse.Namespace) -> None:
    """Reject bad view values with the valid choices, before any work is done."""
    if args.depth is not None and args.depth < 0:
        raise UsageError(f"--depth must be >= 0, not {args.depth}")
    if args.min_share < 0 or args.min_share >= 100:
        raise UsageError(f"--min-share must be in [0, 100), not {args.min_share}")
    main_keys = {"line": LINE_SORT_KEYS, "type": TYPE_SORT_KEYS}.get(args.by, TREE_SORT_KEYS)
    default = "execution" if args.by not in ("line", "type") else "time"
    args.sort = _checked_sort("--sort", args.sort or default, main_keys)
    if args.op_sort is not None:
        args.op_sort = _checked_sort("--op-sort", args.op_sort, OP_SORT_KEYS)
    if args.top < 0:
        raise UsageError(f"--top must be >= 0, not {args.top}")
    if args.stack_depth < 1:
        raise UsageError(f"--stack-depth must be >= 1, not {args.stack_depth}")
    assert set(_GROUP_ALIASES["shapes"]) <= set(GROUP_KEYS)


def _checked_sort(option: str, value: str, allowed: Sequence[str]) -> str:
    """A sort key checked once, here: an old spelling gets the deprecation line and its new word; an
    unknown key is a one-line error listing the choices."""
    if value in OLD_SORT_KEYS:
        deprecated(f"{option} {value}", f"{option} {OLD_SORT_KEYS[value]}")
        value = OLD_SORT_KEYS[value]
    if value not in allowed:
        raise UsageError(f"{option} {value!r} is not a sort key; choose from {', '.join(allowed)}")
    return value


def main_tables(profile: Profile, args: argparse.Namespace, by: str | None = None) -> list[RenderableType]:
    """What a view prints first: the table ``--by line``/``--by type`` asks for, else the module
    tree and, with several steps, the steps table. ``by`` overrides ``args.by``."""
    ascii_only = True if args.ascii else None
    by = by or args.by
    if by == "line":
        sort = args.sort if args.by == "line" else "time"
        return [lines_table(profile.lines(sort_by=sort, limit=args.top or None), ascii_only=ascii_only)]
    if by == "type":
        sort = args.sort if args.by == "type" else "time"
        return [types_table(profile.by_type(depth=args.depth, sort_by=sort), ascii_only=ascii_only)]
    tree = tree_table(
        profile,
        depth=args.depth,
        min_share=args.min_share,
        sort_by=args.sort if args.by == by else "execution",
        ascii_only=ascii_only,
        per_step=args.per_step,
        peak_tflops=args.peak_tflops,
    )
    trigger = trigger_line(profile)
    if trigger is not None:  # a flight recorder's dump: what happened first, then the steps
        return [trigger, steps_table(step_rows(profile.steps), ascii_only=ascii_only), tree]
    if len(profile.steps) > 1:
        return [tree, steps_table(step_rows(profile.steps), ascii_only=ascii_only)]
    return [tree]


def print_profile(profile: Profile, args: argparse.Namespace) -> None:
    """The tree table, then the op table, on stdout (``--by line``/``type``: that table instead)."""
    console = make_console(sys.stdout)
    ascii_only = True if args.ascii else None
    for table in main_tables(profile, args):
        console.print(table)
    if args.by in ("line", "type"):
        return
    if args.top and (profile.op_rows or profile.meta.flight is None):  # a dump has no ops
        if args.group_by == "stack" and not profile.has_stacks:
            print(
                "note: this profile has no Python stacks (record it with --with-stack, or analyze a "
                "trace torch wrote with with_stack=True); ops are grouped by name",
                file=sys.stderr,
            )
        op_sort = args.op_sort or default_op_sort(profile)
        rows = profile.ops(
            sort_by=op_sort,
            group_by=_GROUP_ALIASES[args.group_by],
            limit=args.top,
            stack_depth=args.stack_depth,
            internal_frames=args.internal_frames,
        )
        console.print()
        console.print(
            ops_table(
                rows,
                ascii_only=ascii_only,
                total_cpu_us=profile.totals.cpu_us,
                title=f"Top {len(rows)} ops by {op_sort}"
                + (f" (totals over {len(profile.steps)} steps)" if len(profile.steps) > 1 else ""),
            )
        )


def add_scheduler_options(parser: argparse.ArgumentParser) -> None:
    """--jobs N (files read at once here) and --scheduler ADDRESS (a Dask cluster)."""
    group = parser.add_argument_group("many files")
    group.add_argument(
        "-j",
        "--jobs",
        type=int,
        metavar="N",
        help="files read at once, in N worker processes (default: one per usable core; 1: one after "
        "another, here). At most N traces are held while being read",
    )
    group.add_argument("--workers", dest="jobs", type=int, help=argparse.SUPPRESS)  # the former name
    group.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="read the files on the Dask cluster at ADDRESS (tcp://host:8786); its workers read them by "
        "path, so they must see the same filesystem (needs layerscope[dask])",
    )


def scheduler_of(args: argparse.Namespace) -> str | None:
    """The --scheduler address, checked: Dask must be importable before any file is read (and
    --jobs, which counts files read here, must be at least 1)."""
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {args.jobs}")
    address: str | None = args.scheduler
    if address is None:
        return None
    from layerscope.filemap import DASK_INSTALL_HINT

    try:
        import distributed  # noqa: F401
    except ImportError:
        raise UsageError(DASK_INSTALL_HINT) from None
    return address


def report_written(paths: list[Path] | list[str], quiet: bool = False) -> None:
    """One ``layerscope: saved PATH`` line on stderr per file a command wrote (none with ``-q``)."""
    for path in [] if quiet else paths:
        print(f"layerscope: saved {path}", file=sys.stderr)


def add_strict_option(parser: argparse.ArgumentParser) -> None:
    """--strict: fail on a malformed trace event instead of skipping and counting it."""
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail on the first malformed trace event (default: skip such events, count them, warn once)",
    )


def note_missing_modules(profile: Profile) -> None:
    """One line on stderr when a trace named no module, saying what the tree shows and how to get one."""
    source = profile.meta.module_source
    if source not in ("record_function regions", "none"):
        return
    shown = (
        "its record_function ranges are shown as top-level regions"
        if source != "none"
        else "all work is unattributed"
    )
    print(
        f"layerscope: note: this trace has no module information ({shown}); for a module tree, record "
        "with layerscope (ls.profile, layerscope run) or with torch.profiler(with_stack=True)",
        file=sys.stderr,
    )
