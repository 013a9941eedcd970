"""Tree transforms: fold modules into their ancestors (by depth or by share). Pure: new Profiles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from layerscope.model.metrics import ADDITIVE_PAIRS, Metrics
from layerscope.model.profile import ModuleNode, OpStats, Profile


def absorb(node: ModuleNode, removed: list[ModuleNode]) -> ModuleNode:
    """``node`` with ``removed`` children folded in: their totals join its self figures."""
    fwd, bwd, params = node.forward, node.backward, node.params
    for child in removed:
        fwd = _add_to_self(fwd, child.forward)
        bwd = _add_to_self(bwd, child.backward)
        params += child.params_total
    kept = tuple(c for c in node.children if all(c is not r for r in removed))
    return replace(node, forward=fwd, backward=bwd, params=params, children=kept)


def _add_to_self(own: Metrics, child: Metrics) -> Metrics:
    values = {}
    for self_name, _ in ADDITIVE_PAIRS:
        values[self_name] = getattr(own, self_name) + getattr(child, _total(self_name))
    return replace(own, **values)


def _total(self_name: str) -> str:
    return self_name.removeprefix("self_")


def _rebuild(profile: Profile, fold: Callable[[ModuleNode], bool]) -> tuple[Profile, int]:
    """Fold every non-root node for which ``fold(node)`` is true (with its subtree) into its parent."""
    moved: dict[str, str] = {}
    count = 0

    def visit(node: ModuleNode) -> ModuleNode:
        nonlocal count
        removed = [c for c in node.children if fold(c)]
        for child in removed:
            for sub in child.walk():
                moved[sub.path] = node.path
                count += 1
        node = absorb(node, removed)
        return replace(node, children=tuple(visit(c) for c in node.children))

    root = visit(profile.root)
    if not moved:
        return profile, 0
    rows = tuple(_remap(row, moved) for row in profile.op_rows)
    return replace(profile, root=root, op_rows=rows), count


def _remap(row: OpStats, moved: dict[str, str]) -> OpStats:
    if row.module is not None and row.module in moved:
        return replace(row, module=moved[row.module])
    return row


def fold_depth(profile: Profile, depth: int) -> Profile:
    """Keep modules up to ``depth`` levels below the root; deeper ones fold into their ancestor."""
    root_depth = 0

    def level(node: ModuleNode) -> int:
        return node.path.count(".") + 1 if node.path else root_depth

    return _rebuild(profile, lambda n: level(n) > depth)[0]


def prune_min_share(profile: Profile, min_share_pct: float) -> tuple[Profile, int]:
    """Fold modules whose forward+backward share of the run is below ``min_share_pct`` percent
    (device time when there is any, else CPU time). Returns the profile and how many were folded."""
    field = "device_us" if profile.has_device_time else "cpu_us"
    whole = float(getattr(profile.totals, field))
    if whole <= 0:
        return profile, 0
    limit = whole * min_share_pct / 100.0
    return _rebuild(profile, lambda n: getattr(n.forward, field) + getattr(n.backward, field) < limit)
