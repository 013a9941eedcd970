"""``layerscope diff`` and ``ls.diff``: matched modules and ops, new and vanished, CI gate."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

import layerscope as ls
from layerscope.attribution import build_profile, module_range_name
from layerscope.cli import main
from layerscope.errors import UsageError
from layerscope.events import EventKind, EventTable
from tests.test_build_synthetic import CATALOG

US = 1000


def run(addmm_us: int, gelu: bool) -> ls.Profile:
    """Net[ fc[ addmm ] relu (gelu) ], laid out one after another on one thread."""
    t = EventTable()
    fc_end = 20 + addmm_us + 10
    relu_end = fc_end + 10 + 20
    end = relu_end + (30 if gelu else 10)
    t.add_span(module_range_name("", "Net"), EventKind.CPU_OP, 1, 0, end * US)
    t.add_span(module_range_name("fc", "Linear"), EventKind.CPU_OP, 1, 10 * US, (fc_end - 10) * US)
    t.add_span("aten::addmm", EventKind.CPU_OP, 1, 20 * US, addmm_us * US, shapes="[[4], [2, 8], [8, 4]]")
    t.add_span("aten::relu", EventKind.CPU_OP, 1, (fc_end + 10) * US, 20 * US, shapes="[[2, 4]]")
    if gelu:
        t.add_span("aten::gelu", EventKind.CPU_OP, 1, (relu_end + 2) * US, 20 * US, shapes="[[2, 4]]")
    p = build_profile(t, CATALOG)
    p.validate()
    return p


def profiles() -> tuple[ls.Profile, ls.Profile]:
    """A, and B with fc's addmm 20 µs slower and a new op (aten::gelu) in the root."""
    return run(30, gelu=False), run(50, gelu=True)


def test_diff_matches_modules_and_ops() -> None:
    a, b = profiles()
    d = ls.diff(a, b)
    assert d.total_delta == pytest.approx(40.0)
    modules = {r.key: r for r in d.modules}
    assert modules["fc"].delta == pytest.approx(20.0) and modules["fc"].percent == pytest.approx(40.0)
    assert modules[""].delta == pytest.approx(40.0)
    ops = {r.key.split(" ")[0]: r for r in d.ops}
    assert ops["aten::addmm"].delta == pytest.approx(20.0)
    assert ops["aten::gelu"].status == "new" and ops["aten::gelu"].a is None
    reverse = {r.key.split(" ")[0]: r for r in ls.diff(b, a).ops}
    assert reverse["aten::gelu"].status == "vanished"
    assert [abs(r.delta) for r in d.ops] == sorted((abs(r.delta) for r in d.ops), reverse=True)
    assert d.regressed(5.0) and not d.regressed(50.0)


def test_unknown_metric() -> None:
    a, b = profiles()
    with pytest.raises(UsageError, match="choose from"):
        ls.diff(a, b, metric="speed")


def test_cli_formats_and_fail_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = profiles()
    pa, pb = a.save(tmp_path / "a.json"), b.save(tmp_path / "b.json.gz")
    assert main(["diff", str(pa), str(pb), "--ascii"]) == 0
    out = capsys.readouterr().out
    assert "cpu_us: 100.0us -> 140.0us (+40.0us, +40.0%)" in out
    assert "aten::gelu" in out and "new" in out
    assert main(["diff", str(pa), str(pb), "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("**layerscope diff**") and "| `fc` |" in md
    assert main(["diff", str(pa), str(pb), "--format", "json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["total_delta"] == pytest.approx(40.0) and data["metric"] == "cpu_us"
    assert main(["diff", str(pa), str(pb), "--fail-over", "5%"]) == 1
    assert "slower than A beyond 5%" in capsys.readouterr().err
    assert main(["diff", str(pa), str(pb), "--fail-over", "50"]) == 0
    assert main(["diff", str(pb), str(pa), "--fail-over", "0%"]) == 0  # faster never fails
    assert main(["diff", str(pa), str(pb), "--fail-over", "lots"]) == 2
    assert main(["diff", str(pa), str(tmp_path / "missing.json")]) == 2


def test_diff_of_real_traces_normalises_step_numbers(real_traces: Path) -> None:
    d = ls.diff(
        ls.load(real_traces / "compare" / "base.json.gz"), ls.load(real_traces / "compare" / "test.json.gz")
    )
    keys = {r.key for r in d.ops}
    assert not any(k.startswith("ProfilerStep#1") for k in keys)
    assert d.per_step  # both traces hold two steps
    new = {r.key.split(" ")[0] for r in d.ops if r.status == "new"}
    assert "All2All_Pooled_Req" in new


def test_diff_mixes_a_saved_profile_and_a_trace(
    real_traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ls.load(real_traces / "compare" / "base.json.gz").save(tmp_path / "base.json")
    assert main(["diff", str(base), str(real_traces / "compare" / "test.json.gz"), "--format", "json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["per_step"] is True and any(r["status"] == "new" for r in data["ops"])
