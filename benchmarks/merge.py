"""Merging many ranks: N synthetic per-rank profiles (one rank slowed in one module), merged the way
``layerscope merge`` does (parallel loading, then the cross-rank merge). Reports time and peak RSS.

    python benchmarks/merge.py --ranks 64
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from layerscope.analysis.ranks import merge
from layerscope.attribution import build_profile, module_range_name
from layerscope.events import EventKind, EventTable
from layerscope.loading import load_all

US = 1000


def rank_profile(rank: int, slow_rank: int, modules: int, steps: int) -> EventTable:
    """``steps`` steps of ``modules`` layers; the slow rank spends 3x longer in layer 7."""
    t = EventTable()
    cursor = 0
    for step in range(steps):
        step_start = cursor
        t.add_span(f"ProfilerStep#{step}", EventKind.USER_ANNOTATION, 1, cursor, 0)
        root = t.add_span(module_range_name("", "Net"), EventKind.CPU_OP, 1, cursor + 1 * US, 0)
        cursor += 2 * US
        for m in range(modules):
            cost = 60 if (rank == slow_rank and m == 7) else 20
            t.add_span(
                module_range_name(f"layers.{m}", "Linear"), EventKind.CPU_OP, 1, cursor, (cost + 4) * US
            )
            t.add_span(
                "aten::addmm",
                EventKind.CPU_OP,
                1,
                cursor + 2 * US,
                cost * US,
                seq=step * modules + m,
                shapes="[[1024], [64, 1024], [1024, 1024]]",
                flops=134217728,
            )
            cursor += (cost + 5) * US
        t.span_dur[root] = cursor - t.span_ts[root]
        wait = 10 + (120 if rank != slow_rank else 0)  # the others wait in all_reduce
        t.add_span("gloo:all_reduce", EventKind.USER_ANNOTATION, 1, cursor, wait * US)
        cursor += (wait + 5) * US
        t.span_dur[t.span_name.index(t.intern(f"ProfilerStep#{step}"), 0)] = cursor - step_start
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--modules", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="layerscope-merge-"))
    slow = args.ranks // 2 + 1
    for rank in range(args.ranks):
        table = rank_profile(rank, slow, args.modules, args.steps)
        build_profile(table, None, {"distributed": {"rank": rank, "world_size": args.ranks}}).save(
            folder / f"rank{rank}.json.gz"
        )
    files = sorted(folder.glob("*.json.gz"))
    t0 = time.perf_counter()
    merged = merge(load_all(files))
    elapsed = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    s = merged.straggler
    assert s is not None and s.rank == slow and s.module == "layers.7", s
    print(
        f"{args.ranks} ranks x {args.modules} modules x {args.steps} steps: merged in {elapsed:.2f}s, "
        f"peak RSS {peak:.0f} MiB here, {worker_peak:.0f} MiB in the largest loading worker; "
        f"straggler rank {s.rank} in {s.module}"
    )
    print(
        json.dumps(
            {
                "benchmark": "merge",
                "ranks": args.ranks,
                "modules": args.modules,
                "steps": args.steps,
                "seconds": elapsed,
                "peak_rss_mib": peak,
                "worker_peak_rss_mib": worker_peak,
            }
        )
    )
    for f in files:
        f.unlink()
    folder.rmdir()


if __name__ == "__main__":
    sys.exit(main())
