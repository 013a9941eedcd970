"""Peak FLOP/s of common accelerators, for model FLOPs utilisation (MFU = achieved / peak).

Dense bf16/fp16 tensor-core peaks from the vendors' datasheets (no sparsity), keyed by a substring
of the device name torch records (``torch.cuda.get_device_properties(i).name`` in a live profile,
``deviceProperties[].name`` in a trace). Work in fp32 runs far below these: pass your own peak
(``--peak-tflops``, ``peak_tflops=``) for anything else.
"""

from __future__ import annotations

from typing import Any

#: (name substring, dense bf16/fp16 TFLOP/s), most specific first.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("V100", 125.0),
    ("T4", 65.0),
    ("MI300X", 1307.0),
    ("MI250X", 383.0),
)


def known_peak_tflops(device_name: str) -> float | None:
    """The table's peak for a device name, or None."""
    for key, tflops in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops
    return None


def device_names(meta: dict[str, Any]) -> list[str]:
    """Device names a profile's meta records (live capture or trace)."""
    found = [d.get("name") for d in meta.get("devices") or [] if isinstance(d, dict)]
    trace = meta.get("trace") or {}
    found += [d.get("name") for d in trace.get("device_properties") or [] if isinstance(d, dict)]
    return [str(n) for n in found if n]


def peak_flops_per_s(meta: dict[str, Any], peak_tflops: float | None = None) -> float | None:
    """The peak to compare against: the one given, else the table's for the profile's first known
    device, else None (then no MFU is shown)."""
    if peak_tflops is not None:
        return peak_tflops * 1e12 if peak_tflops > 0 else None
    for name in device_names(meta):
        found = known_peak_tflops(name)
        if found is not None:
            return found * 1e12
    return None
