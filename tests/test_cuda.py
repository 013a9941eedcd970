"""The live device path on a real accelerator (skipped where torch sees no CUDA device).

CI has no GPU; these run on a lent GPU machine. They check what the CPU-only suite cannot: kernels
captured live are linked to their launching op, module and phase, and the totals match torch's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.autograd import DeviceType

import layerscope as ls
from layerscope.attribution.compiled import LABEL_COMPILING
from layerscope.events.names import MODULE_RANGE_PREFIX, PROFILER_STEP_PREFIX
from layerscope.loading import analyze
from tests.fixtures.models import tiny_resnet

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def capture(memory: bool) -> tuple[ls.profile, ls.Profile]:
    model = tiny_resnet().cuda()
    x = torch.randn(4, 3, 64, 64, device="cuda")
    model(x).sum().backward()
    torch.cuda.synchronize()
    with ls.profile(model, memory=memory) as prof:
        model(x).sum().backward()
        torch.cuda.synchronize()
    p = prof.profile
    p.validate()
    return prof, p


@pytest.mark.parametrize("memory", [False, True])
def test_kernels_go_to_modules_forward_and_backward(memory: bool) -> None:
    _, p = capture(memory)
    conv = p.find("layer1.0.conv1")
    assert conv.forward.device_us > 0 and conv.backward.device_us > 0
    linked = p.root.forward.device_us + p.root.backward.device_us
    assert linked >= 0.8 * p.totals.device_us  # nearly all device time has a module
    if memory:
        assert conv.forward.device_alloc_bytes > 0 and conv.forward.device_relative_peak_bytes > 0


def test_device_totals_match_key_averages() -> None:
    prof, p = capture(False)
    averages = prof.torch_profiler.key_averages()
    # torch's own "Self CUDA time total" (profiler_util._build_table): the device-type rows (its
    # kernels, copies and sets) that are not user annotations. Op rows carry their kernels' time too,
    # and ProfilerStep#N's device-side span runs from its first kernel to its last, gaps included.
    theirs = sum(
        e.self_device_time_total
        for e in averages
        if e.device_type != DeviceType.CPU
        and not getattr(e, "is_user_annotation", False)
        and not e.key.startswith((PROFILER_STEP_PREFIX, MODULE_RANGE_PREFIX))
    )
    assert p.totals.device_us == pytest.approx(theirs, rel=0.02)


def test_compiled_model_triton_kernels_go_to_modules() -> None:
    """torch.compile on CUDA (Triton kernels): device time lands in the modules inside the compiled
    region, forward and backward, as on the CPU path (tests/test_compile.py)."""
    pytest.importorskip("triton")
    from tests.fixtures.models import WideAmongNarrow

    torch._dynamo.reset()
    model = torch.compile(WideAmongNarrow().cuda())
    x = torch.randn(4096, 32, device="cuda")
    with ls.profile(model) as prof:
        for _ in range(2):
            model(x).sum().backward()
        torch.cuda.synchronize()
    p = prof.profile
    p.validate()
    assert p.meta.compiled.mapped_graph_calls == p.meta.compiled.graph_calls > 0
    mid = p.find("wide.mid")
    assert mid.forward.device_us > 0 and mid.backward.device_us > 0
    below = sum(c.total.device_us for c in p.root.children)
    assert below >= 0.8 * p.root.total.device_us
    # Inductor benchmarks its kernels' configurations at the first call (autotuning, on a fresh
    # cache): those runs are compiling, not the model's work.
    triton_rows = [
        r
        for r in p.ops(group_by=("name", "module"))
        if r.name.startswith("triton_") and r.scope != LABEL_COMPILING
    ]
    assert triton_rows and all(r.module is not None for r in triton_rows)


@pytest.mark.parametrize("memory", [False, True])
def test_native_reader_reads_device_captures_as_the_bindings_do(memory: bool) -> None:
    """Kernels, memcpys, runtime calls and device allocations: the native reader's table equals the
    bindings' (activity kinds through torch's names, correlation links, device memory)."""
    from layerscope.capture import native
    from layerscope.capture.bindings_reader import table_from_bindings
    from layerscope.capture.flops import FlopCalculator
    from layerscope.capture.native_table import table_from_native
    from layerscope.events.table import EventKind
    from tests.test_native_reader import COLUMNS

    module = native.load()
    if module is None:
        pytest.skip(f"native reader not in use: {native.status().reason}")
    prof, _ = capture(memory)
    results = prof.torch_profiler.profiler.kineto_results
    expected = table_from_bindings(results, FlopCalculator(), shapes=True, cpu_only=False)
    found = table_from_native(module, results, FlopCalculator(), shapes=True, cpu_only=False)
    expected.drop_clock_anchors()  # kept by the bindings; the native reader leaves them out
    for column in COLUMNS:
        assert getattr(found, column) == getattr(expected, column), column
    assert found.threads == expected.threads and expected.threads  # device work on its streams' threads
    assert int(EventKind.KERNEL) in set(expected.span_kind)
    assert any(expected.mem_on_device) == memory


@pytest.mark.parametrize("threads", [2, 5])
def test_native_reader_threads_read_device_captures_as_one_pass(threads: int) -> None:
    """Stretches read on threads and joined (``read_columns``): the device rows (kernels, copies,
    runtime calls on their streams) and device memory come out as one pass gives them."""
    from layerscope.capture import native

    module = native.load()
    if module is None:
        pytest.skip(f"native reader not in use: {native.status().reason}")
    prof, _ = capture(True)
    results = prof.torch_profiler.profiler.kineto_results
    one = module.read_columns(results, True, 1)
    assert len(one["device_row"]) > 0 and len(one["mem_bytes"]) > 0
    assert module.read_columns(results, True, threads) == one


def test_device_memory_peak_is_absolute_and_categorised() -> None:
    """On the caching allocator: the baseline is torch.cuda.memory_allocated() at the start, the
    peak matches the allocator's own max_memory_allocated over the block, parameters and gradients
    are named, and a refused allocation names its module and size."""
    model = tiny_resnet().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(4, 3, 64, 64, device="cuda")
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with ls.profile(model, memory=True) as prof:
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.synchronize()
    p = prof.profile
    p.validate()
    at_peak = p.memory_at_peak("device")
    assert at_peak.device and at_peak.baseline_bytes == before
    assert at_peak.absolute_peak_bytes == torch.cuda.max_memory_allocated()
    params = sum(t.numel() * t.element_size() for t in model.parameters())
    categories = at_peak.by_category()
    assert categories["parameter"] >= params and categories["optimizer_state"] >= params

    class Greedy(torch.nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return t + torch.empty(2**50, dtype=torch.uint8, device="cuda").sum()

    greedy = torch.nn.Sequential(torch.nn.Linear(8, 8), Greedy()).cuda()
    with pytest.raises(torch.OutOfMemoryError), ls.profile(greedy, memory=True) as failing:
        greedy(torch.randn(2, 8, device="cuda"))
    (oom,) = failing.profile.meta.memory.out_of_memory
    assert oom.device and oom.requested_bytes >= 2**50 and oom.module == "1"


def test_device_baseline_counts_every_tensor_alive_at_entry() -> None:
    """Plain tensors made before the block (a 32 MiB attribute, an 8 MiB target, 16 MiB freed
    inside the block): the baseline is the allocator's own figure, the scan sees them all and no
    more than the allocator counts, they read `other`, the freed one stops counting when the
    allocator reports its free, and the scan allocates nothing on the device."""
    import gc

    from layerscope.capture.live_tensors import scan_live
    from layerscope.model.memory_view import BEFORE_BLOCK

    mib = 2**20
    gc.collect()
    model = torch.nn.Linear(64, 64).cuda()
    model.table = torch.randn(8 * mib, device="cuda")  # 32 MiB, neither parameter nor buffer
    target = torch.randn(2 * mib, device="cuda")
    scratch = [torch.empty(16 * mib, dtype=torch.uint8, device="cuda")]
    x = torch.randn(16, 64, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    scan_live()
    assert torch.cuda.memory_allocated() == before
    torch.cuda.reset_peak_memory_stats()
    with ls.profile(model, memory=True) as prof:
        scratch.clear()  # freed: the allocator reports it, at the scanned address
        wide = torch.empty(24 * mib, dtype=torch.uint8, device="cuda")  # the peak, after the free
        loss = (model(x) * model.table.sum()).sum() + target.sum() + wide[:1].float().sum()
        loss.backward()
        torch.cuda.synchronize()
    p = prof.profile
    p.validate()
    at_peak = p.memory_at_peak("device")
    assert at_peak.baseline_bytes == at_peak.baseline_allocator_bytes == before
    made = 56 * mib + sum(t.numel() * t.element_size() for t in model.parameters()) + x.numel() * 4
    assert at_peak.baseline_seen_bytes is not None and made <= at_peak.baseline_seen_bytes <= before
    assert at_peak.absolute_peak_bytes == torch.cuda.max_memory_allocated()  # the freed 16 MiB not counted
    other = sum(r.bytes for r in at_peak.rows if r.module == BEFORE_BLOCK and r.category == "other")
    assert other >= 40 * mib


def test_live_device_summary_matches_the_exported_traces(tmp_path: Path) -> None:
    """A live capture keeps the device summary (``meta.device``) its exported trace gives when
    analysed: the same function computes both, from the same kernels."""
    prof, p = capture(False)
    live = p.meta.device
    assert live is not None and live.launches > 0 and live.streams
    analysed = analyze(prof.export_chrome_trace(tmp_path / "trace.json")).profile.meta.device
    assert analysed is not None
    assert live.launches == analysed.launches

    # per stream, as the trace names it (device, stream), not per launching thread
    def per_stream(streams: tuple[dict[str, Any], ...]) -> list[tuple[Any, ...]]:
        return [(s["device"], s["stream"], s["kernels"]) for s in streams]

    assert per_stream(live.streams) == per_stream(analysed.streams)
    assert live.busy_us == pytest.approx(analysed.busy_us, rel=0.02)
