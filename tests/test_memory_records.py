"""Memory records and names: ``meta.memory``/``meta.memory_timeline`` are typed records that
read schema v1's form, and every surface (console, pandas, CSV, JSON, the HTML report) uses only the
glossary's names (docs/usage.md): ``alloc``, ``net``, ``relative_peak``, ``absolute_peak``."""

from __future__ import annotations

import gzip
import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import layerscope as ls
from layerscope.model.memory import MemoryReport, MemoryTimeline
from layerscope.model.metrics import FIELD_NAMES, RENAMED_FIELDS, Metrics
from layerscope.model.serialize import profile_to_dict
from layerscope.render.exports import modules_csv, ops_csv
from tests.fixtures.models import TinyMLP

V1 = Path(__file__).parent / "fixtures" / "schema_v1"

#: The names the memory quantities had before the glossary fixed them (any spelling of them):
#: ``retained``, a peak that does not say relative or absolute, the timeline's ``cpu_bytes``.
OLD_NAME = re.compile(
    r"retained|(?<!relative_)(?<!absolute_)\bpeak_bytes|_(cpu|device)_peak_bytes|^(cpu|device)_peak_bytes"
    r"|\bself_net\b|\b(cpu|device)_bytes\b"
)


def _raw(name: str) -> dict[str, Any]:
    with gzip.open(V1 / name) as f:
        data: dict[str, Any] = json.loads(f.read())
    return data


@pytest.fixture(scope="module")
def live() -> ls.Profile:
    model = TinyMLP()
    with ls.profile(model, memory=True, schedule=ls.schedule(wait=0, warmup=1, active=2)) as prof:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
    return prof.profile


@pytest.mark.parametrize("name", ["capture_memory_steps.json.gz", "analyzed_gpu_trace.json.gz"])
def test_v1_files_load_with_typed_memory_records(name: str, tmp_path: Path) -> None:
    raw = _raw(name)
    old = raw["meta"]["memory"]["classes"]
    profile = ls.load(V1 / name)
    profile.validate()
    report, timeline = profile.meta.memory, profile.meta.memory_timeline
    assert isinstance(report, MemoryReport) and isinstance(timeline, MemoryTimeline)
    # v1's positional and old-named figures land in the new names
    for saved, now in zip(old, report.classes, strict=True):
        assert now.absolute_peak_bytes == saved["peak_bytes"]
        assert now.baseline_bytes == saved["baseline_bytes"]
        assert [[r.category, r.module, r.phase, r.bytes] for r in now.rows] == saved["rows"]
        figures = [[s.step, s.absolute_peak_bytes, s.alloc_bytes, s.net_bytes] for s in now.steps]
        assert figures == saved["steps"]
    assert timeline.peak.relative_peak_bytes == raw["meta"]["memory_timeline"]["peak"]["bytes"]
    assert list(timeline.cpu_net_bytes) == raw["meta"]["memory_timeline"]["cpu_bytes"]
    steps = {s["step"]: s for s in raw["steps"]}
    assert profile.steps and all(s.absolute_peak_bytes == steps[s.step]["peak_bytes"] for s in profile.steps)
    # v1's totals held the block's absolute peaks; now they are relative (what was live before excluded)
    fields = dict(zip(raw["metric_fields"], raw["totals"], strict=True))
    main = report.main_class()
    assert main is not None
    relative = "device_relative_peak_bytes" if main.device else "cpu_relative_peak_bytes"
    assert fields[relative.replace("_relative", "")] == main.absolute_peak_bytes
    assert getattr(profile.totals, relative) == main.absolute_peak_bytes - main.baseline_bytes
    assert profile.totals.net_bytes == fields["retained_bytes"]
    # saved again, it reads back equal, under the new names only
    again = ls.load(profile.save(tmp_path / "again.json"))
    assert again == profile
    assert not _old_names_in(profile_to_dict(again))


def test_records_round_trip_through_json(live: ls.Profile) -> None:
    report, timeline = live.meta.memory, live.meta.memory_timeline
    assert MemoryReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    assert MemoryTimeline.from_json(json.loads(json.dumps(timeline.to_json()))) == timeline
    assert report.classes and report.classes[0].steps  # the capture recorded steps with memory


def test_old_attribute_names_still_read_with_a_warning(live: ls.Profile) -> None:
    m = Metrics(self_net_bytes=3, net_bytes=5, cpu_relative_peak_bytes=7, device_relative_peak_bytes=11)
    for old, new in RENAMED_FIELDS.items():
        with pytest.warns(DeprecationWarning, match=new):
            assert getattr(m, old) == getattr(m, new)
    step = live.steps[0]
    with pytest.warns(DeprecationWarning, match="absolute_peak_bytes"):
        assert step.peak_bytes == step.absolute_peak_bytes  # type: ignore[attr-defined]
    at_peak = live.memory_at_peak()
    with pytest.warns(DeprecationWarning, match="absolute_peak_bytes"):
        assert at_peak.total_bytes == at_peak.absolute_peak_bytes
    with pytest.warns(DeprecationWarning, match="MemoryReport"):
        assert live.meta.memory["classes"][0]["absolute_peak_bytes"] == at_peak.absolute_peak_bytes


def _old_names_in(value: Any, path: str = "") -> list[str]:
    """Every key (and listed field name) under ``value`` that is an old memory name."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            if OLD_NAME.search(str(key)):
                found.append(f"{path}/{key}")
            found += _old_names_in(item, f"{path}/{key}")
    elif isinstance(value, list):
        if all(isinstance(v, str) for v in value) and path.endswith("metric_fields"):
            found += [f"{path}:{v}" for v in value if OLD_NAME.search(v)]
        for item in value:
            found += _old_names_in(item, path)
    return found


def test_every_surface_uses_only_glossary_names(live: ls.Profile, tmp_path: Path) -> None:
    assert not [f for f in FIELD_NAMES if OLD_NAME.search(f)]
    # JSON: the saved profile's keys, the metric field list, the memory records
    assert not _old_names_in(profile_to_dict(live))
    # pandas
    pytest.importorskip("pandas")
    for table in ("modules", "ops", "unattributed", "steps", "memory_peak"):
        assert not [c for c in live.to_pandas(table).columns if OLD_NAME.search(str(c))], table
    # CSV headers
    for text in (modules_csv(live), ops_csv(live)):
        header = text.splitlines()[0].split(",")
        assert "forward_net_bytes" in header or "net_bytes" in header
        assert not [c for c in header if OLD_NAME.search(c)]
    # console
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # no surface reads an old name
        text = str(live)
    assert "retained" not in text.lower()
    # the HTML report: its script and the data it embeds
    from layerscope.render.assets import __file__ as assets_init

    script = (Path(assets_init).parent / "report.js").read_text()
    assert not OLD_NAME.search(script), OLD_NAME.search(script)
    page = ls.load(live.save(tmp_path / "p.json")).export(tmp_path / "p.html")[0].read_text()
    assert not OLD_NAME.search(page), OLD_NAME.search(page)


def test_old_metric_names_still_sort_and_diff(live: ls.Profile) -> None:
    with pytest.warns(DeprecationWarning, match="net_bytes"):
        old = live.ops(sort_by="self_retained_bytes")
    assert old == live.ops(sort_by="self_net_bytes")
    with pytest.warns(DeprecationWarning, match="net_bytes"):
        assert ls.diff(live, live, metric="retained_bytes") == ls.diff(live, live, metric="net_bytes")
