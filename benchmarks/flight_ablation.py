"""The light record taken apart on the clocks: the recorder's parts added one at a time, every
contender in each round in a shuffled order, in one process (``flight_instructions.py`` counts the
same contenders' instructions under callgrind, which the machine's load does not move).

Contenders: ``plain`` and ``plain2`` (the A/A control); ``wrappers`` (the recorder's class wrappers,
their marks and after-call Python functions that do nothing); ``marks`` (the native marks, no node
hooks); ``marks+hooks`` (no ``rec.step()``); ``light-pywrapper`` (the recorder before the
whole call was native: a Python wrapper calling the native mark twice and the native after-call);
``light`` (the recorder as shipped: ``flight_call``). Each run:
``gc.collect()``, the recorder entered, ``--warm`` steps, ``--steps`` timed on the thread's CPU clock
and the wall clock, with the minor page faults, context switches and the collector's runs. Printed:
medians of the per-round ratios against ``plain``, their interquartile range, and the median
difference in ms per step; say the load (``uptime``) beside them.

    python benchmarks/flight_ablation.py [--rounds 40] [--warm 2] [--steps 2] [--only light,marks]
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import layerscope as ls
from flight import make_loop
from layerscope.capture import flight_clock

#: Contender -> (mark: "native" or "noop", after-call: "native" or "noop", rec.step() called, the
#: whole call made natively), or None for the plain loop.
VARIANTS: dict[str, tuple[str, str, bool, bool] | None] = {
    "plain": None,
    "plain2": None,
    "wrappers": ("noop", "noop", False, False),
    "marks": ("native", "noop", False, False),
    "marks+hooks": ("native", "native", False, False),
    "light-pywrapper": ("native", "native", True, False),
    "light": ("native", "native", True, True),
}

_COLLECTIONS = [0, 0, 0]


def _count_collections(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _COLLECTIONS[info["generation"]] += 1


def _noop_mark(code: int) -> None:
    return None


def _noop_after(args: Any, output: Any) -> None:
    return None


class Patched(flight_clock.FlightClock):
    """A clock whose marks or after-call do nothing (``"noop"``), and the whole-call native path
    only where ``whole_call`` says."""

    mark_kind = "native"
    after_kind = "native"
    whole_call = True

    @property
    def mark(self) -> Callable[[int], None]:
        """The native mark, or one that does nothing."""
        return _noop_mark if self.mark_kind == "noop" else super().mark

    @property
    def watch_output(self) -> Callable[[tuple[Any, ...], Any], None]:
        """The native after-call, or one that does nothing."""
        return _noop_after if self.after_kind == "noop" else super().watch_output

    @property
    def native_call(self) -> Any:
        """The whole-call native path (where asked for and both parts are native)."""
        both = self.mark_kind == self.after_kind == "native"
        return super().native_call if both and self.whole_call else None


def recorder(model: torch.nn.Module, variant: tuple[str, str, bool, bool], out: str) -> Any:
    """A light recorder (not entered) whose clock is patched as ``variant`` says."""
    rec = ls.flight_recorder(model, out=out, slow=None)
    clock = Patched()
    clock.mark_kind, clock.after_kind, clock.whole_call = variant[0], variant[1], variant[3]
    rec.clock = clock
    return rec


def _reading() -> tuple[float, ...]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (
        time.perf_counter(),
        time.thread_time(),
        usage.ru_minflt,
        usage.ru_nvcsw + usage.ru_nivcsw,
        *_COLLECTIONS,
    )


def run(
    model: torch.nn.Module,
    step: Callable[[], None],
    variant: tuple[str, str, bool, bool] | None,
    warm: int,
    steps: int,
    out: str,
) -> tuple[float, ...]:
    """One contender's run: (wall s, thread CPU s, minor faults, context switches, collections of
    generations 0-2) over its ``steps`` timed steps."""
    gc.collect()
    rec = recorder(model, variant, out) if variant is not None else None
    if rec is not None:
        rec.__enter__()
    with_step = variant is not None and variant[2]
    try:
        for _ in range(warm):
            step()
            if with_step:
                rec.step()
        start = _reading()
        for _ in range(steps):
            step()
            if with_step:
                rec.step()
        end = _reading()
    finally:
        if rec is not None:
            rec.__exit__(None, None, None)
    return tuple(e - s for e, s in zip(end, start, strict=True))


def main() -> None:
    """Run the rounds and print one line per contender."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warm", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated contenders (plain always runs)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    gc.callbacks.append(_count_collections)
    model, step = make_loop(20, 4, "cpu")
    for _ in range(3):
        step()
    chosen = set(args.only.split(",")) | {"plain"} if args.only else set(VARIANTS)
    variants = {name: v for name, v in VARIANTS.items() if name in chosen}
    results: dict[str, list[tuple[float, ...]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as out:
        run(model, step, VARIANTS["light"], 2, 2, out)  # the first entry imports and builds
        for _ in range(args.rounds):
            order = list(variants)
            random.shuffle(order)
            for name in order:
                results[name].append(run(model, step, variants[name], args.warm, args.steps, out))
    plain = results["plain"]
    step_ms = statistics.median(p[1] for p in plain) / args.steps * 1000
    print(f"plain step {step_ms:.1f} ms thread CPU; {args.rounds} rounds of {args.warm} + {args.steps} steps")
    for name, rows in results.items():
        pairs = list(zip(rows, plain, strict=True))
        cpu = sorted(r[1] / p[1] for r, p in pairs)
        q1, median, q3 = statistics.quantiles(cpu, n=4) if len(cpu) > 1 else (cpu[0],) * 3
        wall = statistics.median(r[0] / p[0] for r, p in pairs)
        extra_ms = statistics.median(r[1] - p[1] for r, p in pairs) / args.steps * 1000
        per_step = [statistics.mean(r[k] for r in rows) / args.steps for k in range(2, 7)]
        print(
            f"{name:21s} CPU {median:.4f}x (IQR {q1:.4f}-{q3:.4f}, {extra_ms:+.2f} ms/step), wall "
            f"{wall:.4f}x; per step: {per_step[0]:.0f} minor faults, {per_step[1]:.1f} context "
            f"switches, collections {per_step[2]:.2f}/{per_step[3]:.2f}/{per_step[4]:.2f}"
        )


if __name__ == "__main__":
    main()
