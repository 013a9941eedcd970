"""The roofline of a measured profile (``Profile.roofline``): every module in each phase and every op
row that did work, placed against a device's compute and memory roofs.

* **Work**: FLOPs and bytes of the op rows (``OpStats.flops``, ``OpStats.bytes``: from shapes and
  dtypes, a lower bound, ``attribution/op_bytes.py``); a module's are its subtree's op rows' in that
  phase.
* **Time**: device time when the profile has any, else CPU time: an op row's inclusive time (what
  its counted bytes include), a module's the self time of its ops (no Python between them).
* **Roofs**: the device's memory bandwidth and its peak FLOP/s for the dtype class the FLOPs ran in
  (an op its first input's dtype, a module the FLOP-weighted mix of its ops', as MFU does:
  ``peaks.mixed_peak``; fp32 matmuls at the TF32 rate when the run allowed it).
* **Verdict**: roofline time ``max(flops / peak, bytes / bandwidth)`` over the measured time is the
  ``roof_fraction``; below ``overhead_below`` the row is ``overhead``-bound, else ``compute`` when
  its intensity reaches the ridge point ``peak / bandwidth`` and ``memory`` below it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from layerscope.analysis.device_specs import DeviceSpec, device_spec, spec_for_device_name
from layerscope.analysis.peaks import mixed_peak
from layerscope.attribution.flop_dtypes import dtype_class
from layerscope.errors import UsageError
from layerscope.model.meta import Environment
from layerscope.model.profile import OpStats, Phase, Profile
from layerscope.model.roofline import Roofline, RooflineRow

_PHASES = (Phase.FORWARD, Phase.BACKWARD)


@dataclass
class _Work:
    """FLOPs, bytes and time summed over op rows (a module's in one phase)."""

    flops: int = 0
    bytes: int = 0
    unknown: bool = False  # some op's bytes are unknown
    time_us: float = 0.0
    unknown_us: float = 0.0
    calls: int = 0

    def add(self, row: OpStats, time_us: float) -> None:
        self.flops += row.metrics.flops
        self.time_us += time_us
        self.calls += row.calls
        if row.bytes is None:
            self.unknown_us += time_us
            self.unknown = True
        else:
            self.bytes += row.bytes

    @property
    def known_bytes(self) -> int | None:
        """The bytes, or None when the only work that moved any is unknown."""
        return None if self.unknown and not self.bytes else self.bytes


def profile_roofline(profile: Profile, device: Any = None, overhead_below: float = 0.1) -> Roofline:
    """``Profile.roofline``: the rows against ``device`` (see :class:`RooflineView`)."""
    spec = _spec(profile, device)
    on_device = profile.has_device_time
    flags = _tf32_flags(profile)
    mixes: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    work: dict[tuple[str, str], _Work] = defaultdict(_Work)
    ops = []
    for row in profile.op_rows:
        if row.module is None or row.phase not in _PHASES:
            continue
        self_us = row.metrics.self_device_us if on_device else row.metrics.self_cpu_us
        phase = str(row.phase)
        cls = _class(row)
        for path in _ancestors(row.module):
            work[(path, phase)].add(row, self_us)
            if row.metrics.flops:
                mix = mixes[(path, phase)]
                mix[cls] = mix.get(cls, 0) + row.metrics.flops
        if row.metrics.flops > 0 or row.bytes:
            peak = mixed_peak(dict(spec.peak_tflops), {cls: 1}, *flags)[0] * 1e12
            total_us = row.metrics.device_us if on_device else row.metrics.cpu_us
            ops.append(_row(spec, peak, overhead_below, row.module, phase, row.name, row, total_us))
    run_mix: dict[str, int] = {}
    for (path, _), mix in mixes.items():
        if path == "":
            for cls, flops in mix.items():
                run_mix[cls] = run_mix.get(cls, 0) + flops
    run_peak = _peak(spec, run_mix, flags)
    modules = []
    for node in profile.modules():
        for phase in _PHASES:
            w = work.get((node.path, str(phase)))
            if w is None or (w.time_us <= 0 and not w.flops):
                continue
            peak = _peak(spec, mixes.get((node.path, str(phase)), run_mix), flags)
            modules.append(_module_row(spec, peak, overhead_below, node.path, str(phase), w))
    ops.sort(key=lambda r: -r.time_us)
    return Roofline(
        device=spec.key,
        bandwidth_bytes_per_s=spec.bandwidth_bytes_per_s,
        peak_flops_per_s=run_peak,
        time_source="device" if on_device else "cpu",
        overhead_below=overhead_below,
        modules=tuple(modules),
        ops=tuple(ops),
    )


def _module_row(spec: DeviceSpec, peak: float, below: float, path: str, phase: str, w: _Work) -> RooflineRow:
    found = _judge(spec, peak, below, w.flops, w.known_bytes, w.time_us)
    share = w.unknown_us / w.time_us if w.time_us > 0 else 0.0
    return RooflineRow(path, phase, None, w.flops, w.known_bytes, *found, w.time_us, w.calls, peak, share)


def _row(
    spec: DeviceSpec, peak: float, below: float, path: str, phase: str, op: str, row: OpStats, time_us: float
) -> RooflineRow:
    found = _judge(spec, peak, below, row.metrics.flops, row.bytes, time_us)
    unknown = 1.0 if row.bytes is None else 0.0
    return RooflineRow(
        path,
        phase,
        op,
        row.metrics.flops,
        row.bytes,
        *found,
        time_us,
        row.calls,
        peak,
        unknown,
        row.dtype,
        row.input_shapes,
    )


def _judge(
    spec: DeviceSpec, peak: float, below: float, flops: int, nbytes: int | None, time_us: float
) -> tuple[float | None, float | None, float | None, str, float | None]:
    """(intensity, achieved FLOP/s, achieved bytes/s, bound, roof fraction) of some work."""
    seconds = time_us / 1e6
    achieved_flops = flops / seconds if seconds > 0 and flops else None
    if nbytes is None:
        return None, achieved_flops, None, "unknown", None
    achieved_bytes = nbytes / seconds if seconds > 0 else None
    intensity = flops / nbytes if nbytes > 0 else None
    roof_seconds = max(flops / peak if peak > 0 else 0.0, nbytes / spec.bandwidth_bytes_per_s)
    fraction = roof_seconds / seconds if seconds > 0 else None
    ridge = peak / spec.bandwidth_bytes_per_s
    if fraction is not None and fraction < below:
        bound = "overhead"
    elif flops and (intensity is None or intensity >= ridge):
        bound = "compute"
    else:
        bound = "memory"
    return intensity, achieved_flops, achieved_bytes, bound, fraction


def _spec(profile: Profile, device: Any) -> DeviceSpec:
    """The spec given (a DeviceSpec, a key, a device name), else the profile's device's."""
    if device is not None:
        return device_spec(device)
    for name in profile.meta.device_names:
        found = spec_for_device_name(name)
        if found is not None:
            return found
    ran_on = ", ".join(profile.meta.device_names) or "the CPU"
    raise UsageError(
        f"no device spec for this profile (it ran on {ran_on}): pass device= a spec key such as "
        "'h100-sxm' (layerscope show --roofline --device KEY) or a DeviceSpec"
    )


def _class(row: OpStats) -> str:
    """The peak class of an op row's FLOPs (``fp32-conv`` for fp32 convolutions, as MFU splits)."""
    cls = dtype_class(row.dtype) if row.dtype is not None else "unknown"
    return "fp32-conv" if cls == "fp32" and "conv" in row.name else cls


def _peak(spec: DeviceSpec, mix: dict[str, int], flags: tuple[bool, bool]) -> float:
    """FLOP/s of the FLOP-weighted mix (the default class's without FLOPs)."""
    return mixed_peak(dict(spec.peak_tflops), mix if sum(mix.values()) > 0 else {"bf16": 1}, *flags)[0] * 1e12


def _tf32_flags(profile: Profile) -> tuple[bool, bool]:
    """Whether fp32 matmuls and convolutions ran in TF32 (a device's rate: never on the CPU)."""
    if not profile.has_device_time:
        return False, False
    env = profile.meta.environment or Environment()
    return env.float32_matmul_precision != "highest", env.cudnn_allow_tf32


def _ancestors(path: str) -> list[str]:
    """``a.b.c`` -> ``a.b.c``, ``a.b``, ``a``, ``""`` (a module's work is its ancestors' too)."""
    parts = path.split(".") if path else []
    return [".".join(parts[:k]) for k in range(len(parts), -1, -1)]


__all__ = ["profile_roofline"]
