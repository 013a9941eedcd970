"""Bytes per op from recorded shapes and dtypes, and the roofline of measured profiles (issue 37)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.analysis.device_specs import DeviceSpec
from layerscope.analysis.report import build_report
from layerscope.attribution.op_bytes import WRAPPER, op_bytes
from layerscope.cli import main
from layerscope.errors import UsageError
from layerscope.model.roofline import COLUMNS
from layerscope.render.html import draw_report
from tests.test_html_report import _open, browser  # noqa: F401  (browser: the shared Chromium)

GPU_TRACE = Path(__file__).parent / "fixtures" / "gpu" / "memory_block.json.gz"
ELEMENT = {torch.float32: 4, torch.bfloat16: 2, torch.float64: 8}


def _spec(ridge: float, bandwidth: float = 20e9) -> DeviceSpec:
    """A device whose fp32 ridge point is ``ridge`` FLOP/byte."""
    peaks = {"fp32": ridge * bandwidth / 1e12}
    return DeviceSpec("test", "a test device", ("no such device",), 10**9, bandwidth, peaks)


def _linear_profile(
    batch: int, k: int, n: int, dtype: torch.dtype = torch.float32, bias: bool = True
) -> ls.Profile:
    model = nn.Linear(k, n, bias=bias).to(dtype)
    x = torch.randn(batch, k, dtype=dtype)
    with torch.no_grad(), ls.profile(model) as prof:
        model(x)
    profile = prof.profile
    profile.validate()
    return profile


@pytest.mark.parametrize(
    ("dtype", "bias"), [(torch.float32, True), (torch.bfloat16, True), (torch.float64, False)]
)
def test_linear_forward_bytes_are_input_weight_bias_output(
    dtype: torch.dtype, bias: bool, tmp_path: Path
) -> None:
    batch, k, n = 24, 48, 40
    profile = _linear_profile(batch, k, n, dtype, bias)
    expected = (batch * k + n * k + (n if bias else 0) + batch * n) * ELEMENT[dtype]
    module = next(r for r in profile.roofline(_spec(4.0)).modules if r.module == "" and r.phase == "forward")
    assert module.bytes == expected
    assert module.flops == 2 * batch * k * n
    # the bytes sit on the op that carries the FLOPs, so its intensity is its own work's
    carrier = [r for r in profile.op_rows if r.metrics.flops]
    assert len(carrier) == 1 and carrier[0].bytes == expected
    assert sum(r.bytes or 0 for r in profile.op_rows) == expected
    # saved and loaded, the rows keep their bytes and dtype
    saved = tmp_path / "linear.json.gz"
    profile.save(saved)
    assert ls.load(saved).op_rows == profile.op_rows


def test_the_verdict_flips_where_the_intensity_crosses_the_ridge_point() -> None:
    k = n = 64
    spec = _spec(ridge=8.0)
    ridge = spec.peak_tflops["fp32"] * 1e12 / spec.bandwidth_bytes_per_s
    verdicts, intensities = [], []
    for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        rows = _linear_profile(batch, k, n).roofline(spec, overhead_below=0.0).modules
        row = next(r for r in rows if r.module == "" and r.phase == "forward")
        expected = 2 * batch * k * n / (4 * (batch * k + k * n + n + batch * n))
        assert row.intensity == pytest.approx(expected, rel=1e-12)
        assert row.bound == ("compute" if row.intensity >= ridge else "memory")
        verdicts.append(row.bound)
        intensities.append(row.intensity)
    assert intensities == sorted(intensities)
    # memory-bound below the ridge point, compute-bound from it on: one flip, where it is crossed
    flip = verdicts.index("compute")
    assert set(verdicts[:flip]) == {"memory"} and set(verdicts[flip:]) == {"compute"}
    assert intensities[flip - 1] < ridge <= intensities[flip]


def test_overhead_is_work_far_below_both_roofs() -> None:
    profile = _linear_profile(4, 32, 32)
    huge = DeviceSpec("huge", "a very fast device", ("none",), 10**9, 1e18, {"fp32": 1e9})
    roofline = profile.roofline(huge)
    assert all(r.bound == "overhead" and r.roof_fraction is not None for r in roofline.modules)
    fractions = [r.roof_fraction for r in roofline.rows() if r.roof_fraction is not None]
    assert fractions and all(f < roofline.overhead_below for f in fractions)
    assert not any(r.bound == "overhead" for r in profile.roofline(huge, overhead_below=0.0).rows())


def test_a_cpu_profile_needs_a_device_and_unknown_ops_say_so() -> None:
    class Scan(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cumsum(x, 0)  # no rule for cumsum: its bytes are unknown

    model = nn.Sequential(nn.Linear(8, 8), Scan())
    with ls.profile(model) as prof:
        model(torch.randn(4, 8))
    profile = prof.profile
    with pytest.raises(UsageError, match="device"):
        profile.roofline()
    rows = {(r.module, r.phase): r for r in profile.roofline(_spec(4.0)).modules}
    assert rows[("1", "forward")].bytes is None and rows[("1", "forward")].bound == "unknown"
    scan_ops = [r for r in profile.op_rows if r.module == "1" and str(r.phase) == "forward"]
    unknown_us = sum(r.metrics.self_cpu_us for r in scan_ops if r.bytes is None)
    assert [r.name for r in scan_ops if r.bytes is None] == ["aten::cumsum"]
    share = unknown_us / sum(r.metrics.self_cpu_us for r in scan_ops)
    assert rows[("1", "forward")].unknown_bytes_share == pytest.approx(share)
    assert rows[("0", "forward")].bytes is not None
    assert 0 < rows[("", "forward")].unknown_bytes_share < 1


def test_to_pandas_roofline_columns_on_a_gpu_trace() -> None:
    profile = ls.load(GPU_TRACE)  # an H100 trace with shapes and dtypes
    frame = profile.to_pandas("roofline")
    assert list(frame.columns) == list(COLUMNS)
    modules = frame[frame["op"].isna()]
    paths = {m.path for m in profile.modules()}
    assert set(modules["module"]) <= paths and set(modules["phase"]) == {"forward", "backward"}
    assert set(frame["bound"]) <= {"compute", "memory", "overhead", "unknown"}
    known = frame[frame["bytes"].notna() & (frame["bytes"] > 0)]
    assert (known["intensity"] == known["flops"] / known["bytes"]).all()
    timed = known[known["time_us"] > 0]
    assert (timed["achieved_bytes_per_s"] == timed["bytes"] / (timed["time_us"] / 1e6)).all()
    # the profile ran on an H100: that spec is taken without being named
    assert profile.roofline().device == "h100-sxm"


def test_trace_and_both_readers_give_the_same_bytes(tmp_path: Path) -> None:
    from layerscope.capture.kineto import table_from_kineto

    model = nn.Sequential(nn.Linear(16, 8), nn.GELU(), nn.LayerNorm(8))
    with ls.profile(model) as prof:
        model(torch.randn(5, 16, requires_grad=True)).sum().backward()
    trace = prof.export_chrome_trace(tmp_path / "trace.json")
    live = {(r.name, r.module, str(r.phase), r.input_shapes): r.bytes for r in prof.profile.op_rows}
    loaded = {(r.name, r.module, str(r.phase), r.input_shapes): r.bytes for r in ls.load(trace).op_rows}
    shared = live.keys() & loaded.keys()
    assert any(live[key] for key in shared)
    assert {key: live[key] for key in shared} == {key: loaded[key] for key in shared}
    results = prof.recording.torch_profiler.profiler.kineto_results
    tables = [table_from_kineto(results, None, True, use_native=native) for native in (False, True)]
    for table in tables:  # the bindings reader keeps our clock anchors' rows; the native one leaves them out
        table.drop_clock_anchors()
    decoded = [[t.names[i] if i >= 0 else None for i in t.span_dtypes.tolist()] for t in tables]
    assert decoded[0] == decoded[1] and any(decoded[0])


def test_op_bytes_rules() -> None:
    f4 = ["float", "float"]
    assert op_bytes("aten::add", [[4, 1], [3]], [*f4, "Scalar"]) == (4 + 3 + 12) * 4  # broadcast
    assert op_bytes("aten::add_", [[4, 3], [3]], f4) == (12 + 3 + 12) * 4  # in place: self read and written
    assert op_bytes("aten::gt", [[4, 3], [4, 3]], f4) == 24 * 4 + 12  # a bool output
    assert op_bytes("aten::copy_", [[4, 3], [4, 3], []], [*f4, "Scalar"]) == 2 * 12 * 4
    assert op_bytes("aten::fill_", [[4, 3], []], ["float", "Scalar"]) == 12 * 4  # written, not read
    rows = op_bytes("aten::embedding", [[1000, 16], [2, 5]], ["float", "long int"])
    assert rows == 10 * 8 + 2 * 10 * 16 * 4  # the indices and the rows gathered, not the table
    # a convolution's output from its FLOPs: 2 x C_in x kh x kw per output element
    out = 2 * 8 * 6 * 6
    flops = out * 2 * 3 * 3 * 3
    assert op_bytes("aten::convolution", [[2, 3, 8, 8], [8, 3, 3, 3], [8]], ["float"] * 3, flops) == (
        (2 * 3 * 64 + 8 * 27 + 8 + out) * 4
    )
    assert op_bytes("aten::view", [[4, 3], []], ["float", "ScalarList"]) == 0
    assert op_bytes("aten::linear", [[4, 3], [2, 3]], f4) == WRAPPER
    assert op_bytes("aten::cumsum", [[4, 3], []], ["float", "Scalar"]) == -1
    assert op_bytes("triton_poi_fused_add_0", [], []) == -1


def test_show_roofline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "linear.json"
    _linear_profile(8, 16, 4).save(saved)
    assert main(["show", str(saved), "--roofline", "--device", "l4", "--ascii"]) == 0
    out = capsys.readouterr().out
    assert "roofline on l4" in out and "aten::addmm in (root)" in out
    assert {"forward", "Bound"} <= set(out.split())
    assert main(["show", str(saved), "--roofline"]) == 2  # a CPU profile: which device?
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device" in err
    assert main(["show", str(saved), "--device", "l4"]) == 2  # not --memory-device's values
    assert main(["show", str(GPU_TRACE), "--roofline", "--ascii"]) == 0
    assert "roofline on h100-sxm" in capsys.readouterr().out


def _assert_log_axis(screen: list[float], values: list[float]) -> None:
    """Screen positions are a linear function of log10(value), to a pixel."""
    logs = [math.log10(v) for v in values]
    lo, hi = logs.index(min(logs)), logs.index(max(logs))
    scale = (screen[hi] - screen[lo]) / (logs[hi] - logs[lo])
    assert scale > 0
    assert all(abs(screen[lo] + scale * (v - logs[lo]) - x) < 1.0 for x, v in zip(screen, logs, strict=True))


def test_roofline_chart_in_the_browser(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    profile = ls.load(GPU_TRACE)
    report = build_report(profile)
    assert report.roofline is not None
    drawn = [r for r in report.roofline.modules if r.intensity and r.achieved_flops_per_s]
    page_path = tmp_path / "report.html"
    page_path.write_text(draw_report(report), encoding="utf-8")
    page = _open(browser, page_path, "#rooflinechart circle")
    try:
        points = page.evaluate(
            """() => [...document.querySelectorAll('#rooflinechart circle')].map(c => {
                const box = c.getBoundingClientRect();
                return {module: c.dataset.module, phase: c.dataset.phase, bound: c.dataset.bound,
                        x: box.x + box.width / 2, y: box.y + box.height / 2,
                        title: c.querySelector('title').textContent};
            })"""
        )
        assert page.problems == []
        assert page.locator("#roofline").is_visible() and page.locator("#roof").count() == 1
        assert [(p["module"] or "", p["phase"], p["bound"]) for p in points] == [
            (r.module or "(root)", r.phase, r.bound) for r in drawn
        ]
        assert {p["phase"] for p in points} == {"forward", "backward"}
        # log-log: on screen, x is linear in log(intensity) and y in log(achieved FLOP/s)
        _assert_log_axis([p["x"] for p in points], [r.intensity or 0.0 for r in drawn])
        _assert_log_axis([-p["y"] for p in points], [r.achieved_flops_per_s or 0.0 for r in drawn])
        assert all(p["title"].startswith(f"{p['module']} {p['phase']}:") for p in points)
        # work without FLOPs (norms, activations) has no point: its bandwidth is tabled below
        memory_only = [r for r in report.roofline.modules if not r.flops and r.bytes]
        cells = page.locator("#rooflinememory tbody tr td:first-child").all_text_contents()
        assert memory_only and cells == [r.module for r in memory_only]
    finally:
        page.close()


def test_grouped_op_tables_add_bytes_up() -> None:
    profile = _linear_profile(8, 16, 4)
    by_name = {r.name: r for r in profile.ops(group_by=("name",))}
    addmm = [r for r in profile.op_rows if r.name == "aten::addmm"]
    assert by_name["aten::addmm"].bytes == sum(r.bytes or 0 for r in addmm) > 0
    assert by_name["aten::addmm"].dtype == "float"
