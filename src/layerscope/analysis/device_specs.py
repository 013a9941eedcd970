"""Accelerator specs: memory, memory bandwidth and dense peak FLOP/s per dtype class, one record per
device, found by key (``h100-sxm``) or by the name torch reports (``NVIDIA H100 80GB HBM3``).

The one table MFU (``peaks.py``) reads; estimates and rooflines will read it too. Figures are the
vendors' datasheet figures (sources in docs/usage.md, "Device specs"), dense (a datasheet's
"with sparsity" figure halved); a device's fp32 tensor-core rate is its ``tf32`` class. Users add
their own with :class:`DeviceSpec` wherever a key is taken.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from layerscope.errors import UsageError

GB = 10**9
TB = 10**12


@dataclass(frozen=True)
class OpClassCost:
    """What one class of ops costs on a device, measured (``device="cpu"``): ``fixed_us`` per call on
    top of the spec's per-op cost (a kernel's set-up: oneDNN's primitive for a convolution, a
    small matmul's packing), and ``rate_per_s``, the rate its work runs at once it runs (FLOP/s for
    a compute class, at fp32; bytes read plus written per second for the others). A compute class
    may add a data term, its bytes at ``bytes_per_s`` (0: none): a convolution's weights reordered
    and its weight gradient reduced cost time beyond its FLOPs."""

    fixed_us: float
    rate_per_s: float
    bytes_per_s: float = 0.0

    def seconds(self, work: float, moved: float = 0.0) -> float:
        """The time of one call doing ``work`` (FLOPs or bytes) and moving ``moved`` bytes (the
        data term's), the per-op cost aside."""
        data = moved / self.bytes_per_s if self.bytes_per_s > 0 else 0.0
        return self.fixed_us * 1e-6 + work / self.rate_per_s + data


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator: ``match`` are the substrings (all of them, any case) a torch device name
    holds; ``memory_bytes`` its memory; ``bandwidth_bytes_per_s`` its memory bandwidth;
    ``peak_tflops`` dense TFLOP/s per dtype class (fp64, fp32, tf32, bf16, fp16, fp8).

    Estimates add to each op's roofline time ``op_overhead_us`` (an op that runs a kernel: launch
    and dispatch) or ``view_overhead_us`` (a view, which moves no data). The accelerators' defaults
    are a typical eager launch gap; ``device="cpu"`` measures both on this machine.

    ``op_classes`` (measured for ``device="cpu"``, empty for the accelerators): per class of ops
    (``estimates/op_classes.py``) its own fixed cost and rate, used instead of the roofline's peak
    and bandwidth for the ops of that class; ``module_overhead_us``: what each module call costs
    beyond its ops (``nn.Module.__call__`` in Python)."""

    key: str
    name: str
    match: tuple[str, ...]
    memory_bytes: int
    bandwidth_bytes_per_s: float
    peak_tflops: Mapping[str, float]
    op_overhead_us: float = 4.0
    view_overhead_us: float = 0.0
    op_classes: Mapping[str, OpClassCost] = field(default_factory=dict)
    module_overhead_us: float = 0.0

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for a dtype class (``fp32``, ``bf16``...). A class the spec has no
        figure for is held to the nearest one it has: tf32 to fp32, fp8 to bf16/fp16, fp64 to
        fp32, anything else (int, unknown) to bf16, then to the spec's lowest figure. A class the
        spec quotes (``fp32-conv`` on the measured CPU) is its own figure."""
        fallbacks = {
            "tf32": ("tf32", "fp32"),
            "fp8": ("fp8", "bf16", "fp16"),
            "fp64": ("fp64", "fp32"),
            "fp16": ("fp16", "bf16"),
            "bf16": ("bf16", "fp16"),
            "fp32": ("fp32",),
        }
        for name in (dtype, *fallbacks.get(dtype, ()), "bf16", "fp32"):
            figure = self.peak_tflops.get(name)
            if figure:
                return float(figure) * 1e12
        if not self.peak_tflops:
            raise UsageError(f"device spec {self.key!r} has no peak FLOP/s figure")
        return min(self.peak_tflops.values()) * 1e12

    def matches(self, device_name: str) -> bool:
        """Whether torch's name for a device is this one."""
        lowered = device_name.lower()
        return all(part.lower() in lowered for part in self.match)


_H100 = {"fp64": 67.0, "fp32": 67.0, "tf32": 494.5, "bf16": 989.0, "fp16": 989.0, "fp8": 1979.0}
_A100 = {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}

#: Most specific first: the first whose ``match`` a device name holds is its spec.
SPECS: tuple[DeviceSpec, ...] = (
    DeviceSpec("h200", "NVIDIA H200 SXM 141GB", ("H200",), 141 * GB, 4.8 * TB, _H100),
    DeviceSpec(
        "h100-pcie",
        "NVIDIA H100 PCIe 80GB",
        ("H100", "PCIe"),
        80 * GB,
        2.0 * TB,
        {"fp64": 51.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
    ),
    DeviceSpec("h100-sxm", "NVIDIA H100 SXM5 80GB", ("H100",), 80 * GB, 3.35 * TB, _H100),
    DeviceSpec("a100-80gb", "NVIDIA A100 SXM4 80GB", ("A100", "80GB"), 80 * GB, 2.039 * TB, _A100),
    DeviceSpec("a100-40gb", "NVIDIA A100 SXM4 40GB", ("A100",), 40 * GB, 1.555 * TB, _A100),
    DeviceSpec(
        "l40s",
        "NVIDIA L40S",
        ("L40S",),
        48 * GB,
        864 * GB,
        {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
    ),
    DeviceSpec(
        "l4",
        "NVIDIA L4",
        ("L4",),
        24 * GB,
        300 * GB,
        {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
    ),
    DeviceSpec(
        "rtx-4090",
        "NVIDIA GeForce RTX 4090",
        ("RTX 4090",),
        24 * GB,
        1008 * GB,
        {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
    ),
    DeviceSpec(
        "a10g",
        "NVIDIA A10G",
        ("A10G",),
        24 * GB,
        600 * GB,
        {"fp32": 31.2, "tf32": 35.0, "bf16": 70.0, "fp16": 70.0},
    ),
    DeviceSpec(
        "v100",
        "NVIDIA V100 SXM2 32GB",
        ("V100",),
        32 * GB,
        900 * GB,
        {"fp64": 7.8, "fp32": 15.7, "bf16": 15.7, "fp16": 125.0},
    ),
    DeviceSpec("t4", "NVIDIA T4", ("T4",), 16 * GB, 320 * GB, {"fp32": 8.1, "bf16": 8.1, "fp16": 65.0}),
    DeviceSpec(
        "mi300x",
        "AMD Instinct MI300X",
        ("MI300X",),
        192 * GB,
        5.3 * TB,
        {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
    ),
    DeviceSpec(
        "mi250x",
        "AMD Instinct MI250X",
        ("MI250X",),
        128 * GB,
        3.2 * TB,
        {"fp64": 95.7, "fp32": 95.7, "bf16": 383.0, "fp16": 383.0},
    ),
)


def spec_for_device_name(device_name: str, specs: tuple[DeviceSpec, ...] | None = None) -> DeviceSpec | None:
    """The spec of a device as torch names it, or None when the table has none."""
    return next((s for s in (specs if specs is not None else SPECS) if s.matches(device_name)), None)


def device_spec(device: str | DeviceSpec) -> DeviceSpec:
    """A spec by key (``h100-sxm``), by torch's device name, or as given; a UsageError listing the
    keys otherwise. (``cpu``, measured on this machine, is the estimates layer's:
    ``estimates/cpu_spec.py``.)"""
    if isinstance(device, DeviceSpec):
        return device
    by_key = {s.key: s for s in SPECS}
    found = by_key.get(device.lower()) or spec_for_device_name(device)
    if found is None:
        raise UsageError(
            f"no spec for device {device!r}; choose from {', '.join(by_key)} or pass a DeviceSpec"
        )
    return found


__all__ = ["SPECS", "DeviceSpec", "OpClassCost", "device_spec", "spec_for_device_name"]
