"""The report people share (issue 41): a first screen that answers at 1366x768, memory over time
absolute and stacked by category with the same figures as ``memory_at_peak()``, steps as a chart with
the slow ones marked, the options in words, and no network request."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.analysis.advice import advise
from layerscope.analysis.steps import step_rows
from layerscope.render.html import html_report
from layerscope.units import fmt_bytes
from tests.test_html_report import HOSTILE, browser  # noqa: F401  (browser: the shared Chromium)

STEPS = 6
SLOW_STEP = 4


class Trainer(nn.Module):
    """A small MLP with a module named like an HTML injection; one step runs its middle slowly."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(64, 256)
        self.add_module(HOSTILE, nn.Linear(256, 256))
        self.out = nn.Linear(256, 10)
        self.slow = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        middle: nn.Module = getattr(self, HOSTILE)
        h = torch.relu(self.inp(x))
        if self.slow:
            time.sleep(0.4)  # the slow step: its wall time, not its work; 1.5x the median even on a
            # loaded machine, where the other steps ran 14-188 ms
        return self.out(torch.relu(middle(h)))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def trained() -> ls.Profile:
    torch.manual_seed(0)
    model = Trainer()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 64)
    for _ in range(2):  # the optimizer state exists before the block
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    with ls.profile(model, memory=True, schedule=ls.schedule(active=STEPS, repeat=1)) as prof:
        for step in range(STEPS):
            model.slow = step == SLOW_STEP
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    profile = prof.profile
    profile.validate()
    return profile


@pytest.fixture(scope="module")
def page(browser: Any, trained: ls.Profile, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:  # noqa: F811
    path = tmp_path_factory.mktemp("first") / "report.html"
    path.write_text(html_report(trained), encoding="utf-8")
    context = browser.new_context(viewport={"width": 1366, "height": 768})
    requests: list[str] = []

    def route(r: Any) -> None:
        if not r.request.url.startswith("file://"):
            requests.append(r.request.url)
            r.abort()
        else:
            r.continue_()

    context.route("**/*", route)  # the network is blocked: a request out would fail the test below
    opened = context.new_page()
    problems: list[str] = []
    opened.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    opened.on("pageerror", lambda e: problems.append(str(e)))
    opened.goto(path.as_uri())
    opened.wait_for_selector("#tree tbody tr")
    opened.problems, opened.requests = problems, requests
    yield opened
    context.close()


def test_memory_over_time_at_its_peak_is_memory_at_peak(trained: ls.Profile, tmp_path: Path) -> None:
    at_peak = trained.memory_at_peak()
    report = trained.meta.memory
    assert report is not None
    main = report.main_class()
    assert main is not None and main.over_time is not None
    over = main.over_time
    totals = over.totals()
    k = totals.index(max(totals))
    assert totals[k] == at_peak.absolute_peak_bytes
    stacked = {c: series[k] for c, series in zip(over.categories, over.bytes_by_category, strict=True)}
    assert {c: b for c, b in stacked.items() if b} == at_peak.by_category()
    assert stacked["optimizer_state"] > 0 and stacked["parameter"] > 0
    # before any work the stack is what was live before the block
    assert totals[0] >= at_peak.baseline_bytes > 0
    assert len(over.t_us) <= 800 and over.t_us == tuple(sorted(over.t_us))
    assert ls.load(trained.save(tmp_path / "saved.json")).meta.memory == report


def test_the_first_screen_answers_without_scrolling(page: Any, trained: ls.Profile) -> None:
    assert page.problems == [] and page.requests == []
    box = page.eval_on_selector("#summary", "s => s.getBoundingClientRect().bottom")
    assert box <= 768, f"the summary ends at {box}px, below a 1366x768 screen"
    text = page.inner_text("#summary")
    at_peak = trained.memory_at_peak()
    assert fmt_bytes(at_peak.absolute_peak_bytes) in text and "absolute" in text
    slow = sum(r.outlier for r in step_rows(trained.steps))
    assert "Step time (median)" in text and f"over {STEPS} steps, {slow} slow" in text
    for part in ("forward", "backward", "optimizer"):
        assert page.locator(f"#summary .legend .key:has-text('{part} ')").count() == 1, part
    findings = [a.rule for a in advise(trained, None)][:3]
    shown = page.eval_on_selector_all("#findings li b", "bs => bs.map(b => b.textContent)")
    assert shown == findings


def test_the_memory_chart_shows_memory_at_peak(page: Any, trained: ls.Profile) -> None:
    at_peak = trained.memory_at_peak()
    assert int(page.get_attribute("#mempeak", "data-bytes")) == at_peak.absolute_peak_bytes
    drawn = page.eval_on_selector_all("#memchart polygon", "ps => ps.map(p => p.dataset.category)")
    assert set(at_peak.by_category()) <= set(drawn)
    # the live-at-peak table sits beside the chart, on the same row
    chart, table = (
        page.eval_on_selector(s, "e => e.getBoundingClientRect().top") for s in ("#memchart", "#memorypeak")
    )
    assert abs(chart - table) < 80
    tips = page.eval_on_selector_all("#memchart rect.hover title", "ts => ts.map(t => t.textContent)")
    assert any(HOSTILE in tip for tip in tips)  # names stay text: the module runs in them
    assert page.evaluate("document.querySelectorAll('img').length") == 0


def test_the_slow_step_is_marked_in_the_step_chart(page: Any, trained: ls.Profile) -> None:
    rows = step_rows(trained.steps)
    slow = [r.step for r in rows if r.outlier]
    assert SLOW_STEP in slow  # (the first step may be slow too: caches warm up)
    marked = page.eval_on_selector_all("#stepchart g.outlier", "gs => gs.map(g => +g.dataset.step)")
    assert marked == slow
    assert page.locator("#stepchart g[data-step]").count() == len(rows) == STEPS


def test_the_header_says_the_options_in_words(page: Any) -> None:
    header = page.inner_text("#sub")
    assert "{" not in header and "recorded CPU; memory, shapes, FLOPs" in header


def test_the_keyboard_reaches_and_works_the_tree(page: Any) -> None:
    """Tab order follows the page: the phase buttons and the filter before the tree's headers and
    toggles; Enter on a toggle collapses its subtree and keeps the focus on it."""
    page.focus("#treefilter")
    reached = []
    for _ in range(40):
        page.keyboard.press("Tab")
        reached.append(page.evaluate("document.activeElement.className || document.activeElement.tagName"))
        if reached[-1] == "tog":
            break
    assert reached[-1] == "tog" and "TH" in reached  # the sortable headers come first
    rows = "document.querySelectorAll('#tree tbody tr').length"
    before = page.evaluate(rows)
    page.keyboard.press("Enter")
    assert page.evaluate(rows) == 1 < before
    assert page.evaluate("document.activeElement.getAttribute('aria-expanded')") == "false"
    page.keyboard.press(" ")
    assert page.evaluate(rows) == before


def test_choosing_a_step_shows_its_modules(page: Any, trained: ls.Profile) -> None:
    """Clicking (or Enter on) a step's bar lists that step's heaviest modules with their times."""
    step = trained.steps[SLOW_STEP]
    page.click(f"#stepchart g[data-step='{step.step}']")
    assert page.inner_text("#steptree h3") == f"Step {step.step}: its heaviest modules"
    rows = page.eval_on_selector_all("#steptree tbody tr", "rs => rs.map(r => r.children[0].textContent)")
    heaviest = max((p for p in step.modules if p), key=lambda p: sum(step.modules[p]))
    assert heaviest in rows and HOSTILE in rows and len(rows) == len([p for p in step.modules if p])
    page.focus(f"#stepchart g[data-step='{trained.steps[0].step}']")
    page.keyboard.press("Enter")
    assert page.inner_text("#steptree h3").startswith(f"Step {trained.steps[0].step}:")


def test_validate_catches_an_impossible_memory_chart(trained: ls.Profile) -> None:
    """Memory over time must peak at the report's absolute peak and, with addresses, never hold a
    category below zero: validate() says so when either breaks."""
    from dataclasses import replace

    report = trained.meta.memory
    assert report is not None
    main_class = report.main_class()
    assert main_class is not None and main_class.over_time is not None and main_class.addressed
    over = main_class.over_time

    def with_series(series: tuple[tuple[int, ...], ...]) -> ls.Profile:
        broken = replace(main_class, over_time=replace(over, bytes_by_category=series))
        classes = tuple(broken if c is main_class else c for c in report.classes)
        return replace(trained, meta=replace(trained.meta, memory=replace(report, classes=classes)))

    higher = tuple(tuple(b + 1 for b in s) if k == 0 else s for k, s in enumerate(over.bytes_by_category))
    with pytest.raises(ls.ValidationError, match="memory over time peaks at"):
        with_series(higher).validate()
    shifted = [list(s) for s in over.bytes_by_category]
    shifted[0][0] -= 10**12  # one category far below zero at the start; the peak stays the peak
    shifted[1][0] += 10**12
    with pytest.raises(ls.ValidationError, match="category below zero"):
        with_series(tuple(tuple(s) for s in shifted)).validate()
