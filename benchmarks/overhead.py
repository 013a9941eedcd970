"""Collection overhead: plain model vs torch.profiler (same flags) vs layerscope, as ratios.

For each model, runs rounds of K training steps (forward + backward of a sum loss) in three
configurations, interleaved in a shuffled order so drift hits all three alike, and reports median
step times and the ratios. Only the steps inside the profiling window are timed; entering and
leaving the profiler and post-processing are not (post-processing is benchmarks/postprocess.py's job).

    python benchmarks/overhead.py [--rounds 7] [--steps 3]
    python benchmarks/overhead.py --only calls     # µs per module call, within one profiler session
    python benchmarks/overhead.py --device cuda    # the same on a GPU (steps end with a synchronize)
    python benchmarks/overhead.py --memory         # both profilers record memory (profile_memory)

Source lines against torch's with_stack: benchmarks/lines_cost.py.

Ratios: of the median step times, of the fastest rounds, and the median of the per-round ratios
(every configuration runs once per round, back to back: the paired ratio resists the VM's drift).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
import timeit
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

import layerscope as ls
from layerscope.capture import native
from layerscope.capture.module_marks import ModuleMarks
from layerscope.capture.scopes import ModuleScopes
from layerscope.models import resnet18


def tiny_modules(count: int = 200, width: int = 64) -> nn.Module:
    """``count`` x (Linear(width, width) + ReLU): many small modules, little work per module."""
    layers: list[nn.Module] = []
    for _ in range(count):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def tiny_transformer_mlps(blocks: int = 48, width: int = 64) -> nn.Module:
    """Transformer-style small layers at batch 1: ``blocks`` x (LayerNorm -> Linear -> GELU -> Linear),
    241 module calls per step, microseconds of work each: where per-call overhead shows."""
    return nn.Sequential(
        *(
            nn.Sequential(
                nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
            )
            for _ in range(blocks)
        )
    )


def timed_steps(
    model: nn.Module, x: torch.Tensor, steps: int, context: Callable[[], AbstractContextManager[Any]]
) -> float:
    """Seconds per step for ``steps`` training steps inside one ``context``."""
    with context():
        start = time.perf_counter()
        for _ in range(steps):
            model(x).sum().backward()
        if x.is_cuda:  # the step ends when its kernels have run, not when they are queued
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    return elapsed / steps


def interleaved_samples(
    model: nn.Module,
    x: Any,
    configs: dict[str, Callable[[], AbstractContextManager[Any]]],
    rounds: int,
    steps: int,
) -> dict[str, list[float]]:
    """Seconds per step of every configuration, ``rounds`` times: each path warmed up once, then
    rounds in a shuffled order (no configuration always runs right after another), the previous
    run's profiler results freed (``gc.collect()``) before each clock starts."""
    for make in configs.values():
        timed_steps(model, x, 1, make)
    return interleaved_rounds(configs, rounds, lambda make: timed_steps(model, x, steps, make))


def interleaved_rounds(
    configs: dict[str, Callable[[], AbstractContextManager[Any]]],
    rounds: int,
    measure: Callable[[Callable[[], AbstractContextManager[Any]]], float],
) -> dict[str, list[float]]:
    """``measure(config)`` of every configuration, ``rounds`` times, in a shuffled order each round
    (seeded), ``gc.collect()`` before each."""
    samples: dict[str, list[float]] = {k: [] for k in configs}
    order = list(configs)
    shuffle = random.Random(0)
    for _ in range(rounds):
        shuffle.shuffle(order)
        for key in order:
            gc.collect()
            samples[key].append(measure(configs[key]))
    return samples


def measure_on(
    name: str, model: nn.Module, x: torch.Tensor, rounds: int, steps: int, memory: bool = False
) -> dict[str, Any]:
    # layerscope passes torch these flags: record_shapes (for shapes and FLOPs), profile_memory with
    # memory and, without it, profile_all_threads. torch.profiler gets exactly the same.
    probe = ls.profile(model, memory=memory)
    torch_kwargs: dict[str, Any] = {
        "activities": probe.options.activities,
        "record_shapes": True,
        "profile_memory": memory,
        **probe.profiler_kwargs,
    }
    configs: dict[str, Callable[[], AbstractContextManager[Any]]] = {
        "plain": nullcontext,
        "torch.profiler": lambda: torch.profiler.profile(**torch_kwargs),
        "layerscope": lambda: ls.profile(model, memory=memory),
    }
    samples = interleaved_samples(model, x, configs, rounds, steps)
    median = {k: statistics.median(v) for k, v in samples.items()}
    # On a shared VM the median of a few rounds moves by 10-40% between runs; the fastest round is
    # the least disturbed one, so ratios of minima are quoted beside ratios of medians.
    fastest = {k: min(v) for k, v in samples.items()}
    # Each round runs every configuration back to back, so the ratio within a round is measured under
    # nearly the same machine state; the median of those paired ratios resists drift best.
    paired = statistics.median(
        a / b for a, b in zip(samples["layerscope"], samples["torch.profiler"], strict=True)
    )
    calls = sum(1 for _ in model.modules())  # one call per module per step
    return {
        "model": name,
        "memory": memory,
        "step_ms": {k: round(v * 1000, 3) for k, v in median.items()},
        "min_step_ms": {k: round(v * 1000, 3) for k, v in fastest.items()},
        "torch_vs_plain": round(median["torch.profiler"] / median["plain"], 3),
        "layerscope_vs_plain": round(median["layerscope"] / median["plain"], 3),
        "layerscope_vs_torch": round(median["layerscope"] / median["torch.profiler"], 3),
        "layerscope_vs_torch_min": round(fastest["layerscope"] / fastest["torch.profiler"], 3),
        "layerscope_vs_torch_paired": round(paired, 3),
        "modules": calls,
        # what layerscope adds per module call, from the step times (noisy: see module_call_cost)
        "us_per_module_call": round((fastest["layerscope"] - fastest["torch.profiler"]) * 1e6 / calls, 2),
    }


def module_call_cost(modules: int = 200, repeat: int = 15) -> dict[str, Any]:
    """µs that module scopes add to one module call, measured inside one torch.profiler session.

    ``modules`` nn.Identity layers in a Sequential, so a forward is nothing but module calls. Scopes
    are installed and removed in alternation within the session (the fastest of ``repeat`` runs
    each), which cancels the drift that step-level ratios suffer from. Also measures the hook
    path that models with compiled parts, and global mode, still use.
    """
    model = nn.Sequential(*(nn.Identity() for _ in range(modules)))
    x = torch.randn(1, 4)
    calls = modules + 1

    def forward() -> None:
        model(x)

    def fastest_us() -> float:
        return min(timeit.repeat(forward, number=20, repeat=repeat)) / 20 * 1e6

    results: dict[str, list[float]] = {"none": [], "layerscope": [], "marks": [], "hooks": []}
    marks_module = native.load()
    probe = ls.profile(model)  # the flags layerscope runs torch.profiler with
    with torch.profiler.profile(record_shapes=True, **probe.profiler_kwargs), torch.no_grad():
        for _ in range(3):
            results["none"].append(fastest_us())
            scopes = ModuleScopes.for_model(model, "ranges")
            scopes.install()
            results["layerscope"].append(fastest_us())
            scopes.remove()
            if marks_module is not None:
                marks = ModuleMarks(marks_module)
                marks.start()
                marked = ModuleScopes.for_model(model, "auto", marks)
                marked.install()
                results["marks"].append(fastest_us())
                marked.remove()
                marks.stop()
            hooked = ModuleScopes.for_model(model, "hooks")
            hooked.install()
            results["hooks"].append(fastest_us())
            hooked.remove()
    base = min(results["none"])
    layers = training_call_cost()
    return {
        **layers,
        "model": f"{modules} x nn.Identity (forward only, inside one torch.profiler session)",
        "us_per_module_call": round((min(results["layerscope"]) - base) / calls, 2),
        "marks_us_per_module_call": (
            round((min(results["marks"]) - base) / calls, 2) if results["marks"] else None
        ),
        "hooks_us_per_module_call": round((min(results["hooks"]) - base) / calls, 2),
        "torch_profiler_us_per_module_call": round(base / calls, 2),
    }


def training_call_cost(rounds: int = 15, steps: int = 5) -> dict[str, Any]:
    """µs that module scopes add per module call in training steps of real layers (``--only mlp``'s
    model), inside one torch.profiler session: scopes installed and removed in alternation, the
    first step after installing (the one-time catalog of shapes and sources) timed apart."""
    model = tiny_transformer_mlps()
    x = torch.randn(1, 64)
    calls = sum(1 for _ in model.modules())

    def step() -> float:
        start = time.perf_counter()
        model(x).sum().backward()
        return time.perf_counter() - start

    marks_module = native.load()
    kinds = ["ranges", "marks"] if marks_module is not None else ["ranges"]
    bare: list[float] = []
    scoped: dict[str, list[float]] = {k: [] for k in kinds}
    first: list[float] = []
    probe = ls.profile(model)
    with torch.profiler.profile(record_shapes=True, **probe.profiler_kwargs):
        step()
        for _ in range(rounds):
            bare.append(min(step() for _ in range(steps)))
            for kind in kinds:
                marks = ModuleMarks(marks_module) if kind == "marks" else None
                scopes = ModuleScopes.for_model(model, "auto" if marks is not None else "ranges", marks)
                if marks is not None:
                    marks.start()
                scopes.install()
                first.append(step())
                scoped[kind].append(min(step() for _ in range(steps)))
                scopes.remove()
                if marks is not None:
                    marks.stop()
    result: dict[str, Any] = {
        "training_model": f"48 x LN+Linear+GELU+Linear (1x64), {calls} module calls per step",
        "training_step_ms": round(statistics.median(bare) * 1e3, 3),
        "training_first_call_us_per_module": round(
            (statistics.median(first) - statistics.median(scoped["ranges"])) * 1e6 / calls, 2
        ),
    }
    for kind in kinds:
        paired = statistics.median(a - b for a, b in zip(scoped[kind], bare, strict=True))
        result[f"training_{kind}_us_per_module_call"] = round(paired * 1e6 / calls, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--only", choices=("resnet", "tiny", "mlp", "calls"), help="run one workload")
    parser.add_argument("--device", default="cpu", help="where the step workloads run (cpu, cuda)")
    parser.add_argument("--memory", action="store_true", help="both profilers record memory")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)

    def measure(name: str, model: nn.Module, x: torch.Tensor, rounds: int, steps: int) -> dict[str, Any]:
        return measure_on(name, model.to(device), x.to(device), rounds, steps, args.memory)

    workloads = {
        "resnet": lambda: measure(
            "resnet18 (5x3x224x224)", resnet18(), torch.randn(5, 3, 224, 224), args.rounds, args.steps
        ),
        "tiny": lambda: measure(
            "200 x Linear(64,64)+ReLU (32x64)",
            tiny_modules(),
            torch.randn(32, 64),
            args.rounds,
            args.steps * 5,
        ),
        "mlp": lambda: measure(
            "48 x LN+Linear+GELU+Linear (1x64)",
            tiny_transformer_mlps(),
            torch.randn(1, 64),
            args.rounds,
            args.steps * 5,
        ),
    }
    results = [run() for key, run in workloads.items() if args.only in (None, key)]
    calls = module_call_cost() if args.only in (None, "calls") else None
    if calls is not None:
        marks_text = (
            f"marks: {calls['marks_us_per_module_call']:.2f} µs; "
            if calls["marks_us_per_module_call"] is not None
            else "marks: native module not built; "
        )
        print(
            f"module scopes per module call, nn.Identity chain: ranges {calls['us_per_module_call']:.2f} µs "
            f"({marks_text}hooks: {calls['hooks_us_per_module_call']:.2f} µs; torch.profiler's own module "
            f"call {calls['torch_profiler_us_per_module_call']:.2f} µs)"
        )
        per_kind = ", ".join(
            f"{kind} {calls[f'training_{kind}_us_per_module_call']:.2f} µs"
            for kind in ("ranges", "marks")
            if f"training_{kind}_us_per_module_call" in calls
        )
        first = calls["training_first_call_us_per_module"]
        print(
            f"in training steps of real layers, per module call: {per_kind} (first call, once per "
            f"block: +{first:.2f} µs; step {calls['training_step_ms']:.2f} ms)"
        )
    print(
        f"{'model':<36}{'plain':>10}{'torch':>10}{'layerscope':>12}{'torch/plain':>13}"
        f"{'ls/plain':>10}{'ls/torch':>10}{'(fastest)':>11}{'(paired)':>10}"
    )
    for r in results:
        ms = r["step_ms"]
        print(
            f"{r['model']:<36}{ms['plain']:>8.2f}ms{ms['torch.profiler']:>8.2f}ms{ms['layerscope']:>10.2f}ms"
            f"{r['torch_vs_plain']:>12.3f}x{r['layerscope_vs_plain']:>9.3f}x{r['layerscope_vs_torch']:>9.3f}x"
            f"{r['layerscope_vs_torch_min']:>10.3f}x{r['layerscope_vs_torch_paired']:>9.3f}x"
        )
    print(
        json.dumps(
            {
                "benchmark": "overhead",
                "torch": torch.__version__,
                "rounds": args.rounds,
                "results": results,
                "module_call": calls,
            }
        )
    )


if __name__ == "__main__":
    main()
