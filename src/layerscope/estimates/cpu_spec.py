"""``device="cpu"``: this machine measured once, as a :class:`DeviceSpec`, so that CPU estimates can
be checked against CPU profiles here.

A short benchmark (about a second): matmuls (512x512) for the peak FLOP/s of fp32, bf16 and fp16
(fp64 is held to half of fp32), a 3x3 convolution of 64 channels for fp32 convolutions' own rate
(``fp32-conv``), a 16 MiB copy for the memory bandwidth (bytes read plus written per second; the
size of a typical weight or activation of a model one checks on a CPU, so partly cache-resident:
DRAM's alone is lower), and tiny ops for the per-op cost (a chain of one-element multiplications
run forward and backward: dispatch, a kernel call and autograd's work per op, as in a training
step; a view: dispatch only). Each figure is the best of a few repeats, taken with torch's current
thread count (the per-op loops in the process's CPU time, so that a busy machine's waits for a core
stay out). The result is cached as JSON in the layerscope cache folder (``LAYERSCOPE_CACHE``,
default ``~/.cache/layerscope``, as the native module's), keyed by torch's version, the thread count
and the processor, so it is measured once per machine and setting.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

from layerscope.analysis.device_specs import DeviceSpec


def cache_file() -> Path:
    """Where the measured spec is kept (one file per torch version, thread count and processor)."""
    root = os.environ.get("LAYERSCOPE_CACHE")
    base = (
        Path(root)
        if root
        else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "layerscope"
    )
    cpu = "".join(c if c.isalnum() else "-" for c in (platform.processor() or platform.machine()))[:40]
    return base / "devices" / f"cpu-v3-{torch.__version__}-{torch.get_num_threads()}t-{cpu}.json"


def _best_seconds(
    run: Callable[[], object],
    repeats: int,
    budget_s: float = 0.15,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The shortest time of one ``run()``, over ``repeats`` runs or ``budget_s``, whichever ends first."""
    run()  # warm up (allocations, first-call dispatch)
    best = float("inf")
    deadline = time.perf_counter() + budget_s
    for _ in range(repeats):
        start = clock()
        run()
        best = min(best, clock() - start)
        if time.perf_counter() > deadline:
            break
    return best


def _matmul_tflops(dtype: torch.dtype, n: int = 512) -> float:
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    seconds = _best_seconds(lambda: torch.mm(a, b), repeats=20)
    return 2 * n**3 / seconds / 1e12


def _conv_tflops() -> float:
    x = torch.randn(8, 64, 32, 32)
    w = torch.randn(64, 64, 3, 3)
    seconds = _best_seconds(lambda: torch.nn.functional.conv2d(x, w, padding=1), repeats=10)
    return 2 * 8 * 64 * 32 * 32 * 64 * 9 / seconds / 1e12


def _copy_bandwidth(nbytes: int = 16 * 2**20) -> float:
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), repeats=10)
    return 2 * nbytes / seconds


def _per_op_us(loop: Callable[[], object], calls: int = 2000) -> float:
    # One thread's Python loop: its CPU time, so that a busy machine's waits for a core stay out.
    return _best_seconds(loop, repeats=5, clock=time.process_time) / calls * 1e6


def measure_cpu() -> DeviceSpec:
    """This machine's CPU measured now (about a second)."""
    fp32 = _matmul_tflops(torch.float32)
    bf16 = _matmul_tflops(torch.bfloat16)
    fp16 = _matmul_tflops(torch.float16)
    one = torch.ones(1)
    leaf = torch.ones(1, requires_grad=True)

    def chain() -> None:  # 1000 ops forward, each recording its node, and 1000 in backward
        value = leaf
        for _ in range(1000):
            value = value * 1.0001
        value.backward()  # type: ignore[no-untyped-call]

    def views() -> None:
        for _ in range(2000):
            one.view(1)

    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: a figure to show, never to fit against
        memory = 16 * 2**30
    return DeviceSpec(
        key="cpu",
        name=f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        match=(),
        memory_bytes=int(memory),
        bandwidth_bytes_per_s=_copy_bandwidth(),
        peak_tflops={"fp64": fp32 / 2, "fp32": fp32, "fp32-conv": _conv_tflops(), "bf16": bf16, "fp16": fp16},
        op_overhead_us=_per_op_us(chain),
        view_overhead_us=_per_op_us(views),
    )


def _to_json(spec: DeviceSpec) -> dict[str, object]:
    return {
        "name": spec.name,
        "memory_bytes": spec.memory_bytes,
        "bandwidth_bytes_per_s": spec.bandwidth_bytes_per_s,
        "peak_tflops": dict(spec.peak_tflops),
        "op_overhead_us": spec.op_overhead_us,
        "view_overhead_us": spec.view_overhead_us,
    }


def cpu_spec(refresh: bool = False) -> DeviceSpec:
    """This machine's CPU as a spec: read from the cache, else measured and cached (``refresh``:
    measure again)."""
    path = cache_file()
    if not refresh and path.is_file():
        try:
            data = json.loads(path.read_text())
            return DeviceSpec(
                key="cpu",
                name=str(data["name"]),
                match=(),
                memory_bytes=int(data["memory_bytes"]),
                bandwidth_bytes_per_s=float(data["bandwidth_bytes_per_s"]),
                peak_tflops={str(k): float(v) for k, v in data["peak_tflops"].items()},
                op_overhead_us=float(data["op_overhead_us"]),
                view_overhead_us=float(data["view_overhead_us"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged cache file is measured again
    spec = measure_cpu()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(_to_json(spec), indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache: measured each time, still right
    return spec
