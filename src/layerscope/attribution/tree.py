"""Assembling the immutable module tree from per-module own metrics."""

from __future__ import annotations

from layerscope.attribution.catalog import ModuleInfo
from layerscope.model.metrics import ADDITIVE_PAIRS, PEAK_FIELDS, Metrics
from layerscope.model.profile import ModuleNode


def with_children_totals(own: Metrics, children: list[Metrics]) -> Metrics:
    """``own`` holds self figures; return it with totals = self + children's totals and peaks maxed."""
    values: dict[str, float | int] = {}
    for self_name, total_name in ADDITIVE_PAIRS:
        value = getattr(own, self_name)
        values[self_name] = value
        values[total_name] = value + sum(getattr(c, total_name) for c in children)
    for name in PEAK_FIELDS:
        values[name] = max([getattr(own, name)] + [getattr(c, name) for c in children])
    return Metrics(**values)  # type: ignore[arg-type]


def assemble_tree(
    catalog: list[ModuleInfo],
    own: list[tuple[Metrics, Metrics]],
    calls: list[int],
    first_call: dict[int, int],
) -> ModuleNode:
    """Build the tree bottom-up. Children are ordered by their first call (execution order); modules
    never called and with no work below them are left out (the root always stays)."""
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
    never = len(catalog)

    def build(i: int) -> ModuleNode | None:
        kids = [
            k
            for k in (
                build(c) for c in sorted(children_of.get(i, []), key=lambda c: (first_call.get(c, never), c))
            )
            if k is not None
        ]
        fwd, bwd = own[i]
        if i != root and calls[i] == 0 and not kids and fwd == Metrics() and bwd == Metrics():
            return None
        info = catalog[i]
        return ModuleNode(
            path=info.path,
            type_name=info.type_name,
            calls=calls[i],
            params=info.params,
            params_total=info.params_total,
            input_shapes=info.input_shapes,
            output_shapes=info.output_shapes,
            forward=with_children_totals(fwd, [k.forward for k in kids]),
            backward=with_children_totals(bwd, [k.backward for k in kids]),
            children=tuple(kids),
            source=info.source,
        )

    node = build(root)
    assert node is not None
    return node
