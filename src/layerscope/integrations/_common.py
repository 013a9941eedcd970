"""Shared pieces of the integrations: a per-cycle handler that saves, writes a text report and says
where (the one ``layerscope: saved ... in ...`` line of every integration)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from layerscope.handlers import save_to

if TYPE_CHECKING:
    from layerscope.capture.session import Cycle


def text_report(cycle: Cycle) -> str:
    """The module tree, the step table and the top ops of one cycle, as plain text (the ``.txt``
    output's text)."""
    from layerscope.render.text_report import text_report as profile_text

    return profile_text(cycle.profile)


def announce_saved(paths: Sequence[Path], stream: TextIO | None = None) -> None:
    """One line on stderr naming the files a cycle wrote and their folder (frameworks log nothing
    of ours, so without it nobody knows where the profile went)."""
    if not paths:
        return
    names = ", ".join(Path(path).name for path in paths)
    print(f"layerscope: saved {names} in {Path(paths[0]).parent}", file=stream or sys.stderr, flush=True)


def start_flight_recorder(model: Any, folder: str | Path, options: FlightOptions) -> Any:
    """A flight recorder on ``model`` writing dumps into ``folder``, entered (the integration calls
    its ``step()`` per step and ``__exit__`` at the end)."""
    from layerscope.capture.flight_recorder import flight_recorder

    recorder = flight_recorder(
        model, keep=options.keep, detail_every=options.detail_every, out=folder, slow=options.slow
    )
    recorder.__enter__()
    return recorder


@dataclass(frozen=True)
class FlightOptions:
    """The integrations' flight recorder switch: ``keep`` steps, a full profile every
    ``detail_every`` steps (0: never), a dump for a step ``slow`` times the median (None: never)."""

    keep: int = 100
    detail_every: int = 0
    slow: float | None = 3.0


def save_with_report(
    directory: str | Path,
    *,
    trace: bool = False,
    rank: int | None = None,
    report: bool = True,
    announce: bool = True,
) -> Callable[[Cycle], None]:
    """``save_to`` plus, per cycle, the HTML report and the console view (``.txt``) beside the
    profile, all through the one output assembler; with ``announce`` (the main process: every rank
    writes, one says so), :func:`announce_saved`."""
    saver = save_to(directory, trace=trace, html=report, rank=rank, also=(".txt",) if report else ())
    written: list[Path] = saver.written  # type: ignore[attr-defined]

    def handler(cycle: Cycle) -> None:
        first = len(written)
        saver(cycle)
        if announce:
            announce_saved(written[first:])

    handler.written = written  # type: ignore[attr-defined]
    return handler
