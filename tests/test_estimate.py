"""``ls.estimate`` / ``ls.max_batch_size`` / ``layerscope estimate`` (issue 37): the exact parts are
asserted exactly (FLOPs, the model's and optimizer's state), the peak within a generous bound of a
measured CPU profile's."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.analysis.device_specs import DeviceSpec
from layerscope.cli import main
from layerscope.estimates import search_batch
from layerscope.estimates.op_classes import COMPUTE_CLASSES, MEMORY_CLASSES
from layerscope.models import GPTBlock

#: A small fixed device, so that tests measure nothing and batch searches end quickly.
TINY = DeviceSpec("tiny", "a tiny device", ("tiny",), 64 * 2**20, 100e9, {"fp32": 10.0, "bf16": 20.0})


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8))


def _measured(model: nn.Module, x: torch.Tensor) -> tuple[ls.Profile, torch.optim.Optimizer]:
    """A measured steady-state step: optimizer state exists, grads None before the forward."""
    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        model(x).sum().backward()
        opt.step()

    step()
    opt.zero_grad(set_to_none=True)
    with ls.profile(model, memory=True, flops=True) as prof:
        step()
    return prof.profile, opt


@pytest.mark.parametrize("build, shape", [(_mlp, (16, 32)), (lambda: GPTBlock(64, 4, 32), (2, 32, 64))])
def test_flops_and_state_equal_a_measured_step(build, shape) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model, x = build(), torch.randn(*shape)
    est = ls.estimate(model, x, device=TINY)
    est.validate()
    measured, opt = _measured(model, x)
    assert est.totals.flops == measured.totals.flops > 0
    # the module tree's FLOPs agree module by module, forward and backward
    for node in measured.modules():
        assert est.find(node.path).forward.flops == node.forward.flops, node.path
        assert est.find(node.path).backward.flops == node.backward.flops, node.path
    state = est.meta.estimate.state_bytes  # type: ignore[union-attr]
    params = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    opt_state = sum(
        v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v)
    )
    assert (state["parameter"], state["gradient"], state["optimizer_state"]) == (params, grads, opt_state)
    got, want = est.memory_at_peak().by_category(), measured.memory_at_peak("cpu").by_category()
    assert got["parameter"] == want["parameter"] and got["optimizer_state"] == want["optimizer_state"]


def test_linear_bytes_are_its_tensors() -> None:
    est = ls.estimate(nn.Linear(32, 16), torch.randn(8, 32), device=TINY, train=False)
    forward, backward = est.meta.estimate.module_bytes[""]  # type: ignore[union-attr]
    # addmm reads bias, input and weight and writes the output; the weight's transpose is a view
    assert (forward, backward) == ((16 + 8 * 32 + 16 * 32 + 8 * 16) * 4, 0)


@pytest.mark.parametrize("build, shape", [(_mlp, (64, 32)), (lambda: GPTBlock(64, 4, 64), (4, 64, 64))])
def test_peak_is_near_the_measured_one(build, shape) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model, x = build(), torch.randn(*shape)
    predicted = ls.estimate(model, x, device=TINY).memory_at_peak()
    measured = _measured(model, x)[0].memory_at_peak("cpu")
    assert predicted.device is True and predicted.categorised
    assert sum(r.bytes for r in predicted.rows) == predicted.absolute_peak_bytes
    # measured also holds what kernels allocate inside an op (invisible to fake tensors): 15%
    assert abs(predicted.absolute_peak_bytes / measured.absolute_peak_bytes - 1) < 0.15
    assert predicted.saved.keys() <= {n.path for n in ls.estimate(model, x, device=TINY).modules()}


def test_meta_model_allocates_nothing_of_its_size() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(20_000, 20_000), nn.ReLU(), nn.Linear(20_000, 10))  # 1.6 GB
    est = ls.estimate(model, torch.empty(4, 20_000, device="meta"), device="h100-sxm", dtype="bfloat16")
    est.validate()
    peak = est.memory_at_peak()
    weights = (20_000 * 20_000 + 20_000 + 10 * 20_000 + 10) * 2
    assert peak.by_category()["parameter"] == weights
    assert est.meta.estimate.state_bytes["optimizer_state"] == 2 * weights + 4 * 4  # type: ignore[union-attr]
    assert est.meta.estimate.fits and est.totals.device_us > 0 and est.totals.cpu_us == 0  # type: ignore[union-attr]
    assert all(p.device.type == "meta" for p in model.parameters())  # the model is untouched


def test_tied_weights_count_once_and_the_model_is_unchanged() -> None:
    emb = nn.Embedding(100, 16)
    head = nn.Linear(16, 100, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, head)
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    est = ls.estimate(model, torch.randint(0, 100, (2, 8)), device=TINY)
    assert est.meta.estimate.state_bytes["parameter"] == 100 * 16 * 4  # type: ignore[union-attr]
    assert not model.training and model[1].weight is model[0].weight
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert not model[0]._forward_pre_hooks and not model[0]._forward_hooks


def test_eval_and_dtype() -> None:
    model = _mlp()
    train = ls.estimate(model, torch.randn(8, 32), device=TINY)
    infer = ls.estimate(model, torch.randn(8, 32), device=TINY, train=False)
    half = ls.estimate(model, torch.randn(8, 32), device=TINY, dtype="bfloat16")
    # backward of a Linear is twice its forward, less the first layer's input gradient (not needed)
    assert infer.totals.flops * 3 - 2 * 8 * 32 * 64 == train.totals.flops
    assert infer.root.backward.flops == 0 and "optimizer_state" not in infer.memory_at_peak().by_category()
    assert half.meta.estimate.state_bytes["parameter"] * 2 == train.meta.estimate.state_bytes["parameter"]  # type: ignore[union-attr]
    assert half.meta.flops_by_dtype is not None and set(half.meta.flops_by_dtype.run) == {"bf16"}
    assert half.totals.device_us < train.totals.device_us  # bf16's peak is twice fp32's on TINY


def test_saved_estimate_reads_back(tmp_path: Path) -> None:
    est = ls.estimate(_mlp(), torch.randn(8, 32), device=TINY)
    again = ls.load(est.save(tmp_path / "e.json"))
    again.validate()
    assert again.meta.source == "estimate" and again.meta.estimate == est.meta.estimate
    assert again.memory_at_peak() == est.memory_at_peak()
    est.save(tmp_path / "e.html")
    compared = ls.diff(est, again, metric="device_us")
    assert compared.tree and compared.total_a == compared.total_b == est.totals.device_us > 0


def test_max_batch_size_is_the_largest_that_fits() -> None:
    model = _mlp()
    found = search_batch(model, lambda b: torch.randn(b, 32), device=TINY, reserve_bytes=0, limit=1 << 20)
    usable = TINY.memory_bytes
    assert 0 < found.max_batch < 1 << 20
    assert found.tried[found.max_batch] <= usable < found.tried[found.max_batch + 1]
    peaks = sorted(found.tried.items())
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(peaks))  # the peak grows with the batch
    smaller = ls.max_batch_size(model, lambda b: torch.randn(b, 32), device=TINY, reserve_bytes=usable // 2)
    assert smaller < found.max_batch
    assert ls.max_batch_size(model, lambda b: torch.randn(b, 32), device=TINY, reserve_bytes=0, limit=5) == 5
    assert ls.max_batch_size(model, lambda b: torch.randn(b, 32), device=TINY) == 0  # 64 MiB < the reserve


def test_a_step_failing_on_fake_tensors_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """An input the model rejects (longer than the GPT's positions): one line and exit 2, and no
    traceback logged by torch's FakeTensorMode on the way."""
    import logging

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("torch._subclasses.fake_tensor")
    handler = Keep()
    logger.addHandler(handler)
    try:
        assert main(["estimate", "gpt", "--input", "2x256:int64", "-q"]) == 2
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert err.startswith("layerscope: error: the step failed on fake tensors") and err.count("\n") == 1
    assert records == []
    assert logger.filters == []  # the filter is gone after the estimate


def test_cli_estimate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "est.json"
    code = main(
        ["estimate", "gpt", "--input", "2x32:int64", "--dtype", "bfloat16", "--max-batch", "-o", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 0 and "fits: predicted peak" in printed and "max batch" in printed
    saved = json.loads(out.read_text())
    assert saved["meta"]["source"] == "estimate" and saved["meta"]["estimate"]["dtype"] == "bfloat16"
    assert main(["estimate", "gpt", "--device", "nope"]) == 2
    assert "choose from cpu, " in capsys.readouterr().err
    assert main(["estimate", "gpt", "--input", "2xq"]) == 2
    assert main(["estimate", "resnet18", "--input", "2x3x8x8", "--eval", "--optimizer", "none", "-q"]) == 0
    assert capsys.readouterr().out.startswith("fits: ")


def test_cpu_device_is_measured_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERSCOPE_CACHE", str(tmp_path))
    first = ls.estimate(_mlp(), torch.randn(8, 32), device="cpu")
    cached = list((tmp_path / "devices").glob("cpu-*.json"))
    assert len(cached) == 1
    second = ls.estimate(_mlp(), torch.randn(8, 32), device="cpu")
    assert first.meta.estimate == second.meta.estimate.__class__(
        **{  # type: ignore[union-attr]
            **second.meta.estimate.__dict__,
            "wall_s": first.meta.estimate.wall_s,  # type: ignore[union-attr]
        }
    )
    assert first.totals.cpu_us > 0 and first.totals.device_us == 0
    assert first.meta.estimate.peak_tflops["fp32"] > 0  # type: ignore[union-attr]
    # every op class measured, read back from the cache as measured
    spec = ls.estimates.cpu_spec()
    assert set(spec.op_classes) == set(COMPUTE_CLASSES) | set(MEMORY_CLASSES)
    assert all(c.rate_per_s > 0 and c.fixed_us >= 0 for c in spec.op_classes.values())
    assert spec.module_overhead_us > 0 and spec == ls.estimates.cpu_spec()


class _Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)) for _ in range(3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return x


def test_activation_checkpointing_is_booked_as_measured() -> None:
    torch.manual_seed(0)
    model, x = _Checkpointed(), torch.randn(8, 16)
    est = ls.estimate(model, x, device=TINY)
    est.validate()
    measured = _measured(model, x)[0]
    assert est.totals.flops == measured.totals.flops
    for path in ("blocks.0", "blocks.2.0"):
        got, want = est.find(path), measured.find(path)
        assert (got.calls, got.recompute_calls) == (want.calls, want.recompute_calls) == (1, 1)
        assert got.backward.flops == want.backward.flops > 0


def test_an_estimate_says_so() -> None:
    est = ls.estimate(_mlp(), torch.randn(8, 32), device="h100-sxm")
    title = str(est).splitlines()[0]
    assert "estimate for NVIDIA H100 SXM5 80GB" in title and "predicted step" in title
    assert est.meta.device_names == ["NVIDIA H100 SXM5 80GB"]  # MFU is held to the H100's peaks
