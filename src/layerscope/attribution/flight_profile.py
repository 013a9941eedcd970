"""A flight recorder's dump as a :class:`Profile`: the kept steps, the module tree, the trigger.

The light records (``events/flight_records.py``) hold module calls' wall times, forward and backward,
and nothing about ops: the tree made of them has CPU time only (a module's time is the wall time of
its calls, as a profiler range's would be), one row per step in ``steps``, and the time outside every
module call (the optimizer, the data loader, the loss) as the unattributed ``outside modules``. On
CUDA the device time between step boundaries is kept per step and, not being split by module, as the
unattributed ``device (not by module)``. A detailed profile the recorder took (``detail_every``) is
a profile of its own, saved beside the dump (``FlightInfo.detail_file``): its totals cover one step,
the dump's cover every kept step, and one profile cannot hold both and still add up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from layerscope.attribution.catalog import ModuleInfo, parent_path
from layerscope.attribution.flight_calls import StepCalls, module_sums, step_calls
from layerscope.attribution.tree import assemble_tree
from layerscope.events.flight_records import FlightModule, FlightStep
from layerscope.model.meta import FLIGHT, FlightInfo, ProfileMeta
from layerscope.model.metrics import own_metrics, sum_metrics
from layerscope.model.profile import ModuleNode, Phase, Profile, StepStats, UnattributedEntry

#: The unattributed entry of step time outside every module call.
OUTSIDE_MODULES = "outside modules"
#: The unattributed entry of device time measured between step boundaries (CUDA events).
DEVICE_NOT_BY_MODULE = "device (not by module)"


def flight_profile(
    steps: Sequence[FlightStep],
    modules: Sequence[FlightModule],
    flight: FlightInfo,
    meta: ProfileMeta,
) -> Profile:
    """The dump of ``steps`` (oldest first) of a recorder scoping ``modules`` (the root first);
    ``meta`` holds the environment and the model's name, ``flight`` the trigger."""
    calls = [step_calls(step) for step in steps]
    step_rows = tuple(_step_stats(step, found, modules) for step, found in zip(steps, calls, strict=True))
    wall_us = sum(row.wall_us for row in step_rows)
    root = _tree(calls, modules)
    outside = sum(row.unattributed.get(OUTSIDE_MODULES, 0.0) for row in step_rows)
    device = sum(row.device_us for row in step_rows)
    unattributed = [
        UnattributedEntry(OUTSIDE_MODULES, Phase.OTHER, len(step_rows), own_metrics({"cpu_us": outside}))
    ]
    if device > 0:
        device_entry = own_metrics({"device_us": device})
        unattributed.append(
            UnattributedEntry(DEVICE_NOT_BY_MODULE, Phase.OTHER, len(step_rows), device_entry)
        )
    totals = sum_metrics([root.total.folded(), *(e.metrics for e in unattributed)])
    return Profile(
        meta=replace(meta, source=FLIGHT, flight=flight, wall_us=wall_us),
        root=root,
        op_rows=(),
        unattributed=tuple(unattributed),
        totals=totals,
        steps=step_rows,
    )


def _step_stats(step: FlightStep, calls: StepCalls, modules: Sequence[FlightModule]) -> StepStats:
    inclusive, counts = module_sums(calls, len(modules))
    per_module = {
        modules[m].path: (float(inclusive[m, 0]) / 1000.0, float(inclusive[m, 1]) / 1000.0)
        for m in range(len(modules))
        if counts[m]
    }
    top = sum(
        calls.forward_ns[c] + calls.backward_ns[c] for c, parent in enumerate(calls.parent) if parent < 0
    )
    wall = max(step.wall_ns, top)
    return StepStats(
        step=step.step,
        wall_us=step.wall_ns / 1000.0,
        device_us=step.device_us or 0.0,
        cpu_us=wall / 1000.0,
        modules=per_module,
        unattributed={OUTSIDE_MODULES: (wall - top) / 1000.0},
    )


def _tree(calls: Sequence[StepCalls], modules: Sequence[FlightModule]) -> ModuleNode:
    """The module tree: every module's own forward and backward time over all the steps."""
    n = len(modules)
    own = np.zeros((n, 2), dtype=np.int64)
    call_counts = [0] * n
    recompute_counts = [0] * n
    first_call: dict[int, int] = {}
    for found in calls:
        for c, m in enumerate(found.module):
            own[m, 0] += found.forward_self_ns[c]
            own[m, 1] += found.backward_self_ns[c]
            if found.recompute[c]:
                recompute_counts[m] += 1
            else:
                call_counts[m] += 1
            first_call.setdefault(m, len(first_call))
    catalog = [
        ModuleInfo(
            path=module.path,
            type_name=module.type_name,
            parent=None if not module.path else parent_path(module.path),
            params=module.params,
            params_total=module.params_total,
        )
        for module in modules
    ]
    phases = [
        (own_metrics({"cpu_us": float(fwd) / 1000.0}), own_metrics({"cpu_us": float(bwd) / 1000.0}))
        for fwd, bwd in own.tolist()
    ]
    return assemble_tree(catalog, phases, call_counts, first_call, recompute_counts)
