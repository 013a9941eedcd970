"""Attribution rules on hand-built event tables, with exact expected numbers."""

from __future__ import annotations

import pytest

from layerscope.attribution import ModuleInfo, build_profile, module_range_name
from layerscope.events import EventKind, EventTable
from layerscope.model.meta import CaptureInfo, ProfileMeta, SavedOptions
from layerscope.model.profile import Phase

US = 1000  # ns per µs
CATALOG = [
    ModuleInfo(path="", type_name="Net", parent=None, params=0, params_total=10),
    ModuleInfo(path="fc", type_name="Linear", parent="", params=10, params_total=10),
]


def forward_backward_table(with_kernel: bool = True) -> EventTable:
    """Thread 1 runs: Net[ fc[ addmm(seq 7) -> kernel ] relu(seq 8) ] ; sum(seq 9) ; then backward:
    evaluate_function SumBackward0 (seq 9), ReluBackward0 (seq 8), AddmmBackward0 (seq 7) -> mm,
    AccumulateGrad. Memory: 400 B alloc in addmm, 100 B alloc + 100 B free in relu's backward."""
    t = EventTable()
    k = EventKind
    t.add_span(module_range_name("", "Net"), k.CPU_OP, 1, 0, 100 * US)
    t.add_span(module_range_name("fc", "Linear"), k.CPU_OP, 1, 10 * US, 50 * US)
    t.add_span(
        "aten::addmm",
        k.CPU_OP,
        1,
        20 * US,
        30 * US,
        seq=7,
        ext=101,
        shapes="[[4], [2, 8], [8, 4]]",
        flops=128,
    )
    t.add_span("cudaLaunchKernel", k.RUNTIME, 1, 25 * US, 5 * US, corr=9001)
    if with_kernel:
        t.add_span("gemm_kernel", k.KERNEL, 99, 40 * US, 12 * US, corr=9001, ext=101)
    t.add_span("aten::relu", k.CPU_OP, 1, 70 * US, 20 * US, seq=8, shapes="[[2, 4]]")
    t.add_span("aten::sum", k.CPU_OP, 1, 110 * US, 10 * US, seq=9)
    t.add_span(
        "autograd::engine::evaluate_function: SumBackward0", k.CPU_OP, 1, 200 * US, 10 * US, seq=9, fwd_tid=1
    )
    t.add_span(
        "autograd::engine::evaluate_function: ReluBackward0", k.CPU_OP, 1, 220 * US, 20 * US, seq=8, fwd_tid=1
    )
    t.add_span("aten::threshold_backward", k.CPU_OP, 1, 225 * US, 10 * US)
    t.add_span(
        "autograd::engine::evaluate_function: AddmmBackward0",
        k.CPU_OP,
        1,
        250 * US,
        40 * US,
        seq=7,
        fwd_tid=1,
    )
    t.add_span("aten::mm", k.CPU_OP, 1, 255 * US, 30 * US, flops=256)
    t.add_span(
        "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", k.CPU_OP, 1, 300 * US, 5 * US
    )
    t.add_memory(1, 30 * US, 400)
    t.add_memory(1, 228 * US, 100)
    t.add_memory(1, 232 * US, -100)
    t.add_memory(1, 400 * US, -400)  # outside every op
    return t


def test_forward_backward_device_memory_attribution() -> None:
    p = build_profile(
        forward_backward_table(), CATALOG, ProfileMeta(capture=CaptureInfo(options=SavedOptions(memory=True)))
    )
    p.validate()
    fc, root = p.find("fc"), p.root
    # forward CPU: fc range 50 µs, of which addmm 30 µs (itself 25 + runtime 5)
    assert fc.forward.self_cpu_us == 50 and fc.forward.cpu_us == 50
    assert root.forward.self_cpu_us == 100 - 50 and root.forward.cpu_us == 100
    # the kernel: launched by the runtime call inside addmm, so fc's forward device time
    assert fc.forward.device_us == 12 and root.forward.self_device_us == 0
    # backward follows sequence numbers: addmm (seq 7) is fc's, relu (seq 8) is the root's
    assert fc.backward.self_cpu_us == 40 and fc.backward.flops == 256
    assert root.backward.self_cpu_us == 20
    assert fc.forward.flops == 128
    # memory: 400 B allocated in addmm (fc forward), retained; 100 B in/out in relu's backward
    assert fc.forward.cpu_alloc_bytes == 400 and fc.forward.net_bytes == 400
    assert fc.forward.cpu_relative_peak_bytes == 400
    assert root.backward.self_cpu_alloc_bytes == 100 and root.backward.self_net_bytes == 0
    assert root.backward.cpu_relative_peak_bytes == 100
    labels = {(e.label, e.phase): e for e in p.unattributed}
    assert labels[("aten::sum", Phase.OTHER)].metrics.cpu_us == 10
    assert labels[("SumBackward0", Phase.BACKWARD)].metrics.cpu_us == 10
    assert labels[("torch::autograd::AccumulateGrad", Phase.BACKWARD)].metrics.cpu_us == 5
    assert labels[("(memory outside ops)", Phase.OTHER)].metrics.net_bytes == -400
    # totals: all top-level CPU time, every kernel, every FLOP
    assert p.totals.cpu_us == 100 + 10 + 10 + 20 + 40 + 5
    assert p.totals.device_us == 12 and p.totals.flops == 384


def test_op_rows_carry_module_phase_shapes() -> None:
    p = build_profile(forward_backward_table(), CATALOG)
    rows = {(r.name, r.module, r.phase): r for r in p.op_rows}
    addmm = rows[("aten::addmm", "fc", Phase.FORWARD)]
    assert addmm.input_shapes == "[[4], [2, 8], [8, 4]]"
    assert addmm.metrics.self_cpu_us == 25 and addmm.metrics.cpu_us == 30
    assert addmm.metrics.self_device_us == 12 and addmm.metrics.flops == 128
    assert rows[("aten::mm", "fc", Phase.BACKWARD)].metrics.flops == 256
    assert rows[("aten::threshold_backward", "", Phase.BACKWARD)].calls == 1
    by_name = {r.name: r for r in p.ops(group_by=("name",))}
    assert by_name["aten::addmm"].calls == 1


def test_kernel_linked_by_external_id_when_no_runtime_call() -> None:
    t = EventTable()
    t.add_span(module_range_name("", "Net"), EventKind.CPU_OP, 1, 0, 100 * US)
    t.add_span("aten::mm", EventKind.CPU_OP, 1, 10 * US, 20 * US, ext=55)
    t.add_span("k", EventKind.KERNEL, 7, 50 * US, 8 * US, ext=55)
    t.add_span("orphan", EventKind.KERNEL, 7, 70 * US, 3 * US, ext=999)
    p = build_profile(t, CATALOG[:1])
    p.validate()
    assert p.root.forward.device_us == 8
    orphan = [e for e in p.unattributed if e.label == "(device work without a launching op)"]
    assert orphan and orphan[0].metrics.device_us == 3
    assert p.totals.device_us == 11


def test_outermost_flops_only() -> None:
    t = EventTable()
    t.add_span("aten::convolution", EventKind.CPU_OP, 1, 0, 10 * US, flops=1000)
    t.add_span("aten::_convolution", EventKind.CPU_OP, 1, 1 * US, 8 * US, flops=1000)
    p = build_profile(t, None)
    p.validate()
    assert p.totals.flops == 1000


def test_same_name_only_child_is_one_call_like_torch() -> None:
    t = EventTable()
    t.add_span("aten::sum", EventKind.CPU_OP, 1, 0, 10 * US)
    t.add_span("aten::sum", EventKind.CPU_OP, 1, 2 * US, 6 * US)
    p = build_profile(t, None)
    (row,) = p.ops()
    assert row.calls == 1 and row.metrics.self_cpu_us == 10


def test_steps_and_step_gaps() -> None:
    t = EventTable()
    t.add_span("ProfilerStep#3", EventKind.USER_ANNOTATION, 1, 0, 100 * US)
    t.add_span("aten::add", EventKind.CPU_OP, 1, 10 * US, 20 * US, ext=1)
    t.add_span("k", EventKind.KERNEL, 9, 40 * US, 7 * US, ext=1)
    t.add_span("ProfilerStep#4", EventKind.USER_ANNOTATION, 1, 100 * US, 50 * US)
    p = build_profile(t, None)
    p.validate()
    assert [(s.step, s.wall_us, s.device_us) for s in p.steps] == [(3, 100, 7), (4, 50, 0)]
    gaps = {e.label: e for e in p.unattributed}["(Python between ops)"]
    assert gaps.metrics.cpu_us == 80 + 50


def test_a_step_range_is_no_op_and_launches_nothing_itself() -> None:
    # ProfilerStep#1 [ aten::add -> k1 ; cudaMemsetAsync -> memset, launched right inside the step ]
    t = EventTable()
    t.add_span("ProfilerStep#1", EventKind.USER_ANNOTATION, 1, 0, 100 * US, ext=5)
    t.add_span("aten::add", EventKind.CPU_OP, 1, 10 * US, 20 * US, ext=1)
    t.add_span("k1", EventKind.KERNEL, 9, 40 * US, 7 * US, ext=1)
    t.add_span("cudaMemsetAsync", EventKind.RUNTIME, 1, 50 * US, 4 * US, corr=77)
    t.add_span("memset", EventKind.MEMSET, 9, 60 * US, 3 * US, corr=77, ext=5)
    p = build_profile(t, None)
    p.validate()
    assert [(s.step, s.device_us) for s in p.steps] == [(1, 10)]
    assert not any(r.name.startswith("ProfilerStep") for r in p.op_rows)
    rows = {r.name: r for r in p.op_rows}
    assert rows["cudaMemsetAsync"].metrics.self_device_us == 3  # the runtime call launched it
    assert sum(r.metrics.self_device_us for r in p.op_rows) == p.totals.device_us == 10
    gaps = {e.label: e for e in p.unattributed}["(Python between ops)"]
    assert gaps.metrics.self_cpu_us == 100 - 20 - 4 and gaps.metrics.device_us == 0


def test_trace_without_catalog_builds_tree_from_range_names() -> None:
    t = EventTable()
    t.add_span(module_range_name("", "Net"), EventKind.CPU_OP, 1, 0, 100 * US)
    t.add_span(module_range_name("block.0.fc", "Linear"), EventKind.CPU_OP, 1, 10 * US, 10 * US)
    p = build_profile(t, None)
    p.validate()
    assert [n.path for n in p.modules()] == ["", "block", "block.0", "block.0.fc"]
    assert p.find("block").type_name == "?"  # placeholder for a path with no range of its own
    assert p.find("block").forward.cpu_us == 10


def test_validate_catches_broken_sums() -> None:
    from dataclasses import replace

    from layerscope.errors import ValidationError

    p = build_profile(forward_backward_table(), CATALOG)
    fc = p.find("fc")
    broken_fc = replace(fc, forward=replace(fc.forward, cpu_us=fc.forward.cpu_us + 1))
    broken = replace(p, root=replace(p.root, children=(broken_fc,)))
    with pytest.raises(ValidationError, match="self \\+ children"):
        broken.validate()
    dropped = replace(p, unattributed=p.unattributed[1:])
    with pytest.raises(ValidationError, match="modules \\+ unattributed"):
        dropped.validate()


def test_validate_catches_impossible_steps() -> None:
    from dataclasses import replace

    from layerscope.errors import ValidationError
    from layerscope.model.profile import StepStats

    p = build_profile(forward_backward_table(), CATALOG)
    p.validate()
    negative = replace(p, steps=(StepStats(step=1, wall_us=10.0, device_us=-5.0),))
    with pytest.raises(ValidationError, match="step 1: negative device_us"):
        negative.validate()
    too_much = p.totals.cpu_us + 1.0
    overfull = replace(p, steps=(StepStats(step=1, wall_us=10.0, device_us=0.0, cpu_us=too_much),))
    with pytest.raises(ValidationError, match="steps hold cpu_us"):
        overfull.validate()
