"""``layerscope analyze``: device report, advice rules, folders of traces."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

import layerscope as ls
from layerscope.analysis.advice import advise
from layerscope.analysis.device import device_report, kernel_kind
from layerscope.attribution import build_profile
from layerscope.cli import main
from layerscope.events import EventKind, EventTable
from layerscope.loading import analyze

US = 1000


def gpu_table(kernels: int, kernel_us: int, step_us: int, sync: bool) -> EventTable:
    """Two steps on thread 1, each launching ``kernels`` kernels on device 0 (stream 7)."""
    t = EventTable()
    t.threads = {1: (100, 100), 2: (0, 7)}
    cursor = 0
    corr = 1
    for step in range(2):
        t.add_span(f"ProfilerStep#{step}", EventKind.USER_ANNOTATION, 1, cursor, step_us * US)
        op_start = cursor + 10 * US
        t.add_span("aten::add", EventKind.CPU_OP, 1, op_start, (kernels * 6 + 10) * US, ext=corr)
        for k in range(kernels):
            launch = op_start + (1 + 6 * k) * US
            t.add_span("cudaLaunchKernel", EventKind.RUNTIME, 1, launch, 5 * US, corr=corr + k + 1)
            t.add_span(
                "void at::native::vectorized_elementwise_kernel<4, add>",
                EventKind.KERNEL,
                2,
                max(launch + 2 * US, op_start + (2 + k * kernel_us) * US),  # one stream: back to back
                kernel_us * US,
                corr=corr + k + 1,
                ext=corr,
            )
        if sync:
            t.add_span("aten::item", EventKind.CPU_OP, 1, op_start + (kernels * 6 + 20) * US, 30 * US)
            t.add_span(
                "cudaStreamSynchronize", EventKind.RUNTIME, 1, op_start + (kernels * 6 + 21) * US, 25 * US
            )
        corr += kernels + 1
        cursor += step_us * US
    return t


def test_device_report_numbers() -> None:
    table = gpu_table(kernels=4, kernel_us=3, step_us=1000, sync=True)
    report = device_report(table)
    assert report is not None
    assert report.busy_us == pytest.approx(2 * 4 * 3)  # kernels do not overlap
    assert report.launches == 8 and report.tiny_kernels == 8
    assert report.launch_bound == 8  # each 3 µs kernel is shorter than its 5 µs launch
    assert report.by_kind == {"elementwise": pytest.approx(24.0)}
    assert [(s.call, s.op, s.count) for s in report.syncs] == [("cudaStreamSynchronize", "aten::item", 2)]
    assert [s.verdict for s in report.steps] == ["CPU-bound", "CPU-bound"]
    assert report.kernels[0].mean_us == pytest.approx(3.0)


def test_advice_fires_on_evidence_and_stays_silent_without_it() -> None:
    storm = gpu_table(kernels=150, kernel_us=2, step_us=2000, sync=False)
    profile = build_profile(storm, None)
    rules = {a.rule for a in advise(profile, device_report(storm))}
    assert {"tiny-kernel-storm", "low-device-utilisation"} <= rules
    assert "host-device-syncs" not in rules and "fp32-matmul" not in rules  # no syncs; hardware unknown
    busy = gpu_table(kernels=4, kernel_us=240, step_us=1000, sync=False)
    rules = {a.rule for a in advise(build_profile(busy, None), device_report(busy))}
    assert "low-device-utilisation" not in rules and "tiny-kernel-storm" not in rules


@pytest.mark.parametrize(
    ("name", "kind", "expected"),
    [
        ("ampere_sgemm_128x64_tn", EventKind.KERNEL, "gemm"),
        ("ncclKernel_AllReduce_RING", EventKind.KERNEL, "communication"),
        ("Memcpy HtoD (Pageable -> Device)", EventKind.MEMCPY, "memcpy H2D"),
        ("flash_fwd_kernel", EventKind.KERNEL, "attention"),
        ("Memset (Device)", EventKind.MEMSET, "memset"),
        ("implicit_convolve_sgemm", EventKind.KERNEL, "convolution"),
    ],
)
def test_kernel_kinds(name: str, kind: EventKind, expected: str) -> None:
    assert kernel_kind(name, kind) == expected


def test_analyze_real_traces(real_traces: Path) -> None:
    result = analyze(real_traces / "cuda_nccl_distributed.json.gz")
    result.profile.validate()
    assert result.device is not None and 0 < result.device.utilisation < 1
    assert result.device.by_kind["communication"] > 0
    assert {a.rule for a in result.advice} >= {"low-device-utilisation", "channels-last"}
    cpu = analyze(real_traces / "cpu_only_rank34.pt.trace.json.gz")
    assert cpu.device is None  # no device activity: no device section, no device advice


def test_analyze_cli_on_a_tensorboard_folder(
    real_traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "tb" / "worker0"
    logs.mkdir(parents=True)
    shutil.copy(real_traces / "cpu_only_rank34.pt.trace.json.gz", logs / "host_1.pt.trace.json.gz")
    (logs / "host_2.pt.trace.json").write_bytes(
        gzip.decompress((real_traces / "amd_mi250_train.json.gz").read_bytes())
    )
    assert main(["analyze", str(tmp_path / "tb"), "--ascii", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("== ") == 2 and "Device: busy" in out and "Advice:" in out


def test_analyze_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(tmp_path)]) == 2
    assert "no .json or .json.gz trace" in capsys.readouterr().err
    assert ls.load is not None


def test_with_stack_trace_gives_a_module_tree(tmp_path: Path) -> None:
    """A plain torch.profiler trace recorded with with_stack: nn.Module events become the tree."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        model(torch.randn(2, 8)).sum().backward()
    path = tmp_path / "stack.json"
    prof.export_chrome_trace(str(path))
    profile = ls.load(path)
    profile.validate()
    node = profile.find("Sequential_0.Linear_1")
    assert node.type_name == "Linear" and node.calls == 1
    assert node.forward.cpu_us > 0 and node.backward.cpu_us > 0  # backward via sequence numbers
    assert [c.path for c in profile.find("Sequential_0").children] == [
        "Sequential_0.Linear_0",
        "Sequential_0.ReLU_0",
        "Sequential_0.Linear_1",
    ]


def test_memory_near_capacity_uses_the_allocator_total(tmp_path: Path) -> None:
    import json

    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::empty",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 10,
            "args": {"External id": 1},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "fill_kernel",
            "pid": 0,
            "tid": 7,
            "ts": 5,
            "dur": 3,
            "args": {"External id": 1},
        },
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "name": "[memory]",
            "pid": 1,
            "tid": 1,
            "ts": 2,
            "args": {"Bytes": 1024, "Total Allocated": 78 * 2**30, "Device Type": 1, "Device Id": 0},
        },
    ]
    trace = {
        "deviceProperties": [{"id": 0, "totalGlobalMem": 80 * 2**30, "computeMajor": 9}],
        "traceEvents": events,
    }
    path = tmp_path / "full.json"
    path.write_text(json.dumps(trace))
    rules = {a.rule: a for a in analyze(path).advice}
    assert "memory-near-capacity" in rules
    assert rules["memory-near-capacity"].evidence["absolute_peak_bytes"] == 78 * 2**30
    trace["traceEvents"][2]["args"]["Total Allocated"] = 10 * 2**30
    path.write_text(json.dumps(trace))
    assert "memory-near-capacity" not in {a.rule for a in analyze(path).advice}


def _plain_trace(tmp_path: Path, annotate: bool) -> Path:
    """A plain torch.profiler trace (no layerscope, no with_stack) of a forward + backward."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(32, 8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        if annotate:
            with torch.profiler.record_function("## forward ##"):
                loss = model(x).sum()
            with torch.profiler.record_function("## backward ##"):
                loss.backward()
        else:
            model(x).sum().backward()
    path = tmp_path / f"plain-{annotate}.json"
    prof.export_chrome_trace(str(path))
    return path


def test_a_trace_without_modules_shows_its_annotations_as_regions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = ls.load(_plain_trace(tmp_path, annotate=True))
    profile.validate()
    assert profile.meta.module_source == "record_function regions"
    forward = profile.find("## forward ##")
    assert forward.type_name == "record_function" and forward.calls == 1
    # the forward ops' backward nodes (sequence numbers) come back to the region that ran them
    assert forward.forward.cpu_us > 0 and forward.backward.cpu_us > 0
    assert profile.find("## backward ##").forward.cpu_us > 0  # the engine's own time in that range
    assert main(["analyze", str(_plain_trace(tmp_path, annotate=True)), "--ascii"]) == 0
    err = capsys.readouterr().err
    assert err.count("layerscope: note: this trace has no module information") == 1


def test_without_annotations_recorded_ops_are_forward_not_other(tmp_path: Path) -> None:
    profile = ls.load(_plain_trace(tmp_path, annotate=False))
    profile.validate()
    assert profile.meta.module_source == "none"
    phases = {u.label: str(u.phase) for u in profile.unattributed}
    assert phases["aten::linear"] == "forward" and phases["aten::relu"] == "forward"
    assert any(p == "backward" for p in phases.values())


@pytest.mark.parametrize("workers", [None, "2"])
def test_analyze_folder_goes_past_a_bad_file(
    real_traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: str | None
) -> None:
    """A file that is not a trace (it sorts first) fails alone: the real trace is still analysed,
    the failure is one line, exit 1; the same with and without --workers."""
    (tmp_path / "a_execution_trace.json").write_text('{"nodes": []}')
    shutil.copy(real_traces / "compare" / "base.json.gz", tmp_path / "b.json.gz")
    argv = ["analyze", str(tmp_path), "--top", "0"] + (["--workers", workers] if workers else [])
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert "b.json.gz" in out and "Device" in out
    errors = [line for line in err.splitlines() if line.startswith("layerscope: error:")]
    assert len(errors) == 1 and errors[0].count("a_execution_trace.json") == 1


def test_older_kineto_categories_are_read(tmp_path: Path) -> None:
    """Older Kineto spells the categories Operator, Runtime and Kernel; they read as cpu_op,
    cuda_runtime and kernel do: the kernel links to its op through the runtime call."""

    def span(cat: str, name: str, tid: int, ts: int, dur: int, **args: int) -> dict[str, object]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}

    events = [
        span("Operator", "aten::mm", 1, 0, 20, **{"External id": 4}),
        span("Runtime", "cudaLaunchKernel", 1, 2, 5, correlation=9, **{"External id": 4}),
        span("Kernel", "gemm_kernel", 7, 10, 30, correlation=9, **{"External id": 4}),
    ]
    path = tmp_path / "old_kineto.json"
    path.write_text(json.dumps({"traceEvents": events}))
    result = analyze(path)
    result.profile.validate()
    (row,) = [r for r in result.profile.op_rows if r.name == "aten::mm"]
    assert row.metrics.device_us == pytest.approx(30.0)
    assert result.device is not None and result.device.busy_us == pytest.approx(30.0)


def test_gpu_side_step_annotations_are_no_steps(real_traces: Path) -> None:
    """amd_mi250_train.json.gz mirrors ProfilerStep#1 on the GPU timeline (gpu_user_annotation): the
    step verdicts are the CPU steps 1 and 2 only, not a second step 1."""
    result = analyze(real_traces / "amd_mi250_train.json.gz")
    assert result.device is not None
    assert [s.step for s in result.device.steps] == [1, 2]
