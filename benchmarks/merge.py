"""Merging many ranks: N synthetic per-rank profiles (one rank slowed in one module), merged the way
``layerscope merge`` does (parallel loading, then the cross-rank merge). Reports time and peak RSS.

    python benchmarks/merge.py --ranks 64

With ``--scheduler``: N synthetic per-rank *traces* (Chrome JSON, the raw files a job writes), read
on a Dask LocalCluster (127.0.0.1) of 1 and then 2 worker processes; reports time, the per-file cost
and the client's peak RSS (only Profiles come back to the client, never trace bytes).

    python benchmarks/merge.py --scheduler --ranks 16 --steps 3000
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import layerscope as ls
from layerscope.attribution import build_profile, module_range_name
from layerscope.events import EventKind, EventTable
from layerscope.model.meta import DistributedInfo, Environment, ProfileMeta

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


def on_dask(ranks: int, steps: int) -> None:
    """Raw traces read on a LocalCluster of 1, then 2 workers."""
    import logging

    from distributed import Client, LocalCluster

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from fixtures.rank_traces import write_rank_traces

    folder = Path(tempfile.mkdtemp(prefix="layerscope-dask-"))
    slow = ranks // 2 + 1
    files = write_rank_traces(folder, ranks, slow, steps=steps)
    size_mb = sum(f.stat().st_size for f in files) / 1e6
    results = []
    for workers in (1, 2):
        with (
            LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                host="127.0.0.1",
                dashboard_address=None,
                silence_logs=logging.ERROR,
            ) as cluster,
            Client(cluster, set_as_default=False) as client,
        ):
            t0 = time.perf_counter()
            merged = ls.merge(files, scheduler=client)
            elapsed = time.perf_counter() - t0
        s = merged.straggler
        assert s is not None and s.rank == slow and s.module == "layers.3" and not merged.failed, s
        client_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        per_file = elapsed * workers / ranks
        print(
            f"{ranks} traces ({size_mb:.0f} MB, {steps} steps each) on {workers} Dask worker(s): "
            f"{elapsed:.2f}s, {per_file:.3f} worker-s per file, client peak RSS {client_rss:.0f} MiB"
        )
        results.append({"workers": workers, "seconds": elapsed, "worker_s_per_file": per_file})
    print(json.dumps({"benchmark": "merge-dask", "ranks": ranks, "mb": size_mb, "runs": results}))
    for f in files:
        f.unlink()
    folder.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--modules", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--scheduler", action="store_true", help="raw traces on a Dask LocalCluster")
    args = parser.parse_args()
    if args.scheduler:
        on_dask(args.ranks, args.steps)
        return
    folder = Path(tempfile.mkdtemp(prefix="layerscope-merge-"))
    slow = args.ranks // 2 + 1
    for rank in range(args.ranks):
        table = rank_profile(rank, slow, args.modules, args.steps)
        build_profile(
            table, None, ProfileMeta(environment=Environment(distributed=DistributedInfo(rank, args.ranks)))
        ).save(folder / f"rank{rank}.json.gz")
    files = sorted(folder.glob("*.json.gz"))
    t0 = time.perf_counter()
    merged = ls.merge(files)
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
