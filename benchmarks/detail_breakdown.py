"""Where a flight recorder's detailed step goes: the profile's start, its stop and the writer's read
(``Recording.keep_events_only``), each run on the main thread under ``cProfile`` on the flight
benchmark's loop (the recorder runs the read on its writer thread; here it is timed alone).

    python benchmarks/detail_breakdown.py [--device cuda] [--cycles 3] [--top 20]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import time
from contextlib import nullcontext

import torch

from flight import make_loop  # the script's folder, benchmarks/, is on sys.path
from layerscope.capture.flight_shapes import DetailedProfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--sort", default="cumulative", help="a pstats sort key (tottime: own time)")
    args = parser.parse_args()
    model, step = make_loop(20, 4, args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for _ in range(5):
        step()
        sync()
    profilers = {part: cProfile.Profile() for part in ("start", "stop", "read")}
    for cycle in range(args.cycles + 1):  # the first cycle pays one-time set-up: not profiled
        gc.collect()
        times = {}
        detail = DetailedProfile(model, memory=True)
        begin = time.perf_counter()
        with profilers["start"] if cycle else nullcontext():
            detail.start()
        times["start"] = time.perf_counter() - begin
        step()
        sync()
        begin = time.perf_counter()
        with profilers["stop"] if cycle else nullcontext():
            recording = detail.stop()
        times["stop"] = time.perf_counter() - begin
        recording.pause_gc = False
        begin = time.perf_counter()
        with profilers["read"] if cycle else nullcontext():
            recording.keep_events_only(sole_owner=True)
        times["read"] = time.perf_counter() - begin
        print(f"cycle {cycle}: " + "  ".join(f"{k} {v * 1e3:.1f} ms" for k, v in times.items()), flush=True)
    for part, prof in profilers.items():
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats(args.sort).print_stats(args.top)
        table = text.getvalue().split("\n\n", 1)[-1]
        print(f"===== {part} ({args.sort}, over {args.cycles} cycles)\n{table}")


if __name__ == "__main__":
    main()
