"""Memory that tells the truth at the peak: absolute peaks, what was live then by category and
module, tensors saved for backward per keeping module, running backward peaks, out of memory and
blocks that raise (issue 21). Byte counts are computed from the models' shapes by hand."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.profiler._memory_profiler import Action

import layerscope as ls
from layerscope.capture import native
from layerscope.cli import main
from layerscope.render.console import render_to_text, tree_table

F32 = 4
BATCH, D_IN, D_HID = 256, 512, 2048


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, D_HID), nn.GELU(), nn.Linear(D_HID, D_IN))


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * F32 for p in model.parameters())


def _adamw_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.fixture(scope="module")
def adamw_run() -> dict[str, Any]:
    """One AdamW step of the MLP, its optimizer state made by a step before the block; recorded
    with stacks so torch's own MemoryProfile can categorise the same events."""
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(BATCH, D_IN)
    _adamw_step(model, optimizer, x)
    # Every tensor alive at entry is in the baseline: garbage of earlier tests (live until the
    # collector runs) would be too.
    gc.collect()
    with ls.profile(model, memory=True, with_stack=True) as prof:
        _adamw_step(model, optimizer, x)
    profile = prof.profile
    profile.validate()
    return {"model": model, "x": x, "prof": prof, "profile": profile}


def test_the_absolute_peak_counts_what_was_live_before_the_block(adamw_run: dict[str, Any]) -> None:
    model, profile = adamw_run["model"], adamw_run["profile"]
    params = _param_bytes(model)
    at_peak = profile.memory_at_peak()
    # Before the block: parameters, AdamW's two moments (each the parameters' size) and the step
    # counters (4-byte scalars, one per parameter), and the input.
    step_counters = F32 * len(list(model.parameters()))
    input_bytes = BATCH * D_IN * F32
    # Tensors of the process this test did not make (earlier tests' module-level constants, a few
    # bytes) are alive too: the scan counts them as "other", and the block never touches them.
    categories = at_peak.by_category()
    elsewhere = categories.get("other", 0)
    assert elsewhere < 64 * 1024
    assert at_peak.baseline_bytes == params + 2 * params + step_counters + input_bytes + elsewhere
    # At the peak (inside AdamW's step): all of that, the gradients, and a parameter-sized
    # temporary AdamW makes (its denominator) on top.
    assert categories["parameter"] == params
    assert categories["gradient"] == params
    assert categories["optimizer_state"] == 2 * params + step_counters
    assert categories["input"] == input_bytes
    assert at_peak.absolute_peak_bytes == sum(categories.values())
    assert at_peak.absolute_peak_bytes >= 4 * params + input_bytes
    assert profile.totals.cpu_relative_peak_bytes == at_peak.absolute_peak_bytes - at_peak.baseline_bytes
    assert at_peak.where is not None and at_peak.where["module"].startswith("Optimizer.step")


def test_live_at_peak_agrees_with_torchs_memory_profile(adamw_run: dict[str, Any]) -> None:
    """torch's MemoryProfile (profiler._memory_profile(), which needs stacks) replayed to our peak's
    time: the same total, and the same bytes in every category both name."""
    profile, prof = adamw_run["profile"], adamw_run["prof"]
    peak_ns = profile.meta.memory.classes[0].peak_ts_ns
    theirs = _torch_categories_at(prof.torch_profiler._memory_profile(), peak_ns)
    ours = profile.memory_at_peak().by_category()
    # torch's replay knows only tensors the block's events touch: not other tests' leftovers ("other")
    assert sum(theirs.values()) == sum(ours.values()) - ours.get("other", 0)
    for category in ("parameter", "gradient", "optimizer_state"):
        assert ours[category] == theirs[category], category
    # torch also calls an 8-byte scalar of AdamW's step an input; ours calls it temporary.
    assert abs(ours["input"] - theirs["input"]) <= 8


def _torch_categories_at(memory_profile: Any, at_ns: int) -> dict[str, int]:
    """Live CPU bytes per category at ``at_ns``, replaying torch's timeline the way its own
    ``MemoryProfileTimeline`` does."""

    def category(key: Any, version: int) -> str:
        found = memory_profile._categories.get(key, version)
        return found.name.lower() if found is not None else "none"

    sizes: dict[str, int] = {}
    for t, action, (key, version), nbytes in memory_profile.timeline:
        if t > at_ns:
            break
        if key.device.type != "cpu":
            continue
        if action in (Action.PREEXISTING, Action.CREATE):
            sizes[category(key, version)] = sizes.get(category(key, version), 0) + nbytes
        elif action == Action.INCREMENT_VERSION:
            sizes[category(key, version)] = sizes.get(category(key, version), 0) - nbytes
            sizes[category(key, version + 1)] = sizes.get(category(key, version + 1), 0) + nbytes
        elif action == Action.DESTROY:
            sizes[category(key, version)] = sizes.get(category(key, version), 0) - nbytes
    return {k: v for k, v in sizes.items() if v}


def test_saved_for_backward_is_charged_to_the_module_that_keeps_it(adamw_run: dict[str, Any]) -> None:
    saved = adamw_run["profile"].memory_at_peak().saved
    activation = BATCH * D_HID * F32
    # Linear keeps its input (here the model's input), GELU keeps its input, the second Linear
    # keeps GELU's output and its weight.
    assert saved["0"] == {"activation": 0, "parameter": 0, "input": BATCH * D_IN * F32}
    assert saved["1"] == {"activation": activation, "parameter": 0, "input": 0}
    assert saved["2"] == {"activation": activation, "parameter": D_HID * D_IN * F32, "input": 0}
    text = render_to_text(tree_table(adamw_run["profile"]), width=250)
    assert "Saved" in text and "Fwd net" in text and "Peak f/b" in text


def test_backward_peaks_are_running_peaks_over_the_backward() -> None:
    """Two Linear(1024, 1024) blocks: the root's backward keeps both weight gradients at once, so
    its peak is at least their sum, not the largest single autograd node."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(1024, 1024)), nn.Sequential(nn.Linear(1024, 1024)))
    x = torch.randn(8, 1024)
    with ls.profile(model, memory=True) as prof:
        model(x).sum().backward()
    profile = prof.profile
    profile.validate()
    weight_grads = 2 * 1024 * 1024 * F32
    root = profile.root.backward
    assert root.cpu_relative_peak_bytes >= weight_grads  # the largest node holds one weight gradient
    assert root.cpu_relative_peak_bytes >= root.net_bytes
    for child in profile.root.children:
        assert child.backward.cpu_relative_peak_bytes >= 1024 * 1024 * F32
        assert root.cpu_relative_peak_bytes >= child.backward.cpu_relative_peak_bytes


def test_unattributed_work_gets_peaks(adamw_run: dict[str, Any]) -> None:
    entries = {e.label: e for e in adamw_run["profile"].unattributed}
    step = next(e for label, e in entries.items() if label.startswith("Optimizer.step"))
    # AdamW's step allocates a temporary about the parameters' size (its denominator) at once.
    assert step.metrics.cpu_relative_peak_bytes >= 0.99 * _param_bytes(adamw_run["model"])


def test_step_peaks_do_not_depend_on_the_schedule() -> None:
    """SGD with momentum: step 0 creates the momentum buffers; every step's absolute peak is the
    same whatever the schedule recorded before it."""

    def run(schedule: Any) -> dict[int, tuple[int | None, int | None]]:
        model = _mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(BATCH, D_IN)
        found: dict[int, tuple[int | None, int | None]] = {}
        # Garbage of earlier profiled tests freed inside a step would count in its net change
        # (torch reports frees of memory allocated while any profiler recorded).
        gc.collect()

        def keep(cycle: ls.Cycle) -> None:
            cycle.profile.validate()
            for step in cycle.profile.steps:
                found[step.step] = (step.absolute_peak_bytes, step.net_bytes)

        with ls.profile(model, memory=True, schedule=schedule, on_trace_ready=keep) as prof:
            for _ in range(3):
                _adamw_step(model, optimizer, x)
                prof.step()
        return found

    everything = run(ls.schedule(wait=0, warmup=0, active=3, repeat=1))
    late = run(ls.schedule(wait=1, warmup=1, active=1, repeat=1))
    assert set(everything) == {0, 1, 2} and set(late) == {2}
    assert late[2] == everything[2]
    params = _param_bytes(_mlp())
    # Step 0 leaves the momentum buffers behind (the gradients are freed by zero_grad); later
    # steps leave nothing.
    assert everything[0][1] == params and everything[1][1] == 0
    assert everything[0][0] is not None and everything[1][0] is not None
    assert everything[1][0] == everything[2][0] >= 3 * params  # parameters, gradients, momentum


class _Fails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_a_shape_error_in_the_block_keeps_the_profile() -> None:
    model = nn.Sequential(nn.Linear(3, 3), _Fails())
    with pytest.raises(RuntimeError), ls.profile(model, memory=True) as prof:
        model(torch.randn(2, 3))  # the second layer expects 4 features
    profile = prof.profile
    profile.validate()
    error = profile.meta.capture.block_error if profile.meta.capture is not None else None
    assert error is not None and error.type == "RuntimeError" and error.module == "1.fc"
    assert profile.meta.capture.flop_formula_failures["aten::addmm"] == 1
    assert profile.find("0").forward.flops == 2 * 3 * 3 * 2
    assert "the block raised RuntimeError in 1.fc" in str(profile)


class _Greedy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.empty(2**50, dtype=torch.uint8).sum()


def test_out_of_memory_names_the_module_and_the_request(tmp_path: Path) -> None:
    if native.load() is None:  # torch's bindings do not expose the request's size (bindings_reader.py)
        pytest.skip("the out-of-memory request's size is read by the native module only")
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(_Greedy()))
    with pytest.raises(RuntimeError), ls.profile(model, memory=True) as prof:
        model(torch.randn(2, 8))
    profile = prof.profile
    profile.validate()
    (oom,) = profile.meta.memory.out_of_memory
    assert oom.requested_bytes == 2**50
    assert (oom.module, oom.phase, oom.op) == ("1.0", "forward", "aten::empty")
    assert oom.live_bytes is not None and oom.live_bytes >= _param_bytes(model)
    assert "out of memory in 1.0 forward (aten::empty): asked for 1.00 PiB" in str(profile)
    assert profile.meta.capture.block_error.module == "1.0"
    # The trace carries torch's [OutOfMemory] event: read back, the same request and place.
    trace = prof.export_chrome_trace(tmp_path / "oom.json")
    (again,) = ls.load(trace).meta.memory.out_of_memory
    assert (again.requested_bytes, again.module, again.op) == (2**50, "1.0", "aten::empty")


def test_memory_at_peak_survives_save_and_the_cli_shows_it(
    adamw_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = adamw_run["profile"].save(tmp_path / "run.json")
    loaded = ls.load(path)
    assert loaded.memory_at_peak() == adamw_run["profile"].memory_at_peak()
    frame = loaded.to_pandas("memory_peak")
    assert int(frame["bytes"].sum()) == loaded.memory_at_peak().absolute_peak_bytes
    assert main(["show", str(path), "--memory-peak"]) == 0
    out = capsys.readouterr().out
    assert "optimizer_state" in out and "Saved for backward" in out and "was live before the block" in out
    assert main(["show", str(path), "--memory-peak", "--memory-device", "device"]) == 1
    assert "no device memory" in capsys.readouterr().err


def test_profiles_without_memory_say_so() -> None:
    model = nn.Linear(2, 2)
    with ls.profile(model) as prof:
        model(torch.randn(1, 2))
    with pytest.raises(ls.LayerscopeError, match="memory=True"):
        prof.profile.memory_at_peak()


def test_a_real_gpu_traces_peak_is_the_allocators_own() -> None:
    """An H100 trace (benchmarks/gpu_traces.py, memory_block): what the allocator held before the
    first event plus the running total gives the highest "Total Allocated" torch recorded."""
    profile = ls.load(Path(__file__).parent / "fixtures" / "gpu" / "memory_block.json.gz")
    profile.validate()
    at_peak = profile.memory_at_peak()
    assert at_peak.device and not at_peak.categorised
    assert at_peak.absolute_peak_bytes == profile.meta.trace.peak_allocated_bytes["device"] == 1_127_465_984
    assert at_peak.baseline_bytes == 305_250_304  # "Total Allocated" less "Bytes" of the first event
    assert at_peak.where is not None and at_peak.where["phase"] == "backward"
    assert sum(r.bytes for r in at_peak.rows) == at_peak.absolute_peak_bytes


def test_the_html_report_shows_what_was_live_at_the_peak(adamw_run: dict[str, Any]) -> None:
    from layerscope.render.html import html_report

    page = html_report(adamw_run["profile"])
    panel = page[page.index('<div id="memorypeak">') :]
    assert "Live at the peak" in panel and "Saved for backward" in panel
    assert panel.count('class="peakrow"') == len(adamw_run["profile"].memory_at_peak().rows)
    assert "optimizer_state · (before the block)" in panel  # AdamW's state predates the block


def test_the_watch_never_runs_the_users_saved_tensor_hooks() -> None:
    """Reading saved tensors must not unpack them: an unpack hook may copy an offloaded tensor back
    or recompute a checkpointed region. Outputs stay bit-identical and the hooks run as often."""
    model = _mlp()
    x = torch.randn(8, D_IN)
    calls = {"pack": 0, "unpack": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        calls["pack"] += 1
        return t.clone()

    def unpack(t: torch.Tensor) -> torch.Tensor:
        calls["unpack"] += 1
        return t

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = model(x)
        out.sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad()
        return out.detach(), grads

    plain_out, plain_grads = step()
    plain_calls = dict(calls)
    calls.update(pack=0, unpack=0)
    with ls.profile(model, memory=True) as prof:
        out, grads = step()
    assert calls == plain_calls
    assert torch.equal(out, plain_out) and all(
        torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True)
    )
    prof.profile.validate()


def test_every_hook_is_removed_when_the_block_raises() -> None:
    from torch.optim import optimizer as optim_module

    model = nn.Sequential(nn.Linear(3, 3), _Fails())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = (
        len(optim_module._global_optimizer_pre_hooks),
        len(optim_module._global_optimizer_post_hooks),
    )
    with pytest.raises(RuntimeError), ls.profile(model, memory=True):
        optimizer.step()
        model(torch.randn(2, 3))
    after = (
        len(optim_module._global_optimizer_pre_hooks),
        len(optim_module._global_optimizer_post_hooks),
    )
    assert after == before
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda c: c.update(absolute_peak_bytes=c["baseline_bytes"] - 1), "below what was live before"),
        (lambda c: c["rows"].append(["other", "x", "", 1]), "adds up to"),
        (lambda c: c["steps"].append([99, c["absolute_peak_bytes"] + 1, 0, 0]), "step 99's peak"),
    ],
)
def test_validate_catches_impossible_memory_figures(
    adamw_run: dict[str, Any], tamper: Any, message: str
) -> None:
    from dataclasses import replace

    from layerscope.model.memory import MemoryReport

    profile = adamw_run["profile"]
    figures = profile.meta.memory.to_json()
    tamper(figures["classes"][0])
    meta = replace(profile.meta, memory=MemoryReport.from_json(figures))
    with pytest.raises(ls.ValidationError, match=message):
        replace(profile, meta=meta).validate()
