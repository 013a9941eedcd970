"""Advice: rules that fire on evidence in a profile (and its device report) and say what to do.

Each rule returns an :class:`Advice` with the numbers and the place that triggered it, or None —
also when the trace lacks what the rule needs: a rule never guesses.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from layerscope.analysis.device import DeviceReport
from layerscope.events.names import DATA_LOADER_PREFIX, OPTIMIZER_STEP_PREFIX
from layerscope.model.profile import Profile
from layerscope.units import fmt_bytes, fmt_time_us


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


@dataclass(frozen=True, slots=True)
class Advice:
    """One finding: what to do, why (evidence), and where."""

    rule: str
    message: str
    where: str
    evidence: dict[str, Any] = field(default_factory=dict)


Rule = Callable[[Profile, DeviceReport | None], Advice | None]


def _unattributed_share(profile: Profile, prefix: str) -> tuple[float, str] | None:
    total = profile.totals.cpu_us
    hits = [e for e in profile.unattributed if e.label.startswith(prefix)]
    if not hits or total <= 0:
        return None
    return sum(e.metrics.cpu_us for e in hits) / total, hits[0].label


def data_loading(profile: Profile, device: DeviceReport | None) -> Advice | None:
    found = _unattributed_share(profile, DATA_LOADER_PREFIX)
    if found is None or found[0] < 0.2:
        return None
    share, label = found
    return Advice(
        "data-loading",
        f"the data loader takes {100 * share:.0f}% of CPU time: use DataLoader "
        "workers (num_workers > 0), pin_memory=True and prefetching",
        label,
        {"share": share},
    )


def optimizer_step(profile: Profile, device: DeviceReport | None) -> Advice | None:
    found = _unattributed_share(profile, OPTIMIZER_STEP_PREFIX)
    if found is None or found[0] < 0.2:
        return None
    share, label = found
    return Advice(
        "optimizer-step",
        f"the optimizer step takes {100 * share:.0f}% of CPU time: try "
        "foreach=True or fused=True (Adam/AdamW/SGD)",
        label,
        {"share": share},
    )


def low_utilisation(profile: Profile, device: DeviceReport | None) -> Advice | None:
    if device is None or not device.steps:
        return None
    bound = [s for s in device.steps if s.verdict == "CPU-bound"]
    if len(bound) * 2 < len(device.steps):
        return None
    mean = sum(s.utilisation for s in device.steps) / len(device.steps)
    return Advice(
        "low-device-utilisation",
        f"the device is busy {100 * mean:.0f}% of each step on average: "
        "the CPU side is the bottleneck (launch overhead, Python, syncs, data)",
        f"{len(bound)} of {len(device.steps)} steps",
        {"mean_utilisation": mean},
    )


def waiting_on_dependencies(profile: Profile, device: DeviceReport | None) -> Advice | None:
    """Most steps idle the device while launched work waits in its queue: not the CPU's fault."""
    if device is None or not device.steps:
        return None
    held = [s for s in device.steps if s.verdict == "waiting on dependencies"]
    if len(held) * 2 < len(device.steps):
        return None
    queued = sum(s.idle.other_us for s in held)
    wall = sum(s.wall_us for s in held)
    return Advice(
        "waiting-on-dependencies",
        f"the device idles {100 * queued / wall:.0f}% of these steps with work already queued: it waits "
        "on events, other streams or collectives (other ranks), not on the CPU; look for "
        "cross-stream waits and late ranks (layerscope merge), not for launch overhead",
        f"{len(held)} of {len(device.steps)} steps",
        {"queued_wait_us": queued},
    )


def tiny_kernels(profile: Profile, device: DeviceReport | None) -> Advice | None:
    if device is None or device.launches < 200 or device.tiny_kernels < 0.5 * device.launches:
        return None
    return Advice(
        "tiny-kernel-storm",
        f"{device.tiny_kernels} of {device.launches} kernels run under 10 µs "
        f"({device.launch_bound} shorter than their own launch): fuse them with torch.compile or "
        "replay them with CUDA graphs",
        "device",
        {"tiny": device.tiny_kernels, "launches": device.launches},
    )


def frequent_syncs(profile: Profile, device: DeviceReport | None) -> Advice | None:
    if device is None or not device.syncs:
        return None
    total = sum(s.total_us for s in device.syncs)
    count = sum(s.count for s in device.syncs)
    per_step = count / len(device.steps) if device.steps else 0.0  # no steps: judge by time alone
    if total < 0.02 * device.window_us and per_step < 20:
        return None
    worst = device.syncs[0]
    return Advice(
        "host-device-syncs",
        f"{count} host-device synchronisations ({fmt_time_us(total)}); the most "
        f"costly, {worst.call} in {worst.op}, blocks {worst.count} times: avoid .item(), .cpu() and "
        "printing device tensors in the loop; use non_blocking copies",
        worst.op,
        {"count": count, "total_us": total},
    )


def _compute_capability(profile: Profile) -> int:
    props = profile.meta.trace.device_properties
    majors = [int(p["computeMajor"]) for p in props if isinstance(p.get("computeMajor"), int)]
    return max(majors, default=0)


def fp32_matmul(profile: Profile, device: DeviceReport | None) -> Advice | None:
    if device is None or _compute_capability(profile) < 8:
        return None  # tensor cores for TF32/bf16 from Ampere on; unknown hardware: no advice
    fp32 = [
        k
        for k in device.kernels
        if k.kind in ("gemm", "convolution")
        and re.search(r"sgemm|scudnn|_f32f32|fp32", k.name, re.I)
        and not re.search(r"tf32|bf16|f16|h884|h1688|s1688|nchwToNhwc|nhwcToNchw", k.name, re.I)
    ]
    time = sum(k.total_us for k in fp32)
    if not fp32 or time < 0.1 * device.busy_us:
        return None
    return Advice(
        "fp32-matmul",
        f"fp32 GEMM/convolution kernels take {fmt_time_us(time)} "
        f"({100 * time / max(device.busy_us, 1):.0f}% of device time) on a tensor-core GPU: enable TF32 "
        "(torch.backends.cuda.matmul.allow_tf32 = True) or bf16 autocast",
        _short(fp32[0].name),
        {"time_us": time},
    )


def channels_last(profile: Profile, device: DeviceReport | None) -> Advice | None:
    if device is None:
        return None
    layout = [k for k in device.kernels if re.search(r"nchwToNhwc|nhwcToNchw", k.name)]
    time = sum(k.total_us for k in layout)
    if not layout or time < 0.02 * device.busy_us:
        return None
    return Advice(
        "channels-last",
        f"layout conversions NCHW<->NHWC take {fmt_time_us(time)} "
        f"({sum(k.launches for k in layout)} launches): convert model and inputs to "
        "torch.channels_last",
        _short(layout[0].name),
        {"time_us": time},
    )


def memory_near_capacity(profile: Profile, device: DeviceReport | None) -> Advice | None:
    trace = profile.meta.trace
    capacity = max([p.get("totalGlobalMem", 0) for p in trace.device_properties] or [0])
    # the allocator's own running total, else the memory report's: both absolute
    report = profile.meta.memory
    recorded = next((c.absolute_peak_bytes for c in report.classes if c.device), 0) if report else 0
    peak = trace.peak_allocated_bytes.get("device", 0) or recorded
    if not capacity or not peak or peak < 0.9 * capacity:
        return None
    return Advice(
        "memory-near-capacity",
        f"peak device memory {fmt_bytes(peak)} is {100 * peak / capacity:.0f}% of {fmt_bytes(capacity)}: "
        "activation checkpointing, a smaller batch or bf16",
        "device",
        {"absolute_peak_bytes": peak, "capacity_bytes": capacity},
    )


def backward_heavy(profile: Profile, device: DeviceReport | None) -> Advice | None:
    field_name = "device_us" if profile.has_device_time else "cpu_us"
    whole = float(getattr(profile.totals, field_name))
    worst = None
    for node in profile.modules():
        if not node.path or node.children:
            continue
        fwd, bwd = getattr(node.forward, field_name), getattr(node.backward, field_name)
        if fwd > 0 and bwd > 3 * fwd and bwd > 0.05 * whole and (worst is None or bwd > worst[2]):
            worst = (node.path, fwd, bwd)
    if worst is None:
        return None
    path, fwd, bwd = worst
    return Advice(
        "backward-heavy",
        f"{path}'s backward costs {bwd / fwd:.1f}x its forward "
        f"({fmt_time_us(bwd)} vs {fmt_time_us(fwd)}): check for recomputation, non-contiguous "
        "gradients or an op with a slow backward",
        path,
        {"forward_us": fwd, "backward_us": bwd},
    )


def cpu_copies(profile: Profile, device: DeviceReport | None) -> Advice | None:
    if device is not None:
        return None
    total = profile.totals.cpu_us
    copies = [
        r
        for r in profile.ops(group_by=("name",))
        if r.name in ("aten::copy_", "aten::contiguous", "aten::clone")
    ]
    time = sum(r.metrics.self_cpu_us for r in copies)
    if total <= 0 or time < 0.1 * total:
        return None
    return Advice(
        "cpu-copies",
        f"copies (copy_/contiguous/clone) take {100 * time / total:.0f}% of CPU time: "
        "look for .contiguous(), dtype or layout changes in the loop",
        "ops",
        {"time_us": time},
    )


def slow_convolution(profile: Profile, device: DeviceReport | None) -> Advice | None:
    if device is not None:
        return None
    slow = [
        r
        for r in profile.ops(group_by=("name",))
        if r.name in ("aten::slow_conv2d_forward", "aten::thnn_conv2d", "aten::slow_conv3d")
    ]
    if not slow:
        return None
    time = sum(r.metrics.self_cpu_us for r in slow)
    return Advice(
        "cpu-slow-convolution",
        f"{slow[0].name} ({fmt_time_us(time)}) is the reference convolution: "
        "check that oneDNN (mkldnn) is enabled and inputs are float32 and contiguous",
        slow[0].name,
        {"time_us": time},
    )


RULES: tuple[Rule, ...] = (
    data_loading,
    low_utilisation,
    waiting_on_dependencies,
    tiny_kernels,
    frequent_syncs,
    fp32_matmul,
    channels_last,
    memory_near_capacity,
    optimizer_step,
    backward_heavy,
    cpu_copies,
    slow_convolution,
)


def advise(profile: Profile, device: DeviceReport | None) -> list[Advice]:
    """Every rule that fires, in rule order."""
    found = [rule(profile, device) for rule in RULES]
    return [a for a in found if a is not None]


__all__ = ["RULES", "Advice", "advise"]
