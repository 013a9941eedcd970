"""Post-processing paired in one process: the live build with this native module (its reader and
attribution's kernels, now in the trace reader's module) against a baseline native module (an
earlier build, whose reader is the old one and which has no attribution kernels, so attribution runs
numpy), alternated on the same capture.

    python benchmarks/postprocess_ab.py --baseline ~/.cache/layerscope/native/_layerscope_native_<old>.so
    python benchmarks/postprocess_ab.py --baseline <old .so> --model resnet

Each round profiles ``--steps`` training steps (``memory=True, shapes=True``, as ``postprocess.py``),
times torch's first ``key_averages()`` on that capture, then rebuilds the Profile with each module in
turn (order alternating by round). Process CPU time; medians, and the median of per-round ratios.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

from layerscope.capture import native
from layerscope.models import resnet18
from postprocess import capture, deep_mlp


def load(path: Path) -> ModuleType:
    """A native module from its file (any build: the name is the file's)."""
    module, why = native._load_binary(path)
    if module is None:
        raise SystemExit(f"cannot load {path}: {why}")
    return module


def build_with(recording: Any, reader: ModuleType, kernels: ModuleType | None) -> float:
    """CPU seconds of one live build reading with ``reader`` (the native module) and attribution's
    kernels from ``kernels`` (the trace reader's module today; None or one without them: numpy)."""
    real_reader, real_kernels = native.load, native.load_trace_reader
    native.load = lambda: reader  # type: ignore[assignment]
    native.load_trace_reader = lambda: kernels  # type: ignore[assignment]
    try:
        gc.collect()
        c0 = time.process_time()
        recording._build()
        return time.process_time() - c0
    finally:
        native.load, native.load_trace_reader = real_reader, real_kernels  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the earlier native module (.so)")
    parser.add_argument("--model", choices=("resnet", "mlp"), default="mlp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    current = native.load()
    if current is None:
        sys.exit(f"postprocess_ab.py: no native module: {native.status().reason}")
    old = load(args.baseline)  # an old build holds no kernels (attribution runs numpy with it)
    contenders = {"baseline": (old, old), "this": (current, native.load_trace_reader())}
    torch.manual_seed(0)
    model: torch.nn.Module = deep_mlp() if args.model == "mlp" else resnet18()
    x = torch.randn(40, 256) if args.model == "mlp" else torch.randn(5, 3, 224, 224)
    model(x).sum().backward()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    torch_s: list[float] = []
    events = 0
    for r in range(args.rounds):
        prof = capture(model, x, args.steps)
        gc.collect()
        c0 = time.process_time()
        prof.torch_profiler.key_averages()
        torch_s.append(time.process_time() - c0)
        names = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in names:
            times[name].append(build_with(prof.recording, *contenders[name]))
        events = prof.recording.build().meta.event_count
    print(f"{args.model}, {events} events, {args.rounds} rounds (CPU time, medians)")
    t = statistics.median(torch_s)
    print(f"  key_averages (first)   {t * 1e3:8.1f} ms  {t / events * 1e6:6.2f} us/event")
    for name, found in times.items():
        m = statistics.median(found)
        per_event = m / events * 1e6
        print(f"  build, {name:<15} {m * 1e3:8.1f} ms  {per_event:6.2f} us/event  {t / m:5.1f}x key_averages")
    ratios = [b / a for b, a in zip(times["baseline"], times["this"], strict=True)]
    print(f"  this vs baseline: {statistics.median(ratios):.2f}x faster (median of per-round ratios)")


if __name__ == "__main__":
    main()
