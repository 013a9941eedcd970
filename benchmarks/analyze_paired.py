"""``analyze`` of one trace under two layerscope trees, paired: each round runs both (order
alternating) in fresh processes (``benchmarks/analyze.py``'s child: CPU time, peak RSS), and the
figure to read is the median of the per-round CPU ratios, which a shared machine's load moves far
less than the times. Then where ``analyze``'s CPU time goes in this tree, in one process (GC paused
as ``analyze`` pauses it): the read, ``summarize_device``, ``build_profile``, the advice.

    git -C . archive main src | tar -x -C /tmp/before     # the baseline's src
    python benchmarks/analyze_paired.py /tmp/big.json --baseline /tmp/before/src --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from pathlib import Path

from benchmarks.analyze import json_bytes, run_child

HERE = Path(__file__).resolve().parents[1] / "src"


def child(path: Path, src: Path) -> dict[str, float]:
    """``analyze`` of ``path`` in a fresh process importing layerscope from ``src``."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(src), *([saved] if saved else [])])
    try:
        return run_child(path, "analyze", "native")
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def parts(path: Path) -> dict[str, float]:
    """CPU seconds of analyze's stages, in this process (this tree; torch imported first, as the
    child does: the FLOP formulas need it)."""
    import torch  # noqa: F401

    from layerscope import loading
    from layerscope.analysis.advice import advise
    from layerscope.analysis.device_summary import summarize_device
    from layerscope.attribution import nest_native
    from layerscope.attribution.attribute import build_profile
    from layerscope.capture import native
    from layerscope.model.meta import TRACE, ProfileMeta

    nest_native.use(native.load_trace_reader())  # as analyze does (loading._profile_of_trace)
    found: dict[str, float] = {}
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time()
        table = loading._read(path, None, False)
        t1 = time.process_time()
        device, summary = summarize_device(table)
        t2 = time.process_time()
        profile = build_profile(table, None, ProfileMeta(source=TRACE, trace_file=str(path), device=summary))
        t3 = time.process_time()
        advise(profile, device)
        t4 = time.process_time()
    finally:
        gc.enable()
    found.update(read=t1 - t0, summarize_device=t2 - t1, build_profile=t3 - t2, advice=t4 - t3)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--baseline", type=Path, required=True, help="the other tree's src folder")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    mb = json_bytes(args.trace) / 1e6
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
    for k in range(args.rounds):
        order = [("baseline", args.baseline), ("this", HERE)]
        for name, src in order if k % 2 == 0 else order[::-1]:
            runs[name].append(child(args.trace, src))
    for name, found in runs.items():
        cpu = statistics.median(r["cpu_seconds"] for r in found)
        rss = statistics.median(r["peak_rss_mib"] for r in found)
        each = " ".join(f"{r['cpu_seconds']:.2f}" for r in found)
        print(
            f"{name:8}: analyze CPU median {cpu:5.2f}s = {mb / cpu:6.1f} MB/s "
            f"(runs {each}), peak RSS {rss:.0f} MiB"
        )
    ratios = [
        b["cpu_seconds"] / t["cpu_seconds"] for b, t in zip(runs["baseline"], runs["this"], strict=True)
    ]
    print(f"baseline / this CPU, median of {args.rounds} paired rounds: {statistics.median(ratios):.2f}x")
    stages = parts(args.trace)
    total = sum(stages.values())
    print(
        f"this tree, one process: {total:.2f}s CPU = "
        + ", ".join(f"{k} {v:.3f}s ({v / total:.0%})" for k, v in stages.items())
    )


if __name__ == "__main__":
    main()
