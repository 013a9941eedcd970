"""One ``-o`` convention across commands: a path whose suffix names a format is one file, anything
else a folder; every command that writes files lists them on stderr (``layerscope: saved PATH``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.cli import main
from tests.test_run import write_script


def _saved_lines(err: str) -> list[str]:
    return [
        line.removeprefix("layerscope: saved ")
        for line in err.splitlines()
        if line.startswith("layerscope: saved ")
    ]


def test_run_to_a_json_file_writes_that_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = write_script(tmp_path)
    target = tmp_path / "out" / "run.json"
    assert main(["run", "--steps", "3", "-o", str(target), "--html", str(script), "4"]) == 0
    assert target.is_file() and (tmp_path / "out" / "run.html").is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == ["run.html", "run.json"]
    assert _saved_lines(capsys.readouterr().err) == [str(target), str(target.with_name("run.html"))]
    ls.load(target).validate()


def test_run_to_a_json_file_with_several_cycles_numbers_them(tmp_path: Path) -> None:
    script = write_script(tmp_path)
    target = tmp_path / "run.json.gz"
    schedule = ["--wait", "0", "--warmup", "0", "--active", "1", "--repeat", "2"]
    assert main(["run", *schedule, "-o", str(target), "-q", str(script), "4"]) == 0
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.glob("run.*")) == ["run.c0.json.gz", "run.c1.json.gz"]


def test_analyze_saves_the_profile_it_built(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(torch.randn(2, 8)).sum().backward()
    traces = tmp_path / "traces"
    traces.mkdir()
    prof.export_chrome_trace(str(traces / "a.json"))  # torch exports a trace once
    (traces / "b.json").write_bytes((traces / "a.json").read_bytes())
    one = tmp_path / "one.json"
    assert main(["analyze", str(traces / "a.json"), "-o", str(one), "--ascii"]) == 0
    assert _saved_lines(capsys.readouterr().err) == [str(one)]
    ls.load(one).validate()
    # a folder of traces: -o is a folder, one profile each; a file name is refused in one line
    assert main(["analyze", str(traces), "-o", str(tmp_path / "profiles"), "--ascii"]) == 0
    assert sorted(p.name for p in (tmp_path / "profiles").iterdir()) == ["a.json.gz", "b.json.gz"]
    capsys.readouterr()
    assert main(["analyze", str(traces), "-o", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give -o a folder" in err and not (tmp_path / "x.json").exists()


def test_report_and_merge_list_what_they_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.fixtures.rank_traces import write_rank_traces

    ranks = write_rank_traces(tmp_path / "ranks", 2, 1, steps=5)
    assert main(["report", str(ranks[0]), "-o", str(tmp_path / "r.csv")]) == 0
    assert _saved_lines(capsys.readouterr().err) == [
        str(tmp_path / "r.modules.csv"),
        str(tmp_path / "r.ops.csv"),
    ]
    merged, page = tmp_path / "m.json", tmp_path / "m.html"
    assert main(["merge", *map(str, ranks), "-o", str(merged), "--html", "--ascii"]) == 0
    assert _saved_lines(capsys.readouterr().err) == [str(merged), str(page)]
