"""A Profile's convenience methods, served by analysis and render through the registration made at
``import layerscope`` (render/profile_views.py): typed results, ``print(p)``, and notebook display
(Profile, op tables, line tables, diffs) through IPython's own formatter."""

from __future__ import annotations

import pytest
import torch

import layerscope as ls
from layerscope.analysis.report import build_report
from layerscope.analysis.stacks import op_user_stacks
from layerscope.attribution.stacks import user_frames
from layerscope.model.display import NotebookDisplay, register_html
from layerscope.model.profile import OpStats, OpTable
from layerscope.model.tables import LineTable, TypeTable
from layerscope.render.console import render_to_text, tree_table
from layerscope.render.html import html_report, report_data
from tests.fixtures.stack_models import TwoCallSites


@pytest.fixture(scope="module")
def profile() -> ls.Profile:
    torch.manual_seed(0)
    model = TwoCallSites()
    with ls.profile(model, with_stack=True) as prof:
        for _ in range(2):
            model(torch.randn(8, 8))
            prof.step()
    p = prof.profile
    p.validate()
    return p


def test_views_return_typed_tables(profile: ls.Profile) -> None:
    ops = profile.ops(group_by=("name", "module"))
    assert isinstance(ops, OpTable) and ops and all(isinstance(r, OpStats) for r in ops)
    lines = profile.lines()
    assert isinstance(lines, LineTable) and lines
    types = profile.by_type()
    assert isinstance(types, TypeTable) and {r.type_name for r in types} >= {"TwoCallSites"}
    # the tables add up to the same totals, whichever view computed them
    assert sum(r.metrics.self_cpu_us for r in ops) == pytest.approx(sum(r.cpu_us for r in lines))


def test_print_is_the_console_tree(profile: ls.Profile) -> None:
    assert str(profile) == render_to_text(tree_table(profile))
    assert "TwoCallSites" in str(profile)


def test_notebooks_show_profiles_and_tables_through_ipython(profile: ls.Profile) -> None:
    formatter = pytest.importorskip("IPython.core.formatters").DisplayFormatter()
    shown = {
        "profile": formatter.format(profile)[0]["text/html"],
        "ops": formatter.format(profile.ops(limit=3))[0]["text/html"],
        "lines": formatter.format(profile.lines(limit=3))[0]["text/html"],
        "diff": formatter.format(ls.diff(profile, profile))[0]["text/html"],
    }
    assert shown["profile"].startswith("<iframe srcdoc=") and "<script" not in shown["profile"]
    assert 'id="tree"' in html_report(profile) and "id=&quot;tree&quot;" in shown["profile"]
    assert shown["ops"].startswith("<table") and shown["ops"].count("<tr>") == 4  # header + 3 rows
    assert "Source lines: function definition lines" in shown["lines"]
    assert "layerscope diff" in shown["diff"]


def test_a_record_without_a_drawing_shows_as_text() -> None:
    class Plain(NotebookDisplay):
        pass

    class Drawn(Plain):
        pass

    assert Plain()._repr_html_() is None  # IPython then shows the repr
    register_html(Drawn, lambda record: "<b>drawn</b>")
    assert Drawn()._repr_html_() == "<b>drawn</b>"
    assert Plain()._repr_html_() is None


def test_the_report_filters_each_stack_once(profile: ls.Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []

    def counting(stack: tuple[str, ...], internal: bool = False, depth: int | None = None) -> tuple[str, ...]:
        calls.append(stack)
        return user_frames(stack, internal, depth)

    monkeypatch.setattr("layerscope.analysis.stacks.user_frames", counting)
    monkeypatch.setattr("layerscope.analysis.lines.user_frames", counting)
    report = build_report(profile)
    distinct = {row.stack for row in profile.op_rows}
    assert len(calls) == len(distinct) and set(calls) == distinct
    assert report.user_stacks == op_user_stacks(profile)
    assert report.lines is not None and {f.frames_of for f in report.flames} == {"modules", "source"}
    # the page's source column and annotated source come from those frames
    data = report_data(profile)
    strings = data["strings"]
    shown = {strings[k] for k in data["ops"]["stack"] if k >= 0}
    assert shown == {"\n".join(frames[:5]) for frames in report.user_stacks if frames}
    assert data["source"]["files"]
