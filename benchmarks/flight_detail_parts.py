"""Where a flight recorder's detailed step goes, piece by piece (thread CPU time, paired rounds).

Contenders, in a shuffled order each round, on the model and step of ``benchmarks/flight.py``
(one thread): the plain step; the step with only the shapes callback running (``native_shapes.cpp``);
a bare ``torch.profiler`` (``profile_memory``) without and with ``record_shapes``; and layerscope's
detailed-step block (``flight_shapes.DetailedProfile``) with its own shapes and with torch's. For
each: the profile's start, the step under it, the stop, reading the events into a table (layerscope
only) and freeing torch's results. Medians over the rounds, in ms.

    python benchmarks/flight_detail_parts.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Callable

import torch
from benchmarks.flight import make_loop
from torch.profiler import ProfilerActivity, profile

from layerscope.capture import flight_shapes, native
from layerscope.capture.flight_shapes import DetailedProfile, ShapeRecorder

clock = time.thread_time


def main() -> None:
    """Run the rounds and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, step = make_loop(20, 4, "cpu")
    for _ in range(3):
        step()
    module = native.load()
    if not flight_shapes.supported(module):
        raise SystemExit("build the native module first: layerscope native build")

    def plain() -> dict[str, float]:
        start = clock()
        step()
        return {"step": clock() - start}

    def callback_only() -> dict[str, float]:
        recorder = ShapeRecorder(module)
        recorder.start()
        start = clock()
        step()
        took = clock() - start
        recorder.stop()
        recorder.take()
        return {"step": took}

    def bare(shapes: bool) -> dict[str, float]:
        parts = {}
        start = clock()
        tp = profile(activities=[ProfilerActivity.CPU], record_shapes=shapes, profile_memory=True)
        tp.__enter__()
        parts["start"], start = clock() - start, clock()
        step()
        parts["step"], start = clock() - start, clock()
        tp.__exit__(None, None, None)
        parts["stop"], start = clock() - start, clock()
        tp.profiler.kineto_results = None
        parts["free"] = clock() - start
        return parts

    def detailed(own: bool) -> dict[str, float]:
        parts = {}
        flight_shapes.OWN_SHAPES = own
        start = clock()
        detail = DetailedProfile(model, memory=True)
        detail.start()
        parts["start"], start = clock() - start, clock()
        step()
        parts["step"], start = clock() - start, clock()
        recording = detail.stop()
        parts["stop"], start = clock() - start, clock()
        tp = detail.session.torch_profiler
        recording.keep_events_only()
        recording.own_shapes = None
        parts["read"], start = clock() - start, clock()
        tp.profiler.kineto_results = None
        parts["free"] = clock() - start
        flight_shapes.OWN_SHAPES = True
        return parts

    contenders: dict[str, Callable[[], dict[str, float]]] = {
        "plain": plain,
        "shapes callback only": callback_only,
        "bare, no shapes": lambda: bare(False),
        "bare, record_shapes": lambda: bare(True),
        "layerscope, own shapes": lambda: detailed(True),
        "layerscope, torch's shapes": lambda: detailed(False),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    for run in contenders.values():  # warm up
        run()
    for _ in range(args.rounds):
        order = list(contenders)
        random.shuffle(order)
        for name in order:
            gc.collect()
            runs[name].append(contenders[name]())
    for name, found in runs.items():
        parts = "  ".join(f"{key} {statistics.median(r[key] for r in found) * 1000:6.1f}" for key in found[0])
        print(f"{name:28s} {parts}")


if __name__ == "__main__":
    main()
