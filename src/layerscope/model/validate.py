"""Profile invariants: the numbers must add up, or the profile is not trusted."""

from __future__ import annotations

import math

from layerscope.errors import ValidationError
from layerscope.model.memory import UNPAIRED
from layerscope.model.metrics import ADDITIVE_PAIRS, PEAK_FIELDS, Metrics
from layerscope.model.profile import ModuleNode, Profile

_TIME_FIELDS = {"self_cpu_us", "cpu_us", "self_device_us", "device_us"}
#: Times are sums of nanoseconds: anything further below zero than float rounding is a real negative.
_TIME_TOLERANCE_US = 1e-3


def _close(a: float, b: float, scale: float) -> bool:
    # Times are sums of integer nanoseconds divided by 1000: allow float rounding only.
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6 * max(1.0, scale) + 1e-6)


def validate_profile(profile: Profile) -> None:
    """Raise ValidationError naming the first broken invariant.

    1. every node, both phases: total = self + sum(children totals) for each additive metric,
       and a node's peak is at least each child's peak;
    2. no negative time (modules, unattributed entries, op rows), allocation or call count;
    3. unique paths, each child's path below its parent's;
    4. sum of all module selves plus unattributed = the run's independently computed totals;
    5. op rows: per (module, phase) their self CPU fits inside the module's self CPU and their FLOPs
       equal the module's self FLOPs; over the whole run op FLOPs equal total FLOPs;
    6. steps: no negative figure, and the steps (disjoint windows) hold no more CPU or device time
       than the whole run;
    7. memory: the run's absolute peak is at least what was live before it; where events carry
       addresses, the allocations and baseline storages live at the peak add up to it; no step's
       peak above the run's; memory over time peaks at the peak, and (with addresses) no category
       goes below zero;
    8. FLOPs by dtype (``meta.flops_by_dtype``): no negative class, and the classes add up to the
       run's FLOPs; in a mixed run each module's classes add up to its FLOPs.
    """
    errors: list[str] = []
    seen: set[str] = set()
    sums = {total: 0.0 for _, total in ADDITIVE_PAIRS}
    for node in profile.root.walk():
        if node.path in seen:
            errors.append(f"duplicate module path {node.path!r}")
        seen.add(node.path)
        if node.calls < 0 or node.recompute_calls < 0:
            errors.append(f"{node.path!r}: negative calls")
        for child in node.children:
            if node.path and not child.path.startswith(node.path + "."):
                errors.append(f"{child.path!r} is not below its parent {node.path!r}")
        for phase_name in ("forward", "backward"):
            _check_node_phase(node, phase_name, errors)
            metrics: Metrics = getattr(node, phase_name)
            for self_name, total_name in ADDITIVE_PAIRS:
                sums[total_name] += getattr(metrics, self_name)
        if len(errors) > 20:
            break
    for entry in profile.unattributed:
        for name in sorted(_TIME_FIELDS):
            value = getattr(entry.metrics, name)
            if value < -_TIME_TOLERANCE_US:
                errors.append(f"unattributed {entry.label!r}: negative {name}={value!r}")
        for self_name, total_name in ADDITIVE_PAIRS:
            if getattr(entry.metrics, self_name) != getattr(entry.metrics, total_name):
                errors.append(f"unattributed {entry.label!r}: {self_name} != {total_name}")
            sums[total_name] += getattr(entry.metrics, self_name)
    totals = profile.totals
    for _, total_name in ADDITIVE_PAIRS:
        expected = getattr(totals, total_name)
        if not _close(sums[total_name], expected, abs(expected)):
            errors.append(
                f"{total_name}: modules + unattributed = {sums[total_name]!r}, "
                f"but the run's total is {expected!r}"
            )
    _check_op_rows(profile, errors)
    _check_steps(profile, errors)
    _check_memory(profile, errors)
    _check_flops_by_dtype(profile, errors)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ValidationError(f"profile invariant broken: {errors[0]}{more}")


def _check_node_phase(node: ModuleNode, phase_name: str, errors: list[str]) -> None:
    metrics: Metrics = getattr(node, phase_name)
    kids = [getattr(c, phase_name) for c in node.children]
    for self_name, total_name in ADDITIVE_PAIRS:
        total = getattr(metrics, total_name)
        expected = getattr(metrics, self_name) + sum(getattr(k, total_name) for k in kids)
        if not _close(total, expected, abs(total)):
            errors.append(
                f"{node.path!r} {phase_name}: {total_name}={total!r} but self + children = {expected!r}"
            )
        if total_name != "net_bytes":
            own = getattr(metrics, self_name)
            tolerance = _TIME_TOLERANCE_US if self_name in _TIME_FIELDS else 0
            if own < -tolerance:
                errors.append(f"{node.path!r} {phase_name}: negative {self_name}={own!r}")
    for name in PEAK_FIELDS:
        peak = getattr(metrics, name)
        if peak < 0 or any(getattr(k, name) > peak for k in kids):
            errors.append(f"{node.path!r} {phase_name}: {name}={peak} below a child's or negative")


def _check_op_rows(profile: Profile, errors: list[str]) -> None:
    cpu: dict[tuple[str, str], float] = {}
    flops: dict[tuple[str, str], int] = {}
    total_flops = 0
    for row in profile.op_rows:
        if row.calls < 0:
            errors.append(f"op {row.name!r}: negative calls")
        for name in sorted(_TIME_FIELDS):
            value = getattr(row.metrics, name)
            if value < -_TIME_TOLERANCE_US:
                errors.append(f"op {row.name!r} ({row.module or row.scope}): negative {name}={value!r}")
        total_flops += row.metrics.flops
        if row.module is None:
            continue
        key = (row.module, str(row.phase) if row.phase is not None else "both")
        cpu[key] = cpu.get(key, 0.0) + row.metrics.self_cpu_us
        flops[key] = flops.get(key, 0) + row.metrics.flops
    nodes = {node.path: node for node in profile.root.walk()}
    for (path, phase), value in cpu.items():
        node = nodes.get(path)
        if node is None:
            errors.append(f"op rows name module {path!r}, which is not in the tree")
            continue
        metrics = node.phase(phase)
        if value > metrics.self_cpu_us + 1e-3 * max(1.0, value) + 1e-3:
            errors.append(
                f"{path!r} {phase}: ops' self CPU {value:.3f} µs exceeds the module's "
                f"self CPU {metrics.self_cpu_us:.3f} µs"
            )
        if flops.get((path, phase), 0) != metrics.self_flops:
            errors.append(
                f"{path!r} {phase}: ops' FLOPs {flops.get((path, phase), 0)} != module self "
                f"FLOPs {metrics.self_flops}"
            )
    if profile.op_rows and total_flops != profile.totals.flops:
        errors.append(f"op FLOPs {total_flops} != total FLOPs {profile.totals.flops}")


def _check_steps(profile: Profile, errors: list[str]) -> None:
    for step in profile.steps:
        for name in ("wall_us", "cpu_us", "device_us"):
            if getattr(step, name) < -_TIME_TOLERANCE_US:
                errors.append(f"step {step.step}: negative {name}={getattr(step, name)!r}")
    for name in ("cpu_us", "device_us"):
        in_steps = sum(getattr(step, name) for step in profile.steps)
        whole = getattr(profile.totals, name)
        if in_steps > whole + max(_TIME_TOLERANCE_US, 1e-9 * whole):
            errors.append(f"steps hold {name}={in_steps!r}, more than the run's {whole!r}")


def _check_memory(profile: Profile, errors: list[str]) -> None:
    report = profile.meta.memory
    for figures in report.classes if report is not None else ():
        what = "device" if figures.device else "CPU"
        peak, baseline = figures.absolute_peak_bytes, figures.baseline_bytes
        if peak < baseline or baseline < 0:
            errors.append(f"{what} memory peak {peak} below what was live before the block ({baseline})")
        live = sum(row.bytes for row in figures.rows if row.module != UNPAIRED or not figures.addressed)
        if live != peak:  # with addresses, every live byte is an allocation or a baseline storage
            errors.append(f"{what} memory live at the peak adds up to {live}, not the peak's {peak}")
        over = figures.over_time
        if over is not None and over.t_us and max(over.totals()) != peak:
            errors.append(f"{what} memory over time peaks at {max(over.totals())}, not the peak's {peak}")
        if (
            over is not None
            and figures.addressed
            and any(min(s, default=0) < 0 for s in over.bytes_by_category)
        ):
            errors.append(f"{what} memory over time holds a category below zero")
        for step in figures.steps:
            if step.absolute_peak_bytes > peak:
                step_peak = step.absolute_peak_bytes
                errors.append(f"{what} memory: step {step.step}'s peak {step_peak} above the run's {peak}")


def _check_flops_by_dtype(profile: Profile, errors: list[str]) -> None:
    found = profile.meta.flops_by_dtype
    if found is None:
        return
    by_dtype = found.run
    if any(flops < 0 for flops in by_dtype.values()):
        errors.append(f"flops_by_dtype has a negative class: {by_dtype!r}")
    if sum(by_dtype.values()) != profile.totals.flops:
        errors.append(
            f"flops_by_dtype adds up to {sum(by_dtype.values())}, the run's FLOPs are {profile.totals.flops}"
        )
    per_module = found.per_module
    if not per_module:
        return
    for node in profile.root.walk():
        mix = per_module.get(node.path, {})
        if any(flops < 0 for flops in mix.values()) or sum(mix.values()) != node.total.flops:
            where = node.path or "(root)"
            errors.append(f"module {where}: FLOPs by dtype {mix!r} do not add up to its {node.total.flops}")
