"""What the commands write, spelt one way: ``-o/--output PATH`` is always a path (a file when its
suffix names a format, else a folder) and ``--html`` always a flag ("also write the HTML report",
beside the output). Old spellings work for one release, with one ``deprecated`` line on stderr."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from layerscope.render.writers import find_writer, writer_suffix

#: 0.1's ``--html PATH`` (profile, merge) becomes this hidden option before parsing.
HTML_FILE_OPTION = "--html-file"


def deprecated(old: str, new: str) -> None:
    """The one stderr line of a deprecated spelling."""
    print(
        f"layerscope: warning: {old} is deprecated and will be removed in the next release; use {new}",
        file=sys.stderr,
    )


class DeprecatedAlias(argparse.Action):
    """Stores like ``store`` (or ``store_true`` with ``nargs=0``) and warns when given under one of
    ``old`` spellings (``metavar`` of the new one in the message)."""

    def __init__(self, option_strings: Sequence[str], dest: str, old: Sequence[str] = (), **kwargs: Any):
        self.old = tuple(old)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: str | None = None
    ) -> None:
        if option_string in self.old:
            current = [s for s in self.option_strings if s not in self.old]
            deprecated(option_string, "/".join(current))
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


class _HtmlFile(argparse.Action):
    """``--html PATH`` as it was: HTML at PATH, with the deprecation line."""

    def __call__(
        self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: str | None = None
    ) -> None:
        deprecated(f"--html {values}", "--html (a flag: the report beside -o) or -o FILE.html")
        namespace.html = True
        namespace.html_file = values


def is_html_path(token: str) -> bool:
    """Whether a token after ``--html`` is the old form's path rather than the next argument."""
    return token.lower().endswith((".html", ".htm"))


def legacy_argv(tokens: Sequence[str]) -> list[str]:
    """``--html PATH`` / ``--html=PATH`` (a path ending in .html/.htm) -> ``--html-file PATH``: the flag
    stays a flag, and the old form still parses (argparse cannot tell them apart by itself)."""
    out: list[str] = []
    k = 0
    while k < len(tokens):
        token = tokens[k]
        if token == "--html" and k + 1 < len(tokens) and is_html_path(tokens[k + 1]):
            out += [HTML_FILE_OPTION, tokens[k + 1]]
            k += 2
            continue
        if token.startswith("--html="):
            out += [HTML_FILE_OPTION, token[len("--html=") :]]
        else:
            out.append(token)
        k += 1
    return out


def add_output_options(parser: argparse.ArgumentParser, output_help: str, html_help: str) -> None:
    """``-o/--output PATH`` and ``--html`` (the flag), and the hidden old ``--html PATH``."""
    parser.add_argument("-o", "--output", metavar="PATH", help=output_help)
    parser.add_argument("--html", action="store_true", help=html_help)
    parser.add_argument(HTML_FILE_OPTION, action=_HtmlFile, default=None, help=argparse.SUPPRESS)


def is_file_path(path: str | Path) -> bool:
    """Whether ``-o PATH`` names a file (its suffix names a format) rather than a folder."""
    return find_writer(path) is not None


def stem_of(path: Path) -> Path:
    """``path`` without its format suffix (``run.json.gz`` -> ``run``)."""
    suffix = writer_suffix(path)
    return path.with_name(path.name[: len(path.name) - len(suffix)]) if suffix else path


def requested_outputs(
    args: argparse.Namespace, name: str, *, default_folder: Path | None = None
) -> list[Path]:
    """The files a command writes for one result called ``name``: ``-o FILE`` itself, or in an ``-o
    FOLDER`` ``NAME.json.gz``; with ``--html`` the HTML report beside it (``NAME.html`` in the
    folder, or in ``default_folder``/the working folder without ``-o``); the old ``--html PATH`` at
    PATH."""
    output = getattr(args, "output", None)
    paths: list[Path] = []
    if output:
        target = Path(output)
        paths.append(target if is_file_path(target) else target / f"{name}.json.gz")
    html_file = getattr(args, "html_file", None)
    if html_file:
        paths.append(Path(html_file))
    elif getattr(args, "html", False):
        beside = stem_of(paths[0]) if paths else (default_folder or Path(".")) / name
        html = beside.with_name(beside.name + ".html")
        if html not in paths:
            paths.append(html)
    return paths
