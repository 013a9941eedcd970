"""The short benchmark behind ``device="cpu"`` (about a second of CPU time; ``cpu_spec.py`` caches
its result).

- Peaks: 512x512 matmuls for fp32, bf16 and fp16 (fp64 held to half of fp32); a 3x3 convolution of
  64 channels for fp32 convolutions (``fp32-conv``); a 16 MiB copy for the roofline's bandwidth.
- Per op class (``op_classes.py``): its representative op run at a small and a large size, and a
  line through the two times: the slope is the class's rate (FLOP/s or bytes/s), the intercept
  less a one-element op's time its fixed cost per call (what a small call pays beyond dispatch:
  oneDNN's primitive for a convolution, a matmul's packing). So a small convolution costs what
  small convolutions cost here, and a softmax what a softmax costs, not what a copy does. Each
  time is the median of calls on fresh input sets after 64 MiB were written (inputs come from
  memory, as in a step), a matmul's in the three layouts a ``Linear`` uses.
- Per-op cost: a chain of one-element multiplications run forward and backward (dispatch, a kernel
  call and autograd's work per op, as in a training step); a view's (a chain of views, forward and
  backward: dispatch and autograd's view node); a module call's (``nn.Module.__call__`` on a
  forward that does nothing). Each the best of a few repeats.

Times are the process's CPU time with one torch thread (a busy machine's waits for a core stay
out), the wall clock's with more (the CPU time of several threads adds up).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from layerscope.analysis.device_specs import DeviceSpec, OpClassCost
from layerscope.estimates.op_classes import MEMORY_CLASSES
from layerscope.estimates.op_costs import tensor_bytes

#: Elements (fp32) of a memory class's small and large run: 128 KiB and 2 MiB, the size of a small
#: model's activations.
MEMORY_SIZES = (1 << 15, 1 << 19)
#: Square matmul sizes and convolution map sizes (64 channels) of the compute classes' runs; a
#: convolution class also runs 256 channels on 2x2 maps (``fit_conv``).
MATMUL_SIZES = (64, 512)
CONV_SIZES = (4, 16)
#: Before a class's calls, this many bytes are written, so that their inputs come from memory, not
#: from the core's caches, as in a step (an op reads what ops long before it wrote: parameters,
#: saved activations, optimizer state; a small model's step moves tens of MiB). An add of 128 KiB
#: ran 4x faster on inputs in the cache, and 2 MiB adds 1.5x faster over a pool of 16 MiB than over
#: one of 64 MiB (docs/benchmarks.md, issue 37).
FLUSH_BYTES = 64 * 2**20
#: Input sets per run (each used once, cold), and the bytes they may take in all.
POOL_SETS = 16
POOL_BYTES = 24 * 2**20

#: How many distinct input sets a pool holds (the rest are copies of them): a matmul's three
#: layouts, as a ``Linear`` uses them forward (``x @ w.T``) and backward (``g @ w``, ``g.T @ x``).
VARIANTS = 3

#: A class's run: its op, a maker of the ``k``-th set of inputs, and the work one call does (FLOPs,
#: or bytes: None, counted from a call as ``op_costs`` counts an op's: inputs plus outputs).
Run = tuple[Callable[..., object], Callable[[int], tuple[object, ...]], float | None]


def kernel_clock() -> Callable[[], float]:
    """The clock kernels are timed on: the process's CPU time with one torch thread, else the wall."""
    return time.process_time if torch.get_num_threads() == 1 else time.perf_counter


def best_seconds(
    run: Callable[[], object],
    repeats: int,
    budget_s: float = 0.15,
    clock: Callable[[], float] | None = None,
) -> float:
    """The shortest time of one ``run()``, over ``repeats`` runs or ``budget_s`` (wall), whichever
    ends first, on ``clock`` (default :func:`kernel_clock`)."""
    clock = clock or kernel_clock()
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


def _set_bytes(args: tuple[object, ...]) -> int:
    return tensor_bytes([a for a in args if isinstance(a, torch.Tensor)])


def _copy(value: object) -> object:
    return value.clone() if isinstance(value, torch.Tensor) else value


def pooled_seconds(run: Run, flush: torch.Tensor) -> tuple[float, float, float]:
    """The median time of one call, each call on its own input set (``POOL_SETS``, at least 5,
    within ``POOL_BYTES``) after ``flush`` is written; the work of one call and the bytes it
    moves (as ``op_costs`` counts an op's). The median, not the best: a step is the sum of its
    ops' usual times."""
    op, make, work = run
    first = make(0)
    out = op(*first)
    outputs = list(out) if isinstance(out, tuple | list) else [out]
    moved = float(_set_bytes(first) + tensor_bytes([t for t in outputs if isinstance(t, torch.Tensor)]))
    work = moved if work is None else work
    count = max(5, min(POOL_SETS, POOL_BYTES // max(1, _set_bytes(first))))
    pool = [first, *(make(k) for k in range(1, min(count, VARIANTS)))]
    # copies of the first sets: as good as new inputs to the kernels, and faster to make
    pool += [tuple(_copy(a) for a in pool[k % VARIANTS]) for k in range(len(pool), count)]
    flush.fill_(1.0)
    clock = kernel_clock()
    times: list[float] = []
    for args in pool:
        start = clock()
        op(*args)
        times.append(clock() - start)
    times.sort()
    return times[len(times) // 2], work, moved


def memory_run(cls: str, n: int) -> Run:
    """The representative op of memory class ``cls`` on ``n`` fp32 elements."""
    aten = torch.ops.aten

    def flat(k: int) -> tuple[object, ...]:
        return (torch.rand(n),)

    def rows(k: int) -> tuple[object, ...]:
        return (torch.rand(n // 256, 256),)

    def normed_rows(k: int) -> tuple[object, ...]:  # with a layer norm's weight and bias
        return torch.rand(n // 256, 256), torch.ones(256), torch.zeros(256)

    def maps(k: int) -> tuple[object, ...]:  # 8 x 16 channels of n/2048 x 16 maps
        return (torch.rand(8, 16, n // 2048, 16),)

    def normed(k: int) -> tuple[object, ...]:  # with a batch norm's weight, bias and statistics
        return (*maps(k), torch.ones(16), torch.zeros(16), torch.zeros(16), torch.ones(16))

    def masked(k: int) -> tuple[object, ...]:  # an attention mask broadcast over the batch
        return torch.rand(n // 16384, 128, 128), torch.rand(128, 128) > 0.5

    def two(k: int) -> tuple[object, ...]:
        return torch.rand(n), torch.rand(n)

    runs: dict[str, Run] = {
        "elementwise": (torch.add, two, None),
        "elementwise_": (torch.Tensor.add_, two, None),
        "transcendental": (aten.gelu, flat, None),
        "reduction": (lambda x: aten.sum.dim_IntList(x, [-1]), rows, None),
        "softmax": (lambda x: aten._softmax(x, -1, False), rows, None),
        "layer_norm": (lambda x, w, b: aten.native_layer_norm(x, [256], w, b, 1e-5), normed_rows, None),
        "batch_norm": (lambda x, *wbs: aten.native_batch_norm(x, *wbs, True, 0.1, 1e-5), normed, None),
        "indexed": (lambda x, mask: aten.masked_fill(x, mask, -1e4), masked, None),
        "pool": (lambda x: aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1]), maps, None),
    }
    return runs[cls]


def compute_run(cls: str, size: int, channels: int = 64) -> Run:
    """The representative op of compute class ``cls`` at ``size`` (a matmul's side, a map's; a
    convolution's ``channels`` in and out)."""
    if cls == "matmul":

        def layouts(k: int) -> tuple[object, ...]:
            a, b = torch.rand(size, size), torch.rand(size, size)
            return (a, b.t()) if k % 3 == 0 else (a, b) if k % 3 == 1 else (a.t(), b)

        return torch.mm, layouts, 2.0 * size**3
    c = channels
    flops = 2.0 * 8 * c * size * size * c * 9
    if cls == "conv":

        def conv(x: torch.Tensor, w: torch.Tensor) -> object:
            return torch.nn.functional.conv2d(x, w, padding=1)

        return conv, lambda k: (torch.rand(8, c, size, size), torch.rand(c, c, 3, 3)), flops
    if cls == "conv_backward":
        back = torch.ops.aten.convolution_backward

        def run(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> object:
            return back(grad, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])

        def make(k: int) -> tuple[object, ...]:
            return torch.rand(8, c, size, size), torch.rand(8, c, size, size), torch.rand(c, c, 3, 3)

        return run, make, 2 * flops
    raise ValueError(f"no compute class {cls!r}")


def line_through(small: tuple[float, float], large: tuple[float, float], base_s: float = 0.0) -> OpClassCost:
    """The cost through two (seconds, work) points: the slope's rate, and the intercept less
    ``base_s`` (a one-element op's time, which the per-op cost already holds) as the fixed cost,
    never below 0. Where noise hides the difference between the two, the large run's average rate."""
    (t_s, work_s), (t_l, work_l) = small, large
    slope = t_l > t_s and work_l > work_s
    rate = (work_l - work_s) / (t_l - t_s) if slope else work_l / t_l
    return OpClassCost(fixed_us=max(0.0, t_s - work_s / rate - base_s) * 1e6, rate_per_s=rate)


def plane_through(points: list[tuple[float, float, float]], base_s: float = 0.0) -> OpClassCost | None:
    """The cost through three (seconds, FLOPs, bytes) points: ``fixed + FLOPs / rate + bytes /
    bytes_rate``; None where they give no positive rates (noise, or a data term the runs cannot
    tell from the FLOPs)."""
    try:
        fixed, per_flop, per_byte = np.linalg.solve(
            np.array([[1.0, w, b] for _, w, b in points]), np.array([t for t, _, _ in points])
        )
    except np.linalg.LinAlgError:
        return None
    if per_flop <= 0 or per_byte <= 0:
        return None
    return OpClassCost(max(0.0, fixed - base_s) * 1e6, 1 / per_flop, 1 / per_byte)


def fit_line(small: Run, large: Run, base_s: float, flush: torch.Tensor) -> OpClassCost:
    """A class's cost through its two runs' times (:func:`line_through`)."""
    t_s, work_s, _ = pooled_seconds(small, flush)
    t_l, work_l, _ = pooled_seconds(large, flush)
    return line_through((t_s, work_s), (t_l, work_l), base_s)


def fit_conv(cls: str, base_s: float, flush: torch.Tensor) -> OpClassCost:
    """A convolution class: 64 channels on small and large maps, and 256 channels on 2x2 maps
    (as a ResNet's last stage at a small input: the same FLOPs as 64 channels on 8x8 maps, its
    weights 16x larger), through :func:`plane_through`; the line through the first two where the
    three give no data term."""
    runs = [compute_run(cls, CONV_SIZES[0]), compute_run(cls, CONV_SIZES[1]), compute_run(cls, 2, 256)]
    points = [pooled_seconds(run, flush) for run in runs]
    plane = plane_through(points, base_s)
    if plane is not None:
        return plane
    (t_s, work_s, _), (t_l, work_l, _) = points[:2]
    return line_through((t_s, work_s), (t_l, work_l), base_s)


def class_costs() -> dict[str, OpClassCost]:
    """Every class's measured cost."""
    one = torch.ones(1)
    base_s = best_seconds(lambda: torch.add(one, one), repeats=200)
    flush = torch.empty(FLUSH_BYTES // 4)
    costs = {
        "matmul": fit_line(
            compute_run("matmul", MATMUL_SIZES[0]), compute_run("matmul", MATMUL_SIZES[1]), base_s, flush
        ),
        "conv": fit_conv("conv", base_s, flush),
        "conv_backward": fit_conv("conv_backward", base_s, flush),
    }
    for cls in MEMORY_CLASSES:
        small, large = memory_run(cls, MEMORY_SIZES[0]), memory_run(cls, MEMORY_SIZES[1])
        costs[cls] = fit_line(small, large, base_s, flush)
    return costs


def _matmul_tflops(dtype: torch.dtype, n: int = 512) -> float:
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    seconds = best_seconds(lambda: torch.mm(a, b), repeats=20)
    return 2 * n**3 / seconds / 1e12


def _conv_tflops() -> float:
    op, make, flops = compute_run("conv", 32)
    args = make(0)
    return (flops or 0.0) / best_seconds(lambda: op(*args), repeats=10) / 1e12


def _copy_bandwidth(nbytes: int = 16 * 2**20) -> float:
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    seconds = best_seconds(lambda: dst.copy_(src), repeats=10)
    return 2 * nbytes / seconds


def _per_call_us(loop: Callable[[], object], calls: int = 2000) -> float:
    # One thread's Python loop: its CPU time, so that a busy machine's waits for a core stay out.
    return best_seconds(loop, repeats=5, clock=time.process_time) / calls * 1e6


def _overheads_us() -> tuple[float, float, float]:
    """Per op (forward and backward, autograd's work in it), per view, per module call."""
    one = torch.ones(1)
    leaf = torch.ones(1, requires_grad=True)
    nothing = nn.Identity()

    def chain() -> None:  # 1000 ops forward, each recording its node, and 1000 in backward
        value = leaf
        for _ in range(1000):
            value = value * 1.0001
        value.backward()  # type: ignore[no-untyped-call]

    def views() -> None:  # the same for views: 1000 forward, 1000 in backward (ViewBackward's)
        value = leaf
        for _ in range(1000):
            value = value.view(1)
        value.backward()  # type: ignore[no-untyped-call]

    def modules() -> None:
        for _ in range(2000):
            nothing(one)

    return _per_call_us(chain), _per_call_us(views), _per_call_us(modules)


def measure_cpu() -> DeviceSpec:
    """This machine's CPU measured now (about a second)."""
    fp32 = _matmul_tflops(torch.float32)
    bf16 = _matmul_tflops(torch.bfloat16)
    fp16 = _matmul_tflops(torch.float16)
    op_us, view_us, module_us = _overheads_us()
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
        op_overhead_us=op_us,
        view_overhead_us=view_us,
        op_classes=class_costs(),
        module_overhead_us=module_us,
    )
