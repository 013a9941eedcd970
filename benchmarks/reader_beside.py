"""The native reader beside a running program: how much of its own speed a Python thread keeps while
another thread reads a capture (the flight recorder reads its detailed steps on a writer thread
beside the training loop).

A ResNet-18 layout capture (``--steps`` training steps, memory and shapes on) is read ``--reads``
times by ``read_columns`` in a background thread; meanwhile the main thread runs a pure-Python loop.
Reported: the loop's iterations per second during the reads against the same loop alone (paired,
alternated ``--rounds`` times; ``gc.collect()`` before each). The reader's C++ pass runs without the
GIL, so on a machine with a free core the loop keeps most of its speed; a reader holding the GIL
would stop it for the whole pass.

    python benchmarks/reader_beside.py [--steps 20] [--reads 10] [--rounds 5]
    python benchmarks/reader_beside.py --writer    # the flight recorder writer's whole job instead

``--writer`` runs what the writer thread does with a detailed step instead of bare reads: read the
capture into a table and let torch's results go (``Recording.keep_events_only``), with torch's
events freed by the native module off the GIL (``sole_owner=True``, as the recorder does) and
without (freed with the profiler, under the GIL), alternated, each round on a fresh capture.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

from layerscope.capture import native
from layerscope.models import resnet18
from postprocess import capture


def spin(until: threading.Event) -> float:
    """Iterations per second of a pure-Python loop until ``until`` is set."""
    count, start = 0, time.perf_counter()
    while not until.is_set():
        for _ in range(1000):
            count += 1
    return count / (time.perf_counter() - start)


def alone(seconds: float) -> float:
    """The loop's speed with nothing else running, for ``seconds``."""
    done = threading.Event()
    threading.Timer(seconds, done.set).start()
    return spin(done)


def beside(job: Callable[[], None]) -> tuple[float, float]:
    """The loop's speed while a thread runs ``job``, and the job's seconds."""
    done = threading.Event()
    took: list[float] = []

    def run() -> None:
        start = time.perf_counter()
        job()
        took.append(time.perf_counter() - start)
        done.set()

    worker = threading.Thread(target=run)
    worker.start()
    speed = spin(done)
    worker.join()
    return speed, took[0]


def beside_reads(module: Any, results: object, reads: int) -> tuple[float, float]:
    """The loop's speed while a thread reads ``results`` ``reads`` times; the reads' seconds."""

    def read() -> None:
        for _ in range(reads):
            module.read_columns(results, True)

    return beside(read)


def beside_writer(prof: Any, sole_owner: bool) -> tuple[float, float]:
    """The loop's speed while a thread reads ``prof``'s capture into a table and lets torch's
    results go (``keep_events_only``), and that job's seconds."""
    from layerscope.capture.recording import Recording

    direct = prof.recording
    recording = Recording(prof.torch_profiler, direct.context, direct.block_us)
    prof.__dict__.clear()  # the block's own references: the recording is the sole owner
    del direct
    return beside(lambda: recording.keep_events_only(sole_owner=sole_owner))


def writer_rounds(args: argparse.Namespace) -> None:
    """``--writer``: the writer's job with torch's events freed off the GIL and with the profiler."""
    torch.manual_seed(0)
    model, x = resnet18(), torch.randn(5, 3, 224, 224)
    model(x).sum().backward()
    found: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for sole_owner in (True, False):
            prof = capture(model, x, args.steps)
            gc.collect()
            speed, took = beside_writer(prof, sole_owner)
            del prof
            gc.collect()
            found[sole_owner].append((speed / alone(took), took))
    for sole_owner, label in ((True, "events freed off the GIL"), (False, "events freed with the profiler")):
        ratios = [r for r, _ in found[sole_owner]]
        seconds = statistics.median(t for _, t in found[sole_owner])
        print(
            f"{label:<32} job {seconds * 1e3:6.1f} ms   loop beside it {statistics.median(ratios):.2f}x "
            f"its speed alone (rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reads", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--writer", action="store_true", help="the flight recorder writer's whole job")
    args = parser.parse_args()
    module = native.load()
    if module is None:
        raise SystemExit(f"the native module is not built: {native.status().reason}")
    if args.writer:
        writer_rounds(args)
        return
    torch.manual_seed(0)
    model, x = resnet18(), torch.randn(5, 3, 224, 224)
    model(x).sum().backward()
    prof = capture(model, x, args.steps)
    results = prof.torch_profiler.profiler.kineto_results
    ratios, seconds = [], []
    for _ in range(args.rounds):
        gc.collect()
        speed, took = beside_reads(module, results, args.reads)
        gc.collect()
        ratios.append(speed / alone(took))
        seconds.append(took / args.reads)
    events = len(results.events())
    median_ms = statistics.median(seconds) * 1e3
    print(f"{events} events, one read {median_ms:.1f} ms (median of {args.rounds} rounds)")
    print(
        f"Python loop beside the reads: {statistics.median(ratios):.2f}x its speed alone "
        f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
    )


if __name__ == "__main__":
    main()
