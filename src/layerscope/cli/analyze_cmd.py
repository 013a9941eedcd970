"""``layerscope analyze PATH``: any torch.profiler trace (file, TensorBoard folder, per-rank folder)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerscope.cli.outputs import add_output_options, is_file_path, requested_outputs
from layerscope.cli.rank_paths import show_rank_paths, write_path_json
from layerscope.cli.views import (
    add_scheduler_options,
    add_strict_option,
    add_view_options,
    check_view_options,
    note_missing_modules,
    print_profile,
    report_written,
    scheduler_of,
)
from layerscope.errors import UsageError

if TYPE_CHECKING:
    from layerscope.analysis.critical_path import PathWindow
    from layerscope.loading import Analysis


HELP = "analyse torch.profiler traces: tree, ops, device section, advice"
DESCRIPTION = (
    "Analyse a trace written by torch.profiler (.json or .json.gz), a TensorBoard log folder "
    "(*.pt.trace.json[.gz]) or a folder of per-rank traces: the module tree (from layerscope's ranges "
    "when present), the op table, a device section when the trace has device activity, and advice."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``analyze`` command's arguments."""
    parser.add_argument("path", help="a trace file or a folder of traces")
    add_output_options(
        parser,
        output_help="save the profile built from the trace: a file for one trace (its suffix names the "
        "format: .json.gz, .html, .txt...), else a folder (one <trace name>.json.gz each)",
        html_help="also write each trace's HTML report, beside its profile (without -o: beside the trace)",
    )
    add_view_options(parser)
    add_scheduler_options(parser)
    add_strict_option(parser)
    parser.set_defaults(top=10)
    path = parser.add_argument_group("critical path")
    path.add_argument(
        "--critical-path",
        action="store_true",
        help="the critical path: its length, time by bound type, the ops, kernels and modules on it",
    )
    path.add_argument("--step", type=int, metavar="N", help="the path of step N (default: the whole trace)")
    path.add_argument(
        "--annotation",
        metavar="TEXT",
        help="the critical path of the span named with TEXT (Holistic Trace Analysis's window), --instance N",
    )
    path.add_argument(
        "--instance",
        type=int,
        default=0,
        metavar="N",
        help="with --annotation: which span (0-based, in start order)",
    )
    path.add_argument(
        "--json",
        metavar="OUT",
        help='write {"critical_path": {...}} to OUT (one trace, or one path through a folder of rank traces)',
    )
    path.add_argument(
        "--hta-compatible",
        action="store_true",
        help="Holistic Trace Analysis's path and figures, not ours (docs/compared.md says where they differ)",
    )


class _Progress:
    """A progress line on stderr for reads that take more than a few seconds."""

    def __init__(self, path: Any) -> None:
        import time

        self.path = path
        self.clock = time.monotonic
        self.started = self.clock()
        self.last = 0.0
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if now - self.started < 3 or now - self.last < 1:
            return
        self.last = now
        rate = done / (now - self.started) / 1e6
        end = "\r" if sys.stderr.isatty() else "\n"
        print(
            f"layerscope: reading {self.path}: {done / 1e6:.0f} of {total / 1e6:.0f} MB ({rate:.0f} MB/s)",
            end=end,
            file=sys.stderr,
            flush=True,
        )
        self.shown = True


def run(args: argparse.Namespace) -> int:
    """Analyse and print every trace found."""
    from layerscope.loading import trace_files
    from layerscope.render.analysis import (
        advice_list,
        communication_table,
        device_section,
        device_summary_section,
    )
    from layerscope.render.console import make_console
    from layerscope.render.writers import write_outputs

    check_view_options(args)
    scheduler = scheduler_of(args)
    files = trace_files(args.path)
    window = _path_window(args)
    each = window if len(files) == 1 else None  # several traces: one path through the ranks, after
    if args.output and is_file_path(args.output) and len(files) > 1:
        raise UsageError(
            f"{args.path} holds {len(files)} traces: give -o a folder (one profile per trace), "
            f"not the file {args.output}"
        )
    written: list[Path] = []
    console = make_console(sys.stdout)
    ascii_only = True if args.ascii else None
    failures: list[tuple[Path, str]] = []  # filled while the results are taken
    results = _results(files, args, scheduler, failures, each)
    ranks: list[tuple[Path, Any]] = []
    for k, (path, result) in enumerate(results):
        ranks.append((path, result.profile.meta.distributed))
        trace = result.profile.meta.trace
        if trace.truncated:
            print(
                f"layerscope: warning: {path} ends early (a killed job?): {trace.lost_bytes} bytes "
                "after the last complete event were not read; analysing what is there",
                file=sys.stderr,
            )
        if len(files) > 1:
            console.print(("\n" if k else "") + f"== {path}", style="bold")
        note_missing_modules(result.profile)
        print_profile(result.profile, args)
        if result.device is not None:
            console.print(device_section(result.device, top=args.top, ascii_only=ascii_only))
        elif result.profile.meta.device is not None:  # a saved profile: its summary
            console.print(device_summary_section(result.profile.meta.device, ascii_only=ascii_only))
        if trace.communication:
            console.print(communication_table([dict(r) for r in trace.communication], ascii_only=ascii_only))
        console.print(advice_list(result.advice, ascii_only=ascii_only))
        if each is not None:
            written += _show_path(console, path, result, args, ascii_only)
        written += write_outputs(
            result.profile, requested_outputs(args, _trace_name(path), default_folder=path.parent)
        )
    if window is not None and len(files) > 1:
        written += show_rank_paths(console, ranks, window, args, ascii_only)
    report_written(written)
    for path, why in failures:
        # our own errors already start with the file's name; others get it in front
        print(f"layerscope: error: {why if why.startswith(str(path)) else f'{path}: {why}'}", file=sys.stderr)
    return 1 if failures else 0


def _path_window(args: argparse.Namespace) -> PathWindow | None:
    """The critical path's window when asked for (any of its options asks); None otherwise."""
    from layerscope.analysis.critical_path import PathWindow

    if not (
        args.critical_path
        or args.json
        or args.hta_compatible
        or args.step is not None
        or args.annotation is not None
    ):
        return None
    if args.step is not None and args.annotation is not None:
        raise UsageError("--step and --annotation both choose the window: give one")
    if args.instance < 0:
        raise UsageError(f"--instance counts from 0, not {args.instance}")
    return PathWindow(args.step, args.annotation, args.instance, args.hta_compatible)


def _show_path(
    console: Any, path: Path, result: Analysis, args: argparse.Namespace, ascii_only: bool | None
) -> list[Path]:
    """Print the critical path (``--json``: also write it); the files written."""
    from layerscope.render.critical_path import critical_path_section

    if result.critical_path is None:
        print(f"layerscope: {path} is a saved profile: the critical path needs a trace", file=sys.stderr)
        return []
    console.print(critical_path_section(result.critical_path, top=args.top, ascii_only=ascii_only))
    return write_path_json(args.json, str(path), result.critical_path)


def _results(
    files: list[Path],
    args: argparse.Namespace,
    scheduler: str | None,
    failures: list[tuple[Path, str]],
    window: PathWindow | None,
) -> Iterable[tuple[Path, Analysis]]:
    """Each file's analysis, in the files' order: on the Dask cluster, or here ``--jobs`` at a time
    (one file, or one job: one after another, with a progress line while a big trace is read). A
    file that fails among several goes to ``failures``; a single file's error is the command's."""
    from layerscope.filemap import ProgressLine, each_file, jobs_for, map_files
    from layerscope.loading import analyze, warm_for

    read = partial(analyze, strict=args.strict, critical_path=window)
    if scheduler is not None:
        mapped = map_files(read, files, scheduler=scheduler, what="analysed")
        failures += mapped.failures
        return zip(mapped.paths, mapped.results, strict=True)
    if len(files) == 1 or jobs_for(args.jobs, len(files)) == 1:
        return _analyze_each(files, args.strict, failures, window)
    return _analyze_parallel(
        each_file(read, files, args.jobs, prepare=partial(warm_for, files)),
        ProgressLine("analysed", len(files)),
        failures,
    )


def _analyze_parallel(
    outcomes: Iterator[tuple[Path, Analysis | None, str | None]],
    progress: Any,
    failures: list[tuple[Path, str]],
) -> Iterator[tuple[Path, Analysis]]:
    """The analyses of a parallel run as they are handed over in order; failures listed aside."""
    done = 0
    for path, result, why in outcomes:
        done += 1
        if why is not None:
            failures.append((path, why))
        progress.update(done, len(failures))
        if result is not None:
            yield path, result
    progress.update(done, len(failures), final=True)


def _analyze_each(
    files: list[Path], strict: bool, failures: list[tuple[Path, str]], window: PathWindow | None = None
) -> Iterator[tuple[Path, Analysis]]:
    """Analyse the files one at a time. A file that fails among several is listed in ``failures`` and
    the others are still analysed, as with ``--jobs N`` (exit 1 at the end); a single file's error
    is the command's error."""
    from layerscope.filemap import describe
    from layerscope.loading import analyze

    for path in files:
        try:
            result = analyze(path, progress=_Progress(path), strict=strict, critical_path=window)
        except Exception as exc:
            if len(files) == 1:
                raise
            failures.append((path, describe(exc)))
            continue
        yield path, result


def _trace_name(trace: Path) -> str:
    """A trace's name without ``.json``/``.json.gz``: its profile's name in an ``-o`` folder."""
    name = trace.name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
