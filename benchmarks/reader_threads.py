"""The live build with the native reader's pass on one thread against as many as pay off
(``read_columns``'s stretches), alternated in one process: each build on a capture of its own
(``benchmarks/postprocess.py``'s ResNet-18 layout, memory and shapes on), ``gc.collect()`` first,
the order swapped every pair. Reports the median wall and CPU time of each and the paired ratios.

    python benchmarks/reader_threads.py [--pairs 8] [--steps 20] [--threads 0]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch

from layerscope.models import resnet18
from postprocess import capture  # the script's folder, benchmarks/, is on sys.path


def timed_build(model: torch.nn.Module, x: torch.Tensor, steps: int, threads: int) -> tuple[float, float]:
    """Wall and process CPU seconds of one capture's build, read with ``threads``."""
    prof = capture(model, x, steps)
    prof.recording.reader_threads = threads
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    prof.recording.build()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="the contender's threads (0: auto)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, x = resnet18(), torch.randn(5, 3, 224, 224)
    model(x).sum().backward()
    capture(model, x, 2).recording.build()  # the first build's one-time work, outside the pairs
    found: dict[int, list[tuple[float, float]]] = {1: [], args.threads: []}
    for pair in range(args.pairs):
        for threads in (1, args.threads) if pair % 2 else (args.threads, 1):
            found[threads].append(timed_build(model, x, args.steps, threads))
    for threads, runs in found.items():
        wall = statistics.median(w for w, _ in runs) * 1e3
        cpu = statistics.median(c for _, c in runs) * 1e3
        print(f"threads={threads}: build wall median {wall:.1f} ms, CPU median {cpu:.1f} ms")
    ratios = sorted(round(a[0] / b[0], 3) for a, b in zip(found[args.threads], found[1], strict=True))
    print(f"paired wall ratio ({args.threads} / 1): median {statistics.median(ratios):.3f}, {ratios}")
    print(json.dumps({"benchmark": "reader_threads", "runs": {str(k): v for k, v in found.items()}}))


if __name__ == "__main__":
    main()
