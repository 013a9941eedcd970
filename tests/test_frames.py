"""``Profile.to_pandas``: one row per module / op / unattributed entry / step, columns that add up."""

from __future__ import annotations

import sys

import pytest
import torch

import layerscope as ls
from layerscope.analysis.frames import achieved_flops_per_s
from layerscope.errors import UsageError
from layerscope.model.metrics import ADDITIVE_PAIRS
from tests.fixtures.models import TinyMLP

pandas = pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def profile() -> ls.Profile:
    torch.manual_seed(0)
    model = TinyMLP()
    with ls.profile(model, memory=True) as prof:
        for _ in range(2):
            model(torch.randn(64, 8)).sum().backward()
            prof.step()
    p = prof.profile
    p.validate()
    return p


def test_module_rows_and_columns(profile: ls.Profile) -> None:
    frame = profile.to_pandas("modules")
    assert list(frame["path"]) == [n.path for n in profile.modules()]
    assert {"path", "type", "calls", "params", "forward_self_cpu_us", "backward_flops"} <= set(frame.columns)
    fc1 = frame.set_index("path").loc["fc1"]
    node = profile.find("fc1")
    assert fc1["forward_self_cpu_us"] == node.forward.self_cpu_us and fc1["calls"] == node.calls
    assert fc1["depth"] == 1 and fc1["parent"] == ""


def test_self_columns_add_up_to_the_totals(profile: ls.Profile) -> None:
    modules, unattributed = profile.to_pandas("modules"), profile.to_pandas("unattributed")
    for self_name, _ in ADDITIVE_PAIRS:
        summed = (
            modules[f"forward_{self_name}"].sum()
            + modules[f"backward_{self_name}"].sum()
            + unattributed[self_name].sum()
        )
        assert summed == pytest.approx(getattr(profile.totals, self_name), rel=1e-9, abs=1e-6), self_name
    ops = profile.to_pandas("ops")
    assert ops["flops"].sum() == profile.totals.flops
    assert len(ops) == len(profile.op_rows)


def test_steps_and_achieved_flops(profile: ls.Profile) -> None:
    steps = profile.to_pandas("steps")
    assert list(steps["step"]) == [s.step for s in profile.steps] and len(steps) >= 2
    node = profile.find("fc1")
    expected = node.forward.flops / (node.forward.cpu_us / 1e6)
    frame = profile.to_pandas("modules").set_index("path")
    assert frame.loc["fc1", "forward_flops_per_s"] == pytest.approx(expected)
    assert achieved_flops_per_s(profile.find("act").forward) is None  # no FLOPs: blank, not zero


def test_without_pandas_one_clear_error(profile: ls.Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(UsageError, match="pip install pandas"):
        profile.to_pandas()
    with pytest.raises(UsageError, match="unknown table"):
        profile.to_pandas("nope")


def test_mfu_against_a_given_or_known_peak(profile: ls.Profile) -> None:
    from layerscope.analysis.peaks import known_peak_tflops, peak_flops_per_s
    from layerscope.render.console import render_to_text, tree_table

    assert known_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert known_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert known_peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
    assert known_peak_tflops("Some CPU") is None
    from layerscope.model.meta import DeviceInfo, Environment, ProfileMeta

    assert (
        peak_flops_per_s(ProfileMeta(environment=Environment(devices=(DeviceInfo("NVIDIA H200"),)))) == 989e12
    )
    assert peak_flops_per_s(ProfileMeta(environment=Environment())) is None  # CPU run: no MFU unless given
    plain = render_to_text(tree_table(profile, ascii_only=True), width=250)
    assert "FLOP/s" in plain and "MFU" not in plain
    node = profile.find("fc1")
    rate = achieved_flops_per_s(node.total)
    assert rate is not None
    peak_tflops = rate * 4 / 1e12  # fc1 runs at 25% of this made-up peak
    text = render_to_text(tree_table(profile, ascii_only=True, peak_tflops=peak_tflops), width=250)
    header = next(line for line in text.splitlines() if "MFU" in line)
    row = next(line for line in text.splitlines() if "fc1" in line)
    from_end = [c.strip() for c in header.split("|")][::-1].index("MFU")  # tree guides hold "|" too
    assert [c.strip() for c in row.split("|")][::-1][from_end] == "25.0%"


def test_op_tables_and_diffs_show_as_html_in_notebooks(profile: ls.Profile) -> None:
    import xml.dom.minidom

    rows = profile.ops(limit=5)
    page = rows._repr_html_()
    assert isinstance(rows, list) and len(rows) == 5
    table = xml.dom.minidom.parseString(page).documentElement  # well-formed, no script
    assert len(table.getElementsByTagName("tr")) == 6 and "<script" not in page
    assert rows[0].name.replace("<", "&lt;") in page
    d = ls.diff(profile, profile)
    assert "layerscope diff" in d._repr_html_() and "cpu_us" in d._repr_html_()
