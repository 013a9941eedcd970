"""What one aten op of a fake step costs: FLOPs, bytes moved, and a predicted time.

FLOPs come from the formulas a measured profile uses (``capture/flops.py``), given the op's
arguments as the profiler records them (every schema argument, in order, defaults filled in), so
an estimate's FLOPs equal a measured profile's. Bytes are the tensors read plus the tensors written
(each tensor's own elements, not its storage's): a lower bound, since an op's kernel may read an
input more than once or write a temporary. A view moves nothing, nor does an empty tensor's
allocation. The time is the roofline's, ``max(FLOPs / peak(dtype), bytes / bandwidth)``, plus the
spec's per-op cost; on a spec with measured op classes (``device="cpu"``), an op of a measured
class costs that class's fixed cost plus its work (FLOPs for a compute class, scaled from fp32 by
the spec's peaks; bytes for the others) at the class's rate, plus the per-op cost
(``op_classes.py``, ``cpu_bench.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from layerscope.analysis.device_specs import DeviceSpec
from layerscope.capture.flops import FlopCalculator
from layerscope.estimates.op_classes import COMPUTE_CLASSES, op_class

#: torch dtypes -> the classes peaks are quoted for (as ``attribution/flop_dtypes.py`` names them).
DTYPE_CLASSES: dict[torch.dtype, str] = {
    torch.float32: "fp32",
    torch.complex64: "fp32",
    torch.float64: "fp64",
    torch.complex128: "fp64",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.int8: "int8",
    torch.uint8: "int8",
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        DTYPE_CLASSES[getattr(torch, _name)] = "fp8"

#: Convolutions: held to the spec's ``fp32-conv`` class where it has one (TF32 on an accelerator
#: when cuDNN allows it, as MFU does).
_CONVOLUTIONS = frozenset({"aten::convolution", "aten::_convolution", "aten::convolution_backward"})
#: Ops that run no kernel although torch does not mark them as views (the empties allocate and
#: write nothing).
_NO_KERNEL = frozenset(
    {
        "aten::_unsafe_view",
        "aten::lift_fresh",
        "aten::_local_scalar_dense",
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::new_empty",
        "aten::new_empty_strided",
    }
)


@dataclass(frozen=True, slots=True)
class OpCost:
    """One call's FLOPs, bytes, FLOPs' dtype class, predicted µs and its shapes as recorded."""

    flops: int
    bytes: int
    dtype: str
    time_us: float
    shapes: str


def dtype_class(dtype: torch.dtype) -> str:
    """The peak class of a torch dtype (``int`` for other integers and bool)."""
    return DTYPE_CLASSES.get(dtype, "int" if not dtype.is_floating_point else "unknown")


def schema_values(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """Every argument of the op's schema in order, defaults filled in (what the profiler records)."""
    values: list[Any] = []
    for k, argument in enumerate(func._schema.arguments):
        if k < len(args):
            values.append(args[k])
        elif argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif argument.has_default_value():
            values.append(argument.default_value)
        else:
            values.append(None)
    return values


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def tensor_bytes(tensors: list[torch.Tensor]) -> int:
    """The bytes of the tensors' elements (a view's own, not its storage's)."""
    return sum(t.numel() * t.element_size() for t in tensors)


class OpCoster:
    """Costs ops against one device spec with the measured profile's FLOP formulas.

    ``tf32``: fp32 matmuls are held to the tf32 peak (torch's float32 matmul precision is not
    ``highest``); ``tf32_conv``: fp32 convolutions are (cuDNN's ``allow_tf32``)."""

    def __init__(self, spec: DeviceSpec, tf32: bool = False, tf32_conv: bool = False) -> None:
        self.spec = spec
        self.calculator = FlopCalculator()
        self.tf32 = tf32
        self.tf32_conv = tf32_conv
        self._peaks: dict[str, float] = {}

    def _peak(self, dtype: str) -> float:
        found = self._peaks.get(dtype)
        if found is None:
            if dtype in self.spec.peak_tflops:
                used = dtype
            elif dtype.endswith("-conv"):
                used = "tf32" if dtype == "fp32-conv" and self.tf32_conv else dtype.removesuffix("-conv")
            else:
                used = "tf32" if dtype == "fp32" and self.tf32 else dtype
            found = self._peaks[dtype] = self.spec.peak_flops(used)
        return found

    def cost(
        self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], outputs: list[torch.Tensor]
    ) -> OpCost:
        """The cost of one call of ``func`` (aten name ``name``) that returned ``outputs``."""
        values = schema_values(func, args, kwargs)
        shapes = [list(v.shape) if isinstance(v, torch.Tensor) else [] for v in values]
        inputs = [t for v in values for t in _tensors(v)]
        dtype = dtype_class(inputs[0].dtype) if inputs else "unknown"
        peak_class = f"{dtype}-conv" if name in _CONVOLUTIONS else dtype
        flops = 0
        if self.calculator.needs(name):
            concrete = [None if isinstance(v, torch.Tensor) else v for v in values]
            flops = self.calculator.count(name, shapes, concrete)
        spec = self.spec
        if func.is_view or name in _NO_KERNEL:
            return OpCost(flops, 0, dtype, spec.view_overhead_us, str(shapes))
        moved = tensor_bytes(inputs) + tensor_bytes(outputs)
        seconds = self._measured_class(name, flops, moved, peak_class) if spec.op_classes else None
        if seconds is None:
            seconds = max(
                flops / self._peak(peak_class) if flops else 0.0, moved / spec.bandwidth_bytes_per_s
            )
        return OpCost(flops, moved, dtype, seconds * 1e6 + spec.op_overhead_us, str(shapes))

    def _measured_class(self, name: str, flops: int, moved: int, peak_class: str) -> float | None:
        """Seconds by the op's measured class (None: the spec did not measure it). A compute
        class's rate is fp32's; another dtype's is scaled by the spec's matmul peaks, and the time is
        never below the bytes' at the spec's bandwidth."""
        cls = op_class(name)
        cost = self.spec.op_classes.get(cls)
        if cost is None:
            return None
        if cls not in COMPUTE_CLASSES:
            return cost.seconds(moved)
        if not flops:  # a compute op no formula counts: its bytes at the roofline's bandwidth
            return None
        scale = self._peak(peak_class.removesuffix("-conv")) / self._peak("fp32")
        compute = cost.seconds(flops / scale, moved)
        return max(compute, moved / self.spec.bandwidth_bytes_per_s)
