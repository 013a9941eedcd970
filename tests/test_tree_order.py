"""Children in execution order: a container never called itself sits where its first descendant ran."""

from __future__ import annotations

import torch
from torch import nn

import layerscope as ls
from layerscope.attribution.catalog import ModuleInfo
from layerscope.attribution.tree import assemble_tree
from layerscope.model.metrics import Metrics
from layerscope.model.profile import ModuleNode
from layerscope.models import TinyGPT


def first_calls(model: nn.Module) -> dict[str, int]:
    """Each module's position in the order modules were first called, seen by hooks of our own."""
    order: dict[str, int] = {}
    handles = []
    for path, module in model.named_modules():

        def pre(_: nn.Module, __: object, path: str = path) -> None:
            order.setdefault(path, len(order))

        handles.append(module.register_forward_pre_hook(pre))
    model(torch.randint(0, 128, (2, 16)))
    for handle in handles:
        handle.remove()
    return order


def earliest(node: ModuleNode, order: dict[str, int]) -> int:
    return min(order.get(n.path, len(order)) for n in node.walk())


def test_gpt_children_follow_execution_order() -> None:
    model = TinyGPT(layers=3)
    order = first_calls(model)
    assert "blocks" not in order  # the ModuleList is never called itself
    with ls.profile(model) as prof:
        model(torch.randint(0, 128, (2, 16))).sum().backward()
    p = prof.profile
    p.validate()
    assert [c.path for c in p.root.children] == ["tok", "pos", "blocks", "ln_f", "head"]
    for node in p.modules():
        starts = [earliest(child, order) for child in node.children]
        assert starts == sorted(starts), node.path


def test_global_mode_orders_a_container_by_its_first_descendant() -> None:
    model = TinyGPT(layers=2)
    with ls.profile(None) as prof:
        model(torch.randint(0, 128, (2, 16)))
    (root,) = prof.profile.root.children
    assert [c.path.split(".")[-1] for c in root.children] == ["tok", "pos", "blocks", "ln_f", "head"]


def test_assemble_tree_uses_the_earliest_descendant_call() -> None:
    # "" -> a (called second), list (never called) -> list.0 (called first); c never called at all.
    catalog = [
        ModuleInfo(path="", type_name="Net", parent=None),
        ModuleInfo(path="a", type_name="Linear", parent=""),
        ModuleInfo(path="list", type_name="ModuleList", parent=""),
        ModuleInfo(path="list.0", type_name="Linear", parent="list"),
        ModuleInfo(path="c", type_name="Linear", parent=""),
    ]
    busy = (Metrics(self_cpu_us=1.0, cpu_us=1.0), Metrics())
    own = [busy, busy, (Metrics(), Metrics()), busy, busy]
    tree = assemble_tree(catalog, own, calls=[1, 1, 0, 1, 0], first_call={0: 0, 3: 1, 1: 2})
    assert [c.path for c in tree.children] == ["list", "a", "c"]
