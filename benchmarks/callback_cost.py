"""What the Hugging Face Trainer callback costs on the steps it does not record, and where it goes.

1. Per step, in ``Trainer.train()``: a tiny GPT-2 (2 layers, width 32, 2 x 16 tokens) on the CPU,
   contenders in a shuffled order (seeded) each round, the same model object for all,
   ``gc.collect()`` before each run: no callback, no callback again (the A/A pair: this machine's
   noise) and ``LayerscopeCallback(wait=10**6)`` (every step a ``wait`` step: nothing recorded).
   Everything is imported before the first run, so every contender runs in the same process state.
   A clock callback, last in the Trainer's list, marks each ``on_step_end``: a step is the time
   between two marks (data, forward, backward, optimizer, every callback). Per run the lower
   quartile of the steps after ``--skip`` (other processes on the machine only ever add time); per
   round the paired difference against the first no-callback run; the figures are medians over
   rounds with the interquartile range of those differences, as wall time and as this thread's CPU
   time (torch runs on one thread here, so CPU time holds the whole step). A fourth contender
   burning 100 µs of CPU in its ``on_step_end`` (the positive control) shows what a cost of that
   size reads as.
2. The callback's own hooks (thread CPU time): ``on_train_begin`` (the session's start; the first
   run in the process apart: it imports the capture modules and loads the native module and
   torch.profiler), ``on_step_end`` (``session.step()``) and ``on_train_end``.
3. Where an unrecorded step's cost goes, outside the Trainer, same model: a training step (forward
   and backward) inside a started session on a ``wait`` step against none (the module scopes),
   per ``module_scopes`` mode, paired and interleaved as in 1; and ``session.step()`` on a wait step.
4. What a user's short run sees: ``Trainer.train()`` of ``--fresh-steps`` steps, each in a fresh
   process (first-time costs included), with and without the callback, ``--fresh`` times each.

    python benchmarks/callback_cost.py [--rounds 25] [--steps 60] [--skip 5] [--threads 1]
                                       [--fresh 5] [--fresh-steps 5]
"""

from __future__ import annotations

import argparse
import copy
import gc
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback
from transformers.utils import logging as hf_logging

import layerscope as ls
from layerscope.integrations.transformers import LayerscopeCallback

CONTENDERS = ("none", "none again", "callback", "busy 100 µs")
BUSY_NS = 100_000
Batch = dict[str, torch.Tensor]


class StepClock(TrainerCallback):  # type: ignore[misc]
    """Marks (wall, thread CPU) at every ``on_step_end``; last in the list, so after every other."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.append((time.perf_counter(), time.thread_time()))


class Busy(TrainerCallback):  # type: ignore[misc]
    """The positive control: a callback burning ``BUSY_NS`` of CPU at every ``on_step_end``."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        start = time.thread_time_ns()
        while time.thread_time_ns() - start < BUSY_NS:
            pass


def timed(method: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    """``method`` appending its thread CPU seconds to ``into`` (the Trainer calls the instance's)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            into.append(time.thread_time() - start)

    return wrapper


def quiet_arguments(out: str, steps: int) -> TrainingArguments:
    """The Trainer's arguments for every run: CPU, batch 2, ``steps`` steps, no saving or logging."""
    return TrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )


def one_run(base: GPT2LMHeadModel, data: list[Batch], kind: str, steps: int, out: str) -> dict[str, Any]:
    """Train ``steps`` steps with ``kind``'s callbacks; the step marks and the callback's own times."""
    clock = StepClock()
    callbacks: list[TrainerCallback] = [clock]
    hooks: dict[str, list[float]] = {"begin": [], "end": [], "step": []}
    if kind == "callback":
        ours = LayerscopeCallback(wait=10**6, warmup=1, active=1, output_dir=out)
        ours.on_train_begin = timed(ours.on_train_begin, hooks["begin"])  # type: ignore[method-assign]
        ours.on_train_end = timed(ours.on_train_end, hooks["end"])  # type: ignore[method-assign]
        ours.on_step_end = timed(ours.on_step_end, hooks["step"])  # type: ignore[method-assign]
        callbacks.insert(0, ours)
    elif kind.startswith("busy"):
        callbacks.insert(0, Busy())
    args = quiet_arguments(out, steps)
    # the same model object every run: a fresh copy per run would put its tensors elsewhere in memory,
    # which moves a step this small by more than what is measured
    trainer = Trainer(model=base, args=args, train_dataset=data, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)  # its metrics line would land in the JSON
    gc.collect()
    trainer.train()
    return {"marks": clock.marks, **hooks}


def step_quartiles(marks: list[tuple[float, float]], skip: int) -> tuple[float, float]:
    """The lower quartile of the seconds per step (wall, CPU) after the first ``skip`` steps (other
    processes on the machine only ever add time, so the low end is the steadiest figure)."""
    pairs = list(itertools.pairwise(marks))[skip:]
    wall = statistics.quantiles([b[0] - a[0] for a, b in pairs], n=4)[0]
    return wall, statistics.quantiles([b[1] - a[1] for a, b in pairs], n=4)[0]


def in_trainer(
    base: GPT2LMHeadModel, data: list[Batch], rounds: int, steps: int, skip: int
) -> dict[str, Any]:
    """Measurements 1 and 2 of the module docstring."""
    with tempfile.TemporaryDirectory() as out:
        first = {kind: one_run(base, data, kind, steps, out) for kind in CONTENDERS}  # warms the process
        samples: dict[str, list[tuple[float, float]]] = {kind: [] for kind in CONTENDERS}
        hooks: dict[str, list[float]] = {"begin": [], "end": [], "step": []}
        order, shuffle = list(CONTENDERS), random.Random(0)
        for _ in range(rounds):
            shuffle.shuffle(order)
            for kind in order:
                run = one_run(base, data, kind, steps, out)
                samples[kind].append(step_quartiles(run["marks"], skip))
                for key in hooks:
                    hooks[key].extend(run.get(key, []))

    def paired_us(kind: str, which: int) -> list[float]:
        """Median and interquartile range of the per-round differences against "none", µs."""
        diffs = [a[which] - b[which] for a, b in zip(samples[kind], samples["none"], strict=True)]
        quartiles = statistics.quantiles(diffs, n=4)
        return [round(value * 1e6, 1) for value in (statistics.median(diffs), quartiles[0], quartiles[2])]

    def ms(values: list[float]) -> float:
        return round(statistics.median(values) * 1e3, 3)

    return {
        "step_ms": {
            k: {"wall": ms([w for w, _ in v]), "cpu": ms([c for _, c in v])} for k, v in samples.items()
        },
        "paired_us_per_step": {k: {"wall": paired_us(k, 0), "cpu": paired_us(k, 1)} for k in CONTENDERS[1:]},
        "on_step_end_us": round(statistics.median(hooks["step"]) * 1e6, 1),
        "on_train_begin_ms": {
            "first_in_process": ms(first["callback"]["begin"]),
            "later": ms(hooks["begin"]),
        },
        "on_train_end_ms": ms(hooks["end"]),
    }


def median_us(fn: Callable[[], Any], n: int) -> float:
    """Median thread CPU µs of ``n`` calls of ``fn``."""
    times = []
    for _ in range(n):
        start = time.thread_time_ns()
        fn()
        times.append(time.thread_time_ns() - start)
    return statistics.median(times) / 1000


def breakdown(model: GPT2LMHeadModel, batch: Batch, rounds: int) -> dict[str, Any]:
    """Measurement 3 of the module docstring."""

    def step() -> None:
        model(**batch).loss.backward()

    session_steps: dict[str, list[float]] = {}

    @contextmanager
    def waiting(mode: str) -> Iterator[None]:
        session = ls.profile(
            model, schedule=ls.schedule(wait=10**6), on_trace_ready=lambda _: None, module_scopes=mode
        )
        session.start()
        try:
            for _ in range(3):  # first calls (shapes) behind us
                step()
                session.step()
            yield
            session_steps.setdefault(mode, []).append(median_us(session.step, 500))
        finally:
            session.stop()

    @contextmanager
    def nothing() -> Iterator[None]:
        yield

    configs: dict[str, Callable[[], Any]] = {"none": nothing, "none again": nothing}
    configs.update({mode: lambda mode=mode: waiting(mode) for mode in ("auto", "ranges", "hooks")})
    calls = sum(1 for _ in model.modules())  # each module runs once per forward here
    samples: dict[str, list[float]] = {k: [] for k in configs}
    order, shuffle = list(configs), random.Random(0)
    for _ in range(rounds):
        shuffle.shuffle(order)
        for key in order:
            gc.collect()
            with configs[key]():
                samples[key].append(median_us(step, 40))
    paired = {
        k: round(statistics.median(a - b for a, b in zip(v, samples["none"], strict=True)), 1)
        for k, v in samples.items()
        if k != "none"
    }
    return {
        "module_calls_per_step": calls,
        "train_step_us": {k: round(statistics.median(v), 1) for k, v in samples.items()},
        "paired_us_per_step": paired,
        "paired_us_per_module_call": {k: round(v / calls, 2) for k, v in paired.items()},
        "session_step_us": {k: round(statistics.median(v), 1) for k, v in session_steps.items()},
    }


def fresh_processes(count: int, steps: int, threads: int) -> dict[str, Any]:
    """Measurement 4: ``Trainer.train()`` of ``steps`` steps in fresh processes (what a user's run
    sees, first-time costs included), no callback and the callback in alternation; median seconds."""
    found: dict[str, list[dict[str, float]]] = {"none": [], "callback": []}
    for _ in range(count):
        for kind in found:
            command = [sys.executable, __file__, "--one-fresh", kind, "--steps", str(steps)]
            command += ["--threads", str(threads)]
            done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
            found[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        kind: {key: round(statistics.median(run[key] for run in runs), 3) for key in ("wall_s", "cpu_s")}
        for kind, runs in found.items()
    }


def one_fresh(kind: str, steps: int) -> None:
    """One run of :func:`fresh_processes`, in this (fresh) process: prints its JSON line."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16))
    data = [
        {"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(64)
    ]
    with tempfile.TemporaryDirectory() as out:
        args = quiet_arguments(out, steps)
        callbacks = [LayerscopeCallback(wait=10**6, output_dir=out)] if kind == "callback" else []
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
        trainer.remove_callback(PrinterCallback)
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        trainer.train()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps({"wall_s": wall, "cpu_s": cpu}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip", type=int, default=5, help="first steps of each run left out")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--fresh", type=int, default=5, help="fresh processes per contender (4.)")
    parser.add_argument("--fresh-steps", type=int, default=5, help="steps of each fresh run (4.)")
    parser.add_argument("--one-fresh", choices=("none", "callback"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    if args.one_fresh:
        one_fresh(args.one_fresh, args.steps)
        return
    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16))
    data = [
        {"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(64)
    ]
    ids = torch.stack([data[0]["input_ids"], data[1]["input_ids"]])
    found = {
        "model": "GPT-2, 2 layers, width 32, batch 2 x 16 tokens, CPU",
        "rounds": args.rounds,
        "steps": args.steps,
        "skip": args.skip,
        "threads": torch.get_num_threads(),
        "trainer": in_trainer(base, data, args.rounds, args.steps, args.skip),
        "breakdown": breakdown(copy.deepcopy(base), {"input_ids": ids, "labels": ids}, args.rounds),
        "fresh_processes": fresh_processes(args.fresh, args.fresh_steps, args.threads),
    }
    print(json.dumps({"benchmark": "callback-cost", "torch": torch.__version__, **found}, indent=1))


if __name__ == "__main__":
    main()
