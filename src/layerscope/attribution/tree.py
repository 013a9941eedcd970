"""Assembling the immutable module tree from per-module own metrics."""

from __future__ import annotations

from typing import Any

from layerscope.attribution.buckets import Buckets, NameRoles
from layerscope.attribution.catalog import ModuleInfo
from layerscope.attribution.nesting import Sweep
from layerscope.events.table import EventTable
from layerscope.model.metrics import ADDITIVE_PAIRS, FIELD_NAMES, PEAK_FIELDS, Metrics
from layerscope.model.profile import ModuleNode


def with_children_totals(own: Metrics, children: list[Metrics]) -> Metrics:
    """``own`` holds self figures; return it with totals = self + children's totals and peaks maxed."""
    values: list[Any] = own.to_list()
    kids = [c.to_list() for c in children]
    for self_at, total_at in _PAIR_AT:
        values[total_at] = values[self_at] + sum(k[total_at] for k in kids)
    for at in _PEAK_AT:
        values[at] = max([values[at]] + [k[at] for k in kids])
    return Metrics(*values)


#: Positions in ``Metrics.to_list()`` of each additive pair (self, total) and of the peaks.
_PAIR_AT = [(FIELD_NAMES.index(s), FIELD_NAMES.index(t)) for s, t in ADDITIVE_PAIRS]
_PEAK_AT = [FIELD_NAMES.index(name) for name in PEAK_FIELDS]


def assemble_tree(
    catalog: list[ModuleInfo],
    own: list[tuple[Metrics, Metrics]],
    calls: list[int],
    first_call: dict[int, int],
    recompute_calls: list[int] | None = None,
) -> ModuleNode:
    """Build the tree bottom-up. Children are ordered by their first call (execution order); a module
    never called itself (a ``ModuleList``) takes its earliest descendant's first call, so a container
    sits where its work began. Modules never called and with no work below them are left out (the
    root always stays)."""
    children_of: dict[int, list[int]] = {}
    index = {info.path: i for i, info in enumerate(catalog)}
    root = -1
    for i, info in enumerate(catalog):
        if info.parent is None:
            if root >= 0:
                raise ValueError(f"two roots in the module catalog: {catalog[root].path!r}, {info.path!r}")
            root = i
        else:
            children_of.setdefault(index[info.parent], []).append(i)
    if root < 0:
        raise ValueError("the module catalog has no root")
    never = len(catalog) + len(first_call)  # after every real call position
    # Bottom-up without recursion (a recursive closure would be a reference cycle holding the nodes).
    built: dict[int, tuple[ModuleNode | None, int]] = {}
    pending = [(root, False)]
    while pending:
        i, children_done = pending.pop()
        kids = children_of.get(i, [])
        if not children_done:
            pending.append((i, True))
            pending.extend((c, False) for c in kids)
            continue
        counts = (calls[i], recompute_calls[i] if recompute_calls is not None else 0)
        built[i] = _node(
            i, [(*built.pop(c), c) for c in kids], i == root, catalog, own, counts, first_call.get(i, never)
        )
    node = built[root][0]
    assert node is not None
    return node


def _node(
    i: int,
    built: list[tuple[ModuleNode | None, int, int]],
    is_root: bool,
    catalog: list[ModuleInfo],
    own: list[tuple[Metrics, Metrics]],
    counts: tuple[int, int],
    first: int,
) -> tuple[ModuleNode | None, int]:
    """The node of module ``i`` (None when left out) and the earliest first call in its subtree,
    from its children's ``(node, earliest first call, catalog index)``; ``counts`` are its forward
    calls and its recomputations."""
    # Ties (modules never called) keep the catalog order, which is the model's.
    built.sort(key=lambda entry: (entry[1], entry[2]))
    kids = [node for node, _, _ in built if node is not None]
    earliest = min([first, *(f for _, f, _ in built)])
    fwd, bwd = own[i]
    calls, recompute_calls = counts
    if not is_root and calls == 0 and not kids and fwd == Metrics() and bwd == Metrics():
        return None, earliest
    info = catalog[i]
    node = ModuleNode(
        path=info.path,
        type_name=info.type_name,
        calls=calls,
        params=info.params,
        params_total=info.params_total,
        input_shapes=info.input_shapes,
        output_shapes=info.output_shapes,
        forward=with_children_totals(fwd, [k.forward for k in kids]),
        backward=with_children_totals(bwd, [k.backward for k in kids]),
        children=tuple(kids),
        source=info.source,
        recompute_calls=recompute_calls,
    )
    return node, earliest


def module_tree(
    table: EventTable, named: NameRoles, buckets: Buckets, swept: Sweep, per_bucket: list[Metrics]
) -> ModuleNode:
    """The module tree from the sweep and per-bucket metrics, children in order of first call."""
    own = [
        (per_bucket[buckets.forward(m)], per_bucket[buckets.backward(m)]) for m in range(buckets.module_count)
    ]
    first_call: dict[int, int] = {}
    for name_id in table.array("span_name")[swept.module_windows].tolist():
        first_call.setdefault(named.role_module[name_id], len(first_call))
    return assemble_tree(named.catalog, own, swept.module_calls, first_call, swept.recompute_calls)
