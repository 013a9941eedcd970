"""Post-processing speed: layerscope's exit-to-Profile time against torch's first key_averages().

Profiles N training steps of the built-in ResNet-18 layout with memory and shapes on, then, on the
same capture, times torch's first ``key_averages()`` and layerscope's Profile build (in both orders,
on two captures, so neither side profits from running second). Prints a table and one JSON line.

    python benchmarks/postprocess.py --steps 20
    python benchmarks/postprocess.py --model mlp --steps 20   # many small ops: 24 LayerNorm+GELU blocks
    python benchmarks/postprocess.py --model mlp --stages      # where our build's time goes, per stage
    python benchmarks/postprocess.py --with-stack --steps 5    # Python stacks on (many more events)
    python benchmarks/postprocess.py --reader python            # torch's bindings, not the native reader
    python benchmarks/postprocess.py --reader-threads 1         # the native reader's pass on one thread
    python benchmarks/postprocess.py --device cuda              # a GPU capture (kernels, device memory)
    python benchmarks/postprocess.py --rounds 3                 # 3 captures per order, median ratios

``--reader`` picks how torch's results are read: ``native`` (the C++ reader, ``layerscope native
build`` first), ``python`` (torch's Python bindings) or ``auto`` (native when built, as in use).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

import layerscope as ls
from _memory import peak_mib, reset_peak
from layerscope.models import resnet18


def capture(model: torch.nn.Module, x: torch.Tensor, steps: int, with_stack: bool = False) -> ls.profile:
    with ls.profile(model, memory=True, shapes=True, with_stack=with_stack) as prof:
        for _ in range(steps):
            model(x).sum().backward()
        if x.is_cuda:
            torch.cuda.synchronize()
    return prof


def measure(prof: ls.profile, ours_first: bool) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def ours() -> None:
        gc.collect()
        base = reset_peak()
        t0, c0 = time.perf_counter(), time.process_time()
        profile = prof.profile
        result["ours_s"] = time.perf_counter() - t0
        result["ours_cpu_s"] = time.process_time() - c0
        result["ours_peak_rss_mib"] = peak_mib()
        result["ours_rss_growth_mib"] = peak_mib() - base
        result["events"] = profile.meta.event_count
        result["reader"] = profile.meta.capture.reader

    def theirs() -> None:
        gc.collect()
        base = reset_peak()
        t0, c0 = time.perf_counter(), time.process_time()
        prof.torch_profiler.key_averages()
        result["torch_s"] = time.perf_counter() - t0
        result["torch_cpu_s"] = time.process_time() - c0
        result["torch_peak_rss_mib"] = peak_mib()
        result["torch_rss_growth_mib"] = peak_mib() - base

    for step in (ours, theirs) if ours_first else (theirs, ours):
        step()
    return result


def stages(prof: ls.profile, reader: str) -> dict[str, float]:
    """CPU seconds per stage of the live build (``prof.profile``, as it runs): reading torch's
    results (the native reader's C++ pass and columns, or torch's bindings), attribution
    (``build_profile``), and the rest (the marks' spans added, the meta). Process CPU time, so that
    other work on a loaded machine does not count."""
    from layerscope.capture import recording

    timed: dict[str, float] = {}

    def timer(name: str, function: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            c0 = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                timed[name] = timed.get(name, 0.0) + time.process_time() - c0

        return run

    originals = {name: getattr(recording, name) for name in ("table_from_kineto", "build_profile")}
    recording.table_from_kineto = timer(f"{reader} reader", originals["table_from_kineto"])
    recording.build_profile = timer("attribution", originals["build_profile"])
    gc.collect()
    try:
        c0 = time.process_time()
        profile = prof.recording.build()
        whole = time.process_time() - c0
    finally:
        for name, function in originals.items():
            setattr(recording, name, function)
    rest = whole - sum(timed.values())
    return {"events": profile.meta.event_count, **timed, "marks, meta": rest}


def deep_mlp(blocks: int = 24, width: int = 256) -> torch.nn.Module:
    """Many small ops per step: ``blocks`` x (LayerNorm -> Linear -> GELU -> Linear), residual."""

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(width)
            self.up = torch.nn.Linear(width, 2 * width)
            self.act = torch.nn.GELU()
            self.down = torch.nn.Linear(2 * width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(self.act(self.up(self.norm(x))))

    return torch.nn.Sequential(*(Block() for _ in range(blocks)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--model", choices=("resnet", "mlp"), default="resnet")
    parser.add_argument("--stages", action="store_true", help="time the build's stages instead")
    parser.add_argument("--with-stack", action="store_true", help="record Python stacks too")
    parser.add_argument("--reader", choices=("auto", "native", "python"), default="auto")
    parser.add_argument(
        "--reader-threads",
        type=int,
        default=0,
        help="the native reader's threads (0: as many as pay off, as in use; 1: one pass)",
    )
    parser.add_argument("--device", default="cpu", help="where the model runs (cpu, cuda)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="captures per order (the median ratio of each order is printed)"
    )
    args = parser.parse_args()
    if args.reader == "python":
        os.environ["LAYERSCOPE_NATIVE"] = "0"
    elif args.reader == "native":
        from layerscope.capture import native

        if native.load() is None:
            sys.exit(f"postprocess.py: native reader not in use: {native.status().reason}")
    reader = args.reader
    if reader == "auto":
        from layerscope.capture import native

        reader = "native" if native.load() is not None else "python"
    torch.manual_seed(0)
    if args.model == "mlp":
        model: torch.nn.Module = deep_mlp()
        x = torch.randn(args.batch * 8, 256)
    else:
        model = resnet18()
        x = torch.randn(args.batch, 3, args.size, args.size)
    model, x = model.to(args.device), x.to(args.device)
    model(x).sum().backward()  # warm-up outside the profile
    if args.stages:
        found = stages(capture(model, x, args.steps, args.with_stack), reader)
        count = found.pop("events")
        print(f"{'stage (CPU time)':<24}{'seconds':>9}{'µs/event':>10}   ({count:.0f} events)")
        for name, seconds in found.items():
            print(f"{name:<24}{seconds:>8.3f}s{seconds / count * 1e6:>10.2f}")
        total = sum(found.values())
        print(f"{'total':<24}{total:>8.3f}s{total / count * 1e6:>10.2f}")
        print(
            json.dumps(
                {"benchmark": "postprocess-stages", "model": args.model, "reader": reader, "events": count}
                | found
            )
        )
        return
    runs = []
    for _ in range(args.rounds):
        for ours_first in (True, False):
            prof = capture(model, x, args.steps, args.with_stack)
            prof.recording.reader_threads = args.reader_threads
            runs.append({"ours_first": ours_first, **measure(prof, ours_first)})
            del prof
            gc.collect()
    print(f"reader: {runs[0]['reader']}")
    print(
        f"{'order':<14}{'events':>9}{'layerscope':>12}{'key_averages':>14}{'ratio':>8}{'µs/event':>10}"
        f"{'RSS+ ours':>11}{'RSS+ torch':>12}{'CPU ratio':>11}{'CPU µs/event':>14}"
    )
    for r in runs:
        ratio = r["torch_s"] / r["ours_s"]
        print(
            f"{'ours first' if r['ours_first'] else 'torch first':<14}{r['events']:>9.0f}"
            f"{r['ours_s']:>11.3f}s{r['torch_s']:>13.3f}s{ratio:>7.1f}x"
            f"{r['ours_s'] / r['events'] * 1e6:>10.2f}{r['ours_rss_growth_mib']:>8.0f}MiB"
            f"{r['torch_rss_growth_mib']:>9.0f}MiB"
            # process CPU time: what a loaded machine's other work does not inflate
            f"{r['torch_cpu_s'] / r['ours_cpu_s']:>10.1f}x{r['ours_cpu_s'] / r['events'] * 1e6:>14.2f}"
        )
    if args.rounds > 1:  # one run per order moves with the machine: the median of each order's ratios
        for ours_first in (True, False):
            ratios = sorted(r["torch_s"] / r["ours_s"] for r in runs if r["ours_first"] == ours_first)
            order = "ours first" if ours_first else "torch first"
            print(
                f"{order}: median ratio {statistics.median(ratios):.1f}x over {len(ratios)} captures {ratios}"
            )
    print(
        json.dumps(
            {
                "benchmark": "postprocess",
                "model": args.model,
                "with_stack": args.with_stack,
                "steps": args.steps,
                "batch": args.batch,
                "torch": torch.__version__,
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
