"""``layerscope diff A B -o diff.html``: the gate's verdict on top, both module trees side by side
with their changes (coloured beyond noise), the ops that changed most; names stay text."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

import layerscope as ls
from layerscope.cli import main
from layerscope.render.diff import row_cells, value_formatter
from tests.test_diff import profiles
from tests.test_html_report import HOSTILE, HostileNames, _open, browser  # noqa: F401  (the shared Chromium)


def _saved(tmp_path: Path) -> tuple[Path, Path]:
    a, b = profiles()  # B: fc's addmm 20 µs slower, a new aten::gelu
    return a.save(tmp_path / "a.json"), b.save(tmp_path / "b.json")


def _cells(page: str, path: str) -> list[str]:
    row = re.search(rf'<tr class="(\w*)" data-path="{re.escape(path)}">(.*?)</tr>', page, re.S)
    assert row is not None, path
    return [row.group(1), *re.findall(r"<td[^>]*>(?:<span[^>]*>)?(.*?)(?:</span>)?</td>", row.group(2))]


def test_the_page_holds_both_trees_and_the_gate(tmp_path: Path) -> None:
    a_file, b_file = _saved(tmp_path)
    page_file = tmp_path / "diff.html"
    assert main(["diff", str(a_file), str(b_file), "-o", str(page_file), "--fail-over", "1000%"]) == 0
    page = page_file.read_text(encoding="utf-8")
    assert 'id="verdict" data-gate="pass"' in page and "PASS" in page
    d = ls.diff(ls.load(a_file), ls.load(b_file))
    fmt = value_formatter(d.metric)
    for row in d.tree:
        path = row.key
        shown = _cells(page, path)
        _, a, b, delta, percent, _ = row_cells(row, fmt)
        assert shown[2:6] == [a, b, delta, percent], path
    assert _cells(page, "fc")[0] == "slower"  # 20 µs on 40: beyond noise
    assert "aten::gelu" in page and ">new<" in page
    # the gate failed: exit code 1, the page written all the same and saying so; --html beside -o
    failed = tmp_path / "gate.md"
    assert main(["diff", str(a_file), str(b_file), "-o", str(failed), "--html", "--fail-over", "5%"]) == 1
    assert "| `fc` | 50.0µs | 70.0µs | +20.0µs |" in failed.read_text(encoding="utf-8")
    assert 'data-gate="fail"' in (tmp_path / "gate.html").read_text(encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.json",
        "b.json",
        "diff.html",
        "gate.html",
        "gate.md",
    ]


def test_a_bad_output_fails_before_reading(tmp_path: Path, capsys: Any) -> None:
    a_file, b_file = _saved(tmp_path)
    assert main(["diff", str(a_file), str(b_file), "-o", str(tmp_path / "d.csv")]) == 2
    assert "a diff is written as .html, .md, .json" in capsys.readouterr().err
    assert not (tmp_path / "d.csv").exists()


def test_new_modules_and_hostile_names_stay_text_in_chromium(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    torch.manual_seed(0)
    small = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    with ls.profile(small) as prof_a:
        small(torch.randn(4, 8)).sum().backward()
    hostile = HostileNames()
    with ls.profile(hostile) as prof_b:
        hostile(torch.randn(4, 8)).sum().backward()
    a_file, b_file = prof_a.profile.save(tmp_path / "a.json"), prof_b.profile.save(tmp_path / "b.json")
    out = tmp_path / "diff.html"
    assert main(["diff", str(a_file), str(b_file), "-o", str(out), "--fail-over", "1000"]) == 0
    page = _open(browser, out, "#difftree tbody tr")
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if not r.url.startswith("file:") else None)
    page.reload()
    page.wait_for_selector("#difftree tbody tr")
    names = page.eval_on_selector_all(
        "#difftree tbody td:first-child", "tds => tds.map(td => td.textContent)"
    )
    assert HOSTILE in names and "body" in names  # only in B: shown, and as text
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.problems == [] and requests == []
    assert page.inner_text("#verdict").startswith("PASS — B against A, limit +1000%: cpu_us:")
    page.close()


def test_modules_only_in_a_sit_under_their_parent() -> None:
    """The page's tree is one tree: a module B lost is drawn among its parent's children, not last."""

    def profiled(model: nn.Module) -> ls.Profile:
        with ls.profile(model) as prof:
            model(torch.randn(2, 4))
        return prof.profile

    a = profiled(nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), nn.Linear(4, 2)))
    b = profiled(nn.Sequential(nn.Sequential(nn.Linear(4, 4)), nn.Linear(4, 2)))
    d = ls.diff(a, b)
    assert [r.key for r in d.tree] == ["", "0", "0.0", "0.1", "1"]
    assert {r.key: r.status for r in d.tree}["0.1"] == "vanished"
    assert all(r.delta != 0 or r.status != "changed" for r in d.modules)  # modules: changes only
