"""The flight recorder's cost: a training loop plain and with the light record, in paired rounds;
what one detailed step (``detail_every``) adds; the ring's memory; the time from a signal to its dump.

Each round runs the same loop (a GPT-style model with ~200 module calls per step, AdamW,
cross-entropy) plain and recorded back to back, in a shuffled order, each from the same process
state (``gc.collect()`` first); the recorder is entered and left inside the timed region (end to
end). Reported: the median of the per-round ratios against the plain loop (short rounds, many of
them: a shared machine's bursts hit single rounds, the median drops them).

A detailed step happens once per ``detail_every`` steps; its cost is measured on its own: a recorded
run with ``detail_every=D`` against the light run of the same length, the difference per detailed
step, then spread over ``--detail-every`` steps (100) to give that setting's overhead.

    python benchmarks/flight.py [--rounds 21] [--steps 20] [--layers 20] [--batch 4] [--detail-every 100]
    python benchmarks/flight.py --device cuda     # steps end with a synchronize
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import layerscope as ls
from layerscope.models.gpt import TinyGPT


def make_loop(layers: int, batch: int, device: str) -> tuple[nn.Module, Callable[[], None]]:
    """The model and one training step (``batch`` sequences of 64 tokens)."""
    torch.manual_seed(0)
    model = TinyGPT(vocab=512, dim=128, heads=4, layers=layers, max_len=64).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, 512, (batch, 64), device=device)
    target = torch.randint(0, 512, (batch, 64), device=device)

    def step() -> None:
        logits = model(idx)
        loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), target.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    return model, step


def per_call_cost(rounds: int, device: str) -> float:
    """µs the light record adds per module call: 100 x (Linear(16, 16), ReLU) at batch 1 (201 calls
    a step, little work in each), plain and recorded in paired rounds of 50 steps."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(100):
        layers += [nn.Linear(16, 16), nn.ReLU()]
    model = nn.Sequential(*layers).to(device)
    x = torch.randn(1, 16, device=device)

    def step() -> None:
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    extra = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(rounds):
            gc.collect()
            start = time.perf_counter()
            for _ in range(50):
                step()
            plain = time.perf_counter() - start
            with ls.flight_recorder(model, out=folder, slow=None) as rec:
                gc.collect()
                start = time.perf_counter()
                for _ in range(50):
                    step()
                    rec.step()
                recorded = time.perf_counter() - start
            extra.append((recorded - plain) / 50 / 201 * 1e6)
    return statistics.median(extra)


def timed_run(
    model: nn.Module, step: Callable[[], None], steps: int, recorder: dict[str, Any] | None, out: Path
) -> float:
    """Seconds for ``steps`` steps, the recorder (when given) entered and left inside the timing."""
    gc.collect()
    start = time.perf_counter()
    if recorder is None:
        for _ in range(steps):
            step()
    else:
        with ls.flight_recorder(model, out=out, **recorder) as rec:
            for _ in range(steps):
                step()
                rec.step()
    return time.perf_counter() - start


def detail_cost(model: nn.Module, step: Callable[[], None], out: Path, rounds: int) -> float:
    """Seconds one detailed step adds to a recorded loop (median over ``rounds`` paired runs of 10
    steps: ``detail_every=5`` gives one detailed step, at step 5, against the light record)."""
    extra = []
    for _ in range(rounds):
        light = timed_run(model, step, 10, {"slow": None}, out / "light")
        detailed = timed_run(model, step, 10, {"slow": None, "detail_every": 5}, out / "detail")
        extra.append(detailed - light)
    return statistics.median(extra)


def signal_latency(model: nn.Module, step: Callable[[], None], out: Path) -> float:
    """Seconds from SIGUSR1 (sent mid-loop) to its dump written."""
    with ls.flight_recorder(model, out=out, slow=None) as rec:
        for i in range(20):
            step()
            if i == 10:
                sent = time.perf_counter()
                os.kill(os.getpid(), signal.SIGUSR1)
                rec.flush()
                latency = time.perf_counter() - sent
            rec.step()
    return latency


def ring_figures(model: nn.Module, step: Callable[[], None], out: Path, keep: int) -> dict[str, float]:
    """The ring's bytes for ``keep`` steps, per step and per module call."""
    with ls.flight_recorder(model, out=out, keep=keep, slow=None) as rec:
        for _ in range(keep):
            step()
            rec.step()
        calls = sum(len(s.forward) // 2 for s in rec.ring) / len(rec.ring)
        ring = rec.ring_bytes
    return {
        "ring_bytes": ring,
        "bytes_per_step": ring / keep,
        "module_calls_per_step": calls,
        "bytes_per_call": ring / keep / calls,
    }


def main() -> None:
    """Run the rounds and print the figures (and a JSON line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--detail-every", type=int, default=100)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    call_us = per_call_cost(args.rounds, args.device)
    print(f"light record: {call_us:.2f} µs per module call (forward + backward, step() included)")
    model, step = make_loop(args.layers, args.batch, args.device)
    for _ in range(3):
        step()
    configs: dict[str, dict[str, Any] | None] = {"plain": None, "light": {"slow": None}}
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        for _ in range(args.rounds):
            order = list(configs)
            random.shuffle(order)
            for name in order:
                seconds[name].append(timed_run(model, step, args.steps, configs[name], out / name))
        detail_s = detail_cost(model, step, out, rounds=max(3, args.rounds // 3))
        latency = signal_latency(model, step, out / "signal")
        ring = ring_figures(model, step, out / "ring", keep=100)
    step_ms = statistics.median(seconds["plain"]) / args.steps * 1000
    light = statistics.median(s / p for s, p in zip(seconds["light"], seconds["plain"], strict=True))
    detail = light + detail_s / (args.detail_every * step_ms / 1000)
    ratios = {"light": light, f"detail_every={args.detail_every}": detail}
    print(
        f"plain step: {step_ms:.1f} ms ({args.device}, {args.layers} layers, batch {args.batch}, "
        f"{args.steps} steps x {args.rounds} rounds)"
    )
    print(f"light: {light:.4f}x the plain loop ({(light - 1) * 100:+.2f}%), median of per-round ratios")
    print(f"one detailed step adds {detail_s * 1000:.0f} ms ({detail_s * 1000 / step_ms:.1f} plain steps)")
    print(
        f"detail_every={args.detail_every}: {detail:.4f}x the plain loop ({(detail - 1) * 100:+.2f}%), "
        "the light ratio plus the detailed step spread over its steps"
    )
    print(f"signal -> dump written: {latency * 1000:.0f} ms")
    print(
        f"ring: {ring['ring_bytes'] / 1e6:.2f} MB for 100 steps, "
        f"{ring['bytes_per_step'] / 1e3:.1f} kB per step, "
        f"{ring['bytes_per_call']:.0f} B per module call ({ring['module_calls_per_step']:.0f} calls per step)"
    )
    result = {
        "step_ms": step_ms,
        "ratios": ratios,
        "detail_step_s": detail_s,
        "per_call_us": call_us,
        "signal_s": latency,
        **ring,
        "rounds": seconds,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
