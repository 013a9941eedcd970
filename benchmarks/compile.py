"""Compiled models: layerscope's collection overhead against torch.profiler on the same compiled model,
and post-processing time against torch's ``key_averages()``.

The built-in GPT (4 blocks, dim 256, batch 8 x 128 tokens), compiled whole (``torch.compile(model)``)
and per block (``block.compile()``). Each is compiled once inside ``layerscope.compile_info()`` (so
its kernels carry profiler ranges and layerscope knows their modules), then rounds of K training
steps run in three configurations, interleaved in a shuffled order: no profiler, torch.profiler with
the flags layerscope passes it, and layerscope. Then one capture is post-processed both ways.

    python benchmarks/compile.py [--rounds 7] [--steps 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import layerscope as ls
from layerscope.model.meta import CompileReport
from layerscope.models import TinyGPT
from overhead import interleaved_samples


def gpt() -> nn.Module:
    torch.manual_seed(0)
    return TinyGPT(vocab=2048, dim=256, heads=4, layers=4, max_len=128)


def whole(model: nn.Module) -> nn.Module:
    return torch.compile(model)


def regional(model: nn.Module) -> nn.Module:
    for block in model.blocks:
        block.compile()
    return model


def lm_steps(model: nn.Module, tokens: torch.Tensor, steps: int) -> None:
    for _ in range(steps):
        model(tokens).float().mean().backward()


def measure(name: str, model: nn.Module, tokens: torch.Tensor, rounds: int, steps: int) -> dict[str, Any]:
    torch._dynamo.reset()
    started = time.perf_counter()
    with ls.compile_info():
        lm_steps(model, tokens, 2)
    compile_s = time.perf_counter() - started
    probe = ls.profile(model)
    torch_kwargs: dict[str, Any] = {
        "activities": probe.options.activities,
        "record_shapes": True,
        **probe.profiler_kwargs,
    }
    configs: dict[str, Callable[[], AbstractContextManager[Any]]] = {
        "plain": nullcontext,
        "torch.profiler": lambda: torch.profiler.profile(**torch_kwargs),
        "layerscope": lambda: ls.profile(model),
    }

    class Loss(nn.Module):  # timed_steps sums the output and runs backward
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.model(t).float().mean()

    wrapped = Loss()
    samples = interleaved_samples(wrapped, tokens, configs, rounds, steps)
    median = {k: statistics.median(v) for k, v in samples.items()}

    # post-processing, on one capture each way (ours first, then torch's first)
    post: dict[str, float] = {}
    for ours_first in (True, False):
        with ls.profile(model) as prof:
            lm_steps(model, tokens, steps)
        gc.collect()
        for position, side in enumerate(("ours", "torch") if ours_first else ("torch", "ours")):
            t0 = time.perf_counter()
            if side == "ours":
                profile = prof.profile
            else:
                prof.torch_profiler.key_averages()
            post[f"{side}_{'first' if position == 0 else 'second'}_s"] = time.perf_counter() - t0
    compiled = profile.meta.compiled or CompileReport()
    below = sum(c.total.cpu_us for c in profile.root.children) / max(profile.root.total.cpu_us, 1e-9)
    return {
        "model": name,
        "compile_s": round(compile_s, 2),
        "step_ms": {k: round(v * 1000, 3) for k, v in median.items()},
        "torch_vs_plain": round(median["torch.profiler"] / median["plain"], 3),
        "layerscope_vs_torch": round(median["layerscope"] / median["torch.profiler"], 3),
        "postprocess_s": {k: round(v, 4) for k, v in post.items()},
        "events": profile.meta.event_count,
        "graph_calls_mapped": f"{compiled.mapped_graph_calls}/{compiled.graph_calls}",
        "share_below_root": round(below, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    tokens = torch.randint(0, 2048, (8, 128), generator=torch.Generator().manual_seed(0))
    results = [
        measure("GPT, torch.compile(model)", whole(gpt()), tokens, args.rounds, args.steps),
        measure("GPT, block.compile() x4", regional(gpt()), tokens, args.rounds, args.steps),
    ]
    print(
        f"{'model':<28}{'plain':>10}{'torch':>10}{'layerscope':>12}{'ls/torch':>10}"
        f"{'post ours':>11}{'post torch':>12}{'mapped':>8}{'below root':>12}"
    )
    for r in results:
        ms, post = r["step_ms"], r["postprocess_s"]
        ours = min(post["ours_first_s"], post["ours_second_s"])
        theirs = min(post["torch_first_s"], post["torch_second_s"])
        print(
            f"{r['model']:<28}{ms['plain']:>8.2f}ms{ms['torch.profiler']:>8.2f}ms{ms['layerscope']:>10.2f}ms"
            f"{r['layerscope_vs_torch']:>9.3f}x{ours:>10.3f}s{theirs:>11.3f}s{r['graph_calls_mapped']:>8}"
            f"{r['share_below_root']:>12.1%}"
        )
    print(
        json.dumps(
            {"benchmark": "compile", "torch": torch.__version__, "rounds": args.rounds, "results": results}
        )
    )


if __name__ == "__main__":
    main()
