"""The scope plan of a live profile as a table: how each module's calls were scoped, and why."""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from layerscope.errors import UsageError
from layerscope.model.profile import Profile
from layerscope.render.table_fit import Column, wants_ascii


@dataclass(frozen=True)
class ScopeRow:
    """One module's scope as saved in ``meta.capture.scope_plan`` (``capture/scope_plan.py`` writes it)."""

    path: str
    type_name: str
    mechanism: str
    clock: str | None
    reason: str


def scope_rows(profile: Profile) -> list[ScopeRow]:
    """Each module's scope, in model order; a :class:`UsageError` when the profile has no plan."""
    capture = profile.meta.capture
    if capture is None or not capture.scope_plan.reasons:
        raise UsageError(
            "this profile has no scope plan: only live captures keep one "
            "(not traces, nor profiles saved before layerscope 0.2)"
        )
    reasons = capture.scope_plan.reasons
    return [
        ScopeRow(path, type_name, reasons[k].mechanism, reasons[k].clock, reasons[k].reason)
        for path, type_name, k in capture.scope_plan.modules
    ]


SCOPE_COLUMNS: tuple[Column[ScopeRow], ...] = (
    Column("module", "Module", lambda r: r.path or "(root)", justify="left"),
    Column("type", "Type", lambda r: r.type_name, justify="left", drop=2),
    Column("mechanism", "Mechanism", lambda r: r.mechanism, justify="left"),
    Column("clock", "Clock", lambda r: r.clock or "-", justify="left", drop=1),
    Column("reason", "Reason", lambda r: r.reason, justify="left"),
)


def scope_table(profile: Profile, ascii_only: bool | None = None) -> RenderableType:
    """Module, type, mechanism, clock and reason for every module of the plan, under a title line.

    Reasons are prose: on a narrow terminal they wrap (a plain rich table with folding cells)
    rather than columns being left out as :class:`FittedTable` does for figures."""
    ascii_table = wants_ascii() if ascii_only is None else ascii_only
    table = Table(box=box.ASCII2 if ascii_table else box.SIMPLE_HEAVY, pad_edge=False)
    for column in SCOPE_COLUMNS:
        table.add_column(column.title, overflow="fold", no_wrap=column.key != "reason")
    for row in scope_rows(profile):
        table.add_row(*(column.cell(row) for column in SCOPE_COLUMNS))
    kinds = profile.meta.capture.scope_plan.kinds if profile.meta.capture is not None else "?"
    title = Text(f"module scopes: {kinds}", style="bold")
    return Group(title, table)
