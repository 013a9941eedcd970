"""The floor under a detailed step: what a bare ``torch.profiler`` cycle (start, one step, stop)
costs on the flight benchmark's training loop, before layerscope does anything.

The flight recorder's ``detail_every=N`` takes one such cycle every N steps; issue 38's goal (a
detailed step every 100 costs <= 2%, the light record <= 1%) leaves about one plain step for it.
This measures torch's own share of that, per setting of the profiler, so the flight benchmark's
figure can be split into torch's part and ours. Each variant runs one unmeasured cycle first (the
first one pays CUPTI's and Kineto's one-time set-up), then ``--rounds`` measured ones, each after
``gc.collect()``; reported are the medians of the start, the profiled step, the stop, and what the
cycle adds over a plain step (in ms and in plain steps).

    python benchmarks/profiler_floor.py [--device cuda] [--rounds 7] [--layers 20] [--batch 4]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from flight import make_loop  # the script's folder, benchmarks/, is on sys.path

#: The profiler settings compared: name -> keyword arguments of ``torch.profiler.profile``.
VARIANTS: dict[str, dict[str, object]] = {
    "cpu ops": {"activities": [ProfilerActivity.CPU]},
    "cpu ops + device": {"activities": "all"},
    "+ shapes": {"activities": "all", "record_shapes": True},
    "+ shapes + memory": {"activities": "all", "record_shapes": True, "profile_memory": True},
}


def _activities(device: str, setting: object) -> list[ProfilerActivity]:
    if setting == "all" and device == "cuda":
        return [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    return [ProfilerActivity.CPU]


def timed_step(step: Callable[[], None], sync: Callable[[], None]) -> float:
    """One step's wall seconds, device work included."""
    start = time.perf_counter()
    step()
    sync()
    return time.perf_counter() - start


def cycle(step: Callable[[], None], sync: Callable[[], None], kwargs: dict[str, object]) -> dict[str, float]:
    """One profiler cycle around one step: its start, the step under it and its stop (wall s)."""
    gc.collect()
    prof = profile(**kwargs)  # type: ignore[arg-type]
    begin = time.perf_counter()
    prof.start()
    started = time.perf_counter()
    step()
    sync()
    stepped = time.perf_counter()
    prof.stop()
    stopped = time.perf_counter()
    return {"start": started - begin, "step": stepped - started, "stop": stopped - stepped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    _, step = make_loop(args.layers, args.batch, args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for _ in range(5):
        timed_step(step, sync)
    results: dict[str, dict[str, float]] = {}
    for name, setting in VARIANTS.items():
        kwargs = dict(setting, activities=_activities(args.device, setting["activities"]))
        cycle(step, sync, kwargs)  # the first cycle pays one-time set-up
        plain, parts = [], []
        for _ in range(args.rounds):
            gc.collect()
            plain.append(statistics.median(timed_step(step, sync) for _ in range(3)))
            parts.append(cycle(step, sync, kwargs))
        median = {key: statistics.median(part[key] for part in parts) for key in ("start", "step", "stop")}
        plain_s = statistics.median(plain)
        adds = median["start"] + median["step"] + median["stop"] - plain_s
        results[name] = {**median, "plain_step": plain_s, "adds": adds, "adds_steps": adds / plain_s}
        print(
            f"{name:20} start {median['start'] * 1e3:6.1f} ms  step {median['step'] * 1e3:6.1f} ms"
            f" (plain {plain_s * 1e3:5.1f})  stop {median['stop'] * 1e3:6.1f} ms"
            f"  adds {adds * 1e3:6.1f} ms = {adds / plain_s:4.2f} plain steps",
            flush=True,
        )
    summary = {"benchmark": "profiler_floor", "device": args.device, "torch": torch.__version__}
    print(json.dumps({**summary, "results": results}))


if __name__ == "__main__":
    main()
