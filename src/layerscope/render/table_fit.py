"""Console tables described column by column and fitted to the terminal width.

Every console table (module tree, ops, steps, diff, ranks, device section) is a sequence of
:class:`Column` specs and sections of row records; :class:`FittedTable` turns them into a rich table
at render time, leaving out whole columns by their ``drop`` rank when the terminal is too narrow.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

#: What a cell function returns: plain text, or styled text (never markup).
Cell = Text | str

R = TypeVar("R")

#: How narrow the first (label) column may get before whole columns are left out.
LABEL_MIN_WIDTH = 24
#: " | " between columns (padding 1 + rule 1 + padding 1); the tables have no outer edge.
GUTTER = 3


@dataclass(frozen=True, slots=True)
class Column(Generic[R]):
    """One column of a console table: what it shows of a row record and how it behaves.

    ``cell`` maps a row record to the cell. ``shown`` is False for a column the data has nothing
    for (no device time, no memory...). ``drop`` ranks the column for leaving out when the terminal
    is too narrow: 1 goes first, ``None`` never goes. ``justify="left"`` marks a text column
    (clipped rather than widened); numbers are right-justified. The first column of a table is its
    label column whatever its ``justify``: it shrinks with an ellipsis before anything is dropped.
    """

    key: str
    title: str
    cell: Callable[[R], Cell]
    justify: Literal["left", "right"] = "right"
    style: str | None = None
    drop: int | None = None
    shown: bool = True


def item(k: int) -> Callable[[Sequence[Cell]], Cell]:
    """A cell function for rows that are already tuples of cells: the ``k``-th one."""

    def cell(row: Sequence[Cell]) -> Cell:
        return row[k]

    return cell


def wants_ascii() -> bool:
    """ASCII-only output: asked for with ``LAYERSCOPE_ASCII``, or stdout cannot encode Unicode."""
    if os.environ.get("LAYERSCOPE_ASCII"):
        return True
    encoding = getattr(getattr(sys, "stdout", None), "encoding", None) or "utf-8"
    return "utf" not in encoding.lower()


def drop_order(columns: Sequence[Column[R]]) -> list[str]:
    """The keys of the shown, droppable columns, first to be left out first."""
    ranked = [(c.drop, n, c.key) for n, c in enumerate(columns) if c.shown and c.drop is not None]
    return [key for _, _, key in sorted(ranked)]


class FittedTable(Generic[R]):
    """A table fitted to the console width at render time.

    The first column (tree labels, op names) shrinks with an ellipsis down to 24 characters; when
    even that is not enough, whole columns are left out in their ``drop`` order rather than numbers
    being cut in the middle. Cells are computed once, when the table is built.
    """

    def __init__(
        self,
        columns: Sequence[Column[R]],
        sections: Sequence[Sequence[R]],
        ascii_only: bool,
        caption: str = "",
        title: str = "",
    ) -> None:
        self.columns = [c for c in columns if c.shown]
        self.sections = [[tuple(c.cell(row) for c in self.columns) for row in s] for s in sections if s]
        self.ascii_only = ascii_only
        self.caption = caption
        self.title = title

    def _width(self, k: int) -> int:
        cells = [row[k] for section in self.sections for row in section]
        # Multi-line cells (source locations, one frame per line) are as wide as their widest line.
        return max(
            [len(self.columns[k].title)]
            + [max(map(len, (c.plain if isinstance(c, Text) else c).split("\n"))) for c in cells]
        )

    def kept_columns(self, max_width: int) -> list[str]:
        """The keys of the columns that fit in ``max_width`` characters."""
        return [self.columns[k].key for k in self._fit(max_width)[0]]

    def _fit(self, max_width: int) -> tuple[list[int], list[int], int]:
        """(indices of the kept columns, every column's width, the label column's width)."""
        widths = [self._width(k) for k in range(len(self.columns))]
        keep = list(range(len(self.columns)))
        label_min = min(widths[0], LABEL_MIN_WIDTH)

        def needed(kept: list[int]) -> int:
            return sum(widths[k] for k in kept[1:]) + label_min + GUTTER * (len(kept) - 1)

        index = {c.key: k for k, c in enumerate(self.columns)}
        for key in drop_order(self.columns):
            if needed(keep) <= max_width:
                break
            if index[key] in keep:
                keep.remove(index[key])
        label_width = max(label_min, min(widths[0], max_width - needed(keep) + label_min))
        return keep, widths, label_width

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        keep, widths, label_width = self._fit(options.max_width)
        overflow: Literal["ellipsis", "crop"] = "crop" if self.ascii_only else "ellipsis"
        table = Table(
            box=box.ASCII2 if self.ascii_only else box.SIMPLE_HEAVY,
            show_edge=False,
            pad_edge=False,
            caption=self.caption or None,
            caption_justify="left",
            title=self.title or None,
            title_justify="left",
            header_style="bold",
        )
        for k in keep:
            column = self.columns[k]
            if k == 0:
                table.add_column(column.title, no_wrap=True, overflow=overflow, width=label_width)
            elif column.justify == "left":
                table.add_column(
                    column.title, no_wrap=True, overflow=overflow, width=widths[k], style=column.style
                )
            else:
                table.add_column(
                    column.title, justify="right", no_wrap=True, width=widths[k], style=column.style
                )
        limits = {k: (label_width if k == 0 else widths[k]) for k in keep}
        for n, section in enumerate(self.sections):
            if n:
                table.add_section()
            for row in section:
                table.add_row(*(self._cell(row[k], limits[k]) for k in keep))
        yield table

    def _cell(self, value: Cell, width: int) -> Text:
        """Cells are Text, never markup: module and op names such as ``[memory]`` or a ModuleDict key
        ``[bold]`` must print as written. In ASCII mode, units and ellipses are spelled in ASCII and
        long text is clipped here."""
        if not self.ascii_only:
            return value if isinstance(value, Text) else Text(value)
        plain = value.plain if isinstance(value, Text) else value
        plain = plain.replace("µ", "u").replace("…", "...").replace("—", "-")
        if len(plain) > width:
            plain = plain[: max(0, width - 3)] + "..."
        return Text(plain, style=value.style) if isinstance(value, Text) else Text(plain)
