"""The device spec table (issue 37, item 2): found by key or by torch's device name, one owner of the
peaks MFU uses, user specs accepted, unknown devices refused with the keys."""

from __future__ import annotations

import pytest

from layerscope.analysis.device_specs import SPECS, DeviceSpec, device_spec, spec_for_device_name
from layerscope.analysis.peaks import known_peak_tflops
from layerscope.errors import UsageError

#: Names torch.cuda.get_device_properties(i).name reports, and the spec each is.
TORCH_NAMES = {
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H200": "h200",
    "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA A100-SXM4-80GB": "a100-80gb",
    "NVIDIA A100 80GB PCIe": "a100-80gb",
    "NVIDIA L4": "l4",
    "NVIDIA L40S": "l40s",
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "AMD Instinct MI300X": "mi300x",
}


@pytest.mark.parametrize(("name", "key"), TORCH_NAMES.items())
def test_torch_device_names_find_their_spec(name: str, key: str) -> None:
    spec = spec_for_device_name(name)
    assert spec is not None and spec.key == key
    assert device_spec(name) is spec is device_spec(key)


def test_every_spec_is_whole_and_keys_are_unique() -> None:
    assert len({s.key for s in SPECS}) == len(SPECS)
    for spec in SPECS:
        assert spec.memory_bytes > 0 and spec.bandwidth_bytes_per_s > 0, spec.key
        assert spec.peak_tflops and all(v > 0 for v in spec.peak_tflops.values()), spec.key
        # tensor-core classes are never slower than plain fp32
        assert all(spec.peak_tflops.get(c, 1e9) >= spec.peak_tflops.get("fp32", 0) for c in ("bf16", "fp16"))
    h100 = device_spec("h100-sxm")
    assert h100.bandwidth_bytes_per_s == 3.35e12 and h100.memory_bytes == 80 * 10**9
    # the H200: the H100 SXM's compute with more, faster memory
    assert device_spec("h200").peak_tflops == h100.peak_tflops
    assert device_spec("h200").bandwidth_bytes_per_s > h100.bandwidth_bytes_per_s


def test_mfu_reads_the_same_table_and_user_specs_pass_through() -> None:
    assert known_peak_tflops("NVIDIA A100-SXM4-80GB", "bf16") == device_spec("a100-80gb").peak_tflops["bf16"]
    mine = DeviceSpec("mine", "My accelerator", ("Mine",), 10**9, 1e11, {"bf16": 100.0})
    assert device_spec(mine) is mine
    with pytest.raises(UsageError, match="choose from h200, h100-pcie, h100-sxm"):
        device_spec("b9000")


def test_a_class_the_spec_quotes_is_its_own_figure() -> None:
    # the measured CPU quotes fp32 convolutions apart; they were once held to its bf16 (AMX) peak
    cpu = DeviceSpec("cpu", "a CPU", (), 10**9, 1e10, {"fp32": 0.2, "fp32-conv": 0.15, "bf16": 1.0})
    assert cpu.peak_flops("fp32-conv") == 0.15e12
    assert cpu.peak_flops("tf32") == 0.2e12 and cpu.peak_flops("int") == 1.0e12  # fallbacks as before
    # the accelerators have no measured op classes nor module cost: their model is the roofline's
    assert all(not s.op_classes and s.module_overhead_us == 0 for s in SPECS)
