"""Compiled models profiled after they compiled: how much of the model's time the tree places below
its root, and what watching compiles costs.

The wide-among-narrow test model (tests/fixtures/models.py: one wide block whose ``mid`` Linear
dominates, between narrow ones), 1024 x 32 inputs, compiled whole (``torch.compile(model)``) and per
block (``block.compile()``), each compiled *before* the profile: once with no watch (Inductor's
caches as the user has them), once under ``layerscope.watch_compiles()``. Then, after a warm-up
step, ``--rounds`` profiles of ``--steps`` training steps each; per round the share of the root's
time spent in its children (the rest is the compiled runtime's own Python and wrappers).

    python benchmarks/compiled_tree.py [--rounds 5] [--steps 3]
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.models import WideAmongNarrow

import layerscope as ls
from layerscope.capture.compile_watch import CompileWatch


def whole(model: nn.Module) -> nn.Module:
    return torch.compile(model)  # type: ignore[return-value]


def per_block(model: nn.Module) -> nn.Module:
    for block in (*model.narrow, model.wide, model.tail):
        block.compile()
    return model


def train(model: nn.Module, x: torch.Tensor, steps: int) -> None:
    for _ in range(steps):
        model(x).sum().backward()


def compile_seconds(
    compile_model: Callable[[nn.Module], nn.Module], weights: nn.Module, x: torch.Tensor
) -> float:
    torch._dynamo.reset()
    model = compile_model(copy.deepcopy(weights))
    started = time.perf_counter()
    train(model, x, 1)
    return time.perf_counter() - started


def measure(name: str, compile_model: Callable[[nn.Module], nn.Module], rounds: int, steps: int) -> None:
    torch.manual_seed(0)
    weights = WideAmongNarrow()
    x = torch.randn(1024, 32, generator=torch.Generator().manual_seed(1))
    unwatched_s = compile_seconds(compile_model, weights, x)
    with CompileWatch():
        watched_s = compile_seconds(compile_model, weights, x)
    torch._dynamo.reset()
    with CompileWatch():
        model = compile_model(copy.deepcopy(weights))
        train(model, x, 2)  # compiles forward and backward, before any profile
    shares: list[float] = []
    on_root: set[str] = set()
    for _ in range(rounds):
        gc.collect()
        with ls.profile(model) as session:
            train(model, x, steps)
        profile = session.profile
        root = profile.root
        shares.append(sum(c.total.cpu_us for c in root.children) / root.total.cpu_us)
        on_root |= {r.name for r in profile.ops(group_by=("name", "module")) if r.module == ""}
    compiled = profile.meta.compiled
    assert compiled is not None
    kernels_on_root = sorted(n for n in on_root if n.startswith(("aten::", "graph_")))  # runtime ops, fusions
    print(
        f"{name:<26} below the root: median {statistics.median(shares):.1%}, min {min(shares):.1%} "
        f"({rounds} rounds of {steps} steps); graph calls mapped {compiled.mapped_graph_calls}/"
        f"{compiled.graph_calls}; kernels left on the root: {kernels_on_root or 'none'}; "
        f"first call (compile) {unwatched_s:.1f} s unwatched, {watched_s:.1f} s watched"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}")
    measure("torch.compile(model)", whole, args.rounds, args.steps)
    measure("block.compile() x4", per_block, args.rounds, args.steps)


if __name__ == "__main__":
    main()
