"""Schema v2: a profile's meta is typed records (``layerscope.model.meta``), saved by one serializer,
v1 files (saved by the release before, ``tests/fixtures/schema_v1``) load into the same records, the
v1 dict form still reads with a warning, and the device summary is the same live, saved and analyzed."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import layerscope as ls
from layerscope.analysis.device_summary import device_summary, summarize_device
from layerscope.cli import main
from layerscope.errors import TraceFormatError
from layerscope.events.chrome import table_from_trace
from layerscope.loading import analyze
from layerscope.model.memory import MemoryReport, MemoryTimeline
from layerscope.model.meta import SCHEMA_VERSION, ProfileMeta
from layerscope.model.meta_json import meta_to_v1
from layerscope.model.serialize import profile_from_dict, profile_to_dict
from tests.fixtures.models import TinyMLP
from tests.test_memory_records import _raw, live  # noqa: F401  (live: a memory capture with steps)

V1 = Path(__file__).parent / "fixtures" / "schema_v1"
GPU_TRACE = Path(__file__).parent / "fixtures" / "gpu" / "host_bound.json.gz"
RECORDS = {f.name for f in dataclasses.fields(ProfileMeta)}


def _raw_v1(name: str) -> dict[str, Any]:
    data = _raw(name)
    assert data["schema_version"] == 1
    return data


def test_v2_saves_each_record_under_its_own_key_and_reads_it_back(live: ls.Profile) -> None:  # noqa: F811
    data = json.loads(json.dumps(profile_to_dict(live)))
    assert data["schema_version"] == SCHEMA_VERSION == 2
    assert set(data["meta"]) <= RECORDS
    assert {"environment", "capture", "trace", "memory", "memory_timeline"} <= set(data["meta"])
    assert data["meta"]["capture"]["options"]["memory"] is True
    assert data["meta"]["capture"]["scope_plan"]["kinds"] == live.meta.capture.scope_plan.kinds  # type: ignore[union-attr]
    again = profile_from_dict(data)
    assert again.meta == live.meta and again == live
    with pytest.raises(dataclasses.FrozenInstanceError):
        live.meta.model = "changed"  # type: ignore[misc]


@pytest.mark.parametrize("name", ["capture_memory_steps.json.gz", "analyzed_gpu_trace.json.gz"])
def test_v1_files_load_into_the_records(name: str, tmp_path: Path) -> None:
    raw = _raw_v1(name)["meta"]
    profile = ls.load(V1 / name)
    profile.validate()
    meta = profile.meta
    assert meta.extra == {}  # every v1 key found its record
    assert isinstance(meta.memory, MemoryReport) and isinstance(meta.memory_timeline, MemoryTimeline)
    if raw["source"] == "live":
        assert meta.capture is not None and meta.environment is not None
        assert meta.capture.options.memory is True and meta.capture.reader == raw["reader"]
        assert meta.capture.scope_plan.kinds == raw["module_scopes"]
        assert [list(m) for m in meta.capture.scope_plan.modules] == raw["scope_plan"]["modules"]
        assert meta.environment.torch_version == raw["torch_version"]
    else:
        assert meta.capture is None and meta.trace_file == raw["trace_file"]
        assert meta.device_names == ["NVIDIA H100 80GB HBM3"]
    # the v1 view gives back every v1 key with its value (memory as records, the trace's own keys)
    view = meta_to_v1(meta)
    for key, value in raw.items():
        if key in ("memory", "memory_timeline", "schema_version", "trace"):
            continue
        assert json.loads(json.dumps(view[key])) == value, key
    assert {k: v for k, v in raw["trace"].items() if k != "reader"}.items() <= view["trace"].items()
    # saved again it is a v2 file that reads back equal
    again = ls.load(profile.save(tmp_path / "again.json"))
    assert again == profile


def test_the_v1_dict_form_still_reads_with_a_warning(live: ls.Profile) -> None:  # noqa: F811
    meta = live.meta
    with pytest.warns(DeprecationWarning, match="ProfileMeta"):
        assert meta["model"] == "TinyMLP"
    with pytest.warns(DeprecationWarning):
        assert meta.get("module_scopes") == meta.capture.scope_plan.kinds  # type: ignore[union-attr]
    with pytest.warns(DeprecationWarning):
        assert "options" in meta and "nothing" not in meta
    with pytest.warns(DeprecationWarning, match="pass a ProfileMeta"):
        built = dataclasses.replace(live, meta={"model": "Net", "wall_us": 5.0})  # type: ignore[arg-type]
    assert built.meta.model == "Net" and built.meta.wall_us == 5.0


def test_unknown_keys_are_kept_and_bad_records_are_refused(live: ls.Profile) -> None:  # noqa: F811
    data = json.loads(json.dumps(profile_to_dict(live)))
    data["meta"]["from_a_newer_release"] = {"x": 1}
    kept = profile_from_dict(data)
    assert kept.meta.extra == {"from_a_newer_release": {"x": 1}}
    assert profile_from_dict(json.loads(json.dumps(profile_to_dict(kept)))).meta.extra == kept.meta.extra
    data["meta"]["capture"]["options"]["depth"] = "deep"
    with pytest.raises(TraceFormatError, match="schema v2"):
        profile_from_dict(data)


def test_device_summary_is_the_same_analyzed_saved_and_printed(tmp_path: Path, capsys: Any) -> None:
    analysis = analyze(GPU_TRACE)
    assert analysis.device is not None
    summary = analysis.profile.meta.device
    assert summary is not None and summary == device_summary(analysis.device)
    assert summary.launches == analysis.device.launches and summary.streams
    saved = analysis.profile.save(tmp_path / "saved.json")
    assert ls.load(saved).meta.device == summary
    # `analyze` of the saved profile prints the device line the trace's analysis prints
    assert main(["analyze", str(GPU_TRACE)]) == 0
    from_trace = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("Device: busy")
    )
    assert main(["analyze", str(saved)]) == 0
    from_saved = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("Device: busy")
    )
    assert from_saved == from_trace


def test_a_live_capture_keeps_what_the_traces_function_computes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Live captures and traces call the one summarize_device: a live capture's meta.device is what
    it returns for the capture's own events (a GPU trace's summary planted, since CI has no GPU)."""
    import layerscope.capture.recording as recording

    with gzip.open(GPU_TRACE) as f:
        planted = summarize_device(table_from_trace(json.loads(f.read())))
    seen: list[int] = []

    def on_the_live_table(table: Any) -> Any:
        seen.append(table.span_count)
        return planted

    monkeypatch.setattr(recording, "summarize_device", on_the_live_table)
    model = TinyMLP()
    with ls.profile(model) as prof:
        model(torch.randn(2, 8))
    assert prof.profile.meta.device == planted[1] is not None
    assert len(seen) == 1 and seen[0] > 0  # called once, on the capture's events
