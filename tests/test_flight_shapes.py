"""The flight recorder's detailed steps record input shapes themselves (``capture/flight_shapes.py``,
``native_shapes.cpp``) with torch's ``record_shapes`` off: the table read from torch's events joined
with that record must be the table torch's own shapes give, and the callback must be gone after every
way a detailed step can end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import layerscope as ls
from layerscope.capture import flight_shapes, native
from layerscope.capture.flight_shapes import DetailedProfile, JoinedReader, ShapeRecorder
from layerscope.capture.flops import FlopCalculator
from layerscope.capture.native_table import table_from_native
from layerscope.events.table import MEMORY_COLUMNS, SPAN_COLUMNS
from layerscope.model.profile import Profile
from layerscope.models import TinyGPT, resnet18
from tests.test_flight_recorder import Exploding, Net, train


@pytest.fixture(scope="module")
def module() -> ModuleType:
    found = native.load()
    if not flight_shapes.supported(found):
        pytest.skip(f"the native module with the shapes callback is not built: {native.status().reason}")
    assert found is not None
    return found


def gpt_step() -> tuple[nn.Module, Callable[[], None]]:
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, dim=32, heads=2, layers=2, max_len=16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 64, (2, 16))

    def step() -> None:
        logits = model(idx)
        nn.functional.cross_entropy(logits.view(-1, 64), idx.view(-1)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def resnet_step() -> tuple[nn.Module, Callable[[], None]]:
    torch.manual_seed(0)
    model = resnet18(num_classes=10, width=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(2, 3, 32, 32)

    def step() -> None:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    return model, step


MODELS = {"gpt": gpt_step, "resnet": resnet_step}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_joined_table_is_the_one_torch_s_shapes_give(module: ModuleType, name: str) -> None:
    """Both recorded at once (torch's record_shapes and the callback), the same events read both
    ways: every column, the FLOPs, each op's scalar inputs and first dtype equal."""
    _, step = MODELS[name]()
    step()
    recorder = ShapeRecorder(module)
    recorder.start()
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as tp:
            step()
    finally:
        recorder.stop()
    assert not module.shapes_active()
    reader = recorder.take()
    results = tp.profiler.kineto_results
    torch_cols = module.read_columns(results, True)
    own_cols = reader.read_columns(results, True)
    for key in ("shapes", "span_shapes", "dtypes", "span_dtypes", "span_handle", "span_name"):
        assert own_cols[key] == torch_cols[key], key
    assert len(own_cols["shapes"]) > 20  # not vacuous: many distinct shape lists
    spans = np.frombuffer(torch_cols["span_index"], dtype=np.int64).tobytes()
    assert reader.concrete_inputs(results, spans) == module.concrete_inputs(results, spans)
    assert reader.first_dtypes(results, spans) == module.first_dtypes(results, spans)
    expected = table_from_native(module, results, FlopCalculator(), shapes=True)
    got = table_from_native(reader, results, FlopCalculator(), shapes=True)
    assert sum(got.span_flops) > 0
    assert got.span_flops == expected.span_flops
    assert got.names == expected.names
    for column in (*SPAN_COLUMNS, *MEMORY_COLUMNS):
        assert np.array_equal(np.asarray(getattr(got, column)), np.asarray(getattr(expected, column))), column
    assert np.array_equal(got.span_dtypes, expected.span_dtypes)


def _rows(profile: Profile) -> list[tuple[Any, ...]]:
    """Each op row's identity, shapes, calls, FLOPs, bytes and dtype (times left out)."""
    return sorted(
        (
            r.name,
            str(r.phase),
            r.module or "",
            r.scope,
            r.input_shapes or "",
            r.calls,
            r.metrics.flops,
            r.bytes,
            r.dtype,
        )
        for r in profile.op_rows
    )


def _detailed(make: Callable[[], tuple[nn.Module, Callable[[], None]]], own: bool) -> tuple[Profile, bool]:
    model, step = make()
    step()
    flight_shapes.OWN_SHAPES = own
    try:
        detail = DetailedProfile(model, memory=True)
    finally:
        flight_shapes.OWN_SHAPES = True
    detail.start()
    step()
    recording = detail.stop()
    built = recording.build()
    built.validate()
    return built, detail.own_shapes


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_detailed_step_with_own_shapes_is_the_one_torch_s_shapes_give(
    module: ModuleType, name: str
) -> None:
    """Forward and backward, per module: the same ops with the same shapes and FLOPs."""
    own, used = _detailed(MODELS[name], own=True)
    reference, used_torch = _detailed(MODELS[name], own=False)
    assert used and not used_torch
    assert own.totals.flops == reference.totals.flops > 0
    assert _rows(own) == _rows(reference)
    assert any(r.input_shapes for r in own.op_rows)
    per_module = {n.path: (n.forward.flops, n.backward.flops) for n in own.root.walk()}
    assert per_module == {n.path: (n.forward.flops, n.backward.flops) for n in reference.root.walk()}
    assert any(backward for _, backward in per_module.values())


def test_torch_records_no_shapes_in_a_detailed_step(module: ModuleType) -> None:
    detail = DetailedProfile(Net(), memory=True)
    detail.start()
    try:
        assert detail.own_shapes and module.shapes_active()
        assert detail.session.options.torch_kwargs()["record_shapes"] is False
        assert detail.session.torch_profiler.record_shapes is False
    finally:
        detail.stop()
    assert not module.shapes_active()


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_the_callback_is_removed_when_the_detailed_step_raises(
    module: ModuleType, tmp_path: Path, error: BaseException
) -> None:
    model = Exploding(error)
    x = torch.randn(2, 4)
    with (
        pytest.raises(type(error)),
        ls.flight_recorder(model, out=tmp_path, detail_every=2, slow=None) as rec,
    ):
        for i in range(4):
            assert module.shapes_active() == (i == 2)  # step 2 is detailed
            model.armed = i == 2  # and raises
            model(x).sum().backward()
            rec.step()
    assert not module.shapes_active()
    assert rec.flush(30.0)


def test_the_callback_is_removed_when_torch_s_profiler_cannot_start(module: ModuleType) -> None:
    with profile(activities=[ProfilerActivity.CPU]):  # a profiler already runs: the block refuses
        detail = DetailedProfile(Net(), memory=True)
        with pytest.raises(Exception):  # noqa: B017 - whatever the refusal is, nothing stays
            detail.start()
        assert not module.shapes_active()


def test_a_second_recording_falls_back_to_torch_s_shapes(module: ModuleType) -> None:
    """The callback is one per process: a detailed step started while it is held records torch's."""
    module.shapes_start()
    try:
        detail = DetailedProfile(Net(), memory=True)
        detail.start()
        detail.stop()
        assert not detail.own_shapes
    finally:
        module.shapes_stop()


def test_the_program_is_unchanged_with_own_shapes(module: ModuleType, tmp_path: Path) -> None:
    torch.manual_seed(0)
    plain, recorded = Net(), Net()
    recorded.load_state_dict(plain.state_dict())
    expected = train(plain, 7)
    with ls.flight_recorder(recorded, out=tmp_path, detail_every=2, slow=None) as rec:
        losses = train(recorded, 7, rec)
    assert all(torch.equal(a, b) for a, b in zip(expected, losses, strict=True))
    assert all(
        torch.equal(a, b)
        for a, b in zip(plain.state_dict().values(), recorded.state_dict().values(), strict=True)
    )
    detail = ls.load(tmp_path / "flight-detail-step000006.json.gz")
    detail.validate()
    assert detail.totals.flops > 0 and any(r.input_shapes for r in detail.op_rows)


def test_global_mode_s_detailed_steps_have_shapes_and_flops(module: ModuleType, tmp_path: Path) -> None:
    """Without a model (``run``): torch's profiler records every thread, the callback sees them all."""
    model = Net()
    with ls.flight_recorder(None, out=tmp_path, detail_every=2, slow=None) as rec:
        train(model, 3, rec)
    detail = ls.load(tmp_path / "flight-detail-step000002.json.gz")
    detail.validate()
    linear = [r for r in detail.op_rows if r.name == "aten::addmm" and r.module == "Net.stem"]
    assert linear and all(r.input_shapes and r.metrics.flops > 0 for r in linear)


def test_the_record_goes_once_the_writer_has_read_it(module: ModuleType, tmp_path: Path) -> None:
    model = Net()
    with ls.flight_recorder(model, out=tmp_path, detail_every=2, slow=None) as rec:
        train(model, 3, rec)
        assert rec.flush(30.0)
        recording = rec._detail_kept[0][2]
        assert recording.own_shapes is None and recording.torch_profiler is None


def test_reader_refuses_an_event_it_did_not_read(module: ModuleType) -> None:
    recorder = ShapeRecorder(module)
    recorder.start()
    recorder.stop()
    reader: JoinedReader = recorder.take()
    with pytest.raises(IndexError):
        reader.first_dtypes(None, np.array([5], dtype=np.int64).tobytes())


@pytest.fixture(autouse=True)
def _no_callback_left(module: ModuleType) -> Iterator[None]:
    yield
    assert not module.shapes_active()
