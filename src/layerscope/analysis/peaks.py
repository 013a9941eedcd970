"""Peak FLOP/s of common accelerators per dtype, for model FLOPs utilisation (MFU = achieved / peak).

Dense peaks (no structured sparsity) from the vendors' datasheets, keyed by a substring of the device
name torch records (``torch.cuda.get_device_properties(i).name`` in a live profile,
``deviceProperties[].name`` in a trace). Sources: NVIDIA H100/H200 Tensor Core GPU datasheets (SXM and
PCIe columns), A100 datasheet, L40S and L4 datasheets, A10 datasheet (A10G: AWS G5, half the A10's
tensor rate), V100 and T4 datasheets (no bf16 tensor cores: bf16 work is held to the fp32 rate),
AMD Instinct MI300X and MI250X datasheets (matrix rates). Sparse figures in the datasheets are twice
these.

A profile's FLOPs are split by the dtype each op ran in (``meta.flops_by_dtype``); the peak MFU
compares against is the FLOP-weighted one (:func:`mixed_peak`): a run whose FLOPs are 90% bf16 and
10% fp32 is held to ``1 / (0.9 / bf16_peak + 0.1 / fp32_peak)``. fp32 matmuls count at the TF32 rate
when the run allowed TF32 (``torch.get_float32_matmul_precision()`` not ``highest``), fp32
convolutions (``fp32-conv``) when cuDNN did (``torch.backends.cudnn.allow_tf32``, on by default).
"""

from __future__ import annotations

from dataclasses import dataclass

from layerscope.analysis.device_specs import spec_for_device_name
from layerscope.model.meta import Environment, ProfileMeta

#: The dtype class whose peak stands in where the profile says nothing about dtypes.
DEFAULT_CLASS = "bf16"


@dataclass(frozen=True)
class PeakChoice:
    """The peak MFU is computed against, and how it was chosen (for the table's header)."""

    flops_per_s: float
    #: e.g. ``H100: bf16 989.5 TFLOP/s (92% of FLOPs), fp32 67 (8%)`` or ``--peak-tflops 312``.
    description: str


def known_peaks(device_name: str) -> dict[str, float] | None:
    """The spec table's peaks (dense TFLOP/s by dtype class) for a device name, or None."""
    spec = spec_for_device_name(device_name)
    return dict(spec.peak_tflops) if spec is not None else None


def known_peak_tflops(device_name: str, dtype: str = DEFAULT_CLASS) -> float | None:
    """The table's peak for a device name and dtype class, or None."""
    peaks = known_peaks(device_name)
    return peaks.get(dtype) if peaks is not None else None


def mixed_peak(
    peaks: dict[str, float], flops_by_dtype: dict[str, int], tf32: bool, tf32_conv: bool = True
) -> tuple[float, str]:
    """The FLOP-weighted peak (TFLOP/s) for FLOPs split by dtype class, and its description. Classes
    the device has no peak for (int, unknown) are held to the default class's peak; ``tf32`` and
    ``tf32_conv`` say whether fp32 matmuls and fp32 convolutions ran in TF32."""
    fallback = peaks.get(DEFAULT_CLASS) or max(peaks.values())
    total = sum(flops_by_dtype.values())
    seconds_per_tflop = 0.0
    parts = []
    for dtype, flops in flops_by_dtype.items():
        allowed = tf32_conv if dtype == "fp32-conv" else tf32
        used = dtype.removesuffix("-conv")
        used = "tf32" if used == "fp32" and allowed and "tf32" in peaks else used
        peak = peaks.get(used, fallback)
        seconds_per_tflop += (flops / total) / peak
        parts.append(f"{used} {peak:g} ({100 * flops / total:.0f}% of FLOPs)")
    return 1.0 / seconds_per_tflop, ", ".join(parts)


def choose_peak(meta: ProfileMeta, peak_tflops: float | None = None) -> PeakChoice | None:
    """The peak to compare against: the one given, else the table's for the profile's first known
    device, weighted by the profile's FLOPs per dtype (without them: the bf16/fp16 peak), else None
    (then no MFU is shown)."""
    if peak_tflops is not None:
        return PeakChoice(peak_tflops * 1e12, f"--peak-tflops {peak_tflops:g}") if peak_tflops > 0 else None
    device = _first_known_device(meta)
    if device is None:
        return None
    name, peaks = device
    by_dtype = meta.flops_by_dtype
    if by_dtype is not None and sum(by_dtype.run.values()) > 0:
        tflops, how = mixed_peak(peaks, dict(by_dtype.run), *_tf32_flags(meta))
        per_module = " (each module against its own mix)" if by_dtype.per_module else ""
        return PeakChoice(tflops * 1e12, f"{name} peak TFLOP/s: {how}{per_module}")
    fallback = peaks.get(DEFAULT_CLASS) or max(peaks.values())
    how = f"{DEFAULT_CLASS} {fallback:g} TFLOP/s (dtypes unknown)"
    return PeakChoice(fallback * 1e12, f"{name} peak: {how}")


def module_peak_rates(meta: ProfileMeta, peak_tflops: float | None = None) -> dict[str, float]:
    """FLOP/s peaks per module path, each weighted by the module's own FLOPs per dtype, in a mixed
    run on a known device (``meta.flops_by_dtype.per_module``); {} otherwise (then every module
    is held to :func:`choose_peak`'s, as a given ``--peak-tflops`` always holds them)."""
    per_module = meta.flops_by_dtype.per_module if meta.flops_by_dtype is not None else {}
    device = _first_known_device(meta)
    if peak_tflops is not None or device is None or not per_module:
        return {}
    peaks, flags = device[1], _tf32_flags(meta)
    return {
        path: mixed_peak(peaks, dict(mix), *flags)[0] * 1e12
        for path, mix in per_module.items()
        if sum(mix.values()) > 0
    }


def _first_known_device(meta: ProfileMeta) -> tuple[str, dict[str, float]] | None:
    """The first device the profile names that the table has peaks for, and its peaks."""
    for name in meta.device_names:
        peaks = known_peaks(name)
        if peaks is not None:
            return name, peaks
    return None


def _tf32_flags(meta: ProfileMeta) -> tuple[bool, bool]:
    """Whether fp32 matmuls and fp32 convolutions ran in TF32, as the run recorded (a trace does
    not say: torch's defaults)."""
    env = meta.environment or Environment()
    return env.float32_matmul_precision != "highest", env.cudnn_allow_tf32


def peak_flops_per_s(meta: ProfileMeta, peak_tflops: float | None = None) -> float | None:
    """The FLOP/s of :func:`choose_peak`, or None."""
    chosen = choose_peak(meta, peak_tflops)
    return chosen.flops_per_s if chosen is not None else None
