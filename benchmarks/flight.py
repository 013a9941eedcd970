"""The flight recorder's cost: a training loop plain and with the light record, in paired rounds;
what one detailed step (``detail_every``) adds; the ring's memory; the time from a signal to its dump.

Each round runs the same loop (a GPT-style model with ~200 module calls per step, AdamW, cross-
entropy) plain, plain again (the A/A control: how far two identical contenders read apart on this
machine) and recorded, in a shuffled order, each from the same process state (``gc.collect()``
first). The recorder is entered before its steps and left after them, each part timed: the first
``--warm-steps`` steps after the entry apart (the recorder's first two cost ~1-1.5% more than later
ones; every contender runs them), the steps after them alone give the steady-state ratio (a job
enters the recorder once), all of it with the entry and exit the end-to-end ratio. Each is timed on
the wall clock and in process CPU time (``time.process_time``: every thread of the process, the
writer's included). Reported: the median of the per-round ratios against the plain loop, their
interquartile range and the median's 95% confidence interval (short rounds, many of them: a shared
machine's bursts hit single rounds, the median drops them, and the interval narrows as the rounds
grow where one round's spread does not).

A detailed step happens once per ``detail_every`` steps; its cost is measured on its own, in steady
state: a recorded run with two detailed steps against one with one (same length, same block end: the
writer's work included, leaving the recorder waits for it), then spread over ``--detail-every``
steps (100) to give that setting's overhead; what the block's end adds once (writing the latest
detailed profile) is reported apart. The part on the step's thread is read from the ring: the
detailed step (the profile's start and the step) and the step after it (the profile's stop) against
the median light step.

    python benchmarks/flight.py [--rounds 21] [--steps 20] [--layers 20] [--batch 4] [--detail-every 100]
    python benchmarks/flight.py --threads 1     # torch's intra-op threads (default: torch's choice)
    python benchmarks/flight.py --warm-steps 2  # the steps after entry timed apart (the default: 2)
    python benchmarks/flight.py --device cuda   # steps end with a synchronize
    python benchmarks/flight.py --detail-shapes both   # detailed steps: own shapes and torch's, paired
"""

from __future__ import annotations

import argparse
import gc
import json
import math
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
from layerscope.capture import flight_shapes
from layerscope.models.gpt import TinyGPT

#: One timed part: (wall seconds, process CPU seconds).
Timing = tuple[float, float]


def _clocks() -> Timing:
    return time.perf_counter(), time.process_time()


def _since(start: Timing) -> Timing:
    now = _clocks()
    return now[0] - start[0], now[1] - start[1]


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


def per_call_cost(rounds: int, device: str) -> Timing:
    """µs the light record adds per module call (wall, CPU): 100 x (Linear(16, 16), ReLU) at batch
    1 (201 calls a step, little work in each), plain and recorded in paired rounds of 50 steps (the
    recorder entered before the timing: its steady state)."""
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
    extra: list[Timing] = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(rounds):
            gc.collect()
            start = _clocks()
            for _ in range(50):
                step()
            plain = _since(start)
            with ls.flight_recorder(model, out=folder, slow=None) as rec:
                gc.collect()
                start = _clocks()
                for _ in range(50):
                    step()
                    rec.step()
                recorded = _since(start)
            extra.append(tuple((r - p) / 50 / 201 * 1e6 for r, p in zip(recorded, plain, strict=True)))  # type: ignore[misc]
    return statistics.median(e[0] for e in extra), statistics.median(e[1] for e in extra)


def timed_run(
    model: nn.Module,
    step: Callable[[], None],
    steps: int,
    recorder: dict[str, Any] | None,
    out: Path,
    used: list[Any] | None = None,
    warm: int = 0,
) -> dict[str, Timing]:
    """The parts of ``warm`` then ``steps`` steps: ``warm`` (the first steps after the recorder's
    entry, or the plain loop's first: the recorder's first two steps cost ~1-1.5% more than later
    ones, docs/benchmarks.md), ``steps`` (the loop after them: the steady state), and with a recorder
    its ``enter`` and ``exit`` (leaving waits for the writer's work); the recorder is appended to
    ``used``. Also ``median_step``: the median step (its ``rec.step()`` included) on each clock,
    which a burst on this shared machine moves less than the loop's sum."""
    gc.collect()
    rec = None
    parts: dict[str, Timing] = {}
    if recorder is not None:
        start = _clocks()
        rec = ls.flight_recorder(model, out=out, **recorder)
        if used is not None:
            used.append(rec)
        rec.__enter__()
        parts["enter"] = _since(start)
    per_step: list[Timing] = []
    try:
        first = _clocks()
        for _ in range(warm):
            step()
            if rec is not None:
                rec.step()
        parts["warm"] = _since(first)
        loop = _clocks()
        for _ in range(steps):
            start = _clocks()
            step()
            if rec is not None:
                rec.step()
            per_step.append(_since(start))
        parts["steps"] = _since(loop)
    finally:
        if rec is not None:
            start = _clocks()
            rec.__exit__(None, None, None)
            parts["exit"] = _since(start)
    parts["median_step"] = (
        statistics.median(t[0] for t in per_step),
        statistics.median(t[1] for t in per_step),
    )
    return parts


def end_to_end(parts: dict[str, Timing], clock: int) -> float:
    """Seconds of the loop with its first steps and the recorder's entry and exit, on one clock (0:
    wall, 1: CPU)."""
    return sum(parts[name][clock] for name in ("enter", "warm", "steps", "exit") if name in parts)


def detail_run(
    model: nn.Module, step: Callable[[], None], every: int, out: Path, own_shapes: bool = True
) -> dict[str, Any]:
    """One recorded run of 13 steps with ``detail_every=every`` (0: the light record): wall and
    process CPU seconds of the whole (entry and exit in: leaving waits for the writer), the step's
    thread's CPU seconds, each step's on that thread (its ``rec.step()`` included) and of that its
    ``rec.step()`` alone, the ring. ``own_shapes``: the detailed steps record shapes themselves
    (``flight_shapes.py``), else torch's ``record_shapes`` does."""
    gc.collect()
    flight_shapes.OWN_SHAPES = own_shapes
    wall, cpu, main = time.perf_counter(), time.process_time(), time.thread_time()
    # warmup 3: the rolling median is known by step 6, so the recorder measures its detailed step's
    # cost itself (``detail_schedule.py``), to set beside this benchmark's paired figure
    rec = ls.flight_recorder(model, out=out, slow=None, detail_every=every, warmup=3)
    rec.__enter__()
    per_step, in_rec_step = [], []
    try:
        for _ in range(13):
            start = time.thread_time()
            step()
            stepped = time.thread_time()
            rec.step()
            end = time.thread_time()
            per_step.append(end - start)
            in_rec_step.append(end - stepped)
    finally:
        rec.__exit__(None, None, None)
        flight_shapes.OWN_SHAPES = True
    return {
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu,
        "main": time.thread_time() - main,
        "per_step": per_step,
        "rec_step": in_rec_step,
        "ring": {s.step: s.wall_ns / 1e9 for s in rec.ring},
        "own_estimate": (rec.schedule.last_cost_us or 0.0) / 1e6,
    }


def detail_cost(
    model: nn.Module, step: Callable[[], None], out: Path, rounds: int, modes: tuple[bool, ...] = (True,)
) -> dict[str, dict[str, float]]:
    """Seconds one detailed step costs in steady state, and what the block's end adds once, for
    each of ``modes`` (own shapes or torch's: ``detail_run``), keyed "own" / "torch"; medians over
    ``rounds`` rounds of runs of 13 steps (``detail_run``), in a shuffled order: ``detail_every=6``
    (detailed steps 6 and 12) and ``detail_every=12`` (step 12 only) per mode, and the light
    record. Both detailed runs end the block alike (the latest detailed step is written then), so
    the first against the second is one detailed step with all that follows from it. Read three
    ways: the whole runs' difference (wall, process CPU: every thread, but a 13-step run's noise is
    in it), the step's thread alone (CPU of the two steps that start and stop the profile over the
    run's median step, split into the profile's start, the step under it and its stop; wall from
    the ring), and the other threads' CPU (the writer's: with ``--threads 1`` torch starts no
    thread of its own here). The block's end: the writer's CPU in the one-detail run less that
    marginal writer work."""
    configs: dict[tuple[str, bool], int] = {("light", True): 0}
    for own in modes:
        configs[("two", own)], configs[("one", own)] = 6, 12
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {key: [] for key in configs}
    for _ in range(rounds):
        order = list(configs)
        random.shuffle(order)
        for key in order:
            name, own = key
            runs[key].append(detail_run(model, step, configs[key], out / f"{name}-{own}", own_shapes=own))

    def typical(values: list[float]) -> float:
        return statistics.median(t for k, t in enumerate(values) if k not in (5, 6, 11, 12))

    def on_thread(run: dict[str, Any], key: str) -> float:
        # steps 5 and 6 of the loop: the profile's start (in step 5's rec.step()), step 6 and the stop
        per = run["per_step"] if key == "cpu" else [run["ring"][k] for k in range(13)]
        return float(per[5] + per[6] - 2 * typical(per))

    def parts(run: dict[str, Any]) -> tuple[float, float, float]:
        """The profile's start, the step under it, its stop (thread CPU over the typical step)."""
        rec_step, per = run["rec_step"], run["per_step"]
        steps = [p - r for p, r in zip(per, rec_step, strict=True)]
        return rec_step[5] - typical(rec_step), steps[6] - typical(steps), rec_step[6] - typical(rec_step)

    def writer(run: dict[str, Any]) -> float:
        return float(run["cpu"] - run["main"])

    found: dict[str, dict[str, float]] = {}
    for own in modes:
        two, one = runs[("two", own)], runs[("one", own)]

        def median_of(value: Callable[[dict[str, Any], dict[str, Any]], float]) -> float:
            return statistics.median(value(a, b) for a, b in zip(two, one, strict=True))  # noqa: B023

        writer_step = median_of(lambda a, b: writer(a) - writer(b))
        split = [statistics.median(parts(a)[k] for a in two) for k in range(3)]
        found["own" if own else "torch"] = {
            "wall": median_of(lambda a, b: a["wall"] - b["wall"]),
            "cpu": median_of(lambda a, b: a["cpu"] - b["cpu"]),
            "on_thread": statistics.median(on_thread(a, "wall") for a in two),
            "on_thread_cpu": statistics.median(on_thread(a, "cpu") for a in two),
            "start_cpu": split[0],
            "under_cpu": split[1],
            "stop_cpu": split[2],
            "writer_cpu": writer_step,
            "writer_cpu_block_end": statistics.median(writer(b) for b in one) - writer_step,
            "recorder_estimate": statistics.median(a["own_estimate"] for a in two),
        }
    return found


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


def ratios(
    seconds: dict[str, list[dict[str, Timing]]], name: str, clock: int, whole: bool, part: str = "steps"
) -> list[float]:
    """Per-round ratios of ``name`` against the plain loop: its ``part`` (the steps, or the median
    step), or (``whole``) the steps with the recorder's entry and exit."""
    return [
        end_to_end(r, clock) / end_to_end(p, clock) if whole else r[part][clock] / p[part][clock]
        for r, p in zip(seconds[name], seconds["plain"], strict=True)
    ]


def median_ci(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95% confidence interval of the median: the order statistics the
    binomial(n, 1/2) puts 1.96 standard deviations either side of the middle."""
    ordered = sorted(values)
    n = len(ordered)
    half = 1.96 * n**0.5 / 2
    lo, hi = max(0, math.floor(n / 2 - half) - 1), min(n - 1, math.ceil(n / 2 + half))
    return ordered[lo], ordered[hi]


def spread(values: list[float]) -> str:
    """The median ratio, its interquartile range and the 95% confidence interval of the median, as
    text (many short rounds narrow the interval where one round's spread cannot)."""
    q1, median, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    lo, hi = median_ci(values)
    interval = f"median's 95% CI {lo:.4f}-{hi:.4f}"
    return f"{median:.4f}x ({(median - 1) * 100:+.2f}%, IQR {q1:.4f}-{q3:.4f}, {interval})"


def print_detail(
    mode: str,
    detail: dict[str, float],
    seconds: dict[str, list[dict[str, Timing]]],
    result: dict[str, Any],
    steps: int,
    every: int,
) -> None:
    """The detailed step's figures of one shapes mode."""
    print(f"detailed steps, shapes recorded by {'layerscope' if mode == 'own' else 'torch'}:")
    for key, clock, label in (("wall", "wall", "wall"), ("cpu", "CPU", "CPU ")):
        step_s = statistics.median(r["steps"][clock == "CPU"] for r in seconds["plain"]) / steps
        light = result[f"ratios_{clock}"]["light"]
        print(
            f"  {label} one detailed step adds {detail[key] * 1000:.0f} ms, whole runs' difference "
            f"({detail[key] / step_s:.1f} plain steps on this clock); "
            f"detail_every={every}: {light + detail[key] / (every * step_s):.4f}x"
        )
    parts = detail["on_thread_cpu"] + detail["writer_cpu"]
    cpu_step_s = statistics.median(r["steps"][1] for r in seconds["plain"]) / steps
    print(
        f"  CPU  by thread: the step's {detail['on_thread_cpu'] * 1000:.0f} ms (profile start "
        f"{detail['start_cpu'] * 1000:.0f}, step under it +{detail['under_cpu'] * 1000:.0f}, stop "
        f"{detail['stop_cpu'] * 1000:.0f}) + the writer's {detail['writer_cpu'] * 1000:.0f} ms = "
        f"{parts * 1000:.0f} ms ({parts / cpu_step_s:.2f} plain steps; detail_every={every}: "
        f"+{parts / (every * cpu_step_s) * 100:.2f}% over the light record)"
    )
    print(
        f"       the step's thread, wall: {detail['on_thread'] * 1000:.0f} ms; the block's end writes "
        f"the latest detailed profile once: {detail['writer_cpu_block_end'] * 1000:.0f} ms writer CPU"
    )
    print(
        f"       the recorder's own estimate (what detail_budget spaces by): "
        f"{detail['recorder_estimate'] * 1000:.0f} ms"
    )


def main() -> None:
    """Run the rounds and print the figures (and a JSON line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument(
        "--call-rounds", type=int, default=0, help="rounds of the per-call figure (0: --rounds)"
    )
    parser.add_argument("--detail-every", type=int, default=100)
    parser.add_argument(
        "--detail-rounds",
        type=int,
        default=0,
        help="rounds of the detailed step's figure (0: max(3, rounds/3))",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch's intra-op threads (0: torch's default)"
    )
    parser.add_argument(
        "--detail-shapes",
        default="own",
        choices=("own", "torch", "both"),
        help="detailed steps' shapes: recorded by layerscope (own), by torch, or both paired",
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--skip", default="", help="comma-separated: percall,detail,signal,ring")
    parser.add_argument(
        "--warm-steps",
        type=int,
        default=2,
        help="steps after entry timed apart from the steady state (each contender runs them)",
    )
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    if args.threads:
        torch.set_num_threads(args.threads)
    if "percall" not in skip:
        call_us = per_call_cost(args.call_rounds or args.rounds, args.device)
        print(
            f"light record: {call_us[0]:.2f} µs per module call wall, {call_us[1]:.2f} µs CPU "
            "(step() included)"
        )
    model, step = make_loop(args.layers, args.batch, args.device)
    for _ in range(3):
        step()
    configs: dict[str, dict[str, Any] | None] = {"plain": None, "plain (A/A)": None, "light": {"slow": None}}
    seconds: dict[str, list[dict[str, Timing]]] = {name: [] for name in configs}
    result: dict[str, Any] = {"threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        timed_run(model, step, 2, {"slow": None}, out / "warm")  # the first entry imports and builds
        for _ in range(args.rounds):
            order = list(configs)
            random.shuffle(order)
            for name in order:
                seconds[name].append(
                    timed_run(model, step, args.steps, configs[name], out / name, warm=args.warm_steps)
                )
        if "detail" not in skip:
            detail_rounds = args.detail_rounds or max(3, args.rounds // 3)
            modes = {"own": (True,), "torch": (False,), "both": (True, False)}[args.detail_shapes]
            result["detail_step_s"] = detail_cost(model, step, out, rounds=detail_rounds, modes=modes)
        if "signal" not in skip:
            result["signal_s"] = signal_latency(model, step, out / "signal")
        if "ring" not in skip:
            result.update(ring_figures(model, step, out / "ring", keep=100))
    step_ms = statistics.median(r["steps"][0] for r in seconds["plain"]) / args.steps * 1000
    print(
        f"plain step: {step_ms:.1f} ms ({args.device}, {args.layers} layers, batch {args.batch}, "
        f"{torch.get_num_threads()} threads, {args.steps} steps x {args.rounds} rounds)"
    )
    for clock, clock_name in ((0, "wall"), (1, "CPU ")):
        aa = ratios(seconds, "plain (A/A)", clock, whole=False)
        steady = ratios(seconds, "light", clock, whole=False)
        whole = ratios(seconds, "light", clock, whole=True)
        print(f"{clock_name} A/A control (plain vs plain): {spread(aa)}")
        print(f"{clock_name} light, steady state (steps only): {spread(steady)}")
        print(
            f"{clock_name} light, end to end ({args.warm_steps} + {args.steps} steps, entry and exit in): "
            f"{spread(whole)}"
        )
        if args.warm_steps:
            first = ratios(seconds, "light", clock, whole=False, part="warm")
            print(f"{clock_name} light, its first {args.warm_steps} steps after entry: {spread(first)}")
        if args.steps >= 5:
            aa_median = ratios(seconds, "plain (A/A)", clock, whole=False, part="median_step")
            light_median = ratios(seconds, "light", clock, whole=False, part="median_step")
            print(f"{clock_name} A/A control, median step: {spread(aa_median)}")
            print(f"{clock_name} light, median step: {spread(light_median)}")
        result[f"ratios_{clock_name.strip()}"] = {
            "aa": statistics.median(aa),
            "light": statistics.median(steady),
            "light_end_to_end": statistics.median(whole),
        }
    enter_ms = [r["enter"][0] * 1000 for r in seconds["light"]]
    exit_ms = [r["exit"][0] * 1000 for r in seconds["light"]]
    print(
        f"entry {statistics.median(enter_ms):.1f} ms, exit {statistics.median(exit_ms):.1f} ms "
        "(wall, medians)"
    )
    if "detail_step_s" in result:
        for mode, detail in result["detail_step_s"].items():
            print_detail(mode, detail, seconds, result, args.steps, args.detail_every)
    if "signal_s" in result:
        print(f"signal -> dump written: {result['signal_s'] * 1000:.0f} ms")
    if "ring_bytes" in result:
        print(
            f"ring: {result['ring_bytes'] / 1e6:.2f} MB for 100 steps, "
            f"{result['bytes_per_step'] / 1e3:.1f} kB per step, {result['bytes_per_call']:.0f} B per "
            f"module call ({result['module_calls_per_step']:.0f} calls per step)"
        )
    result.update(step_ms=step_ms, rounds=seconds)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
