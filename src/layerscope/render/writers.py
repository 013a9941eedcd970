"""File outputs of a Profile by suffix: one table that ``layerscope report`` and ``Profile.export`` share.

Every writer writes atomically (temp file, then rename) and returns the paths it wrote: two for CSV
(``NAME.modules.csv`` and ``NAME.ops.csv``), one for the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from layerscope.errors import UsageError
from layerscope.model.profile import Profile
from layerscope.model.serialize import write_atomic
from layerscope.render.exports import collapsed_stacks, modules_csv, ops_csv


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """Options of the stack-based outputs (collapsed stacks, SVG flame graph); the others ignore them.

    ``metric`` weighs the frames (see ``STACK_METRICS``); ``frames`` is ``"modules"`` or
    ``"source"`` (the ops' Python frames, for profiles recorded with stacks); ``internal_frames``
    keeps torch's and layerscope's own frames in source stacks.
    """

    metric: str = "cpu_us"
    frames: str = "modules"
    internal_frames: bool = False


@dataclass(frozen=True, slots=True)
class Writer:
    """One output format: its name (``report --format``) and how to write it."""

    format: str
    write: Callable[[Profile, Path, ExportOptions], list[Path]]


def _check_source_frames(profile: Profile, frames: str) -> None:
    if frames == "source" and not profile.has_stacks:
        raise UsageError(
            "--frames source needs Python stacks: record with --with-stack (ls.profile(..., "
            "with_stack=True)) or analyze a trace torch wrote with with_stack=True"
        )


def write_html(profile: Profile, path: Path, options: ExportOptions) -> list[Path]:
    """The self-contained HTML report."""
    # Imported here: the report's assets and flame-graph code are not needed by the other formats.
    from layerscope.render.html import write_html_report

    return [write_html_report(profile, path)]


def write_csv(profile: Profile, path: Path, options: ExportOptions) -> list[Path]:
    """Two CSV files beside ``path``: ``STEM.modules.csv`` and ``STEM.ops.csv``."""
    stem = path.name[: -len(".csv")] if path.name.lower().endswith(".csv") else path.name
    written = [path.with_name(f"{stem}.modules.csv"), path.with_name(f"{stem}.ops.csv")]
    write_atomic(written[0], modules_csv(profile).encode())
    write_atomic(written[1], ops_csv(profile).encode())
    return written


def write_collapsed(profile: Profile, path: Path, options: ExportOptions) -> list[Path]:
    """Collapsed stacks (``frame;frame;op value`` lines) for flame-graph tools."""
    _check_source_frames(profile, options.frames)
    text = collapsed_stacks(profile, options.metric, options.frames, options.internal_frames)
    return [write_atomic(path, text.encode())]


def write_svg(profile: Profile, path: Path, options: ExportOptions) -> list[Path]:
    """A standalone SVG flame graph."""
    from layerscope.render.flamegraph import flamegraph_svg

    _check_source_frames(profile, options.frames)
    svg = flamegraph_svg(
        profile, options.metric, frames_of=options.frames, internal_frames=options.internal_frames
    )
    return [write_atomic(path, svg.encode())]


def write_profile(profile: Profile, path: Path, options: ExportOptions) -> list[Path]:
    """The profile itself, as ``.json`` or ``.json.gz``."""
    return [profile.save(path)]


_HTML = Writer("html", write_html)
_COLLAPSED = Writer("collapsed", write_collapsed)
_JSON = Writer("json", write_profile)

#: Output suffix (lower case) -> writer.
WRITERS: dict[str, Writer] = {
    ".html": _HTML,
    ".htm": _HTML,
    ".csv": Writer("csv", write_csv),
    ".collapsed": _COLLAPSED,
    ".folded": _COLLAPSED,
    ".txt": _COLLAPSED,
    ".svg": Writer("svg", write_svg),
    ".json": _JSON,
    ".json.gz": _JSON,
}

#: Format name -> writer, in the order of :data:`WRITERS`.
FORMATS: dict[str, Writer] = {w.format: w for w in WRITERS.values()}


def find_writer(path: str | Path) -> Writer | None:
    """The writer for ``path``'s suffix (the longest that matches, case-insensitive), or None."""
    name = Path(path).name.lower()
    for suffix in sorted(WRITERS, key=len, reverse=True):
        if name.endswith(suffix):
            return WRITERS[suffix]
    return None


def writer_for(path: str | Path) -> Writer:
    """The writer for ``path``'s suffix; UsageError naming the known suffixes when there is none."""
    writer = find_writer(path)
    if writer is None:
        raise UsageError(
            f"cannot tell the format of {Path(path).name} from its suffix; known suffixes: "
            + ", ".join(WRITERS)
        )
    return writer
