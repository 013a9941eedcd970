"""The critical path's cost: reading the trace, then the path itself, in µs per span.

On a synthetic Kineto trace of about N MB (``benchmarks/analyze.py``'s generator: ProfilerStep
ranges, module ranges, CPU ops launching kernels, a backward thread) and on HTA's
``ns_resolution`` test trace. The trace is read once; the path of the whole trace is then computed
``--repeat`` times and the median reported, split into its stages (graph, longest path, the rest:
categories, top ops, modules), because the machine is shared and single runs wander.

    python benchmarks/critical_path.py --size-mb 100 --repeat 5
    python benchmarks/critical_path.py --size-mb 1000 --repeat 3
    python benchmarks/critical_path.py --size-mb 0          # the fixture only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyze import generate  # benchmarks/ is on sys.path, not a package
from layerscope.analysis import critical_path as paths
from layerscope.analysis.critical_graph import Window, build_graph
from layerscope.events.table import EventTable
from layerscope.gcpause import gc_paused
from layerscope.loading import _read

FIXTURE = Path(__file__).resolve().parents[1] / "tests/fixtures/critical_path/ns_resolution.json.gz"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``fn`` took, and what it returned."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(name: str, path: Path, repeat: int) -> dict[str, Any]:
    """Read ``path`` once, then time the whole-trace path ``repeat`` times (medians)."""
    with gc_paused():
        read_s, table = timed(lambda: _read(path, None, False))
    assert isinstance(table, EventTable)
    start, end = paths.select_window(table)
    runs: dict[str, list[float]] = {"graph": [], "longest": [], "path": []}
    result = None
    for _ in range(repeat):
        with gc_paused():
            graph_s, graph = timed(lambda: build_graph(table, Window(start, end)))
            longest_s, _ = timed(partial(paths.longest_path, graph))
            path_s, result = timed(lambda: paths.critical_path(table))
        runs["graph"].append(graph_s)
        runs["longest"].append(longest_s)
        runs["path"].append(path_s)
    med = {k: statistics.median(v) for k, v in runs.items()}
    spans = table.span_count
    assert result is not None
    return {
        "trace": name,
        "mb": path.stat().st_size / 1e6,
        "spans": spans,
        "graph_nodes": int(graph.node_ts.size),
        "graph_edges": len(graph.src),
        "read_s": read_s,
        "path_s": med["path"],
        "graph_s": med["graph"],
        "longest_s": med["longest"],
        "runs_path_s": [round(s, 3) for s in runs["path"]],
        "us_per_span": med["path"] / spans * 1e6,
        "read_us_per_span": read_s / spans * 1e6,
        "length_us": result.length_us,
        "path_nodes": result.nodes,
    }


def show(r: dict[str, Any]) -> None:
    """One trace's line for people, then its JSON."""
    print(
        f"{r['trace']}: {r['mb']:.0f} MB, {r['spans']} spans ({r['graph_nodes']} nodes, "
        f"{r['graph_edges']} edges); read {r['read_s']:.2f}s ({r['read_us_per_span']:.1f} µs/span); "
        f"path {r['path_s']:.2f}s = {r['us_per_span']:.2f} µs/span (median of {len(r['runs_path_s'])}: "
        f"graph {r['graph_s']:.2f}s, longest path {r['longest_s']:.2f}s); "
        f"length {r['length_us']:.0f} µs through {r['path_nodes']} nodes"
    )
    print(json.dumps({"benchmark": "critical_path", **r}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100.0, help="synthetic trace size; 0: none")
    parser.add_argument("--repeat", type=int, default=5, help="runs of the path (median reported)")
    parser.add_argument("--keep", metavar="PATH", help="write the synthetic trace here and keep it")
    parser.add_argument("--trace", metavar="PATH", help="time this trace instead of a synthetic one")
    args = parser.parse_args()
    show(measure("ns_resolution", FIXTURE, args.repeat))
    if args.trace:
        show(measure(Path(args.trace).name, Path(args.trace), args.repeat))
        return
    if args.size_mb <= 0:
        return
    with tempfile.TemporaryDirectory(prefix="layerscope-bench-") as folder:
        path = Path(args.keep) if args.keep else Path(folder) / "synthetic.json"
        if not (args.keep and path.exists()):
            generate(path, args.size_mb)
        show(measure(f"synthetic {args.size_mb:g} MB", path, args.repeat))


if __name__ == "__main__":
    main()
