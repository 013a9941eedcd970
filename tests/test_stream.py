"""Reading traces in blocks: same result as a whole parse, and cut files keep what survives."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

import layerscope as ls
from layerscope.attribution import build_profile
from layerscope.events.chrome import TraceTableBuilder, table_from_trace
from layerscope.events.stream import stream_trace

TRACES = [
    "cuda_nccl_distributed.json.gz",
    "amd_mi250_train.json.gz",
    "two_ranks/rank-0.json.gz",
    "cpu_only_rank34.pt.trace.json.gz",
]


@pytest.mark.parametrize("name", TRACES)
@pytest.mark.parametrize("block", [997, 65536])
def test_blocks_give_the_same_profile_as_a_whole_parse(real_traces: Path, name: str, block: int) -> None:
    path = real_traces / name
    whole = orjson.loads(gzip.decompress(path.read_bytes()))
    expected = build_profile(table_from_trace(whole), None)
    builder = TraceTableBuilder()
    result = stream_trace(path, builder, block_bytes=block)
    assert not result.truncated and result.lost_bytes == 0
    assert result.header.get("schemaVersion") == whole.get("schemaVersion")
    assert result.header.get("traceName", whole.get("traceName")) == whole.get("traceName")
    got = build_profile(builder.finish(result.header), None)
    assert got == expected


def test_a_cut_trace_keeps_every_complete_event(real_traces: Path, tmp_path: Path) -> None:
    raw = gzip.decompress((real_traces / "cuda_nccl_distributed.json.gz").read_bytes())
    path = tmp_path / "killed.json"
    path.write_bytes(raw[: len(raw) // 2])
    profile = ls.load(path)
    profile.validate()
    trace = profile.meta.trace
    assert trace.truncated is True and 0 < trace.lost_bytes < 10_000
    full = ls.load(real_traces / "cuda_nccl_distributed.json.gz")
    assert 0 < profile.totals.device_us < full.totals.device_us
    gz = tmp_path / "killed.json.gz"
    gz.write_bytes(gzip.compress(raw)[: len(raw) // 20])  # the gzip stream itself ends early
    cut = ls.load(gz)
    assert cut.meta.trace.truncated is True


def test_truncation_is_reported_by_the_cli(
    real_traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from layerscope.cli import main

    raw = gzip.decompress((real_traces / "amd_mi250_train.json.gz").read_bytes())
    path = tmp_path / "cut.json"
    path.write_bytes(raw[: int(len(raw) * 0.8)])
    assert main(["analyze", str(path), "--top", "0"]) == 0
    assert "ends early" in capsys.readouterr().err
