"""The HTML report: its data and markup (always), and its behaviour in a real headless Chromium
(when Chromium and Playwright are installed; ``make test`` installs both where it can)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.cli import main
from layerscope.render.html import html_report, report_data

HOSTILE = "<img src=x onerror=alert(1)>"
ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


class HostileNames(nn.Module):
    """A model whose child is named like an HTML injection: the report must show it as text."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.add_module(HOSTILE, nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head: nn.Module = getattr(self, HOSTILE)
        return head(self.body(x))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def profile() -> ls.Profile:
    model = HostileNames()
    with ls.profile(model, memory=True, schedule=ls.schedule(active=2, repeat=1)) as prof:
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
    result = prof.profile
    result.validate()
    return result


def _embedded(page: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert match is not None
    return orjson.loads(match.group(1))  # type: ignore[no-any-return]


def test_report_is_self_contained_and_carries_the_profile(profile: ls.Profile) -> None:
    page = html_report(profile)
    # no network: nothing is loaded from anywhere
    assert not re.search(r'\b(src|href)="(https?:)?//', page)
    data = _embedded(page)
    assert data == orjson.loads(orjson.dumps(report_data(profile)))
    strings = data["strings"]
    assert HOSTILE in strings
    # the hostile name never appears as markup: only inside JSON (escaped) and SVG text (escaped)
    assert HOSTILE not in page
    assert "\\u003cimg" in page
    assert page.count("</script>") == page.count("<script")


def test_report_sections_hold_steps_memory_and_all_modules(profile: ls.Profile) -> None:
    data = report_data(profile)
    modules = data["modules"]
    assert len(modules["path"]) == len(list(profile.modules()))
    assert len(data["steps"]) == 2
    assert data["memory"]["t_us"], "a memory profile must give the page a memory timeline"
    assert sum(data["ops"]["calls"]) == sum(row.calls for row in profile.op_rows)


def test_report_command_writes_html_atomically(profile: ls.Profile, tmp_path: Path) -> None:
    saved = profile.save(tmp_path / "run.json")
    out = tmp_path / "report.html"
    assert main(["report", str(saved), "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    # written through a temp file and renamed: nothing else is left beside it
    assert {p.name for p in tmp_path.iterdir()} == {"run.json", "report.html"}


# --- in a real browser -------------------------------------------------------------------------


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module (playwright's sync API allows one session at a time)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    executable = _chromium()
    if executable is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def _open(browser: Any, path: Path, ready: str, width: int = 1400) -> Any:
    """A page showing ``path``, with ``page.problems`` collecting console errors, page errors, dialogs."""
    page = browser.new_page(viewport={"width": width, "height": 1000})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.goto(path.as_uri())
    page.wait_for_selector(ready)
    page.problems = problems
    return page


@pytest.fixture(scope="module")
def browser_page(
    browser: Any, profile: ls.Profile, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    report = tmp_path_factory.mktemp("html") / "report.html"
    report.write_text(html_report(profile), encoding="utf-8")
    page = _open(browser, report, "#tree tbody tr")
    yield page
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    page.close()


def _column(page: Any, table: str, header: str) -> list[str]:
    return page.evaluate(  # type: ignore[no-any-return]
        """([table, header]) => {
            const heads = [...document.querySelectorAll(`#${table} thead th`)].map(h => h.textContent);
            const k = heads.indexOf(header);
            return [...document.querySelectorAll(`#${table} tbody tr`)].map(r => r.children[k].textContent);
        }""",
        [table, header],
    )


def test_page_loads_without_errors_and_shows_names_as_text(browser_page: Any) -> None:
    assert browser_page.problems == []
    names = browser_page.evaluate(
        "[...document.querySelectorAll('#tree tbody td:first-child')].map(td => td.textContent)"
    )
    assert any(HOSTILE in name for name in names)
    assert browser_page.evaluate("document.querySelectorAll('img').length") == 0
    steps = browser_page.evaluate("document.querySelectorAll('#steps tbody tr').length")
    assert steps == 2
    # memory over time, stacked by category (one polygon per category that held any memory)
    assert browser_page.evaluate("document.querySelectorAll('#memchart polygon').length") >= 2


def test_tree_rows_expand_and_collapse(browser_page: Any) -> None:
    rows = "document.querySelectorAll('#tree tbody tr').length"
    opened = browser_page.evaluate(rows)
    assert opened > 1
    browser_page.click("#tree tbody tr:first-child .tog")
    assert browser_page.evaluate(rows) == 1
    browser_page.click("#tree tbody tr:first-child .tog")
    assert browser_page.evaluate(rows) == opened


def test_sorting_the_op_table_reorders_it(browser_page: Any) -> None:
    browser_page.click("#ops thead th:text-is('Calls')")
    first = [int(v) for v in _column(browser_page, "ops", "Calls")]
    assert first == sorted(first, reverse=True)
    browser_page.click("#ops thead th:text-is('Calls')")
    second = [int(v) for v in _column(browser_page, "ops", "Calls")]
    assert second == sorted(second) and second != first


def test_clicking_a_flame_frame_zooms_into_it(browser_page: Any) -> None:
    flame = "div.flame[data-metric='cpu_us'] svg"
    assert browser_page.evaluate(f'document.querySelectorAll("{flame} g.f").length') > 3
    hidden = f"[...document.querySelectorAll(\"{flame} g.f\")].filter(g => g.style.display === 'none').length"
    assert browser_page.evaluate(hidden) == 0
    target = browser_page.evaluate_handle(
        f"""[...document.querySelectorAll("{flame} g.f")]
            .filter(g => +g.dataset.d === 2 && +g.dataset.w < 0.9 && +g.dataset.w > 0.05)[0]"""
    )
    target.as_element().dispatch_event("click")
    assert browser_page.evaluate(hidden) > 0
    width = float(target.as_element().evaluate("g => g.querySelector('rect').getAttribute('width')"))
    full = float(browser_page.evaluate(f"document.querySelector(\"{flame}\").getAttribute('width')"))
    assert width > 0.95 * full
    browser_page.evaluate(f"document.querySelector(\"{flame} .reset\").dispatchEvent(new Event('click'))")
    assert browser_page.evaluate(hidden) == 0


def test_ranks_page_renders_in_the_browser(browser: Any, tmp_path: Path) -> None:
    from layerscope.analysis.ranks import merge_profiles as merge
    from layerscope.render.ranks_html import ranks_html
    from tests.test_ranks import one

    paths = ["enc", "mid", HOSTILE]
    fast = {"enc": 100, "mid": 80, HOSTILE: 50}
    profiles = [one(paths, {**fast, "mid": 80 + 200 * (rank == 2)}) for rank in range(4)]
    page_file = tmp_path / "ranks.html"
    page_file.write_text(ranks_html(merge(profiles)), encoding="utf-8")
    page = _open(browser, page_file, "#heatmap tbody tr", width=1200)
    straggler = page.inner_text("#heatmap td.straggler")
    names = page.eval_on_selector_all("#heatmap tbody td:first-child", "tds => tds.map(t => t.textContent)")
    bars = page.eval_on_selector_all("#ranks .seg", "s => s.map(x => x.getBoundingClientRect().width)")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "ranks.png"), full_page=True)
    page.close()
    assert page.problems == []
    assert straggler.strip() and names[0] == "mid" and HOSTILE in names
    assert len(bars) == 3 * 4 and max(bars) > 0


NOTEBOOK_CELL = """
import torch
from torch import nn
import layerscope as ls

torch.manual_seed({seed})
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, {width}))
with ls.profile(model) as prof:
    model(torch.randn(4, 8)).sum().backward()
prof.profile
"""


def test_profiles_in_an_executed_notebook_render_inline(browser: Any, tmp_path: Path) -> None:
    """A real notebook (nbclient + ipykernel) whose cells end with a Profile: each cell's text/html
    output is the interactive report; two of them in one page, under the notebook's own hostile CSS,
    both render and work, with no console error."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(NOTEBOOK_CELL.format(seed=0, width=4)),
        nbformat.v4.new_code_cell(NOTEBOOK_CELL.format(seed=1, width=6)),
    ]
    nbclient.NotebookClient(notebook, timeout=180, kernel_name="python3").execute()
    outputs = [
        next(o for o in cell.outputs if o.get("output_type") == "execute_result")["data"]["text/html"]
        for cell in notebook.cells
    ]
    assert all(o.startswith("<iframe srcdoc=") and "<script" not in o for o in outputs)  # all escaped
    page_file = tmp_path / "notebook.html"
    hostile_css = "<style>table, svg { display: none !important } #tree { color: red }</style>"
    page_file.write_text(f"<html><head>{hostile_css}</head><body>{''.join(outputs)}</body></html>")
    page = _open(browser, page_file, "iframe")
    frames = [f for f in page.frames if f is not page.main_frame]
    assert len(frames) == 2
    for frame in frames:
        frame.wait_for_selector("#tree tbody tr")
        rows = frame.evaluate("document.querySelectorAll('#tree tbody tr').length")
        visible = frame.evaluate("document.querySelector('#tree').getBoundingClientRect().height")
        assert rows >= 4 and visible > 0  # the notebook's CSS does not reach into the report
    widths = [
        f.evaluate("[...document.querySelectorAll('#tree tbody td')].map(t => t.textContent).join(' ')")
        for f in frames
    ]
    assert widths[0] != widths[1]  # two different profiles, each drawn by its own script
    assert page.problems == []
    page.close()


def test_tree_shows_achieved_flops(browser_page: Any) -> None:
    rates = _column(browser_page, "tree", "FLOP/s")
    assert any(r.endswith("/s") for r in rates) and "" in rates  # Linear rows have it, ReLU rows not


def test_source_locations_in_the_report(browser: Any, tmp_path: Path) -> None:
    """with_stack profiles: ops group by source location, the flame chart switches to source frames,
    tree rows tell where each module's forward is defined."""
    from tests.fixtures.stack_models import TwoCallSites

    model = TwoCallSites()
    x = torch.randn(8, 8)
    with ls.profile(model, with_stack=True) as prof:
        model(x)
    report = tmp_path / "stacks.html"
    report.write_text(html_report(prof.profile), encoding="utf-8")
    page = _open(browser, report, "#tree tbody tr")
    try:
        assert page.problems == []
        root_title = page.evaluate("document.querySelector('#tree tbody tr').title")
        # input and output shapes of the first call, then where forward is defined (the path relative
        # to the sys.path entry the fixture was imported from)
        assert root_title.split("\n")[:2] == ["input 8x8", "output 8x8"]
        assert root_title.split("\n")[2].startswith("TwoCallSites.forward defined at ")
        assert root_title.endswith("fixtures/stack_models.py:18")
        output_cells = page.evaluate(
            "[...document.querySelectorAll('#tree tbody td.shape')].map(c => c.textContent)"
        )
        assert output_cells[0] == "8x8"
        page.select_option("#opgroup", "source")
        sources = [
            s
            for s, n in zip(_column(page, "ops", "Source location"), _column(page, "ops", "Op"), strict=True)
            if n == "aten::mm"
        ]
        innermost = sorted(s.split("\n")[0] for s in sources)
        assert innermost[0].endswith("fixtures/stack_models.py(21): left")
        assert innermost[1].endswith("fixtures/stack_models.py(24): right")
        visible = "[...document.querySelectorAll('div.flame')].filter(f => f.style.display !== 'none')"
        assert page.evaluate(f"{visible}.map(f => f.dataset.frames)") == ["modules"]
        page.select_option("#flameframes", "source")
        assert page.evaluate(f"{visible}.map(f => f.dataset.frames)") == ["source"]
        labels = page.evaluate(f"{visible}[0].querySelector('svg').textContent")
        assert "stack_models.py(21): left" in labels
    finally:
        page.close()


def test_notebook_op_table_values_stay_on_one_line_when_narrow(
    browser: Any, profile: ls.Profile, tmp_path: Path
) -> None:
    from layerscope.render.html_tables import ops_html

    page_file = tmp_path / "ops.html"
    page_file.write_text(f"<!DOCTYPE html><meta charset=utf-8><body>{ops_html(profile.ops())}</body>")
    page = _open(browser, page_file, "table tbody tr", width=360)  # a narrow notebook output area
    lines = page.evaluate(
        """[...document.querySelectorAll('tbody td')].filter(td => td.style.textAlign === 'right')
            .map(td => { const r = document.createRange(); r.selectNodeContents(td);
                         return new Set([...r.getClientRects()].map(q => Math.round(q.top))).size; })"""
    )
    page.close()
    assert lines and set(lines) <= {0, 1}  # each value on one line (0: an empty cell)


def test_device_section_of_a_gpu_trace_in_the_browser(browser: Any, tmp_path: Path) -> None:
    """A trace recorded on an H100: the report's Device section shows the stream and each step's
    verdict, as text (a hostile verdict planted in the data stays text)."""
    profile = ls.load(Path(__file__).parent / "fixtures" / "gpu" / "host_bound.json.gz")
    device = profile.meta.device
    assert device is not None
    steps = ({**device.steps[0], "verdict": HOSTILE}, *device.steps[1:])
    profile = replace(profile, meta=replace(profile.meta, device=replace(device, steps=steps)))
    page_file = tmp_path / "gpu.html"
    page_file.write_text(html_report(profile), encoding="utf-8")
    page = _open(browser, page_file, "#device table")
    tables = page.eval_on_selector_all(
        "#device table", "ts => ts.map(t => [...t.querySelectorAll('tbody tr')].map(r => r.innerText))"
    )
    page.close()
    assert page.problems == []
    streams, steps = tables
    assert len(streams) == 1 and streams[0].startswith("0/7")
    assert (
        len(steps) == 3 and HOSTILE in steps[0] and all(s.rstrip().endswith("CPU-bound") for s in steps[1:])
    )


def test_the_memory_peak_panel_draws_a_bar_per_live_row(browser_page: Any, profile: ls.Profile) -> None:
    rows = len(profile.memory_at_peak().rows)
    drawn = browser_page.evaluate(
        """[...document.querySelectorAll('#memory .peakrow')].map(
            row => row.children[1].firstElementChild.getBoundingClientRect().width)"""
    )
    assert len(drawn) == min(rows, 20) > 0
    assert all(width > 0 for width in drawn)
    assert drawn[0] >= max(drawn)  # rows come largest first, so the first bar is the longest
