"""The critical path through ranks: its cost against each rank's own path, on the same tables.

On the shared two-rank job (``$LAYERSCOPE_REAL_TRACES/two_ranks``, HTA's test traces) and, with
``--size-mb N --ranks K``, on K copies of a synthetic trace of about N MB (``benchmarks/analyze.py``'s
generator), each copy's clock moved by a second and slowed by 0.01% per rank (K ranks' graphs to
join; the synthetic trace has no collectives, so this times the joining and the per-rank work, not
collective edges). The traces are
read once; each path is then computed ``--repeat`` times, the joined path and the ranks' own paths
in turn (paired: the machine is shared), and the medians reported.

    python benchmarks/critical_ranks.py --repeat 7
    python benchmarks/critical_ranks.py --size-mb 100 --ranks 2 --repeat 3
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyze import generate  # benchmarks/ is on sys.path, not a package
from layerscope.analysis.critical_path import critical_path
from layerscope.analysis.critical_ranks import RankTable, rank_ids, ranks_critical_path
from layerscope.events.table import EventTable
from layerscope.gcpause import gc_paused
from layerscope.loading import _read

TRACES = Path(
    os.environ.get("LAYERSCOPE_REAL_TRACES", Path(__file__).resolve().parents[1] / "../shared/traces")
)


def read(path: Path) -> EventTable:
    """A trace's table."""
    with gc_paused():
        table = _read(path, None, False)
    assert isinstance(table, EventTable)
    return table


def shifted(table: EventTable, by_ns: int, rank: int) -> EventTable:
    """A copy of ``table`` on a clock ``by_ns`` ahead, as rank ``rank``, each rank 0.01% slower than
    the one before (identical copies would tie for the longest path, a case real jobs do not
    have, which costs a topological order over the whole graph to break)."""
    moved = copy.copy(table)
    t0 = min(table.span_ts)

    def moved_time(t: int) -> int:
        return t0 + by_ns + (t - t0) * (10_000 + rank) // 10_000

    moved.span_ts = [moved_time(t) for t in table.span_ts]
    moved.span_dur = [
        moved_time(t + d) - moved_time(t) for t, d in zip(table.span_ts, table.span_dur, strict=True)
    ]
    moved._arrays = {}
    moved.meta = {**table.meta, "distributed": {"rank": rank}}
    return moved


def measure(name: str, ranks: list[RankTable], repeat: int) -> dict[str, Any]:
    """The joined path and the ranks' own paths, ``repeat`` times each, in turn."""
    joined: list[float] = []
    alone: list[float] = []
    result = None
    for _ in range(repeat):
        with gc_paused():
            t0 = time.perf_counter()
            result = ranks_critical_path(ranks)
            t1 = time.perf_counter()
            for r in ranks:
                critical_path(r.table)
            t2 = time.perf_counter()
        joined.append(t1 - t0)
        alone.append(t2 - t1)
    assert result is not None and result.ranks is not None
    ratios = [j / a for j, a in zip(joined, alone, strict=True)]
    return {
        "trace": name,
        "ranks": len(ranks),
        "spans": sum(r.table.span_count for r in ranks),
        "joined_s": statistics.median(joined),
        "alone_s": statistics.median(alone),
        "ratio": statistics.median(ratios),
        "runs_joined_s": [round(s, 4) for s in joined],
        "runs_alone_s": [round(s, 4) for s in alone],
        "length_us": result.length_us,
        "segments": len(result.segments),
        "per_rank_us": {str(k): v for k, v in result.ranks.items()},
    }


def show(r: dict[str, Any]) -> None:
    """One line for people, then the JSON."""
    print(
        f"{r['trace']}: {r['ranks']} ranks, {r['spans']} spans; joined path {r['joined_s'] * 1000:.1f} ms, "
        f"the ranks' own paths {r['alone_s'] * 1000:.1f} ms (median of {len(r['runs_joined_s'])}; paired "
        f"ratio {r['ratio']:.2f}); length {r['length_us']:.0f} µs in {r['segments']} stretches"
    )
    print(json.dumps({"benchmark": "critical_ranks", **r}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--size-mb", type=float, default=0.0, help="a synthetic trace per rank; 0: none")
    parser.add_argument("--ranks", type=int, default=2, help="synthetic ranks")
    args = parser.parse_args()
    files = sorted((TRACES / "two_ranks").glob("rank-*.json.gz"))
    if files:
        tables = [read(f) for f in files]
        ranks = [RankTable(r, t) for r, t in zip(rank_ids(tables), tables, strict=True)]
        show(measure("two_ranks", ranks, args.repeat))
    if args.size_mb <= 0:
        return
    with tempfile.TemporaryDirectory(prefix="layerscope-bench-") as folder:
        path = Path(folder) / "synthetic.json"
        generate(path, args.size_mb)
        table = read(path)
    ranks = [RankTable(k, shifted(table, k * 1_000_000_000, k)) for k in range(args.ranks)]
    show(measure(f"synthetic {args.size_mb:g} MB x {args.ranks}", ranks, args.repeat))


if __name__ == "__main__":
    main()
