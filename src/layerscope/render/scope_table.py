"""The scope plan of a live profile as a table: how each module's calls were scoped, and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich import box
from rich.table import Table

from layerscope.errors import UsageError
from layerscope.model.profile import Profile


@dataclass(frozen=True)
class ScopeRow:
    """One module's scope as saved in ``meta["scope_plan"]`` (``capture/scope_plan.py`` writes it)."""

    path: str
    type_name: str
    mechanism: str
    clock: str | None
    reason: str


def scope_rows(profile: Profile) -> list[ScopeRow]:
    """Each module's scope, in model order; a :class:`UsageError` when the profile has no plan."""
    plan: Any = profile.meta.get("scope_plan")
    if not isinstance(plan, dict) or not isinstance(plan.get("reasons"), list):
        raise UsageError(
            "this profile has no scope plan: only live captures keep one "
            "(not traces, nor profiles saved before layerscope 0.2)"
        )
    reasons = plan["reasons"]
    return [
        ScopeRow(str(path), str(type_name), *_reason(reasons, k))
        for path, type_name, k in plan.get("modules", [])
    ]


def _reason(reasons: list[Any], k: int) -> tuple[str, str | None, str]:
    mechanism, clock, reason = reasons[k]
    return str(mechanism), clock if clock is None else str(clock), str(reason)


def scope_table(profile: Profile, ascii_only: bool = False) -> Table:
    """Module, type, mechanism, clock and reason for every module of the plan."""
    table = Table(
        title=f"module scopes: {profile.meta.get('module_scopes', '?')}",
        box=box.ASCII if ascii_only else box.HEAVY_HEAD,
        title_justify="left",
    )
    for title in ("Module", "Type", "Mechanism", "Clock", "Reason"):
        table.add_column(title, overflow="fold")
    for row in scope_rows(profile):
        table.add_row(row.path or "(root)", row.type_name, row.mechanism, row.clock or "-", row.reason)
    return table
