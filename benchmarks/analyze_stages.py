"""Where ``analyze``'s CPU time and memory go, step by step, in one process (GC paused as ``analyze``
pauses it): the read, ``summarize_device`` and each step of ``build_profile``.

    python benchmarks/analyze_stages.py /tmp/big.json --rounds 2     # CPU seconds, the least of N
    python benchmarks/analyze_stages.py /tmp/big.json --memory       # traced MiB at entry, peak inside

``--memory`` runs once under ``tracemalloc`` (numpy's arrays are traced; the interpreter, torch and
the native reader's own buffers are not): per step, what was live when it started and the highest
it reached inside. Add the RSS after imports (``benchmarks/analyze.py`` prints it) and the allocator's
unused heap to compare with a peak RSS.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The steps of ``build_profile`` timed, as ``attribution/attribute.py`` names them.
STEPS = (
    "_nest",
    "link_device_work",
    "memory_owners",
    "_op_rows",
    "_bucket_metrics",
    "module_tree",
    "step_stats",
    "_memory_report",
    "_profile_meta",
    "_totals",
)


def _wrapped(module: Any, name: str, seen: Callable[[str, Callable[[], Any]], Any]) -> None:
    original = getattr(module, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        return seen(name, lambda: original(*args, **kwargs))

    setattr(module, name, call)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--memory", action="store_true", help="traced memory per step, one round")
    args = parser.parse_args()
    import torch  # noqa: F401  (the FLOP formulas need it, as benchmarks/analyze.py's child imports it)

    from layerscope import loading
    from layerscope.attribution import attribute

    spent: dict[str, float] = {}

    def timed(name: str, run: Callable[[], Any]) -> Any:
        if args.memory:
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            found = run()
            _, peak = tracemalloc.get_traced_memory()
            print(f"  {name:18} entry {before / 2**20:5.0f} MiB, peak inside {peak / 2**20:5.0f} MiB")
            return found
        t = time.process_time()
        found = run()
        spent[name] = spent.get(name, 0.0) + time.process_time() - t
        return found

    for name in STEPS:
        _wrapped(attribute, name, timed)
    _wrapped(loading, "_read", timed)
    _wrapped(loading, "summarize_device", timed)
    if args.memory:
        tracemalloc.start(1)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        spent.clear()
        gc.collect()
        gc.disable()
        try:
            start = time.process_time()
            analysis = loading.analyze(args.trace)
            total = time.process_time() - start
        finally:
            gc.enable()
        if args.memory:
            break
        steps = sum(v for k, v in spent.items() if k in STEPS)
        spent["(the rest)"] = total - steps - spent["_read"] - spent["summarize_device"]
        spent["total"] = total
        for k, v in spent.items():
            best[k] = min(best.get(k, float("inf")), v)
        del analysis
    if best:
        mb = args.trace.stat().st_size / 1e6
        for k, v in best.items():
            print(f"{k:20} {v:6.3f} s CPU")
        print(f"total: {mb / best['total']:.1f} MB/s of JSON (least of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
