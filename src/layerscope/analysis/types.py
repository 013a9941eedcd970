"""Per-type totals: "all Linear layers: 62% of the time" (DeepSpeed's aggregated profile).

Without ``depth``, every module's *self* figures are summed per type, so nothing is counted twice and
the types add up to the whole tree. With ``depth``, only the modules at that depth count, with their
*inclusive* figures (their subtrees are disjoint, so again nothing is counted twice): the view of
the model at one level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from layerscope.errors import UsageError
from layerscope.model.metrics import Metrics, PhaseTotals, sum_metrics
from layerscope.model.profile import ModuleNode, Profile

TYPE_SORT_KEYS = ("time", "cpu", "device", "flops", "params", "calls", "type")


@dataclass(frozen=True)
class TypeStats(PhaseTotals):
    """One module type: its instances (``modules``), their calls, forward and backward figures
    (self figures without a depth; inclusive at one depth: see the module's docstring), and their own
    parameters (all parameters of the subtree at one depth)."""

    type_name: str
    modules: int
    calls: int
    forward: Metrics
    backward: Metrics
    params: int


class TypeTable(list[TypeStats]):
    """The rows ``Profile.by_type()`` returns, heaviest first; ``time_kind`` is ``device`` when the
    profile has device time, else ``cpu``; ``depth`` is the depth asked for (None: every module)."""

    time_kind: str = "cpu"
    depth: int | None = None

    def time_of(self, row: TypeStats) -> float:
        """The time the table ranks and shares by."""
        return row.device_us if self.time_kind == "device" else row.cpu_us

    def share(self, row: TypeStats) -> float:
        """``row``'s fraction of the whole table's time (0 when there is none)."""
        whole = sum(self.time_of(r) for r in self)
        return self.time_of(row) / whole if whole > 0 else 0.0


def type_table(profile: Profile, depth: int | None = None, sort_by: str = "time") -> TypeTable:
    """Modules summed per type (see the module's docstring); ``sort_by`` one of :data:`TYPE_SORT_KEYS`."""
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
        raise UsageError(f"depth must be a non-negative integer or None, not {depth!r}")
    if sort_by not in TYPE_SORT_KEYS:
        raise UsageError(f"cannot sort types by {sort_by!r}; choose from {', '.join(TYPE_SORT_KEYS)}")
    inclusive = depth is not None
    groups: dict[str, list[ModuleNode]] = {}
    stack: list[tuple[ModuleNode, int]] = [(profile.root, 0)]
    while stack:  # depth from the tree itself (a folded tree's parent is not always the path's prefix)
        node, level = stack.pop()
        if depth is None or level == depth:
            groups.setdefault(node.type_name or "(root)", []).append(node)
        if depth is None or level < depth:
            stack.extend((child, level + 1) for child in node.children)
    rows = [
        TypeStats(
            type_name=name,
            modules=len(nodes),
            calls=sum(n.calls for n in nodes),
            forward=sum_metrics([n.forward if inclusive else n.forward.own() for n in nodes]),
            backward=sum_metrics([n.backward if inclusive else n.backward.own() for n in nodes]),
            params=sum(n.params_total if inclusive else n.params for n in nodes),
        )
        for name, nodes in groups.items()
    ]
    table = TypeTable(rows)
    table.time_kind = "device" if profile.has_device_time else "cpu"
    table.depth = depth
    table.sort(key=_sort_key(sort_by, table))
    return table


def _sort_key(sort_by: str, table: TypeTable) -> Callable[[TypeStats], Any]:
    if sort_by == "type":
        return lambda r: r.type_name
    if sort_by == "time":
        return lambda r: -table.time_of(r)
    attribute = {"cpu": "cpu_us", "device": "device_us", "flops": "flops", "params": "params"}.get(sort_by)
    return (lambda r: -r.calls) if attribute is None else (lambda r: -getattr(r, attribute))


__all__ = ["TYPE_SORT_KEYS", "TypeStats", "TypeTable", "type_table"]
