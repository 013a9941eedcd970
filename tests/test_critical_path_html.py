"""The critical path in the HTML pages: the report of a profile read from a trace, and the merge
page of a job's rank traces (the path through the ranks), each in a real browser."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import layerscope as ls
from layerscope.analysis.report import build_report
from layerscope.render.html import html_report
from layerscope.render.ranks_html import ranks_html
from tests.test_critical_ranks import write_job
from tests.test_html_report import HOSTILE, _open, browser  # noqa: F401  (browser: the shared Chromium)


def span(
    name: str, cat: str, ts: float, dur: float, tid: int = 1, pid: int = 1, **args: Any
) -> dict[str, Any]:
    """One complete trace event (µs)."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def module_trace(path: Path) -> Path:
    """Two modules' ranges: an op launching a 250 µs kernel in the first, the CPU waiting for it,
    then an op with a hostile name in the second (30 µs)."""
    events = [
        span("ls:encoder:Linear", "user_annotation", 0, 110),
        span("A", "cpu_op", 0, 100),
        span("cudaLaunchKernel", "cuda_runtime", 10, 10, correlation=1),
        span("K", "kernel", 50, 250, tid=7, pid=0, correlation=1, stream=7),
        span("cudaDeviceSynchronize", "cuda_runtime", 150, 160, correlation=2),
        span("Context Sync", "cuda_sync", 300, 10, tid=-1, pid=0, correlation=2, stream=-1),
        span("ls:head:ReLU", "user_annotation", 315, 40),
        span(HOSTILE, "cpu_op", 320, 30),
    ]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def rows(page: Any, table: int) -> list[str]:
    """The body rows' text of the section's ``table``-th table."""
    found: list[str] = page.eval_on_selector_all(
        "#critical-path table",
        f"ts => [...ts[{table}].querySelectorAll('tbody tr')].map(r => r.innerText.replace(/\\t/g, ' '))",
    )
    return found


def test_report_has_the_critical_path_of_its_trace(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """A profile read from a trace: the section gives the length, the time by bound type, the ops
    and kernels on the path and the modules they ran in (names as text, not markup)."""
    profile = ls.load(module_trace(tmp_path / "trace.json.gz"))
    expected = profile.critical_path()
    assert expected.length_us == 350 and expected.modules is not None
    page_file = tmp_path / "report.html"
    page_file.write_text(html_report(profile), encoding="utf-8")
    page = _open(browser, page_file, "#critical-path table")
    intro = page.inner_text("#critical-path p")
    by_type, ops, modules = rows(page, 0), rows(page, 1), rows(page, 2)
    hostile = page.evaluate("document.querySelectorAll('#critical-path img').length")
    page.close()
    assert page.problems == [] and hostile == 0
    assert intro.startswith("Critical path: 350.0µs through")
    assert by_type == [
        "gpu_compute_bound 250.0µs 71.4%",
        "cpu_bound 40.0µs 11.4%",
        "gpu_kernel_launch_overhead 40.0µs 11.4%",
        "idle 20.0µs 5.7%",
    ]
    assert ops == ["K 250.0µs 71.4%", f"{HOSTILE} 30.0µs 8.6%", "A 10.0µs 2.9%"]
    assert modules == ["encoder forward 260.0µs 74.3%", "head forward 30.0µs 8.6%"]


def test_live_captures_and_gone_traces_have_no_section(tmp_path: Path) -> None:
    """No trace behind the profile, no section (and no error)."""
    trace = module_trace(tmp_path / "trace.json.gz")
    profile = ls.load(trace)
    assert build_report(profile).critical_path == profile.critical_path()
    trace.unlink()
    assert build_report(profile).critical_path is None
    assert 'id="critical-path"' not in html_report(profile)


def test_merge_page_has_the_path_through_the_ranks(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """``layerscope merge -o ranks.html`` of rank traces: the path's section with its ranks table
    (time on the path and clock offset per rank) and each op's rank."""
    merged = ls.merge(write_job(tmp_path / "job"))
    page_file = tmp_path / "ranks.html"
    page_file.write_text(ranks_html(merged), encoding="utf-8")
    page = _open(browser, page_file, "#critical-path table")
    text = page.inner_text("#critical-path")
    ranks, ops = rows(page, 1), rows(page, 2)
    page.close()
    assert page.problems == []
    assert (
        "Through 2 ranks (2 collectives matched across them): rank 0 600.0µs (52.2%), rank 1 550.0µs (47.8%)."
        in text
    )
    assert ranks == ["0 600.0µs 52.2% 0", "1 550.0µs 47.8% 5.00ms"]
    assert ops[:2] == ["A1 1 490.0µs 42.6%", "B0 0 300.0µs 26.1%"]


def test_long_kernel_names_wrap_inside_the_section(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """A real GPU trace's kernel (a templated name of ~300 characters) wraps: the section is no
    wider than the page, its kernels named without their parameter lists."""
    profile = ls.load(Path(__file__).parent / "fixtures" / "gpu" / "host_bound.json.gz")
    page_file = tmp_path / "gpu.html"
    page_file.write_text(html_report(profile), encoding="utf-8")
    page = _open(browser, page_file, "#critical-path table", width=1000)
    widths = page.evaluate("(s => [s.scrollWidth, s.clientWidth])(document.querySelector('#critical-path'))")
    ops = rows(page, 1)
    page.close()
    assert page.problems == [] and widths[0] <= widths[1]
    assert ops[0].startswith("aten::tanh") and any("tanh_kernel_cuda" in r and "(int," not in r for r in ops)
