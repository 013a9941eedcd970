"""The one output assembler (``write_outputs``) and the surface around it: every extension written
atomically, a failing renderer leaving no file, old spellings warning and still working, one sort
vocabulary whose errors list the choices."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import layerscope as ls
from layerscope.attribution import build_profile
from layerscope.errors import UsageError
from layerscope.handlers import FileSaver, save_to
from layerscope.model.meta import CaptureInfo, ProfileMeta, SavedOptions
from layerscope.model.profile import Profile
from layerscope.model.sort_keys import OP_SORT_KEYS, TREE_SORT_KEYS, check_sort_key
from layerscope.render.console import render_to_text, tree_table
from layerscope.render.writers import WRITERS, Output, Writer, write_outputs
from tests.test_build_synthetic import CATALOG, forward_backward_table

HAS_PARQUET = all(importlib.util.find_spec(name) for name in ("pandas", "pyarrow"))


@pytest.fixture
def profile() -> Profile:
    p = build_profile(
        forward_backward_table(),
        CATALOG,
        ProfileMeta(model="Net", capture=CaptureInfo(options=SavedOptions(memory=True))),
    )
    p.validate()
    return p


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("suffix", [s for s in WRITERS if s != ".parquet"])
def test_every_suffix_is_written_through_the_assembler(profile: Profile, tmp_path: Path, suffix: str) -> None:
    written = write_outputs(profile, [tmp_path / "deep" / f"r{suffix}"])
    assert written and all(path.is_file() and path.stat().st_size > 0 for path in written)
    assert _files(tmp_path) == sorted(path.name for path in written)  # no temp file left behind


def test_parquet_writes_two_tables_or_says_what_is_missing(profile: Profile, tmp_path: Path) -> None:
    if not HAS_PARQUET:
        with pytest.raises(UsageError) as caught:
            profile.save(tmp_path / "r.parquet")
        assert "\n" not in str(caught.value) and "pyarrow" in str(caught.value)
        assert _files(tmp_path) == []
        return
    import pandas as pd

    first = profile.save(tmp_path / "r.parquet")
    assert _files(tmp_path) == ["r.modules.parquet", "r.ops.parquet"] and first.name == "r.modules.parquet"
    modules = pd.read_parquet(first)
    assert len(modules) == len(list(profile.modules()))


def test_a_failing_renderer_leaves_no_file(
    profile: Profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object) -> list[tuple[Path, bytes]]:
        raise RuntimeError("renderer failed")

    monkeypatch.setitem(WRITERS, ".svg", Writer("svg", broken))
    kept = tmp_path / "r.json"
    kept.write_text("old")  # an existing file is not replaced either
    with pytest.raises(RuntimeError, match="renderer failed"):
        write_outputs(profile, [kept, tmp_path / "r.html", tmp_path / "r.svg"])
    assert _files(tmp_path) == ["r.json"] and kept.read_text() == "old"


def test_an_unknown_suffix_fails_before_any_rendering(profile: Profile, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="known suffixes"):
        write_outputs(profile, [tmp_path / "r.html", tmp_path / "r.xyz"])
    with pytest.raises(UsageError, match="choose from html, csv"):
        write_outputs(profile, [Output(tmp_path / "r.out", "nope")])
    assert _files(tmp_path) == []


def test_a_format_can_override_the_suffix(profile: Profile, tmp_path: Path) -> None:
    (written,) = write_outputs(profile, [Output(tmp_path / "report.out", "html")])
    assert written.read_bytes().lower().startswith(b"<!doctype html>")


def test_txt_is_the_console_view(profile: Profile, tmp_path: Path) -> None:
    text = profile.save(tmp_path / "r.txt").read_text()
    assert text.startswith("layerscope") and "Net" in text and "\x1b[" not in text
    assert render_to_text(tree_table(profile, ascii_only=False), width=160).splitlines()[0] in text


def test_export_is_deprecated_and_still_works(profile: Profile, tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match=r"Profile\.save"):
        written = profile.export(tmp_path / "r.csv")
    assert written == [tmp_path / "r.modules.csv", tmp_path / "r.ops.csv"]


def test_compile_info_and_moved_names_are_deprecated_and_still_work() -> None:
    from layerscope.capture.compile_watch import compile_info
    from layerscope.model.metrics import Metrics

    with pytest.warns(DeprecationWarning, match="watch_compiles"):
        assert ls.compile_info is compile_info
    with pytest.warns(DeprecationWarning, match="layerscope.model.metrics"):
        assert ls.Metrics is Metrics
    assert "compile_info" not in ls.__all__ and "Metrics" not in ls.__all__
    assert all(getattr(ls, name) is not None for name in ls.__all__)


def test_sort_keys_are_checked_once_with_the_choices(profile: Profile) -> None:
    with pytest.raises(UsageError) as caught:
        profile.ops(sort_by="speed")
    message = str(caught.value)
    assert "\n" not in message and "'speed'" in message and ", ".join(OP_SORT_KEYS) in message
    with pytest.raises(UsageError, match=", ".join(TREE_SORT_KEYS)):
        tree_table(profile, sort_by="speed")
    with pytest.warns(DeprecationWarning, match="'name'"):
        assert check_sort_key("type", TREE_SORT_KEYS, "x") == "name"


def test_one_word_means_one_figure_in_every_view(profile: Profile) -> None:
    by_word = profile.ops(sort_by="self_cpu")
    assert [r.name for r in by_word] == [r.name for r in profile.ops(sort_by="self_cpu_us")]
    values = [r.metrics.self_cpu_us for r in by_word]
    assert values == sorted(values, reverse=True)
    names = [r.name for r in profile.ops(sort_by="name")]
    assert names == sorted(names)
    types = profile.by_type(sort_by="name")
    assert [t.type_name for t in types] == sorted(t.type_name for t in types)
    with pytest.warns(DeprecationWarning):
        old = profile.by_type(sort_by="type")
    assert [t.type_name for t in old] == [t.type_name for t in types]
    allocs = [
        t.forward.cpu_alloc_bytes + t.backward.cpu_alloc_bytes for t in profile.by_type(sort_by="alloc")
    ]
    assert allocs == sorted(allocs, reverse=True)


class _Cycle:
    """What the handlers read of a Cycle."""

    def __init__(self, profile: Profile, index: int = 0) -> None:
        self.profile, self.index, self.steps = profile, index, (0, 1)

    def export_chrome_trace(self, path: Path) -> Path:  # pragma: no cover - trace=False here
        raise AssertionError("not asked for")


def test_save_to_and_file_saver_write_through_the_assembler(profile: Profile, tmp_path: Path) -> None:
    handler = save_to(tmp_path / "runs", html=True, also=(".txt", ".csv"), rank=0)
    handler(_Cycle(profile))  # type: ignore[arg-type]
    suffixes = sorted(p.name.split(".", 1)[1] for p in handler.written)  # type: ignore[attr-defined]
    assert suffixes == ["html", "json.gz", "modules.csv", "ops.csv", "txt"]
    with pytest.raises(UsageError, match="known suffixes"):
        save_to(tmp_path, also=(".xyz",))
    saver = FileSaver(tmp_path / "one" / "run.html", html=True)
    saver(_Cycle(profile))  # type: ignore[arg-type]
    saver.finish()
    assert saver.written == [tmp_path / "one" / "run.html"] and _files(tmp_path / "one") == ["run.html"]
