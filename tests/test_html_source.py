"""The HTML report's annotated source (issue 24): each line of the user's files with the figures of
the ops it called, files read when the report is written, drawn as text in a real browser.

Profiles are built by hand (no capture): op rows whose stacks point at files written here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

import layerscope.render.source_view as source_view
from layerscope.analysis.lines import NO_LINE, line_table
from layerscope.model.meta import CallLinesInfo, ProfileMeta
from layerscope.model.metrics import ADDITIVE_PAIRS, FIELD_NAMES, PEAK_FIELDS, Metrics, own_metrics
from layerscope.model.profile import ModuleNode, OpStats, Phase, Profile, UnattributedEntry
from layerscope.render.html import html_report, report_data
from layerscope.render.html_tables import lines_html
from layerscope.render.source_view import NOT_FOUND, TOO_LARGE, windows
from tests.test_html_report import HOSTILE, _open, browser  # noqa: F401  (browser: the shared Chromium)

MISSING = "/nonexistent/layerscope-test/gone.py"
SCRIPT = "</script><img src=x onerror=\"document.title='pwned'\">"
MODEL_SOURCE = [
    "import torch",
    "",
    "def forward(x):",
    f"    y = x @ x  # {SCRIPT}",
    "    z = y.relu()  # <b>bold</b>",
    "    return z  # <script>document.title = 'pwned too'</script>",
]


def _op(
    name: str,
    module: str | None,
    phase: Phase,
    frame: str | None,
    cpu: float,
    flops: int = 0,
    scope: str = "",
) -> OpStats:
    """An op row of ``cpu`` µs self CPU time (device time twice that) called from ``frame``; with
    ``module`` None, work outside every module in the entry ``scope``."""
    metrics = own_metrics({"cpu_us": cpu, "device_us": 2 * cpu, "flops": flops})
    stack = (frame, "/usr/lib/python3/runpy.py(88): _run_code") if frame else ()
    return OpStats(name, phase, module, None, 1, metrics, scope=scope, stack=stack)


def _with_children(own: Metrics, children: list[Metrics]) -> Metrics:
    """A node's metrics: its own work plus its children's totals."""
    values = {name: getattr(own, name) for name in FIELD_NAMES}
    for _, total in ADDITIVE_PAIRS:
        values[total] += sum(getattr(child, total) for child in children)
    for peak in PEAK_FIELDS:
        values[peak] = max([values[peak], *(getattr(child, peak) for child in children)])
    return Metrics(**values)


def _own(rows: list[OpStats], module: str, phase: Phase) -> Metrics:
    """A module's own metrics in one phase: the sum of its op rows."""
    mine = [r.metrics for r in rows if r.module == module and r.phase is phase]
    return own_metrics(
        {
            "cpu_us": sum(m.cpu_us for m in mine),
            "device_us": sum(m.device_us for m in mine),
            "flops": sum(m.flops for m in mine),
        }
    )


def _profile(rows: list[OpStats], call_lines: bool = True) -> Profile:
    """A validated profile of a root ``Net`` with children ``enc`` and ``head`` running ``rows``."""
    kids = []
    for path in ("enc", "head"):
        fwd, bwd = _own(rows, path, Phase.FORWARD), _own(rows, path, Phase.BACKWARD)
        kids.append(ModuleNode(path, "Linear", 1, 10, 10, None, None, fwd, bwd))
    root_fwd = _with_children(_own(rows, "", Phase.FORWARD), [k.forward for k in kids])
    root_bwd = _with_children(_own(rows, "", Phase.BACKWARD), [k.backward for k in kids])
    root = ModuleNode("", "Net", 1, 0, 20, None, None, root_fwd, root_bwd, tuple(kids))
    outside = tuple(
        UnattributedEntry(r.scope, r.phase or Phase.FORWARD, r.calls, r.metrics)
        for r in rows
        if r.module is None
    )
    parts = [root_fwd, root_bwd, *(e.metrics for e in outside)]
    totals = own_metrics({name: sum(getattr(m, name) for m in parts) for _, name in ADDITIVE_PAIRS})
    lines = CallLinesInfo(ops=len(rows), stacks=1) if call_lines else None
    profile = Profile(ProfileMeta(model="Net", call_lines=lines), root, tuple(rows), outside, totals)
    profile.validate()
    return profile


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """The user's model file; its name is hostile markup too (a path is shown as text)."""
    path = tmp_path / (HOSTILE + ".py")  # only Python files are embedded
    path.write_text("\n".join(MODEL_SOURCE) + "\n", encoding="utf-8")
    return path


def _rows(model_file: Path) -> list[OpStats]:
    """Line 4 runs a matmul (forward in enc, its backward too), line 5 a relu in head, a line of a
    file that is gone an add in head, and one op has no user line at all."""
    at = f"{model_file}({{}}): forward"
    return [
        _op("aten::mm", "enc", Phase.FORWARD, at.format(4), 100.0, flops=1000),
        _op("aten::mm", "enc", Phase.BACKWARD, at.format(4), 150.0, flops=2000),
        _op("aten::relu", "head", Phase.FORWARD, at.format(5), 50.0),
        _op("aten::add", "head", Phase.FORWARD, f"{MISSING}(42): gone", 20.0),
        _op("aten::empty", "", Phase.FORWARD, None, 10.0),
    ]


def _embedded(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert found is not None
    return orjson.loads(found.group(1))  # type: ignore[no-any-return]


def test_the_page_embeds_each_lines_figures_and_the_whole_short_file(model_file: Path) -> None:
    page = html_report(_profile(_rows(model_file)))
    source = _embedded(page)["source"]
    assert source["call_lines"] is True and source["time_kind"] == "device"
    assert source["total"] == pytest.approx(2 * 330.0)
    model = source["files"][0]
    assert model["path"] == str(model_file) and model["note"] == ""
    assert model["lines"] == [4, 5]
    assert model["fwd"] == [200.0, 100.0] and model["bwd"] == [300.0, 0.0]  # device time
    assert model["flops"] == [3000, 0]
    assert model["module"] == ["enc", "head"] and model["function"] == ["forward", "forward"]
    assert model["windows"] == [[1, MODEL_SOURCE]]  # a short file is shown whole
    assert source["no_line"] == {
        "label": NO_LINE,
        "module": "(root)",
        "calls": 1,
        "fwd": 20.0,
        "bwd": 0.0,
        "flops": 0,
    }
    assert source["more"] is None
    assert 'id="source"' in page and "Exact call lines" in page and "device time" in page
    # the source text is only inside the JSON, with its "<" escaped
    assert SCRIPT not in page and "<b>bold" not in page
    assert page.count("</script>") == page.count("<script")


def test_a_file_that_cannot_be_read_keeps_its_line_numbers_and_figures(model_file: Path) -> None:
    source = report_data(_profile(_rows(model_file)))["source"]
    gone = next(f for f in source["files"] if f["path"] == MISSING)
    assert gone["note"] == NOT_FOUND and gone["windows"] == []
    assert gone["lines"] == [42] and gone["fwd"] == [40.0] and gone["module"] == ["head"]


def test_cpu_time_without_device_time_and_def_lines_without_call_lines(model_file: Path) -> None:
    rows = [
        OpStats(
            r.name, r.phase, r.module, None, r.calls, own_metrics({"cpu_us": r.metrics.cpu_us}), stack=r.stack
        )
        for r in _rows(model_file)
    ]
    page = html_report(_profile(rows, call_lines=False))
    source = _embedded(page)["source"]
    assert source["time_kind"] == "cpu" and source["call_lines"] is False
    assert source["files"][0]["fwd"] == [100.0, 50.0] and source["files"][0]["bwd"] == [150.0, 0.0]
    assert "Function definition lines (with_stack only)" in page and "exclusive CPU time" in page


def test_long_files_show_windows_around_the_lines_with_figures(tmp_path: Path) -> None:
    long_file = tmp_path / "long.py"
    long_file.write_text("".join(f"x{k} = {k}\n" for k in range(1, 401)), encoding="utf-8")
    rows = [
        _op("aten::mm", "enc", Phase.FORWARD, f"{long_file}(30): f", 5.0),
        _op("aten::mm", "enc", Phase.FORWARD, f"{long_file}(300): g", 5.0),
        _op("aten::mm", "enc", Phase.FORWARD, f"{long_file}(310): g", 5.0),
        _op("aten::mm", "head", Phase.FORWARD, f"{long_file}(999): h", 5.0),  # past the end: changed since
    ]
    source = report_data(_profile(rows))["source"]
    shown = source["files"][0]["windows"]
    assert [(start, len(text)) for start, text in shown] == [(22, 17), (292, 27)]
    assert shown[0][1][0] == "x22 = 22" and shown[1][1][-1] == "x318 = 318"
    assert source["files"][0]["lines"] == [30, 300, 310, 999]  # line 999 keeps its figures
    assert windows([5, 7], 100) == [(1, 100)]  # short files whole
    assert windows([20, 40], 1000, context=8) == [(12, 28), (32, 48)]
    assert windows([20, 39], 1000, context=8) == [(12, 47)]  # a gap of up to 3 lines is joined


def test_large_files_are_not_read(model_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source_view, "MAX_FILE_BYTES", 16)
    model = report_data(_profile(_rows(model_file)))["source"]["files"][0]
    assert model["note"] == TOO_LARGE and model["windows"] == [] and model["lines"] == [4, 5]


def test_only_the_heaviest_files_are_shown(tmp_path: Path) -> None:
    rows = [
        _op("aten::mm", "enc", Phase.FORWARD, f"{tmp_path}/m{k}.py({k + 1}): f", float(k + 1))
        for k in range(source_view.MAX_FILES + 2)
    ]
    source = report_data(_profile(rows))["source"]
    paths = [f["path"] for f in source["files"]]
    assert paths[0] == f"{tmp_path}/m{source_view.MAX_FILES + 1}.py" and len(paths) == source_view.MAX_FILES
    assert source["more"] == {"files": 2, "fwd": 2 * 3.0, "bwd": 0.0, "flops": 0}


def test_no_section_without_stacks(model_file: Path) -> None:
    rows = [OpStats(r.name, r.phase, r.module, None, r.calls, r.metrics) for r in _rows(model_file)]
    page = html_report(_profile(rows))
    assert _embedded(page)["source"] is None and 'id="source"' not in page


def test_work_outside_every_module_names_its_entry(model_file: Path) -> None:
    rows = [
        *_rows(model_file),
        _op("aten::sum", None, Phase.FORWARD, f"{model_file}(6): forward", 7.0, scope="loss"),
    ]
    model = report_data(_profile(rows))["source"]["files"][0]
    assert model["lines"] == [4, 5, 6] and model["module"] == ["enc", "head", "[loss]"]


def test_notebook_lines_table_escapes_every_cell(model_file: Path) -> None:
    table = lines_html(line_table(_profile(_rows(model_file))))
    assert "exact call lines" in table
    assert HOSTILE not in table and "&lt;img src=x onerror=alert(1)&gt;" in table
    assert "200.0µs" in table and "300.0µs" in table and NO_LINE in table and "(root)" in table


# --- in a real browser -------------------------------------------------------------------------


def test_hostile_source_is_shown_as_text_in_chromium(
    browser: Any,  # noqa: F811  (the shared fixture imported above)
    model_file: Path,
    tmp_path: Path,
) -> None:
    report = tmp_path / "report.html"
    report.write_text(html_report(_profile(_rows(model_file))), encoding="utf-8")
    page = _open(browser, report, "#sourcelist table.listing tbody tr")
    try:
        listing = page.evaluate(
            """[...document.querySelector('#sourcelist table.listing').querySelectorAll('tbody tr')]
                .map(tr => [tr.dataset.line, [...tr.children].map(td => td.textContent),
                            tr.style.backgroundColor])"""
        )
        files = page.evaluate(
            "[...document.querySelectorAll('#sourcefiles tbody tr')].map(tr => tr.children[0].textContent)"
        )
        summary = page.evaluate("document.querySelector('#sourcelist summary .src').textContent")
        injected = page.evaluate("document.querySelectorAll('img, #sourcelist b, #sourcelist script').length")
        title = page.evaluate("document.title")
        gone = page.evaluate(
            """[...document.querySelectorAll('#sourcelist details')].filter(d =>
                d.querySelector('summary .src').textContent.endsWith('gone.py'))
                .map(d => [d.querySelector('.note').textContent.trim(),
                           [...d.querySelectorAll('tbody tr')].map(tr => tr.dataset.line)])"""
        )
    finally:
        page.close()
    assert page.problems == []  # no console error, no page error, no dialog
    assert injected == 0 and title == "layerscope report"  # nothing injected ran or was made
    # every line is there, its text exactly the file's (markup shown as text)
    assert [row[0] for row in listing] == ["1", "2", "3", "4", "5", "6"]
    assert [row[1][-1] for row in listing] == MODEL_SOURCE
    assert summary == str(model_file) and files[0] == str(model_file)
    line4, line5, line6 = listing[3], listing[4], listing[5]
    # columns: line, forward, backward, FLOPs, share, module, source
    assert line4[1][1:6] == ["200.0µs", "300.0µs", "3.00K", "75.8%", "enc"]
    assert line5[1][1:6] == ["100.0µs", "", "", "15.2%", "head"]
    # the heaviest line is shaded darkest; a line without figures not at all
    assert line4[2] and line5[2] and line6[2] == ""
    assert float(line4[2].split(",")[-1].rstrip(")")) > float(line5[2].split(",")[-1].rstrip(")"))
    assert gone == [[NOT_FOUND, [None, "42"]]]  # a gap row for lines 1-41, then line 42 alone
    assert any(f.startswith(NO_LINE) for f in files)


def test_only_python_files_are_embedded(tmp_path: Path) -> None:
    """A profile from elsewhere naming any other file of this machine gets no text of it."""
    secret = tmp_path / "secret.txt"
    secret.write_text("password = hunter2\n", encoding="utf-8")
    rows = [_op("aten::mm", "enc", Phase.FORWARD, f"{secret}(1): forward", 10.0)]
    source = report_data(_profile(rows))["source"]
    assert source["files"][0]["note"] == NOT_FOUND and source["files"][0]["windows"] == []
    assert "hunter2" not in html_report(_profile(rows))
