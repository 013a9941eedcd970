"""Ready-made ``on_trace_ready`` handlers: save every cycle, or print a summary of it."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from layerscope.capture.session import Cycle


def current_rank() -> int:
    """This process's rank: torch.distributed's when initialised, else $RANK, else 0."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:  # pragma: no cover - torch without distributed
        pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def cycle_file_name(cycle: Cycle, rank: int, suffix: str) -> str:
    """``rank0_steps12-14_20261122T041500_c0`` + suffix: rank, step range, time, cycle index."""
    steps = cycle.steps
    span = f"steps{steps[0]}-{steps[1]}" if steps else "nosteps"
    stamp = time.strftime("%Y%m%dT%H%M%S")
    return f"rank{rank}_{span}_{stamp}_c{cycle.index}{suffix}"


def _unused(path: Path) -> Path:
    """``path`` itself, or ``name-1``, ``name-2``...: an earlier cycle is never overwritten."""
    if not path.exists():
        return path
    stem, dot, rest = path.name.partition(".")
    k = 1
    while True:
        candidate = path.with_name(f"{stem}-{k}{dot}{rest}")
        if not candidate.exists():
            return candidate
        k += 1


def _write_cycle(
    cycle: Cycle, profile_path: Path, companion: Callable[[str], Path], *, trace: bool, also: Sequence[str]
) -> list[Path]:
    """Write a cycle's profile and its companions (one per suffix in ``also``, e.g. ``.html``,
    ``.txt``) through the output assembler, then its Chrome trace when asked (torch's events, not a
    rendering of the profile); their paths from ``companion(ending)``; the paths written."""
    from layerscope.render.writers import write_outputs

    others = [path for path in (companion(ending) for ending in also) if path != profile_path]
    written = write_outputs(cycle.profile, [profile_path, *others])
    if trace:
        written.append(cycle.export_chrome_trace(companion(".pt.trace.json.gz")))
    return written


def _companions(html: bool, also: Sequence[str]) -> tuple[str, ...]:
    """The suffixes written beside each cycle's profile, checked once (before any cycle runs)."""
    from layerscope.render.writers import writer_for

    suffixes = tuple(dict.fromkeys([*([".html"] if html else []), *also]))
    for suffix in suffixes:
        writer_for("cycle" + suffix)
    return suffixes


def save_to(
    directory: str | Path,
    *,
    trace: bool = False,
    html: bool = False,
    rank: int | None = None,
    also: Sequence[str] = (),
) -> Callable[[Cycle], None]:
    """A handler writing each cycle's profile (``.json.gz``) into ``directory``; with ``trace``, its
    Chrome trace (``.pt.trace.json.gz``); with ``html``, its HTML report (``.html``); ``also``: more
    formats beside it by suffix (``.txt``, ``.csv``, ``.svg``...: see ``Profile.save``). Names carry
    rank, step range and time; nothing is overwritten. The paths written are kept in the handler's
    ``written`` list."""
    folder = Path(directory)
    written: list[Path] = []
    companions = _companions(html, also)

    def handler(cycle: Cycle) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        who = current_rank() if rank is None else rank
        target = _unused(folder / cycle_file_name(cycle, who, ".json.gz"))

        def companion(ending: str) -> Path:
            return _unused(target.with_name(target.name.replace(".json.gz", ending)))

        written.extend(_write_cycle(cycle, target, companion, trace=trace, also=companions))

    handler.written = written  # type: ignore[attr-defined]
    return handler


class FileSaver:
    """``on_trace_ready`` handler for one named file (``run.json``, ``run.json.gz``, ``run.html``...:
    any suffix ``Profile.save`` writes).

    Cycle k is written as ``run.c<k>.json`` (with ``.pt.trace.json.gz`` / ``.html`` companions when
    asked); :meth:`finish` renames a lone cycle's files to the names asked for (``run.json``,
    ``run.pt.trace.json.gz``, ``run.html``). ``written`` lists the final paths.
    """

    def __init__(self, path: str | Path, *, trace: bool = False, html: bool = False) -> None:
        self.path = Path(path)
        self.trace, self.html = trace, html
        from layerscope.render.writers import writer_for, writer_suffix

        writer_for(self.path)  # an unknown suffix fails now, not after the first cycle
        name = self.path.name
        self.suffix = name[len(name) - len(writer_suffix(name)) :]
        self.stem = name[: -len(self.suffix)]
        self.written: list[Path] = []
        self.cycles = 0

    def __call__(self, cycle: Cycle) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.cycles += 1
        base = self.path.with_name(f"{self.stem}.c{cycle.index}")

        def companion(ending: str) -> Path:
            return base.with_name(base.name + ending)

        written = _write_cycle(
            cycle, companion(self.suffix), companion, trace=self.trace, also=(".html",) if self.html else ()
        )
        self.written.extend(written)

    def finish(self) -> None:
        """With exactly one cycle, give its files the names asked for (``NAME.c0.*`` -> ``NAME.*``)."""
        if self.cycles != 1:
            return
        prefix = f"{self.stem}.c0"
        renamed: list[Path] = []
        for source in self.written:
            if not source.name.startswith(prefix):
                renamed.append(source)
                continue
            target = source.with_name(self.stem + source.name[len(prefix) :])
            os.replace(source, target)
            renamed.append(target)
        self.written = renamed


def print_summary(
    file: IO[str] | None = None, depth: int | None = 2, top: int = 10, min_share: float = 0.0
) -> Callable[[Cycle], None]:
    """A handler printing each cycle's module tree, its step table and the top ops."""

    def handler(cycle: Cycle) -> None:
        from layerscope.analysis.steps import step_rows
        from layerscope.render.console import make_console, ops_table, steps_table, tree_table

        console = make_console(file if file is not None else sys.stderr)
        p = cycle.profile
        console.print(
            f"layerscope cycle {cycle.index}"
            + (f" (steps {cycle.steps[0]}-{cycle.steps[1]})" if cycle.steps else "")
        )
        console.print(tree_table(p, depth=depth, min_share=min_share))
        if len(p.steps) > 1:
            console.print(steps_table(step_rows(p.steps)))
        if top:
            console.print(ops_table(p.ops(limit=top), total_cpu_us=p.totals.cpu_us))

    return handler
