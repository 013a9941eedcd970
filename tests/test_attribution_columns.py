"""The vectorised attribution gives what the Python sweep gave: identical saved profiles.

``attribution/nest_columns.py`` replaced the one Python loop over CPU spans (``nesting.sweep``),
which stays as the fallback and the reference. Each case builds the same recorded capture (or
trace, or hand-made table) both ways and compares everything a saved profile holds: the tree, op
rows, memory, steps and meta.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import layerscope as ls
from layerscope.attribution import attribute, module_range_name
from layerscope.attribution.buckets import ROLE_STEP, Buckets, name_roles
from layerscope.attribution.devices import device_launchers
from layerscope.attribution.flop_dtypes import _unique_rows
from layerscope.attribution.forward_ops import ForwardOps
from layerscope.attribution.nest_columns import parents, sweep_columns
from layerscope.attribution.nesting import sweep, time_order
from layerscope.capture import recording
from layerscope.events import EventKind, EventTable
from layerscope.events.table import CPU_KINDS, DEVICE_WORK_KINDS
from layerscope.loading import _read as read_trace
from layerscope.model.serialize import profile_to_dict
from layerscope.models import TinyGPT, resnet18

FIXTURES = Path(__file__).parent / "fixtures"
SHARED = Path(__file__).parents[2] / "shared" / "traces"  # the real traces, beside the checkout
TRACES = [FIXTURES / "stack_trace.json.gz", *sorted((FIXTURES / "gpu").glob("*.json.gz"))]
TRACES += sorted(SHARED.rglob("*.json.gz")) if SHARED.is_dir() else []


def both_ways(build: Callable[[], ls.Profile], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """The saved form of ``build()`` with the vectorised sweep, then with the Python sweep."""
    new = profile_to_dict(build())
    with monkeypatch.context() as patched:
        patched.setattr(attribute, "sweep_columns", sweep)
        old = profile_to_dict(build())
    return new, old


def recorded(
    model: nn.Module, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch, steps: int = 2, **options: Any
) -> Callable[[], ls.Profile]:
    """Profile ``steps`` training steps once; return a function that builds the profile again from
    the very arguments the recording passed to ``build_profile``."""
    seen: dict[str, Any] = {}
    real = recording.build_profile

    def keep(*args: Any, **kwargs: Any) -> ls.Profile:
        seen["args"], seen["kwargs"] = args, kwargs
        return real(*args, **kwargs)

    monkeypatch.setattr(recording, "build_profile", keep)
    with ls.profile(model, **options) as prof:
        for _ in range(steps):
            model(x).sum().backward()
    prof.profile.validate()
    monkeypatch.setattr(recording, "build_profile", real)
    return lambda: attribute.build_profile(*seen["args"], **seen["kwargs"])


def mlp() -> nn.Module:
    return nn.Sequential(
        *(nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(3))
    )


class Checkpointed(nn.Module):
    def __init__(self, use_reentrant: bool) -> None:
        super().__init__()
        self.use_reentrant = use_reentrant
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.use_reentrant)
        return x


CASES: dict[str, Callable[[], tuple[nn.Module, torch.Tensor, dict[str, Any]]]] = {
    "mlp": lambda: (mlp(), torch.randn(8, 32), {}),
    "mlp-memory": lambda: (mlp(), torch.randn(8, 32), {"memory": True, "shapes": True}),
    "mlp-stack": lambda: (mlp(), torch.randn(8, 32), {"with_stack": True}),
    "resnet18": lambda: (resnet18(), torch.randn(2, 3, 32, 32), {"memory": True, "shapes": True}),
    "gpt": lambda: (
        TinyGPT(vocab=64, dim=32, heads=2, layers=2, max_len=16),
        torch.randint(0, 64, (2, 16)),
        {},
    ),
    "checkpoint": lambda: (Checkpointed(False), torch.randn(4, 16, requires_grad=True), {"memory": True}),
    "checkpoint-reentrant": lambda: (Checkpointed(True), torch.randn(4, 16, requires_grad=True), {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_capture_builds_the_same_profile_both_ways(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model, x, options = CASES[case]()
    new, old = both_ways(recorded(model, x, monkeypatch, **options), monkeypatch)
    assert new["root"]["children"], "the tree has modules"
    assert new == old


@pytest.mark.parametrize("trace", TRACES, ids=[path.name for path in TRACES])
def test_a_trace_file_builds_the_same_profile_both_ways(trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    new, old = both_ways(lambda: ls.load(trace), monkeypatch)
    assert new["ops"]["name"]
    assert new == old


def random_table(rng: random.Random) -> EventTable:
    """Spans on two threads that nest, overlap without nesting, share starts, last no time at all or
    (a broken trace) less than none; module ranges, steps and backward nodes among plain ops."""
    table = EventTable()
    names = [
        module_range_name("", "Net"),
        module_range_name("a", "Block"),
        module_range_name("a.x", "Linear"),
        "ProfilerStep#1",
        "autograd::engine::evaluate_function: MmBackward0",
        "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
        "aten::mm",
        "aten::add",
        "## Call CompiledFxGraph abc ##",
    ]
    for _ in range(rng.randint(1, 60)):
        tid = rng.choice([1, 2])
        start = rng.randint(0, 40)
        dur = rng.choice([0, -1, rng.randint(0, 30), rng.randint(0, 5)])
        kind = rng.choice([EventKind.CPU_OP, EventKind.USER_ANNOTATION, EventKind.KERNEL])
        seq = rng.choice([-1, rng.randint(0, 5)])
        table.add_span(rng.choice(names), kind, tid, start, dur, seq=seq, fwd_tid=rng.choice([0, 0, 1, 2]))
    return table


@pytest.mark.parametrize("seed", range(40))
def test_random_tables_sweep_the_same(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(25):
        table = random_table(rng)
        named = name_roles(table.names, None, [], None)
        order = time_order(table)
        found = []
        for way in (sweep, sweep_columns):
            buckets = Buckets(len(named.catalog))
            swept = way(table, order, named.roles, named.role_module, buckets, recorded_ops_are_forward=True)
            made = dict(vars(swept))
            made.pop("levels")  # found by the native pass only (tests/test_nest_native.py)
            for column in ("parent", "excl", "bucket"):
                assert made[column].dtype == np.int64
                made[column] = made[column].tolist()
            made["forward_op_of"] = made["forward_op_of"].mapping()
            found.append((made, buckets))
        assert found[0] == found[1]


@pytest.mark.parametrize("seed", range(20))
def test_time_order_is_start_then_longest_first(seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = EventTable()
    for _ in range(int(rng.integers(0, 300))):
        kind = EventKind(int(rng.integers(0, 8)))
        table.add_span("op", kind, 1, int(rng.integers(0, 30)), int(rng.integers(-1, 10)))
    kinds, ts, dur = table.array("span_kind"), table.array("span_ts"), table.array("span_dur")
    cpu = np.flatnonzero(np.isin(kinds, [int(k) for k in CPU_KINDS]))
    assert time_order(table).tolist() == cpu[np.lexsort((-dur[cpu], ts[cpu]))].tolist()


def launchers_reference(
    table: EventTable, order: np.ndarray, parent: list[int], device_spans: list[int], not_ops: set[int]
) -> list[int]:
    """``devices._device_launchers`` as it was: a Python loop over the CPU spans."""
    kinds = table.span_kind
    runtime_by_corr: dict[int, int] = {}
    op_by_ext: dict[int, int] = {}
    for i in order.tolist():
        if kinds[i] == EventKind.RUNTIME:
            if table.span_corr[i] > 0:
                runtime_by_corr[table.span_corr[i]] = i
        elif table.span_ext[i] > 0 and table.span_name[i] not in not_ops:
            op_by_ext[table.span_ext[i]] = i
    owners: list[int] = []
    for k in device_spans:
        runtime = runtime_by_corr.get(table.span_corr[k], -1) if table.span_corr[k] > 0 else -1
        if runtime >= 0:
            op = parent[runtime]
            while op >= 0 and kinds[op] == EventKind.RUNTIME:
                op = parent[op]
            owners.append(op if op >= 0 and table.span_name[op] not in not_ops else runtime)
        else:
            owners.append(op_by_ext.get(table.span_ext[k], -1) if table.span_ext[k] > 0 else -1)
    return owners


def check_launchers(table: EventTable, not_ops: set[int]) -> int:
    """Compare the launchers both ways; return how many device spans found one."""
    order = time_order(table)
    parent = parents(table, order)
    device = np.flatnonzero(np.isin(table.array("span_kind"), [int(k) for k in DEVICE_WORK_KINDS]))
    found = device_launchers(table, order, parent, device, not_ops).tolist()
    assert found == launchers_reference(table, order, parent.tolist(), device.tolist(), not_ops)
    return sum(owner >= 0 for owner in found)


@pytest.mark.parametrize("trace", TRACES, ids=[path.name for path in TRACES])
def test_device_launchers_as_before_on_traces(trace: Path) -> None:
    table = read_trace(trace)
    if isinstance(table, EventTable):
        steps = {
            i for i, role in enumerate(name_roles(table.names, None, [], None).roles) if role == ROLE_STEP
        }
        check_launchers(table, steps)


@pytest.mark.parametrize("seed", range(20))
def test_device_launchers_as_before_on_random_tables(seed: int) -> None:
    rng = random.Random(seed)
    linked = 0
    for _ in range(25):
        table = EventTable()
        for _ in range(rng.randint(1, 60)):
            kind = rng.choice([EventKind.CPU_OP, EventKind.RUNTIME, EventKind.KERNEL, EventKind.MEMCPY])
            name = rng.choice(["aten::mm", "cudaLaunchKernel", "ProfilerStep#1", "kernel"])
            corr, ext = rng.randint(-1, 6), rng.randint(-1, 6)
            table.add_span(name, kind, 1, rng.randint(0, 40), rng.randint(0, 30), corr=corr, ext=ext)
        linked += check_launchers(table, {i for i, n in enumerate(table.names) if n == "ProfilerStep#1"})
    assert linked


@pytest.mark.parametrize("seed", range(20))
def test_forward_ops_are_the_dict_they_replaced(seed: int) -> None:
    """ForwardOps answers as the dict of the forward ops in time order did: the last op of each
    (thread, sequence number) wins, keys in order of first sight, -1 for pairs it lacks."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    tids = rng.integers(1, 4, n) * 1000
    seqs = rng.integers(0, 15, n)
    ops = np.arange(n, dtype=np.int64) * 7
    expected: dict[tuple[int, int], int] = {}
    for t, s, op in zip(tids.tolist(), seqs.tolist(), ops.tolist(), strict=True):
        expected[(t, s)] = op
    found = ForwardOps(tids, seqs, ops)
    assert found.mapping() == expected and list(found.mapping()) == list(expected)
    asked_t = rng.integers(0, 5, 40) * 1000
    asked_s = rng.integers(-2, 18, 40)
    assert found.lookup(asked_t, asked_s).tolist() == [
        expected.get((t, s), -1) for t, s in zip(asked_t.tolist(), asked_s.tolist(), strict=True)
    ]


@pytest.mark.parametrize("seed", range(10))
def test_unique_rows_is_numpys_unique_over_rows(seed: int) -> None:
    rng = np.random.default_rng(seed)
    columns = [rng.integers(-3, 5, int(rng.integers(1, 60))) for _ in range(1)]
    columns += [rng.integers(-3, 5, columns[0].size) for _ in range(2)]
    distinct, inverse = _unique_rows(*columns)
    rows, expected = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
    assert np.array_equal(np.stack(distinct, axis=1), rows)
    assert np.array_equal(inverse, expected.reshape(-1))
