"""Trace analysis at scale: generate a realistic synthetic Kineto trace, then time ``analyze``.

The trace has what GPU training traces have: ProfilerStep ranges, layerscope module ranges, CPU ops
with shapes and concrete inputs, runtime launches, kernels linked by correlation, fwdbwd flows,
backward nodes with sequence numbers, and memory events. ``analyze`` runs in a fresh process so its
peak RSS is its own.

    python benchmarks/analyze.py --size-mb 100                  # both readers: read alone, analyze
    python benchmarks/analyze.py --size-mb 1000 --reader native
    python benchmarks/analyze.py --trace some.json.gz           # an existing trace
    python benchmarks/analyze.py --replicate ../shared/traces/cuda_nccl_distributed.json.gz --size-mb 200

Wall and CPU time (user + system: on a shared machine, the time this process ran) exclude importing
layerscope and torch (torch is imported up front, for the FLOP formulas; the import time and the RSS
after imports are printed beside them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HEADER = (
    '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {"id": 0, "name": "Synthetic GPU", '
    '"totalGlobalMem": 85899345920, "computeMajor": 9, "computeMinor": 0}\n  ],\n  "traceEvents": [\n'
)
FOOTER = '\n  ],\n  "traceName": "synthetic",\n  "displayTimeUnit": "ms"\n}\n'


class Writer:
    """Writes events in Kineto's layout, keeping time and ids moving forward."""

    def __init__(self, out: object) -> None:
        self.out = out
        self.first = True
        self.ext = 0
        self.corr = 0
        self.flow = 0
        self.seq = 0
        self.gpu_ts = 0.0

    def emit(self, text: str) -> None:
        self.out.write(("" if self.first else ",\n") + text)  # type: ignore[attr-defined]
        self.first = False

    def span(self, cat: str, name: str, ts: float, dur: float, args: str, pid: int = 1, tid: int = 1) -> None:
        self.emit(
            f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid},\n'
            f'    "ts": {ts:.3f}, "dur": {dur:.3f},\n    "args": {{\n      {args}\n    }}\n  }}'
        )

    def op_with_kernel(self, name: str, ts: float, dims: str, seq: int | None) -> float:
        """An op launching one kernel; returns its end."""
        self.ext += 1
        self.corr += 1
        seq_args = f'"Sequence number": {seq}, "Fwd thread id": 0, ' if seq is not None else ""
        self.span(
            "cpu_op",
            name,
            ts,
            30.0,
            f'"External id": {self.ext}, {seq_args}"Record function id": 0, '
            f'"Concrete Inputs": ["", "", "", "1", "1"], "Input type": ["float", "float", "float", '
            f'"Scalar", "Scalar"], "Input Strides": [[1], [1024, 1], [1, 1024], [], []], '
            f'"Input Dims": {dims}, "Ev Idx": {self.ext}',
        )
        self.span(
            "cuda_runtime",
            "cudaLaunchKernel",
            ts + 10,
            8.0,
            f'"External id": {self.ext}, "cbid": 211, "correlation": {self.corr}',
        )
        self.gpu_ts = max(self.gpu_ts, ts + 20)
        self.span(
            "kernel",
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
            self.gpu_ts,
            25.0,
            f'"External id": {self.ext}, "queued": 0, "device": 0, "context": 1, "stream": 7, '
            f'"correlation": {self.corr}, "registers per thread": 168, "grid": [132, 1, 1], '
            f'"block": [384, 1, 1]',
            pid=0,
            tid=7,
        )
        self.gpu_ts += 26
        self.emit(
            f'  {{\n    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, '
            f'"tid": 1,\n    "ts": {ts + 12:.3f},\n    "args": {{\n      "Total Reserved": 0, '
            f'"Total Allocated": 4194304, "Bytes": 4194304, "Device Id": 0, "Device Type": 1, '
            f'"Addr": {1000 + self.ext}, "Ev Idx": {self.ext}\n    }}\n  }}'
        )
        return ts + 30


def generate(path: Path, size_mb: float, layers: int = 24) -> int:
    """Write a trace of about ``size_mb`` MB; returns the number of steps written."""
    dims = "[[1024], [64, 1024], [1024, 1024], [], []]"
    steps = 0
    with path.open("w") as out:
        out.write(HEADER)
        w = Writer(out)
        ts = 1_000_000.0
        while out.tell() < size_mb * 1e6:
            step_start = ts
            w.span(
                "user_annotation", f"ProfilerStep#{steps}", ts, 40.0 * layers * 3 + 100, '"External id": 0'
            )
            seqs = []
            for layer in range(layers):
                w.span("cpu_op", f"ls:layers.{layer}:Linear", ts + 1, 38.0, f'"External id": {w.ext}')
                w.seq += 1
                seqs.append(w.seq)
                ts = w.op_with_kernel("aten::addmm", ts + 2, dims, w.seq) + 6
            for seq in reversed(seqs):
                w.ext += 1
                w.span(
                    "cpu_op",
                    "autograd::engine::evaluate_function: AddmmBackward0",
                    ts,
                    70.0,
                    f'"External id": {w.ext}, "Sequence number": {seq}, "Fwd thread id": 1, '
                    f'"Record function id": 0, "Ev Idx": {w.ext}',
                    tid=2,
                )
                ts = w.op_with_kernel("aten::mm", ts + 2, "[[64, 1024], [1024, 1024]]", None)
                ts = w.op_with_kernel("aten::mm", ts + 1, "[[1024, 64], [64, 1024]]", None) + 8
            ts = max(ts, step_start + 40.0 * layers * 3 + 100) + 5
            steps += 1
        out.write(FOOTER)
    return steps


_SHIFTED_IDS = ("External id", "correlation", "Record function id", "Ev Idx")


def replicate(source: Path, path: Path, size_mb: float) -> int:
    """Write ``source`` (a real trace) repeated to about ``size_mb`` MB: each copy later in time by the
    trace's length and with its ids (external, correlation, flow, record function) moved past the
    previous copy's, so links stay one to one. Returns the number of copies."""
    import gzip

    import orjson

    raw = source.read_bytes()
    trace = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = trace.pop("traceEvents")
    times = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    length = max(times) - min(times) + 1000
    copies = 0
    with path.open("wb") as out:
        out.write(orjson.dumps(trace)[:-1] + b',"traceEvents":[\n')
        while out.tell() < size_mb * 1e6:
            for k, event in enumerate(events):
                moved = dict(event)
                if isinstance(moved.get("ts"), (int, float)):
                    moved["ts"] = moved["ts"] + copies * length
                if isinstance(moved.get("id"), int):
                    moved["id"] = moved["id"] + copies * 10_000_000
                if isinstance(moved.get("args"), dict):
                    moved["args"] = dict(moved["args"])
                    for key in _SHIFTED_IDS:
                        if isinstance(moved["args"].get(key), int) and moved["args"][key] > 0:
                            moved["args"][key] += copies * 10_000_000
                out.write((b",\n" if copies or k else b"") + orjson.dumps(moved))
            copies += 1
        out.write(b"\n]}\n")
    return copies


CHILD = """
import json, os, resource, sys, time
t0 = time.perf_counter()
from pathlib import Path
from layerscope.loading import _read, analyze
from layerscope.events import native_trace
if os.environ.get("BENCH_TORCH") == "1":
    import torch  # FLOP formulas need it: imported up front so read and analyze times exclude it
t1 = time.perf_counter()
usage = resource.getrusage(resource.RUSAGE_SELF)
before, cpu0 = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
if sys.argv[2] == "read":
    table = _read(Path(sys.argv[1]))
    facts = {"events": table.event_count}
else:
    result = analyze(sys.argv[1])
    facts = {"events": result.profile.meta.event_count, "steps": len(result.profile.steps),
             "modules": sum(1 for _ in result.profile.modules()),
             "device_busy_us": result.device.busy_us if result.device else 0,
             "advice": [a.rule for a in result.advice]}
t2 = time.perf_counter()
usage = resource.getrusage(resource.RUSAGE_SELF)
peak, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime - cpu0
print(json.dumps({"seconds": t2 - t1, "cpu_seconds": cpu, "import_seconds": t1 - t0, "peak_rss_mib": peak,
                  "rss_after_imports_mib": before, "declined": native_trace.last_decline, **facts}))
"""


def json_bytes(path: Path) -> int:
    """The size of the JSON: the file's, or for gzip the trailer's (uncompressed size mod 4 GiB)."""
    with path.open("rb") as f:
        if f.read(2) != b"\x1f\x8b":
            return path.stat().st_size
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


def run_child(path: Path, what: str, reader: str) -> dict[str, Any]:
    """``what`` (read or analyze) of ``path`` in a fresh process with ``reader`` (native or python)."""
    env = dict(os.environ, BENCH_TORCH="1")
    if reader == "python":
        env["LAYERSCOPE_NATIVE"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), what], capture_output=True, text=True, check=True, env=env
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def summary_line(reader: str, what: str, mb: float, result: dict[str, Any]) -> str:
    """One line per timed run: throughput, events per second, peak RSS."""
    seconds, cpu = float(result["seconds"]), float(result["cpu_seconds"])
    declined = f"; declined: {result['declined']}" if result["declined"] and reader == "native" else ""
    return (
        f"{reader:6} {what:7}: {seconds:5.2f}s = {mb / seconds:6.1f} MB/s of JSON "
        f"(CPU {cpu:5.2f}s = {mb / cpu:6.1f} MB/s) "
        f"({int(result['events']) / seconds / 1e3:.0f}k events/s), peak RSS {result['peak_rss_mib']:.0f} MiB "
        f"({result['rss_after_imports_mib']:.0f} after imports, {result['import_seconds']:.1f}s){declined}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100.0)
    parser.add_argument("--keep", metavar="PATH", help="write the trace here and keep it")
    parser.add_argument("--trace", metavar="PATH", help="time this trace instead of generating one")
    parser.add_argument("--replicate", metavar="TRACE", help="generate by repeating this real trace")
    parser.add_argument(
        "--reader", choices=("native", "python", "both"), default="both", help="which trace reader to time"
    )
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="layerscope-bench-")
    path = Path(args.trace or args.keep or Path(folder) / "synthetic.json")
    if not args.trace:
        t0 = time.perf_counter()
        if args.replicate:
            copies = replicate(Path(args.replicate), path, args.size_mb)
            print(f"{copies} copies of {args.replicate} in {time.perf_counter() - t0:.1f}s")
        else:
            steps = generate(path, args.size_mb)
            print(f"generated {steps} steps in {time.perf_counter() - t0:.1f}s")
    mb = json_bytes(path) / 1e6
    try:
        for reader in ("native", "python") if args.reader == "both" else (args.reader,):
            for what in ("read", "analyze"):
                result = run_child(path, what, reader)
                print(summary_line(reader, what, mb, result))
                print(
                    json.dumps(
                        {"benchmark": "analyze", "reader": reader, "what": what, "size_mb": mb, **result}
                    )
                )
    finally:
        if not args.keep and not args.trace:
            os.unlink(path)
            os.rmdir(folder)


if __name__ == "__main__":
    main()
