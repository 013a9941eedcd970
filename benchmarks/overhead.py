"""Collection overhead: plain model vs torch.profiler (same flags) vs layerscope, as ratios.

For each model, runs rounds of K training steps (forward + backward of a sum loss) in three
configurations, interleaved in a shuffled order so drift hits all three alike, and reports median
step times and the ratios. Only the steps inside the profiling window are timed; entering and
leaving the profiler and post-processing are not (post-processing is benchmarks/postprocess.py's job).

    python benchmarks/overhead.py [--rounds 7] [--steps 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

import layerscope as ls
from layerscope.models import resnet18


def tiny_modules(count: int = 200, width: int = 64) -> nn.Module:
    """``count`` x (Linear(width, width) + ReLU): many small modules, little work per module."""
    layers: list[nn.Module] = []
    for _ in range(count):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def timed_steps(
    model: nn.Module, x: torch.Tensor, steps: int, context: Callable[[], AbstractContextManager[Any]]
) -> float:
    """Seconds per step for ``steps`` training steps inside one ``context``."""
    with context():
        start = time.perf_counter()
        for _ in range(steps):
            model(x).sum().backward()
        elapsed = time.perf_counter() - start
    return elapsed / steps


def measure(name: str, model: nn.Module, x: torch.Tensor, rounds: int, steps: int) -> dict[str, Any]:
    # layerscope passes torch these flags: record_shapes (for shapes and FLOPs) and, without
    # memory, profile_all_threads. torch.profiler gets exactly the same.
    probe = ls.profile(model)
    torch_kwargs: dict[str, Any] = {
        "activities": probe.activities,
        "record_shapes": True,
        **probe.profiler_kwargs,
    }
    configs: dict[str, Callable[[], AbstractContextManager[Any]]] = {
        "plain": nullcontext,
        "torch.profiler": lambda: torch.profiler.profile(**torch_kwargs),
        "layerscope": lambda: ls.profile(model),
    }
    for make in configs.values():  # warm-up every path once
        timed_steps(model, x, 1, make)
    samples: dict[str, list[float]] = {k: [] for k in configs}
    order = list(configs)
    shuffle = random.Random(0)
    for _ in range(rounds):
        shuffle.shuffle(order)  # no configuration always runs right after another
        for key in order:
            gc.collect()  # the previous run's profiler results are freed before the clock starts
            samples[key].append(timed_steps(model, x, steps, configs[key]))
    median = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "model": name,
        "step_ms": {k: round(v * 1000, 3) for k, v in median.items()},
        "torch_vs_plain": round(median["torch.profiler"] / median["plain"], 3),
        "layerscope_vs_plain": round(median["layerscope"] / median["plain"], 3),
        "layerscope_vs_torch": round(median["layerscope"] / median["torch.profiler"], 3),
        "modules": sum(1 for _ in model.modules()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    results = [
        measure("resnet18 (5x3x224x224)", resnet18(), torch.randn(5, 3, 224, 224), args.rounds, args.steps),
        measure(
            "200 x Linear(64,64)+ReLU (32x64)",
            tiny_modules(),
            torch.randn(32, 64),
            args.rounds,
            args.steps * 5,
        ),
    ]
    print(
        f"{'model':<36}{'plain':>10}{'torch':>10}{'layerscope':>12}{'torch/plain':>13}"
        f"{'ls/plain':>10}{'ls/torch':>10}"
    )
    for r in results:
        ms = r["step_ms"]
        print(
            f"{r['model']:<36}{ms['plain']:>8.2f}ms{ms['torch.profiler']:>8.2f}ms{ms['layerscope']:>10.2f}ms"
            f"{r['torch_vs_plain']:>12.3f}x{r['layerscope_vs_plain']:>9.3f}x{r['layerscope_vs_torch']:>9.3f}x"
        )
    print(
        json.dumps(
            {"benchmark": "overhead", "torch": torch.__version__, "rounds": args.rounds, "results": results}
        )
    )


if __name__ == "__main__":
    main()
