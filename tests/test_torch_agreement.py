"""Our numbers against torch's own where both measure the same thing."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import layerscope as ls
from layerscope.capture.clock_anchors import ANCHOR_NAME
from layerscope.models import TinyGPT
from tests.fixtures.models import Containers, TinyMLP, tiny_resnet

MODELS = {
    "mlp": (TinyMLP, lambda: torch.randn(8, 8)),
    "containers": (Containers, lambda: torch.randn(4, 8)),
    "resnet": (tiny_resnet, lambda: torch.randn(2, 3, 32, 32)),
    "gpt": (
        lambda: TinyGPT(vocab=64, dim=32, heads=2, layers=2, max_len=16),
        lambda: torch.randint(0, 64, (2, 16)),
    ),
}


def capture(
    name: str, memory: bool = False, module_scopes: str = "auto"
) -> tuple[ls.profile, nn.Module, torch.Tensor]:
    factory, make_input = MODELS[name]
    model = factory()
    x = make_input()
    model(x).sum().backward()  # warm-up
    with ls.profile(model, memory=memory, module_scopes=module_scopes) as prof:
        model(x).float().sum().backward()
    return prof, model, x


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(("memory", "module_scopes"), [(False, "auto"), (True, "auto"), (False, "ranges")])
def test_op_self_cpu_matches_key_averages(name: str, memory: bool, module_scopes: str) -> None:
    prof, _, _ = capture(name, memory, module_scopes)
    p = prof.profile
    p.validate()
    marks = p.meta.capture.scope_plan.kinds == "marks"
    assert marks == (module_scopes == "auto" and p.meta.capture.reader == "native")
    averages = prof.torch_profiler.key_averages()
    # Step ranges are no op rows of ours (their self time is our "(Python between ops)"; with marks,
    # torch also counts there the time inside a module but outside its ops).
    skipped = ("ls:", "ProfilerStep", ANCHOR_NAME)  # our ranges, torch's steps, our clock anchors
    # torch lists our module ranges as rows too; everything else is an op row of ours.
    theirs_ops = sum(e.self_cpu_time_total for e in averages if not e.key.startswith(skipped))
    ours_ops = sum(r.metrics.self_cpu_us for r in p.op_rows if not r.name.startswith(skipped))
    assert ours_ops == pytest.approx(theirs_ops, rel=0.02)
    # The covered time is the same either way.
    theirs_all = sum(e.self_cpu_time_total for e in averages)
    assert p.totals.cpu_us == pytest.approx(theirs_all, rel=0.02)
    # Per op name, calls agree exactly and self time within 2%.
    ours_by_name: dict[str, tuple[int, float]] = {}
    for row in p.ops(group_by=("name",)):
        assert not row.name.startswith("ProfilerStep")
        calls, self_us = ours_by_name.get(row.name, (0, 0.0))
        ours_by_name[row.name] = (calls + row.calls, self_us + row.metrics.self_cpu_us)
    for e in averages:
        if e.key.startswith(skipped) or e.key == "[memory]":  # ranges and allocation markers, not ops
            continue
        calls, self_us = ours_by_name[e.key]
        assert calls == e.count, e.key
        assert self_us == pytest.approx(e.self_cpu_time_total, rel=0.02, abs=0.01), e.key


@pytest.mark.parametrize("name", ["gpt", "mlp"])
def test_module_flops_match_flop_counter_mode(name: str) -> None:
    """Forward + backward per module. (Models whose branches join, like ResNet's downsample, are
    compared forward-only below: FlopCounterMode's backward tracking misfiles their gradients.)"""
    prof, model, x = capture(name)
    p = prof.profile
    model.zero_grad()
    with FlopCounterMode(display=False) as counter:
        model(x).float().sum().backward()
    counts = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    root_name = type(model).__name__
    assert p.root.forward.flops + p.root.backward.flops == pytest.approx(counts[root_name], rel=0.01)
    compared = 0
    for node in p.modules():
        if not node.path or node.calls == 0:  # never-called containers (ModuleList) exist only in our tree
            continue
        expected = counts.get(f"{root_name}.{node.path}", 0)
        got = node.forward.flops + node.backward.flops
        assert got == pytest.approx(expected, rel=0.01), node.path
        compared += expected > 0
    assert compared >= 2  # the comparison covered real work, not only zeros


def test_flops_split_forward_backward_resnet() -> None:
    prof, _, _ = capture("resnet")
    p = prof.profile
    conv = p.find("layer1.0.conv1")
    # backward of a conv computes grad input and grad weight: twice the forward FLOPs
    assert conv.backward.flops == 2 * conv.forward.flops
    first = p.find("conv1")  # the stem conv's input needs no gradient: grad weight only
    assert first.backward.flops == first.forward.flops


def test_flops_where_flop_counter_mode_double_counts() -> None:
    """Two heads reading one tensor: FlopCounterMode's backward tracking files one gradient matmul
    under both heads (its leaves sum to more than its own global total). Ours sums exactly, and each
    head's backward is the two matmuls its formulas give."""
    prof, model, x = capture("containers")
    p = prof.profile
    model.zero_grad()
    with FlopCounterMode(display=False) as counter:
        model(x).float().sum().backward()
    counts = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    leaves = [n for n in p.modules() if not n.children]
    assert sum(n.forward.flops + n.backward.flops for n in leaves) == counts["Global"]
    assert sum(counts[f"Containers.{n.path}"] for n in leaves) > counts["Global"]
    for head in ("heads.left", "heads.right"):
        node = p.find(head)
        assert node.forward.flops == 2 * 4 * 8 * 2  # addmm of a 4x8 batch into 2 outputs
        assert node.backward.flops == 2 * node.forward.flops  # grad input + grad weight


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_flops_per_module_match_flop_counter_mode(name: str) -> None:
    prof, model, x = capture(name)
    p = prof.profile
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    counts = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    root_name = type(model).__name__
    assert p.root.forward.flops == counts[root_name]
    for node in p.modules():
        if node.path and node.calls:
            assert node.forward.flops == counts.get(f"{root_name}.{node.path}", 0), node.path


def test_resnet_backward_flops_follow_the_formulas() -> None:
    prof, model, x = capture("resnet")
    p = prof.profile
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    assert p.root.forward.flops + p.root.backward.flops == counter.get_total_flops()
    for node in p.modules():
        if node.type_name in ("Conv2d", "Linear"):
            factor = 1 if node.path == "conv1" else 2  # the stem's input needs no gradient
            assert node.backward.flops == factor * node.forward.flops, node.path
