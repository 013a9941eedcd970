"""Saving and loading profiles; bad files give TraceFormatError with a clear message."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

import layerscope as ls
from layerscope.errors import TraceFormatError
from layerscope.model.serialize import profile_to_dict, write_atomic
from tests.fixtures.models import TinyMLP


@pytest.fixture(scope="module")
def live_profile() -> ls.Profile:
    model = TinyMLP()
    with ls.profile(model, memory=True) as prof:
        model(torch.randn(4, 8)).sum().backward()
    return prof.profile


@pytest.mark.parametrize("name", ["run.json", "run.json.gz"])
def test_round_trip_is_equal(tmp_path: Path, live_profile: ls.Profile, name: str) -> None:
    path = live_profile.save(tmp_path / name)
    loaded = ls.load(path)
    assert loaded == live_profile
    loaded.validate()
    assert loaded.find("fc1") == live_profile.find("fc1")
    if name.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"


def test_saved_form_is_versioned(live_profile: ls.Profile) -> None:
    data = profile_to_dict(live_profile)
    assert data["format"] == "layerscope.profile" and data["schema_version"] == 2
    assert data["metric_fields"][0] == "self_cpu_us"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"{not json", "not valid JSON"),
        (b'{"hello": 1}', "neither a layerscope profile nor a torch.profiler trace"),
        (b'{"format": "layerscope.profile", "schema_version": 99}', "schema version 99"),
        (b'{"traceEvents": []}', "holds no profiler events"),
        (b"\x1f\x8b\x08\x00garbage", "corrupt gzip"),
        (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "x", "dur": 1}]}', "malformed"),
    ],
)
def test_bad_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message):
        ls.load(path)


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no such file"):
        ls.load(tmp_path / "nope.json")
    with pytest.raises(TraceFormatError, match="is a folder"):
        ls.load(tmp_path)


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")

    class Boom(bytes):
        pass

    with pytest.raises(TypeError):
        write_atomic(target, 12345)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


@pytest.mark.parametrize("exporter", ["torch", "layerscope"])
def test_trace_written_by_torch_loads_with_module_tree(tmp_path: Path, exporter: str) -> None:
    """A Chrome trace exported from a layerscope run carries our module ranges: the file path
    rebuilds the same tree the live path built. torch's own exporter writes them when the scopes
    are profiler ranges; layerscope's writes them either way (marks become the same events)."""
    model = TinyMLP()
    x = torch.randn(4, 8)
    with ls.profile(model, module_scopes="ranges" if exporter == "torch" else "auto") as prof:
        model(x).sum().backward()
    live = prof.profile
    trace = tmp_path / "trace.json"
    if exporter == "torch":
        prof.torch_profiler.export_chrome_trace(str(trace))
    else:
        prof.export_chrome_trace(trace)
    from_file = ls.load(trace)
    from_file.validate()
    assert [n.path for n in from_file.modules()] == [n.path for n in live.modules()]
    for node in live.modules():
        other = from_file.find(node.path)
        assert other.calls == node.calls
        assert other.forward.flops == node.forward.flops and other.backward.flops == node.backward.flops
        # the JSON keeps ns precision, so times agree closely
        assert other.forward.cpu_us == pytest.approx(node.forward.cpu_us, rel=1e-3, abs=0.01)
        assert other.backward.cpu_us == pytest.approx(node.backward.cpu_us, rel=1e-3, abs=0.01)
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(trace.read_bytes()))
    assert ls.load(gz).root.forward.flops == live.root.forward.flops
