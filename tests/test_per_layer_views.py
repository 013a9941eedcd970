"""What users of per-layer tools expect (issue 25): output shapes, per-type totals, MFU by dtype."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.analysis import device_specs
from layerscope.analysis.device_specs import DeviceSpec
from layerscope.analysis.frames import achieved_flops_per_s
from layerscope.analysis.peaks import choose_peak, known_peaks, mixed_peak
from layerscope.model.meta import DeviceInfo, Environment, FlopsByDtype, ProfileMeta
from layerscope.render.columns import tree_view
from layerscope.render.console import render_to_text, tree_table
from layerscope.render.types import types_table


class Mixed(nn.Module):
    """Two Linear layers in fp32 and one in bf16: FLOPs in two dtypes, types used twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 32)
        self.act = nn.ReLU()
        self.low = nn.Linear(32, 32).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(self.act(self.a(x)))
        return self.low(y.to(torch.bfloat16)).float()


@pytest.fixture(scope="module")
def mixed() -> ls.Profile:
    torch.manual_seed(0)
    model, x = Mixed(), torch.randn(16, 32)
    with ls.profile(model) as prof:
        model(x).sum().backward()
    profile = prof.profile
    profile.validate()
    return profile


def test_types_add_up_to_the_tree(mixed: ls.Profile) -> None:
    types = mixed.by_type()
    by_name = {t.type_name: t for t in types}
    assert by_name["Linear"].modules == 3 and by_name["Linear"].calls == 3
    assert by_name["Linear"].params == 32 * 64 + 64 + 64 * 32 + 32 + 32 * 32 + 32
    assert sum(t.flops for t in types) == mixed.root.total.flops
    assert sum(t.cpu_us for t in types) == pytest.approx(mixed.root.total.cpu_us)
    assert sum(types.share(t) for t in types) == pytest.approx(1.0)
    assert by_name["Linear"].flops == mixed.root.total.flops  # only the Linear layers compute FLOPs
    text = render_to_text(types_table(types, ascii_only=True), width=120)
    assert "Linear" in text and "ReLU" in text and "add up to the tree" in text


def test_types_at_one_depth_use_inclusive_figures(mixed: ls.Profile) -> None:
    at_one = mixed.by_type(depth=1)
    assert {t.type_name for t in at_one} == {"Linear", "ReLU"}
    assert sum(t.flops for t in at_one) == mixed.root.total.flops
    root_only = mixed.by_type(depth=0)
    assert [t.type_name for t in root_only] == ["Mixed"]
    assert root_only[0].cpu_us == pytest.approx(mixed.root.total.cpu_us)
    frame = mixed.to_pandas("types")
    assert set(frame["type"]) == {"Mixed", "Linear", "ReLU"}
    with pytest.raises(ls.UsageError, match="depth"):
        mixed.by_type(depth=-1)


def test_output_shapes_column(mixed: ls.Profile) -> None:
    text = render_to_text(tree_table(mixed, ascii_only=True), width=200)
    header = next(line for line in text.splitlines() if "Output" in line)
    assert "Output" in header
    row = next(line for line in text.splitlines() if line.lstrip("|`- ").startswith("a "))
    assert "16x64" in row  # Linear(32, 64) on a 16x32 batch
    frame = mixed.to_pandas("modules")
    assert frame.set_index("path").loc["a", "output_shapes"] == "[[16, 64]]"
    assert frame.set_index("path").loc["a", "input_shapes"] == "[[16, 32]]"


def _on_device(profile: ls.Profile, name: str) -> ls.Profile:
    """The profile as if it had run on the device named ``name``."""
    on = Environment(devices=(DeviceInfo(name),))
    return replace(profile, meta=replace(profile.meta, environment=on))


def _run_split(profile: ls.Profile) -> dict[str, int]:
    assert profile.meta.flops_by_dtype is not None
    return dict(profile.meta.flops_by_dtype.run)


def test_flops_are_split_by_dtype(mixed: ls.Profile) -> None:
    by_dtype = _run_split(mixed)
    mm = 2 * 16 * 32 * 64
    fp32 = 2 * mm + 3 * mm  # a: forward + weight gradient (x needs none); b: forward + both gradients
    bf16 = 2 * 16 * 32 * 32 * 3  # low: forward + grad input + grad weight
    assert by_dtype == {"fp32": fp32, "bf16": bf16}
    assert sum(by_dtype.values()) == mixed.totals.flops


def test_each_module_has_its_own_dtype_mix(mixed: ls.Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mixed run keeps each module's FLOPs per dtype (children included); its MFU cell is held to
    the peak of its own mix: the fp32 layer to the fp32 peak, the bf16 one to bf16's, the root to
    the run's mix; a given --peak-tflops holds every row to itself."""
    mm = 2 * 16 * 32 * 64
    assert mixed.meta.flops_by_dtype is not None
    run, per_module = mixed.meta.flops_by_dtype.run, mixed.meta.flops_by_dtype.per_module
    assert per_module["a"] == {"fp32": 2 * mm}
    assert per_module["b"] == {"fp32": 3 * mm}
    assert per_module["low"] == {"bf16": 3 * 2 * 16 * 32 * 32}
    assert per_module[""] == run
    assert "act" not in per_module  # no FLOPs

    on_h100 = _on_device(mixed, "NVIDIA H100 80GB HBM3")
    view = tree_view(on_h100, per_step=False, peak_tflops=None)
    h100 = known_peaks("NVIDIA H100 80GB HBM3")
    assert h100 is not None
    assert view.module_peaks["a"] == pytest.approx(h100["fp32"] * 1e12)
    assert view.module_peaks["low"] == pytest.approx(h100["bf16"] * 1e12)
    run_peak = mixed_peak(h100, dict(run), tf32=False)[0] * 1e12
    assert view.module_peaks[""] == pytest.approx(run_peak) == pytest.approx(view.peak_rate)
    low = on_h100.find("low")
    rate = achieved_flops_per_s(low.total)
    assert rate is not None
    assert view.mfu_cell(low.total, "low") == f"{100 * rate / (h100['bf16'] * 1e12):.1f}%"
    assert "each module against its own mix" in view.peak_note
    # The console rows use the module's peak: on a made-up device slow enough for CPU rates to show,
    # the bf16 layer at 1 MFLOP/s peak, the fp32 ones at 10.
    slowpoke = DeviceSpec("slowpoke", "Slowpoke", ("Slowpoke",), 1, 1.0, {"fp32": 1e-5, "bf16": 1e-6})
    monkeypatch.setattr(device_specs, "SPECS", (slowpoke,))
    slow = _on_device(mixed, "Slowpoke 1")
    text = render_to_text(tree_table(slow, ascii_only=True), width=250)
    for path, peak in (("low", 1e6), ("a", 1e7)):
        node_rate = achieved_flops_per_s(slow.find(path).total)
        assert node_rate is not None
        row = next(line for line in text.splitlines() if line.lstrip("|`- ").startswith(f"{path} "))
        assert f" {100 * node_rate / peak:.1f}% " in row, (path, row)
    assert "each module against its own mix" in text
    given = tree_view(on_h100, per_step=False, peak_tflops=100.0)
    assert given.module_peaks == {} and given.mfu_cell(low.total, "low") == f"{100 * rate / 100e12:.1f}%"

    broken_split = FlopsByDtype(run, {**per_module, "a": {"fp32": 1}})
    broken = replace(mixed, meta=replace(mixed.meta, flops_by_dtype=broken_split))
    with pytest.raises(ls.ValidationError, match="module a: FLOPs by dtype"):
        broken.validate()


def test_fp32_convolutions_are_their_own_class() -> None:
    """cuDNN runs fp32 convolutions in TF32 by default, matmuls only when asked: two classes."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    with ls.profile(model) as prof:
        model(torch.randn(2, 3, 8, 8))
    by_dtype = _run_split(prof.profile)
    assert by_dtype == {"fp32-conv": 2 * 2 * 4 * 6 * 6 * 3 * 3 * 3, "fp32": 2 * 2 * 144 * 2}
    a100 = known_peaks("NVIDIA A100-SXM4-80GB")
    assert a100 is not None
    conv_tf32, how = mixed_peak(a100, {"fp32-conv": 1}, tf32=False, tf32_conv=True)
    assert conv_tf32 == 156.0 and how.startswith("tf32")
    assert mixed_peak(a100, {"fp32-conv": 1}, tf32=False, tf32_conv=False)[0] == 19.5


def test_mfu_peak_is_weighted_by_the_dtype_mix() -> None:
    h100 = known_peaks("NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100["bf16"] == 989.0 and h100["fp32"] == 67.0
    # half the FLOPs at 989, half at 67: the time is 0.5/989 + 0.5/67 per TFLOP
    peak, how = mixed_peak(h100, {"bf16": 1000, "fp32": 1000}, tf32=False)
    assert peak == pytest.approx(1 / (0.5 / 989.0 + 0.5 / 67.0))
    assert "bf16 989 (50% of FLOPs)" in how and "fp32 67 (50% of FLOPs)" in how
    tf32_peak, how = mixed_peak(h100, {"fp32": 10}, tf32=True)
    assert tf32_peak == pytest.approx(494.5) and how.startswith("tf32")
    on_a100 = Environment(devices=(DeviceInfo("NVIDIA A100-SXM4-80GB"),))
    meta = ProfileMeta(environment=on_a100, flops_by_dtype=FlopsByDtype({"fp32": 5}))
    chosen = choose_peak(meta)
    assert chosen is not None and chosen.flops_per_s == pytest.approx(19.5e12)
    assert "fp32 19.5" in chosen.description
    given = choose_peak(meta, peak_tflops=100.0)
    assert given is not None and given.flops_per_s == 100e12 and given.description == "--peak-tflops 100"
    unknown = choose_peak(ProfileMeta(environment=Environment(devices=(DeviceInfo("NVIDIA H100"),))))
    assert unknown is not None and unknown.flops_per_s == 989e12 and "dtypes unknown" in unknown.description


def test_tree_caption_names_the_peak(mixed: ls.Profile) -> None:
    text = render_to_text(tree_table(mixed, ascii_only=True, peak_tflops=1.0), width=220)
    assert "MFU against --peak-tflops 1" in text
    assert "MFU against" not in render_to_text(tree_table(mixed, ascii_only=True), width=220)  # CPU: none


def test_traces_give_the_same_flops_by_dtype(tmp_path: Path) -> None:
    """A trace's ops carry "Input type": read back, the dtype split equals the live one."""
    torch.manual_seed(0)
    model, x = Mixed(), torch.randn(16, 32)
    with ls.profile(model) as prof:
        model(x).sum().backward()
    live = _run_split(prof.profile)
    loaded = ls.load(prof.export_chrome_trace(tmp_path / "trace.json"))
    assert loaded.meta.flops_by_dtype is not None and loaded.meta.flops_by_dtype.run == live


def test_validate_catches_a_dtype_split_that_does_not_add_up(mixed: ls.Profile) -> None:
    from dataclasses import replace

    found = mixed.meta.flops_by_dtype
    assert found is not None

    def with_run(run: dict[str, int]) -> ls.Profile:
        return replace(mixed, meta=replace(mixed.meta, flops_by_dtype=FlopsByDtype(run, found.per_module)))

    with pytest.raises(ls.ValidationError, match="flops_by_dtype adds up to"):
        with_run({**found.run, "bf16": found.run["bf16"] + 1}).validate()
    with pytest.raises(ls.ValidationError, match="negative class"):
        with_run({"fp32": mixed.totals.flops + 5, "bf16": -5}).validate()
