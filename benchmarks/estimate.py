"""Estimates against measurements on this machine's CPU (issue 37), and the cost of a large estimate.

For each reference model: one steady-state training step (optimizer state exists, gradients None
before the forward; forward, sum loss, backward, AdamW step) is estimated with ``device="cpu"``
and profiled with ``memory=True``. Reported: FLOPs (must be equal), parameters, gradients and
optimizer state live at the peak (must be equal), the predicted absolute peak against the measured
``memory_at_peak().absolute_peak_bytes``, and the predicted step time against the median measured
step (plain timing, no profiler, ``--steps`` steps after a warm-up).

    python benchmarks/estimate.py                 # the table (reference + transformers models)
    python benchmarks/estimate.py --llama8b       # an 8B Llama config on meta: time and peak RSS
    python benchmarks/estimate.py --paired        # the CPU spec measured again before each model

Timings use one torch thread by default (``--threads``): on a shared machine more threads than free
cores make every op wait on the others.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import layerscope as ls
from layerscope.estimates import cpu_spec
from layerscope.estimates.fake_step import first_tensor
from layerscope.models import GPTBlock, TinyGPT, resnet18

Case = tuple[str, Callable[[], nn.Module], Callable[[], Any]]


def _transformers_cases() -> list[Case]:
    try:
        from transformers import (
            BertConfig,
            BertModel,
            GPT2Config,
            GPT2LMHeadModel,
            LlamaConfig,
            LlamaForCausalLM,
        )
    except ImportError:
        return []
    ids = lambda: {"input_ids": torch.randint(0, 1000, (4, 64))}  # noqa: E731
    llama = LlamaConfig(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=1000,
    )
    gpt2 = GPT2Config(n_embd=256, n_layer=4, n_head=8, vocab_size=1000, n_positions=128)
    bert = BertConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1024, vocab_size=1000
    )
    return [
        ("llama (hf, 4x256)", lambda: LlamaForCausalLM(llama), ids),
        ("gpt2 (hf, 4x256)", lambda: GPT2LMHeadModel(gpt2), ids),
        ("bert (hf, 4x256)", lambda: BertModel(bert), ids),
    ]


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    )


def cases() -> list[Case]:
    """The reference models and their inputs."""
    return [
        ("mlp", _mlp, lambda: torch.randn(64, 512)),
        (
            "resnet18 layout (w32, 64px)",
            lambda: resnet18(num_classes=100, width=32),
            lambda: torch.randn(8, 3, 64, 64),
        ),
        ("gpt block", GPTBlock, lambda: torch.randn(8, 128, 128)),
        ("tiny gpt", TinyGPT, lambda: torch.randint(0, 128, (8, 128))),
        *_transformers_cases(),
    ]


def _call(model: nn.Module, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def _state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    def size(tensors: Any) -> int:
        return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))

    return {
        "parameter": size({id(t): t for t in [*model.parameters(), *model.buffers()]}.values()),
        "gradient": size(p.grad for p in model.parameters()),
        "optimizer_state": size(v for s in opt.state.values() for v in s.values()),
    }


def measure(
    model: nn.Module, inputs: Any, steps: int
) -> tuple[ls.Profile, tuple[float, float], dict[str, int]]:
    """A measured profile of one steady-state step, the fastest plain step in wall time and in
    the process's CPU time (µs), and the state's bytes after it."""
    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        first_tensor(_call(model, inputs)).sum().backward()
        opt.step()

    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        step()
    times: list[float] = []
    cpu_times: list[float] = []  # the process's CPU time: waiting for a core is not in it
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        times.append((time.perf_counter() - start) * 1e6)
        cpu_times.append((time.process_time() - cpu_start) * 1e6)
    opt.zero_grad(set_to_none=True)
    with ls.profile(model, memory=True, flops=True) as prof:
        step()
    return prof.profile, (min(times), min(cpu_times)), _state_bytes(model, opt)


def row(
    name: str, build: Callable[[], nn.Module], make: Callable[[], Any], steps: int, paired: bool
) -> dict[str, Any]:
    """One model's figures (``paired``: the CPU measured again just before, so that the spec and
    the steps see the same load on a shared machine)."""
    if paired:
        cpu_spec(refresh=True)
    torch.manual_seed(0)
    model, inputs = build(), make()
    started = time.perf_counter()
    est = ls.estimate(model, inputs, device="cpu")
    est_s = time.perf_counter() - started
    measured, step_us, state = measure(model, inputs, steps)
    got, want = est.memory_at_peak(), measured.memory_at_peak("cpu")
    cats = ("parameter", "gradient", "optimizer_state")
    return {
        "model": name,
        "flops_equal": est.totals.flops == measured.totals.flops,
        "flops": est.totals.flops,
        "state_equal": all(est.meta.estimate.state_bytes.get(c, 0) == state[c] for c in cats)  # type: ignore[union-attr]
        and all(got.by_category().get(c, 0) == want.by_category().get(c, 0) for c in cats if c != "gradient"),
        "peak_predicted": got.absolute_peak_bytes,
        "peak_measured": want.absolute_peak_bytes,
        "time_predicted_us": est.totals.cpu_us,
        "time_measured_us": step_us[0],
        "time_cpu_us": step_us[1],
        "estimate_s": est_s,
        "by_category": (got.by_category(), want.by_category()),
    }


def llama8b() -> None:
    """An 8B Llama config built on meta, estimated for an H100 training step in bf16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    started = time.perf_counter()
    est = ls.estimate(
        model,
        {"input_ids": torch.empty(1, 2048, dtype=torch.long, device="meta")},
        device="h100-sxm",
        dtype="bfloat16",
    )
    seconds = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak = est.memory_at_peak()
    print(f"8B Llama (bf16, 1x2048, AdamW) on h100-sxm: {seconds:.1f} s, peak RSS {rss:.0f} MiB (process)")
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(
        f"  params {billions:.2f} B, {est.totals.flops / 1e12:.1f} TFLOPs, "
        f"predicted step {est.totals.device_us / 1e3:.0f} ms, "
        f"peak {peak.absolute_peak_bytes / 2**30:.1f} GiB "
        f"({', '.join(f'{k} {v / 2**30:.1f}' for k, v in peak.by_category().items())}), "
        f"where {peak.where}"
    )


def main() -> None:
    """Print the table (or the 8B figures)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--llama8b", action="store_true")
    parser.add_argument("--paired", action="store_true", help="measure the CPU again before each model")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.llama8b:
        llama8b()
        return
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average {load:.1f} on {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s)\n")
    print(
        "| model | FLOPs equal | params/grads/opt state equal | peak predicted | peak measured | peak error "
        "| step predicted | step measured (wall / CPU time, fastest) | time error (vs CPU time) "
        "| estimate took |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, build, make in cases():
        r = row(name, build, make, args.steps, args.paired)
        peak_err = r["peak_predicted"] / r["peak_measured"] - 1
        time_err = r["time_predicted_us"] / r["time_cpu_us"] - 1
        print(
            f"| {name} | {'yes' if r['flops_equal'] else 'NO'} ({r['flops'] / 1e9:.2f} GFLOP) "
            f"| {'yes' if r['state_equal'] else 'NO'} | {r['peak_predicted'] / 2**20:.2f} MiB "
            f"| {r['peak_measured'] / 2**20:.2f} MiB | {peak_err:+.1%} "
            f"| {r['time_predicted_us'] / 1e3:.2f} ms "
            f"| {r['time_measured_us'] / 1e3:.2f} / {r['time_cpu_us'] / 1e3:.2f} ms | {time_err:+.0%} "
            f"| {r['estimate_s']:.2f} s |"
        )
        if not r["state_equal"] or abs(peak_err) > 0.05:
            print(f"|  ↳ by category: predicted {r['by_category'][0]}, measured {r['by_category'][1]} |")


if __name__ == "__main__":
    main()
