"""Every command spells its outputs one way: ``-o/--output PATH`` (a file when its suffix names a
format, else a folder), ``--html`` a flag (the report beside -o); old spellings still work one
release with one deprecation line on stderr; bad keys are one line listing the choices."""

from __future__ import annotations

from pathlib import Path

import pytest

import layerscope as ls
from layerscope.cli import main
from tests.test_cli import FACTORY
from tests.test_outputs import _saved_lines
from tests.test_run import write_script

MLP = [f"{FACTORY}:small_mlp", "--input", "4x8"]  # not -q: the saved lines and warnings are checked


def _deprecation_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "is deprecated" in line]


def test_profile_output_is_a_path_and_html_a_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "run.json.gz"
    assert main(["profile", *MLP, "-o", str(target), "--html"]) == 0
    assert _saved_lines(capsys.readouterr().err) == [str(target), str(tmp_path / "run.html")]
    ls.load(target).validate()
    # the suffix picks the format; a path without one is a folder
    assert main(["profile", *MLP, "-o", str(tmp_path / "view.txt")]) == 0
    assert (tmp_path / "view.txt").read_text().startswith("layerscope")
    assert main(["profile", *MLP, "-o", str(tmp_path / "folder"), "--html"]) == 0
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == ["profile.html", "profile.json.gz"]
    assert _deprecation_lines(capsys.readouterr().err) == []


def test_profile_html_path_still_works_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "page.html"
    assert main(["profile", *MLP, "--html", str(page)]) == 0
    err = capsys.readouterr().err
    assert page.is_file() and _saved_lines(err) == [str(page)]
    assert len(_deprecation_lines(err)) == 1 and "--html" in err
    assert main(["profile", *MLP, f"--html={tmp_path / 'eq.html'}"]) == 0
    assert (tmp_path / "eq.html").is_file()


def test_show_and_report_write_through_the_same_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "run.json"
    assert main(["profile", *MLP, "-o", str(saved)]) == 0
    assert main(["show", str(saved), "--ascii", "-o", str(tmp_path / "run.svg"), "--html"]) == 0
    assert (tmp_path / "run.svg").is_file() and (tmp_path / "run.html").is_file()
    (tmp_path / "run.html").unlink()
    assert main(["show", str(saved), "--ascii", "--html"]) == 0  # without -o: beside the input
    assert (tmp_path / "run.html").is_file()
    capsys.readouterr()
    assert main(["report", str(saved), "-o", str(tmp_path / "r.csv"), "--html"]) == 0
    assert _saved_lines(capsys.readouterr().err) == [
        str(tmp_path / "r.modules.csv"),
        str(tmp_path / "r.ops.csv"),
        str(tmp_path / "r.html"),
    ]


def test_merge_html_is_a_flag_and_the_old_path_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.fixtures.rank_traces import write_rank_traces

    ranks = write_rank_traces(tmp_path / "ranks", 2, 1, steps=5)
    merged = tmp_path / "m.json"
    assert main(["merge", *map(str, ranks), "-o", str(merged), "--html", "--ascii"]) == 0
    err = capsys.readouterr().err
    assert _saved_lines(err) == [str(merged), str(tmp_path / "m.html")] and not _deprecation_lines(err)
    assert main(["merge", *map(str, ranks), "--html", str(tmp_path / "old.html"), "--ascii"]) == 0
    err = capsys.readouterr().err
    assert (tmp_path / "old.html").is_file() and len(_deprecation_lines(err)) == 1
    assert main(["merge", *map(str, ranks), "-o", str(tmp_path / "m.svg")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ".json, .json.gz, .html" in err


def test_run_output_dir_and_depth_keep_working_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = write_script(tmp_path)
    folder = tmp_path / "runs"
    assert main(["run", "--steps", "2", "--output-dir", str(folder), "-q", str(script), "4"]) == 0
    err = capsys.readouterr().err
    assert len(list(folder.glob("*.json.gz"))) == 1
    assert [line for line in _deprecation_lines(err) if "--output-dir" in line]
    target = tmp_path / "shallow.json"
    assert main(["run", "--steps", "2", "--depth", "0", "-o", str(target), "-q", str(script), "4"]) == 0
    err = capsys.readouterr().err
    assert [line for line in _deprecation_lines(err) if "--record-depth" in line]
    assert [m.path for m in ls.load(target).modules()] == [""]
    deep = tmp_path / "deep.json"
    argv = ["run", "--steps", "2", "--record-depth", "1", "--depth", "0", "-o", str(deep), "-q"]
    assert main([*argv, str(script), "4"]) == 0
    assert not _deprecation_lines(capsys.readouterr().err)
    assert len(list(ls.load(deep).modules())) > 1  # --depth only folds the view


def test_sort_keys_are_one_line_errors_listing_the_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "run.json"
    assert main(["profile", *MLP, "-o", str(saved)]) == 0
    capsys.readouterr()
    assert main(["show", str(saved), "--sort", "speed"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--sort 'speed'" in err and "execution, time, cpu" in err
    assert main(["show", str(saved), "--op-sort", "nope"]) == 2
    assert "choose from time, cpu" in capsys.readouterr().err
    assert main(["show", str(saved), "--by", "type", "--sort", "type", "--ascii"]) == 0
    err = capsys.readouterr().err
    assert len(_deprecation_lines(err)) == 1 and "--sort name" in err


def test_an_output_that_cannot_be_written_fails_before_profiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a)
    )
    monkeypatch.setattr("layerscope.cli.profile_cmd.resolve_factory", _never_called)
    assert main(["profile", *MLP, "-o", str(tmp_path / "r.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pyarrow" in err and list(tmp_path.iterdir()) == []


def _never_called(*_: object) -> None:
    raise AssertionError("the model was built before the outputs were checked")


def test_show_device_is_now_memory_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "mem.json"
    assert main(["profile", *MLP, "--memory", "-o", str(saved)]) == 0
    capsys.readouterr()
    assert main(["show", str(saved), "--memory-peak", "--memory-device", "cpu", "--ascii"]) == 0
    new = capsys.readouterr()
    assert not _deprecation_lines(new.err)
    assert main(["show", str(saved), "--memory-peak", "--device", "cpu", "--ascii"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out and len(_deprecation_lines(old.err)) == 1 and "--memory-device" in old.err
