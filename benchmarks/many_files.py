"""Many trace files at once: N synthetic rank traces loaded into Profiles (what ``layerscope merge``
and ``analyze FOLDER`` do per file) one after another, in a pool of threads and in a pool of
processes, each run in a fresh process; wall and CPU time (this process and its workers), peak RSS,
and whether every mode gives the same Profiles. Rounds alternate the modes (paired on a shared
machine); the per-round ratios against the serial run are summarized by their medians.

    python benchmarks/many_files.py --files 8 --size-mb 20 --jobs 2 --rounds 3
    python benchmarks/many_files.py --files 8 --size-mb 20 --gzip        # .json.gz traces

It also times what a process pool pays that threads do not: pickling each Profile back (dumps in the
worker, loads here) and its size. The traces are ``benchmarks/analyze.py``'s synthetic GPU training
steps (module ranges, ops with shapes, kernels, flows, memory events).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyze import generate

CHILD = """
import gc, hashlib, json, pickle, resource, sys, time
from pathlib import Path
if sys.argv[4] == "1":
    import torch  # FLOP formulas: imported up front, so forked workers inherit it
from layerscope.filemap import map_files
from layerscope.loading import load, load_many
from layerscope.model.serialize import profile_to_dict
import orjson
folder, mode, jobs = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
files = sorted(folder.iterdir())
def cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime
gc.collect()
t0, c0, w0 = time.perf_counter(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
if mode == "threads":
    done = map_files(load, files, jobs=jobs, pool="threads")
else:  # as ``layerscope merge`` loads: serial, or processes (the default pool)
    done = load_many(files, jobs=1 if mode == "serial" else jobs)
wall, here = time.perf_counter() - t0, cpu(resource.RUSAGE_SELF) - c0
workers = cpu(resource.RUSAGE_CHILDREN) - w0
assert not done.failures, done.failures
facts = {"seconds": wall, "cpu_seconds": here + workers, "here_cpu_seconds": here,
         "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
         "worker_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
         "digest": hashlib.sha256(b"".join(orjson.dumps(profile_to_dict(p)) for p in done.results))
         .hexdigest(),
}
if mode == "serial":  # as the pool's parent unpickles: the collector on, the heap collected
    gc.collect()
    t = time.perf_counter(); blobs = [pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL) for p in done.results]
    facts["pickle_dumps_s"] = time.perf_counter() - t
    gc.collect()
    t = time.perf_counter(); [pickle.loads(b) for b in blobs]
    facts["pickle_loads_s"] = time.perf_counter() - t
    facts["pickle_mb"] = sum(map(len, blobs)) / 1e6
print(json.dumps(facts))
"""

MODES = ("serial", "threads", "processes")

#: One file loaded in this process with the native reader's ``feed`` (its scan, which releases the
#: GIL) timed by thread CPU time: the share of a load that threads could run at once.
GIL_CHILD = """
import json, sys, time, types
from pathlib import Path
import torch
from layerscope.capture import native
from layerscope.loading import load
module = native.load_trace_reader()
spent = [0.0]
class Timed:
    def __init__(self, *args):
        self.reader = module.TraceReader(*args)
    def feed(self, block):
        t = time.thread_time(); self.reader.feed(block); spent[0] += time.thread_time() - t
    def __getattr__(self, name):
        return getattr(self.reader, name)
native.load_trace_reader = lambda: types.SimpleNamespace(TraceReader=Timed)
path = Path(sys.argv[1])
load(path)  # warm: the FLOP formulas, first-call costs
spent[0] = 0.0
t = time.process_time(); load(path); total = time.process_time() - t
print(json.dumps({"scan_cpu_s": spent[0], "load_cpu_s": total}))
"""


def make_traces(folder: Path, files: int, size_mb: float, compress: bool) -> float:
    """``files`` traces of ``size_mb`` MB of JSON each (one generated, copied); the JSON MB in all."""
    first = folder / "rank-0.json"
    generate(first, size_mb)
    if compress:
        first.with_suffix(".json.gz").write_bytes(gzip.compress(first.read_bytes(), compresslevel=6))
        first.unlink()
        first = first.with_suffix(".json.gz")
    for k in range(1, files):
        shutil.copyfile(first, folder / first.name.replace("rank-0", f"rank-{k}"))
    return files * size_mb


def run_child(folder: Path, mode: str, jobs: int, torch_first: bool) -> dict[str, Any]:
    """One mode in a fresh process (its peak RSS its own)."""
    argv = [sys.executable, "-c", CHILD, str(folder), mode, str(jobs), "1" if torch_first else "0"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--size-mb", type=float, default=20.0, help="JSON MB per trace")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gzip", action="store_true", help="the traces as .json.gz")
    parser.add_argument(
        "--torch-first",
        action="store_true",
        help="import torch before timing (default: as the CLI, which imports it at the first trace "
        "with shapes: once here, once in each worker process)",
    )
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="layerscope-many-"))
    try:
        mb = make_traces(folder, args.files, args.size_mb, args.gzip)
        print(f"{args.files} traces, {mb:.0f} MB of JSON{' (gzip)' if args.gzip else ''}; load: {_load()}")
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        for r in range(args.rounds):
            for mode in MODES[r % 3 :] + MODES[: r % 3]:  # each mode first in turn
                runs[mode].append(run_child(folder, mode, args.jobs, args.torch_first))
        report(runs, mb, args)
        gil_free_share(next(folder.iterdir()), args.jobs)
    finally:
        shutil.rmtree(folder)


def report(runs: dict[str, list[dict[str, Any]]], mb: float, args: argparse.Namespace) -> None:
    """Medians per mode, per-round ratios to serial, the pickling cost, and one JSON line."""
    digests = {r["digest"] for rs in runs.values() for r in rs}
    serial = runs["serial"]
    summary: dict[str, Any] = {"benchmark": "many-files", "files": args.files, "mb": mb, "jobs": args.jobs}
    for mode, rs in runs.items():
        wall = statistics.median(r["seconds"] for r in rs)
        cpu = statistics.median(r["cpu_seconds"] for r in rs)
        speedup = statistics.median(s["seconds"] / r["seconds"] for s, r in zip(serial, rs, strict=True))
        here = statistics.median(r["here_cpu_seconds"] for r in rs)
        jobs = 1 if mode == "serial" else args.jobs
        # with ``jobs`` free cores: what this process does, plus its workers' share each
        free = here + (cpu - here) / jobs if mode == "processes" else None
        rss = statistics.median(r["peak_rss_mib"] for r in rs)
        worker = statistics.median(r["worker_peak_rss_mib"] for r in rs)
        print(
            f"{mode:9} jobs={jobs}: wall {wall:5.2f}s ({mb / wall:5.1f} MB/s, {speedup:4.2f}x serial), "
            f"CPU {cpu:5.2f}s"
            + (f" ({here:.2f}s here)" if free else "")
            + f", peak RSS {rss:.0f} MiB"
            + (f" + {worker:.0f} MiB per worker" if worker else "")
            + (f"; on {jobs} free cores about {free:.2f}s" if free else "")
        )
        summary[mode] = {"seconds": wall, "cpu_seconds": cpu, "speedup": speedup, "peak_rss_mib": rss}
        summary[mode].update(worker_peak_rss_mib=worker, here_cpu_seconds=here, free_cores_estimate_s=free)
    dumps = statistics.median(r["pickle_dumps_s"] for r in serial)
    loads = statistics.median(r["pickle_loads_s"] for r in serial)
    size = serial[0]["pickle_mb"]
    share = (dumps + loads) / statistics.median(r["cpu_seconds"] for r in serial)
    print(
        f"pickling the {args.files} Profiles back from processes: {size:.2f} MB, dumps {dumps * 1e3:.0f} ms, "
        f"loads {loads * 1e3:.0f} ms ({share:.1%} of the serial CPU time)"
    )
    print(f"identical Profiles in every mode and round: {len(digests) == 1}; load after: {_load()}")
    summary.update(pickle_mb=size, pickle_s=dumps + loads, identical=len(digests) == 1)
    print(json.dumps(summary))


def gil_free_share(path: Path, jobs: int) -> None:
    """The native scan's share of one load's CPU time (run alone, plain ``.json``: with gzip the
    inflating thread adds to it), and the most threads could then gain (Amdahl)."""
    if path.name.endswith(".gz"):
        return
    done = subprocess.run(
        [sys.executable, "-c", GIL_CHILD, str(path)], capture_output=True, text=True, check=True
    )
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    share = facts["scan_cpu_s"] / facts["load_cpu_s"]
    bound = 1 / ((1 - share) + share / jobs)
    print(
        f"one load: {facts['load_cpu_s']:.3f} s CPU, of which the native scan (GIL released) "
        f"{facts['scan_cpu_s']:.3f} s = {share:.0%}: threads can gain at most {bound:.2f}x with {jobs} jobs, "
        f"{1 / (1 - share):.2f}x with any number"
    )
    print(json.dumps({"benchmark": "many-files-gil", **facts, "share": share, "thread_bound": bound}))


def _load() -> str:
    """The load averages and the cores, to print beside the figures."""
    one, five, _ = os.getloadavg()
    return f"{one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores at {time.strftime('%H:%M')}"


if __name__ == "__main__":
    main()
