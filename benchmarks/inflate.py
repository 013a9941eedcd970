"""The decompression bound of ``.json.gz`` traces: inflating alone (Python's zlib, the decompressor the
trace reader uses; ISA-L's ``isal`` and ``zlib-ng`` where they are installed) against the native read
of the same trace as ``.json`` and as ``.json.gz`` (whose inflating runs on a second thread while
the reader parses). Contenders alternate in one process, rounds paired; MB/s are of JSON.

    python benchmarks/analyze.py --size-mb 100 --keep /tmp/mf100.json
    python benchmarks/inflate.py /tmp/mf100.json --rounds 5

The ``.json.gz`` is written beside the trace (gzip level 9, as torch's ``tensorboard_trace_handler``
writes it) unless it exists. Each inflate reads the file in the reader's 2 MiB chunks and inflates
to blocks of at most 8 MiB, as ``events/native_trace.py`` does.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import importlib
import json
import os
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from layerscope.capture import native
from layerscope.events.native_trace import BLOCK_BYTES
from layerscope.loading import _read

#: Decompressors with zlib's ``decompressobj`` interface: module name -> what to call it.
INFLATERS = {"zlib": "zlib (CPython)", "isal.isal_zlib": "isal (ISA-L)", "zlib_ng.zlib_ng": "zlib-ng"}


def inflate_with(module: Any, path: Path) -> int:
    """Inflate ``path`` as the reader's block loop does; the bytes of JSON it holds."""
    total = 0
    with path.open("rb") as raw:
        inflate = module.decompressobj(31)
        while data := raw.read(BLOCK_BYTES // 4):
            while data:
                if inflate.eof:
                    inflate = module.decompressobj(31)
                total += len(inflate.decompress(data, BLOCK_BYTES))
                data = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
        while not inflate.eof and (rest := inflate.decompress(b"", BLOCK_BYTES)):
            total += len(rest)
    return total


def timed(run: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU) seconds of one call, after a collection."""
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="an uncompressed .json trace")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    plain: Path = args.trace
    packed = plain.with_name(plain.name + ".gz")
    if not packed.exists():
        packed.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=9))
    mb = plain.stat().st_size / 1e6
    assert native.load_trace_reader() is not None, "the native trace reader is not built"
    contenders: dict[str, Callable[[], object]] = {}
    for name, label in INFLATERS.items():
        try:
            module = importlib.import_module(name)
        except ImportError:
            print(f"{label}: not installed")
            continue
        contenders[f"inflate, {label}"] = lambda m=module: inflate_with(m, packed)
    contenders["native read, .json"] = lambda: _read(plain)
    contenders["native read, .json.gz"] = lambda: _read(packed)
    one, five, _ = os.getloadavg()
    print(f"{mb:.0f} MB of JSON, {packed.stat().st_size / 1e6:.1f} MB gzip; load {one:.1f} / {five:.1f}")
    for name, run in contenders.items():  # warm: page cache, imports, the FLOP formulas
        got = run()
        if name.startswith("inflate"):  # every decompressor gives the whole JSON back
            assert got == plain.stat().st_size, (name, got)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(timed(contenders[name]))
    summary: dict[str, Any] = {"benchmark": "inflate", "mb": mb, "gzip_mb": packed.stat().st_size / 1e6}
    for name, pairs in times.items():
        wall = statistics.median(w for w, _ in pairs)
        cpu = statistics.median(c for _, c in pairs)
        print(f"{name:32} {wall:6.3f}s = {mb / wall:6.0f} MB/s (CPU {cpu:6.3f}s = {mb / cpu:6.0f} MB/s)")
        summary[name] = {"seconds": wall, "cpu_seconds": cpu, "mb_per_s": mb / wall}
    base = times["inflate, zlib (CPython)"]
    for name in names:
        if name.startswith("inflate") and name != "inflate, zlib (CPython)":
            ratio = statistics.median(b[0] / t[0] for b, t in zip(base, times[name], strict=True))
            print(f"{name} is {ratio:.2f}x zlib's speed (median of per-round ratios)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    one, five, _ = os.getloadavg()
    print(f"peak RSS {peak:.0f} MiB; load after {one:.1f} / {five:.1f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
