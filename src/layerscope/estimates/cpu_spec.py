"""``device="cpu"``: this machine measured once (``cpu_bench.py``, about a second), as a
:class:`DeviceSpec`, so that CPU estimates can be checked against CPU profiles here.

The result is cached as JSON in the layerscope cache folder (``LAYERSCOPE_CACHE``, default
``~/.cache/layerscope``, as the native module's), keyed by torch's version, the thread count and the
processor, with when it was measured and the machine's load then (the 1-minute load average per
core). A spec measured on a busy machine is slower than the machine (one such spec predicted a
step twice as long as a quiet one), so the cache is not kept blindly:

- a cached spec measured under load (more than one runnable process per core) is measured again
  when it is read on a machine at most half as busy, and each figure keeps the best of the old and
  the new (a quiet machine's figures win, a loaded one's never replace them);
- ``cpu_spec(refresh=True)`` measures now and replaces the cache: what ``benchmarks/estimate.py
  --paired`` does, so that the spec and the steps it is compared with see the same load.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from layerscope.analysis.device_specs import DeviceSpec, OpClassCost
from layerscope.estimates.cpu_bench import measure_cpu

#: Load per core above which a measurement counts as taken on a busy machine.
BUSY_LOAD = 1.0


def cache_file() -> Path:
    """Where the measured spec is kept (one file per torch version, thread count and processor)."""
    root = os.environ.get("LAYERSCOPE_CACHE")
    base = (
        Path(root)
        if root
        else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "layerscope"
    )
    cpu = "".join(c if c.isalnum() else "-" for c in (platform.processor() or platform.machine()))[:40]
    return base / "devices" / f"cpu-v4-{torch.__version__}-{torch.get_num_threads()}t-{cpu}.json"


def load_per_core() -> float:
    """The 1-minute load average per core this process may use (0 where the OS does not say): a
    container given 2 of a host's 64 cores is busy at a load of 2, not 64."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        return os.getloadavg()[0] / (cores or 1)
    except (OSError, AttributeError):
        return 0.0


def _best_class(a: OpClassCost, b: OpClassCost) -> OpClassCost:
    """The faster of two whole fits. Never a mix of their figures: a fit's fixed cost and rate
    trade off against each other under noise, and the lowest of one with the highest of the other
    is a line neither measurement saw, faster than both. Compared at each fit's knee (the work
    whose time equals its fixed cost), moving as many bytes as it does work."""
    knees = [cost.fixed_us * 1e-6 * cost.rate_per_s for cost in (a, b)]
    total = [sum(cost.seconds(work, work) for work in knees) for cost in (a, b)]
    return a if total[0] <= total[1] else b


def best_of(a: DeviceSpec, b: DeviceSpec) -> DeviceSpec:
    """Each figure at its best of two measurements of one machine: the higher rate, the lower cost;
    per op class the faster whole fit (:func:`_best_class`)."""
    classes = {
        name: _best_class(cost, b.op_classes[name]) if name in b.op_classes else cost
        for name, cost in a.op_classes.items()
    }
    peaks = {k: max(v, b.peak_tflops.get(k, 0.0)) for k, v in a.peak_tflops.items()}
    return replace(
        a,
        bandwidth_bytes_per_s=max(a.bandwidth_bytes_per_s, b.bandwidth_bytes_per_s),
        peak_tflops=peaks,
        op_overhead_us=min(a.op_overhead_us, b.op_overhead_us),
        view_overhead_us=min(a.view_overhead_us, b.view_overhead_us),
        module_overhead_us=min(a.module_overhead_us, b.module_overhead_us),
        op_classes={**b.op_classes, **classes},
    )


def to_json(spec: DeviceSpec, load: float) -> dict[str, object]:
    """The cache file's content: the spec, when it was measured and the load per core then."""
    return {
        "name": spec.name,
        "memory_bytes": spec.memory_bytes,
        "bandwidth_bytes_per_s": spec.bandwidth_bytes_per_s,
        "peak_tflops": dict(spec.peak_tflops),
        "op_overhead_us": spec.op_overhead_us,
        "view_overhead_us": spec.view_overhead_us,
        "module_overhead_us": spec.module_overhead_us,
        "op_classes": {k: [c.fixed_us, c.rate_per_s, c.bytes_per_s] for k, c in spec.op_classes.items()},
        "measured_at": time.time(),
        "load_per_core": load,
    }


def from_json(data: dict[str, Any]) -> tuple[DeviceSpec, float]:
    """A cache file's spec and the load per core it was measured under (KeyError, ValueError or
    TypeError on a damaged file)."""
    spec = DeviceSpec(
        key="cpu",
        name=str(data["name"]),
        match=(),
        memory_bytes=int(data["memory_bytes"]),
        bandwidth_bytes_per_s=float(data["bandwidth_bytes_per_s"]),
        peak_tflops={str(k): float(v) for k, v in data["peak_tflops"].items()},
        op_overhead_us=float(data["op_overhead_us"]),
        view_overhead_us=float(data["view_overhead_us"]),
        module_overhead_us=float(data["module_overhead_us"]),
        op_classes={str(k): OpClassCost(*(float(x) for x in v[:3])) for k, v in data["op_classes"].items()},
    )
    return spec, float(data["load_per_core"])


def _read(path: Path) -> tuple[DeviceSpec, float] | None:
    try:
        return from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None  # missing or damaged: measured again


def _write(path: Path, spec: DeviceSpec, load: float) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(to_json(spec, load), indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache: measured each time, still right


def cpu_spec(refresh: bool = False) -> DeviceSpec:
    """This machine's CPU as a spec: read from the cache, else measured and cached (``refresh``:
    measure now and replace the cache). A cached spec measured under load is measured again on a
    quieter machine, keeping each figure's best (module docstring)."""
    path = cache_file()
    cached = None if refresh else _read(path)
    load = load_per_core()
    if cached is not None:
        spec, cached_load = cached
        if cached_load <= BUSY_LOAD or load > cached_load / 2:
            return spec
        merged = best_of(measure_cpu(), spec)
        _write(path, merged, load)
        return merged
    spec = measure_cpu()
    _write(path, spec, load)
    return spec
