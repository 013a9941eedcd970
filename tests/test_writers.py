"""File outputs by suffix: ``Profile.save`` and ``layerscope report`` share one writer table."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import layerscope as ls
from layerscope.attribution import build_profile
from layerscope.cli import main
from layerscope.errors import UsageError
from layerscope.model.meta import CaptureInfo, ProfileMeta, SavedOptions
from layerscope.model.profile import Profile
from layerscope.render.writers import FORMATS, WRITERS, find_writer
from tests.test_build_synthetic import CATALOG, forward_backward_table


@pytest.fixture
def profile() -> Profile:
    p = build_profile(
        forward_backward_table(),
        CATALOG,
        ProfileMeta(model="Net", capture=CaptureInfo(options=SavedOptions(memory=True))),
    )
    p.validate()
    return p


@pytest.mark.parametrize(
    ("name", "start"),
    [
        ("r.html", b"<!doctype html>"),
        ("r.HTM", b"<!doctype html>"),
        ("r.collapsed", b"Net;"),
        ("r.folded", b"Net;"),
        ("r.txt", b"layerscope"),
        ("r.svg", b"<?xml"),
    ],
)
def test_save_writes_one_file_per_suffix_as_report_does(
    profile: Profile, tmp_path: Path, name: str, start: bytes
) -> None:
    (tmp_path / "api").mkdir()
    written = profile.save(tmp_path / "api" / name)
    assert written == tmp_path / "api" / name
    data = written.read_bytes()
    assert data.lower().startswith(start.lower())
    saved = profile.save(tmp_path / "run.json")
    assert main(["report", str(saved), "-o", str(tmp_path / name)]) == 0
    assert (tmp_path / name).read_bytes() == data
    assert sorted(p.name for p in (tmp_path / "api").iterdir()) == [name]  # no temp file left behind


def test_save_csv_writes_two_files(profile: Profile, tmp_path: Path) -> None:
    first = profile.save(tmp_path / "r.csv")
    written = sorted(tmp_path.iterdir())
    assert first == written[0] and written == [tmp_path / "r.modules.csv", tmp_path / "r.ops.csv"]
    assert written[0].read_text().startswith("path,type,calls,recompute_calls,params_total,phase,")
    assert written[1].read_text().startswith("name,phase,module,unattributed,input_shapes,calls,")


@pytest.mark.parametrize("name", ["copy.json", "copy.json.gz"])
def test_save_json_round_trips(profile: Profile, tmp_path: Path, name: str) -> None:
    written = profile.save(str(tmp_path / name))
    assert written == tmp_path / name
    assert ls.load(written) == profile


def test_save_options_reach_the_stack_writers(profile: Profile, tmp_path: Path) -> None:
    by_time = profile.save(tmp_path / "t.collapsed").read_text()
    by_alloc = profile.save(tmp_path / "a.collapsed", metric="cpu_alloc_bytes").read_text()
    assert by_time != by_alloc
    with pytest.raises(UsageError, match="cannot weigh stacks"):
        profile.save(tmp_path / "x.svg", metric="nonsense")
    with pytest.raises(UsageError, match="needs Python stacks"):
        profile.save(tmp_path / "x.folded", frames="source")


def test_save_unknown_suffix_names_the_known_ones(profile: Profile, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        profile.save(tmp_path / "r.xyz")
    message = str(caught.value)
    assert "\n" not in message and "r.xyz" in message
    assert all(suffix in message for suffix in WRITERS)
    assert list(tmp_path.iterdir()) == []


def test_writer_table_matches_the_report_formats() -> None:
    assert list(FORMATS) == ["html", "csv", "collapsed", "txt", "svg", "json", "parquet"]
    assert find_writer("A.JSON.GZ") is WRITERS[".json.gz"] and find_writer("a.gz") is None


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    mask: int = request.param
    before = os.umask(mask)
    try:
        yield mask
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_written_files_get_the_mode_open_gives(profile: Profile, tmp_path: Path, umask: int) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # what a plain open() gives under this umask
    assert mode(plain) == 0o666 & ~umask
    written = [profile.save(tmp_path / "p.json.gz"), profile.save(tmp_path / "p.json")]
    for name in ("r.html", "r.txt", "r.collapsed", "r.svg"):
        written.append(profile.save(tmp_path / name))
    profile.save(tmp_path / "r.csv")
    written += [tmp_path / "r.modules.csv", tmp_path / "r.ops.csv"]
    assert main(["report", str(written[0]), "-o", str(tmp_path / "cli.html")]) == 0
    written.append(tmp_path / "cli.html")
    for path in written:
        assert mode(path) == mode(plain), path.name
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_replaced_file_keeps_its_mode(profile: Profile, tmp_path: Path, umask: int) -> None:
    target = tmp_path / "p.json"
    target.write_text("old")
    target.chmod(0o640)
    profile.save(target)
    assert mode(target) == 0o640 and ls.load(target).root.path == ""
