"""Per-type totals: "all Linear layers: 62% of the time" (DeepSpeed's aggregated profile).

Without ``depth``, every module's *self* figures are summed per type, so nothing is counted twice and
the types add up to the whole tree. With ``depth``, only the modules at that depth count, with their
*inclusive* figures (their subtrees are disjoint, so again nothing is counted twice): the view of
the model at one level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from layerscope.errors import UsageError
from layerscope.model.metrics import sum_metrics
from layerscope.model.profile import ModuleNode, Profile
from layerscope.model.sort_keys import TYPE_SORT_KEYS, check_sort_key, metric_sort_value
from layerscope.model.tables import TypeStats, TypeTable


def type_table(profile: Profile, depth: int | None = None, sort_by: str = "time") -> TypeTable:
    """Modules summed per type (see the module's docstring); ``sort_by`` one of :data:`TYPE_SORT_KEYS`."""
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
        raise UsageError(f"depth must be a non-negative integer or None, not {depth!r}")
    sort_by = check_sort_key(sort_by, TYPE_SORT_KEYS, "types")
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
    table.sort(key=_sort_key(sort_by, profile.has_device_time))
    return table


def _sort_key(sort_by: str, has_device_time: bool) -> Callable[[TypeStats], Any]:
    if sort_by == "name":
        return lambda r: r.type_name
    if sort_by == "calls":
        return lambda r: -r.calls
    if sort_by == "params":
        return lambda r: -r.params
    value = metric_sort_value(sort_by, has_device_time)
    return lambda r: -(value(r.forward) + value(r.backward))


__all__ = ["TYPE_SORT_KEYS", "TypeStats", "TypeTable", "type_table"]
