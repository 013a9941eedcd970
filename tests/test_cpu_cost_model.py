"""The measured CPU's cost model (issue 37): op classes, their representatives, the line through
two runs, the pricing of an op by its class, module calls' cost, and the cache's policy under load.
Structure and arithmetic only: no absolute time is asserted."""

from __future__ import annotations

import importlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import layerscope as ls
from layerscope.analysis.device_specs import DeviceSpec, OpClassCost
from layerscope.estimates import cpu_bench
from layerscope.estimates.op_classes import (
    COMPUTE_CLASSES,
    MEMBERS,
    MEMORY_CLASSES,
    REPRESENTATIVES,
    op_class,
)
from layerscope.estimates.op_costs import OpCoster

ALL_CLASSES = (*COMPUTE_CLASSES, *MEMORY_CLASSES)
#: the module (the package's ``cpu_spec`` is its function)
cpu_spec = importlib.import_module("layerscope.estimates.cpu_spec")


def _spec(**changes: Any) -> DeviceSpec:
    base = DeviceSpec(
        "cpu",
        "a made-up CPU",
        (),
        2**34,
        10e9,
        {"fp32": 0.1, "fp32-conv": 0.05, "bf16": 0.4},
        op_overhead_us=3.0,
        view_overhead_us=1.0,
        op_classes={
            cls: OpClassCost(2.0 * k, 1e9 * (k + 1), 5e8 if "conv" in cls else 0.0)
            for k, cls in enumerate(ALL_CLASSES)
        },
        module_overhead_us=0.0,
    )
    return replace(base, **changes)


class _LastOp(TorchDispatchMode):  # type: ignore[misc]
    """Keeps the last aten op run under it, with its arguments and outputs."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.last: tuple[Any, ...] | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.last = (func, args, kwargs or {}, [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
        return out


def test_ops_fall_into_their_classes() -> None:
    assert op_class("aten::mm") == op_class("aten::addmm") == op_class("aten::bmm") == "matmul"
    assert op_class("aten::convolution") == "conv"
    assert op_class("aten::convolution_backward") == "conv_backward"
    assert op_class("aten::gelu") == op_class("aten::gelu_") == "transcendental"
    assert op_class("aten::_softmax") == op_class("aten::_softmax_backward_data") == "softmax"
    assert op_class("aten::masked_fill_") == "indexed"
    # plain arithmetic, and any op no class names, stream as an add does; in place, as an add_
    assert op_class("aten::add") == op_class("aten::some_new_op") == "elementwise"
    assert op_class("aten::mul_") == op_class("aten::addcmul_") == "elementwise_"
    assert set(MEMBERS) <= set(ALL_CLASSES) and set(REPRESENTATIVES) == set(ALL_CLASSES)


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_each_representative_is_an_op_of_its_class_and_its_work_is_counted_as_an_estimate_counts(
    cls: str,
) -> None:
    run = (
        cpu_bench.compute_run(cls, cpu_bench.CONV_SIZES[0] if "conv" in cls else cpu_bench.MATMUL_SIZES[0])
        if cls in COMPUTE_CLASSES
        else cpu_bench.memory_run(cls, cpu_bench.MEMORY_SIZES[0])
    )
    op, make, work = run
    args = make(0)
    mode = _LastOp()
    with mode:
        op(*args)
    assert mode.last is not None
    func, op_args, op_kwargs, outputs = mode.last
    name = func._schema.name
    assert op_class(name) == cls, name
    cost = OpCoster(_spec()).cost(func, name, op_args, op_kwargs, outputs)
    seconds, counted, moved = cpu_bench.pooled_seconds(run, torch.empty(1024))
    assert seconds > 0 and moved == cost.bytes > 0  # the bytes an estimate counts
    if cls in COMPUTE_CLASSES:
        assert work == counted == cost.flops > 0  # the FLOPs a measured profile counts
    else:
        assert counted == moved


def test_the_line_through_two_runs() -> None:
    # 5 µs fixed, 1 GB/s: 1 kB in 6 µs, 1 MB in 1005 µs; a one-element op's 2 µs is the per-op cost's
    cost = cpu_bench.line_through((6e-6, 1e3), (1005e-6, 1e6), base_s=2e-6)
    assert cost.rate_per_s == pytest.approx(1e9)
    assert cost.fixed_us == pytest.approx(3.0)
    assert cost.seconds(1e6) == pytest.approx(1003e-6)
    # a cache-fast small run (above the line) never makes the fixed cost negative
    assert cpu_bench.line_through((1e-7, 1e3), (1e-3, 1e6)).fixed_us == 0.0
    # noise larger than the difference: the large run's average rate
    assert cpu_bench.line_through((2e-3, 1e3), (1e-3, 1e6)).rate_per_s == pytest.approx(1e9)


def test_the_plane_through_three_runs() -> None:
    # 10 µs fixed, 100 GFLOP/s, and 2 GB/s of data beyond the FLOPs (a convolution's weights)
    def seconds(flops: float, moved: float) -> float:
        return 10e-6 + flops / 100e9 + moved / 2e9

    points = [(seconds(w, b), w, b) for w, b in ((1e6, 1e5), (1e8, 1e6), (2.5e7, 2.5e6))]
    cost = cpu_bench.plane_through(points, base_s=4e-6)
    assert cost is not None
    assert cost.fixed_us == pytest.approx(6.0)
    assert cost.rate_per_s == pytest.approx(100e9) and cost.bytes_per_s == pytest.approx(2e9)
    assert cost.seconds(1e8, 1e6) == pytest.approx(seconds(1e8, 1e6) - 4e-6)
    # runs whose time does not grow with their bytes give no data term: the caller keeps a line
    flat = [(10e-6 + w / 100e9 - b / 1e9, w, b) for _, w, b in points]
    assert cpu_bench.plane_through(flat) is None


def test_an_op_is_priced_by_its_class() -> None:
    spec = _spec()
    coster = OpCoster(spec)
    a, b = torch.ones(64, 64), torch.ones(64, 64)
    mode = _LastOp()
    with mode:
        torch.add(a, b)
        add = mode.last
        torch.mm(a, b)
        mm = mode.last
        torch.mm(a.bfloat16(), b.bfloat16())
        mm16 = mode.last
    assert add is not None and mm is not None and mm16 is not None
    elementwise = spec.op_classes["elementwise"]
    got = coster.cost(add[0], "aten::add", add[1], add[2], add[3])
    assert got.time_us == pytest.approx(3.0 + elementwise.fixed_us + got.bytes / elementwise.rate_per_s * 1e6)
    matmul = spec.op_classes["matmul"]
    got = coster.cost(mm[0], "aten::mm", mm[1], mm[2], mm[3])
    assert got.time_us == pytest.approx(3.0 + matmul.fixed_us + got.flops / matmul.rate_per_s * 1e6)
    # bf16 at fp32's class rate times the spec's bf16/fp32 peak ratio (4x here)
    got16 = coster.cost(mm16[0], "aten::mm", mm16[1], mm16[2], mm16[3])
    assert got16.time_us == pytest.approx(3.0 + matmul.fixed_us + got.flops / (4 * matmul.rate_per_s) * 1e6)
    # a compute class's data term adds its bytes at the term's rate
    data = replace(matmul, bytes_per_s=1e9)
    got_data = OpCoster(_spec(op_classes={"matmul": data})).cost(mm[0], "aten::mm", mm[1], mm[2], mm[3])
    assert got_data.time_us == pytest.approx(got.time_us + got.bytes / 1e9 * 1e6)
    # a spec without classes (every accelerator's) keeps the roofline
    plain = OpCoster(_spec(op_classes={})).cost(add[0], "aten::add", add[1], add[2], add[3])
    assert plain.time_us == pytest.approx(3.0 + plain.bytes / 10e9 * 1e6)


def test_an_empty_tensor_moves_nothing() -> None:
    mode = _LastOp()
    with mode:
        torch.empty(1024)
    assert mode.last is not None
    func, args, kwargs, outputs = mode.last
    cost = OpCoster(_spec()).cost(func, func._schema.name, args, kwargs, outputs)
    assert cost.bytes == 0 and cost.time_us == 1.0  # a view's cost: no kernel runs


def test_each_module_call_costs_the_specs_module_overhead() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
    x = torch.randn(4, 8)
    without = ls.estimate(model, x, device=_spec())
    with_cost = ls.estimate(model, x, device=_spec(module_overhead_us=7.0))
    with_cost.validate()
    calls = sum(node.calls for node in with_cost.root.walk())
    assert calls == 6  # the root, two linears, two ReLUs, the inner Sequential
    assert with_cost.totals.cpu_us - without.totals.cpu_us == pytest.approx(7.0 * calls)
    inner = next(n for n in with_cost.root.walk() if n.path == "2")
    assert inner.forward.self_cpu_us == pytest.approx(7.0)  # a container: its call, no op of its own


class _Bench:
    """A stand-in for the benchmark: each measurement one figure slower or faster."""

    def __init__(self, op_us: list[float]) -> None:
        self.op_us = op_us
        self.calls = 0

    def __call__(self) -> DeviceSpec:
        spec = _spec(op_overhead_us=self.op_us[self.calls])
        self.calls += 1
        return spec


def _cache_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, bench: _Bench, load: list[float]) -> None:
    monkeypatch.setenv("LAYERSCOPE_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_spec, "measure_cpu", bench)
    monkeypatch.setattr(cpu_spec, "load_per_core", lambda: load[0])


def test_a_spec_measured_under_load_is_measured_again_when_quieter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench, load = _Bench([9.0, 4.0, 5.0]), [3.0]
    _cache_with(monkeypatch, tmp_path, bench, load)
    assert cpu_spec.cpu_spec().op_overhead_us == 9.0 and bench.calls == 1
    assert cpu_spec.cpu_spec().op_overhead_us == 9.0 and bench.calls == 1  # still busy: cached
    load[0] = 0.5
    again = cpu_spec.cpu_spec()  # quieter: measured again, each figure its best
    assert bench.calls == 2 and again.op_overhead_us == 4.0
    assert again.op_classes == _spec().op_classes  # read back from the file as measured
    saved = json.loads(cpu_spec.cache_file().read_text())
    assert saved["load_per_core"] == 0.5 and saved["op_overhead_us"] == 4.0
    load[0] = 0.1
    assert cpu_spec.cpu_spec().op_overhead_us == 4.0 and bench.calls == 2  # measured quiet: kept


def test_refresh_replaces_and_a_quiet_spec_is_kept_under_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench, load = _Bench([4.0, 9.0]), [0.2]
    _cache_with(monkeypatch, tmp_path, bench, load)
    assert cpu_spec.cpu_spec().op_overhead_us == 4.0
    load[0] = 5.0
    assert cpu_spec.cpu_spec().op_overhead_us == 4.0 and bench.calls == 1
    # refresh: this moment's figures, slower or not (what a paired benchmark compares with)
    assert cpu_spec.cpu_spec(refresh=True).op_overhead_us == 9.0 and bench.calls == 2
    assert cpu_spec.cpu_spec().op_overhead_us == 9.0
    cpu_spec.cache_file().write_text("{damaged")
    bench.op_us.append(6.0)
    assert cpu_spec.cpu_spec().op_overhead_us == 6.0 and bench.calls == 3


def test_best_of_two_measurements_takes_each_figures_best() -> None:
    slow = _spec(
        op_overhead_us=5.0,
        bandwidth_bytes_per_s=5e9,
        op_classes={
            "matmul": OpClassCost(1.0, 1e9),
            "softmax": OpClassCost(4.0, 1e9),
            "conv": OpClassCost(5.0, 1e9, 2e9),
        },
    )
    fast = _spec(
        op_overhead_us=4.0,
        bandwidth_bytes_per_s=8e9,
        op_classes={
            "matmul": OpClassCost(2.0, 3e9),
            "pool": OpClassCost(1.0, 1e9),
            "conv": OpClassCost(5.0, 1e9, 1e9),
        },
    )
    best = cpu_spec.best_of(slow, fast)
    assert best.op_overhead_us == 4.0 and best.bandwidth_bytes_per_s == 8e9
    assert best.op_classes["matmul"] == OpClassCost(2.0, 3e9)  # a whole fit, never a mix of two
    assert set(best.op_classes) == {"matmul", "softmax", "pool", "conv"}
    assert best.op_classes["conv"].bytes_per_s == 2e9  # the faster data term
    # a low fixed cost with a slow rate against the reverse: the one faster where both matter
    cheap_start, fast_run = OpClassCost(1.0, 1e9), OpClassCost(50.0, 2e9)
    assert (
        cpu_spec.best_of(
            _spec(op_classes={"softmax": cheap_start}), _spec(op_classes={"softmax": fast_run})
        ).op_classes["softmax"]
        == cheap_start
    )  # 0.10 ms at the two knees against 0.15
    assert cpu_spec.best_of(fast, _spec()).op_classes["matmul"].bytes_per_s == 0.0  # none is fastest
