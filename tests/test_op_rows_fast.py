"""Op rows made by the native module (``slot_objects``: each frozen dataclass's slots filled directly)
are the very objects their ``__init__`` makes, and a profile built either way saves the same."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import FrozenInstanceError
from types import ModuleType
from typing import Any

import orjson
import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.attribution import op_rows
from layerscope.capture import native
from layerscope.model.metrics import FIELD_NAMES, Metrics
from layerscope.model.profile import OpStats, Phase
from layerscope.model.serialize import profile_to_dict


@pytest.fixture(scope="module")
def module() -> Iterator[ModuleType]:
    found = native.load()
    if found is None or not hasattr(found, "slot_objects"):
        pytest.skip(f"the native module is not built here: {native.status().reason}")
    yield found


@pytest.fixture()
def plain() -> Iterator[None]:
    """Rows made by ``__init__`` inside the test, then what was used before."""
    before = op_rows._native
    op_rows.use(None)
    try:
        yield
    finally:
        op_rows._native = before


def _columns(rows: int) -> tuple[list[list[Any]], list[list[Any]]]:
    metric_columns: list[list[Any]] = [
        [float(k) + j / 8 if name.endswith("_us") else k * 1000 + j for k in range(rows)]
        for j, name in enumerate(FIELD_NAMES)
    ]
    metrics = [Metrics(*row) for row in zip(*metric_columns, strict=True)]
    op_columns: list[list[Any]] = [
        [f"aten::op{k % 3}" for k in range(rows)],
        [Phase.FORWARD if k % 2 else Phase.BACKWARD for k in range(rows)],
        [None if k % 4 == 0 else f"layer.{k}" for k in range(rows)],
        [None if k % 5 == 0 else "[[2, 3]]" for k in range(rows)],
        list(range(rows)),
        metrics,
        ["" if k % 4 else "(outside modules)" for k in range(rows)],
        [() if k % 2 else ("x.py(1): f",) for k in range(rows)],
        [None if k % 3 == 0 else 64 * k for k in range(rows)],
        [None if k % 3 == 1 else "float" for k in range(rows)],
    ]
    return metric_columns, op_columns


def test_slot_objects_equal_init(module: ModuleType) -> None:
    metric_columns, op_columns = _columns(50)
    for cls, columns in ((Metrics, metric_columns), (OpStats, op_columns)):
        fast = module.slot_objects(cls, cls.__slots__, columns)
        slow = [cls(*row) for row in zip(*columns, strict=True)]
        assert fast == slow
        assert all(type(f) is cls for f in fast)
        assert [hash(f) for f in fast] == [hash(s) for s in slow]
        assert [repr(f) for f in fast] == [repr(s) for s in slow]
        for f, s in zip(fast, slow, strict=True):  # the very objects, not equal copies
            assert all(getattr(f, n) is getattr(s, n) for n in cls.__slots__)
            with pytest.raises(FrozenInstanceError):  # still frozen
                setattr(f, cls.__slots__[0], 3)
    assert module.slot_objects(Metrics, Metrics.__slots__, [[] for _ in FIELD_NAMES]) == []


def test_slot_objects_refuses_what_it_cannot_fill(module: ModuleType) -> None:
    metric_columns, _ = _columns(3)
    with pytest.raises(TypeError, match="not a slot"):
        module.slot_objects(Metrics, ("self_cpu_us", "merged"), metric_columns[:2])
    with pytest.raises(TypeError, match="not a class"):
        module.slot_objects(Metrics(), Metrics.__slots__, metric_columns)
    with pytest.raises(ValueError, match="one column per slot"):
        module.slot_objects(Metrics, Metrics.__slots__, metric_columns[:-1])
    with pytest.raises(ValueError, match="different lengths"):
        module.slot_objects(Metrics, Metrics.__slots__, [*metric_columns[:-1], [0]])
    with pytest.raises(TypeError, match="not a list"):
        module.slot_objects(Metrics, Metrics.__slots__, [*metric_columns[:-1], (0, 0, 0)])


def test_make_objects_either_way(module: ModuleType, plain: None) -> None:
    _, op_columns = _columns(20)
    slow = op_rows.make_objects(OpStats, op_columns)
    op_rows.use(module)
    assert op_rows.make_objects(OpStats, op_columns) == slow


def test_profile_the_same_without_native_rows(
    module: ModuleType, plain: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    with ls.profile(model, memory=True, with_stack=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
    recording = prof.recording
    first = recording.build()
    first.validate()
    assert op_rows._native is module  # handed over by the live read
    monkeypatch.setattr(op_rows, "use", lambda found: None)  # the rebuild's read hands nothing over
    op_rows._native = None
    again = recording._build()
    saved = orjson.dumps(profile_to_dict(first))
    assert saved == orjson.dumps(profile_to_dict(again))
    assert b"aten::addmm" in saved and first.op_rows == again.op_rows
