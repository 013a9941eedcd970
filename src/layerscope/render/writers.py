"""The one output assembler: a Profile and the outputs asked for (paths, formats by extension) in,
files out, every one of them written atomically.

Renderers are registered by suffix in :data:`WRITERS`; each turns a profile into the bytes of one or
more files (CSV and Parquet write ``NAME.modules.*`` and ``NAME.ops.*``) and writes nothing itself.
:func:`write_outputs` resolves every request first (an unknown suffix fails before any work), renders
every file, and only then writes them through :func:`commit_files` (temp file, then rename): a
renderer that fails leaves no file of the request behind, and no file is ever half-written.
``Profile.save``, ``layerscope`` commands, ``ls.save_to`` and the integrations all write through it.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from layerscope.errors import UsageError
from layerscope.model.profile import Profile
from layerscope.model.serialize import encode_json, profile_to_dict, write_atomic
from layerscope.render.exports import collapsed_stacks, modules_csv, ops_csv

#: One file a renderer made: where it goes and its bytes.
RenderedFile = tuple[Path, bytes]


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
    """One output format: its name (``report --format``) and its renderer (profile -> files)."""

    format: str
    render: Callable[[Profile, Path, ExportOptions], list[RenderedFile]]

    def write(self, profile: Profile, path: Path, options: ExportOptions | None = None) -> list[Path]:
        """Render and write this format at ``path`` (through :func:`write_outputs`)."""
        return write_outputs(profile, [Output(Path(path), self.format)], options)


@dataclass(frozen=True, slots=True)
class Output:
    """One requested output: a path, and a format name when the suffix should not decide."""

    path: Path
    format: str | None = None


def _check_source_frames(profile: Profile, frames: str) -> None:
    if frames == "source" and not profile.has_stacks:
        raise UsageError(
            "--frames source needs Python stacks: record with --with-stack (ls.profile(..., "
            "with_stack=True)) or analyze a trace torch wrote with with_stack=True"
        )


def _stem(path: Path, suffix: str) -> str:
    return path.name[: -len(suffix)] if path.name.lower().endswith(suffix) else path.name


def render_html(profile: Profile, path: Path, options: ExportOptions) -> list[RenderedFile]:
    """The self-contained HTML report."""
    # Imported here: the report's assets and flame-graph code are not needed by the other formats.
    from layerscope.render.html import html_report

    return [(path, html_report(profile).encode())]


def render_csv(profile: Profile, path: Path, options: ExportOptions) -> list[RenderedFile]:
    """Two CSV files beside ``path``: ``STEM.modules.csv`` and ``STEM.ops.csv``."""
    stem = _stem(path, ".csv")
    return [
        (path.with_name(f"{stem}.modules.csv"), modules_csv(profile).encode()),
        (path.with_name(f"{stem}.ops.csv"), ops_csv(profile).encode()),
    ]


def _check_parquet() -> None:
    import importlib.util

    if not all(importlib.util.find_spec(name) for name in ("pandas", "pyarrow")):
        raise UsageError("writing .parquet needs pandas and pyarrow: pip install pandas pyarrow")


def render_parquet(profile: Profile, path: Path, options: ExportOptions) -> list[RenderedFile]:
    """Two Parquet files beside ``path``: ``STEM.modules.parquet`` and ``STEM.ops.parquet`` (the
    tables of ``Profile.to_pandas``); needs pandas and pyarrow."""
    _check_parquet()
    stem = _stem(path, ".parquet")
    files: list[RenderedFile] = []
    for table in ("modules", "ops"):
        buffer = io.BytesIO()
        profile.to_pandas(table).to_parquet(buffer, index=False)
        files.append((path.with_name(f"{stem}.{table}.parquet"), buffer.getvalue()))
    return files


def render_collapsed(profile: Profile, path: Path, options: ExportOptions) -> list[RenderedFile]:
    """Collapsed stacks (``frame;frame;op value`` lines) for flame-graph tools."""
    _check_source_frames(profile, options.frames)
    text = collapsed_stacks(profile, options.metric, options.frames, options.internal_frames)
    return [(path, text.encode())]


def render_svg(profile: Profile, path: Path, options: ExportOptions) -> list[RenderedFile]:
    """A standalone SVG flame graph."""
    from layerscope.render.flamegraph import flamegraph_svg

    _check_source_frames(profile, options.frames)
    svg = flamegraph_svg(
        profile, options.metric, frames_of=options.frames, internal_frames=options.internal_frames
    )
    return [(path, svg.encode())]


def render_text(profile: Profile, path: Path, options: ExportOptions) -> list[RenderedFile]:
    """The console view as plain text: the module tree, the step table (several steps), the top ops."""
    from layerscope.render.text_report import text_report

    return [(path, text_report(profile).encode())]


def render_profile(profile: Profile, path: Path, options: ExportOptions) -> list[RenderedFile]:
    """The profile itself, as ``.json`` or ``.json.gz`` (gzipped by the name)."""
    return [(path, encode_json(path, profile_to_dict(profile)))]


_HTML = Writer("html", render_html)
_COLLAPSED = Writer("collapsed", render_collapsed)
_JSON = Writer("json", render_profile)

#: Output suffix (lower case) -> writer.
WRITERS: dict[str, Writer] = {
    ".html": _HTML,
    ".htm": _HTML,
    ".csv": Writer("csv", render_csv),
    ".collapsed": _COLLAPSED,
    ".folded": _COLLAPSED,
    ".txt": Writer("txt", render_text),
    ".svg": Writer("svg", render_svg),
    ".json": _JSON,
    ".json.gz": _JSON,
    ".parquet": Writer("parquet", render_parquet),
}

#: Format name -> writer, in the order of :data:`WRITERS`.
FORMATS: dict[str, Writer] = {w.format: w for w in WRITERS.values()}


def writer_suffix(path: str | Path) -> str:
    """The registered suffix ``path`` ends with (the longest that matches, case-insensitive), or ""."""
    name = Path(path).name.lower()
    return next((s for s in sorted(WRITERS, key=len, reverse=True) if name.endswith(s)), "")


def find_writer(path: str | Path) -> Writer | None:
    """The writer for ``path``'s suffix (the longest that matches, case-insensitive), or None."""
    suffix = writer_suffix(path)
    return WRITERS[suffix] if suffix else None


def writer_for(path: str | Path) -> Writer:
    """The writer for ``path``'s suffix; UsageError naming the known suffixes when there is none."""
    writer = find_writer(path)
    if writer is None:
        raise UsageError(
            f"cannot tell the format of {Path(path).name} from its suffix; known suffixes: "
            + ", ".join(WRITERS)
        )
    return writer


def _resolve(request: str | Path | Output) -> tuple[Path, Writer]:
    if not isinstance(request, Output):
        return Path(request), writer_for(request)
    if request.format is None:
        return request.path, writer_for(request.path)
    if request.format not in FORMATS:
        raise UsageError(f"unknown format {request.format!r}; choose from {', '.join(FORMATS)}")
    return request.path, FORMATS[request.format]


def check_outputs(outputs: Iterable[str | Path | Output]) -> None:
    """Fail now, in one line, on a request :func:`write_outputs` would refuse (an unknown suffix or
    format, Parquet without pyarrow): for commands that check before a long capture."""
    for _, writer in map(_resolve, outputs):
        if writer.format == "parquet":
            _check_parquet()


def write_outputs(
    profile: Profile, outputs: Iterable[str | Path | Output], options: ExportOptions | None = None
) -> list[Path]:
    """Write ``profile`` once per requested output, the format from each path's suffix (or the
    :class:`Output`'s format); returns the paths written, in order. Every request is checked before
    any rendering, every file rendered before any is written: nothing is written when one fails."""
    resolved = [_resolve(request) for request in outputs]
    chosen = options if options is not None else ExportOptions()
    files = [file for path, writer in resolved for file in writer.render(profile, path, chosen)]
    return commit_files(files)


def commit_files(files: Sequence[RenderedFile]) -> list[Path]:
    """Write rendered files, each atomically (temp file in its folder, then rename), folders made as
    needed; the one place layerscope writes a result file."""
    written = []
    for path, payload in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        written.append(write_atomic(path, payload))
    return written
