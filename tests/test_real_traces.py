"""Device-time attribution on real traces from NVIDIA, AMD and CPU-only machines (third-party data
in ../shared/traces; skipped where absent, never committed)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest

import layerscope as ls
from layerscope.attribution.attribute import LABEL_UNLINKED_DEVICE

TRACES = [
    "cuda_alexnet.json.gz",
    "cuda_nccl_distributed.json.gz",
    "amd_mi250_train.json.gz",
    "cpu_only_rank34.pt.trace.json.gz",
    "cuda_triton.json.gz",
    "compare/base.json.gz",
    "compare/test.json.gz",
    "two_ranks/rank-0.json.gz",
]
DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def raw_events(path: Path) -> list[dict[str, object]]:
    events = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return [e for e in events if isinstance(e, dict)]


@pytest.mark.parametrize("name", TRACES)
def test_real_trace_validates_and_device_time_reconciles(real_traces: Path, name: str) -> None:
    path = real_traces / name
    p = ls.load(path)
    p.validate()
    events = raw_events(path)
    device_us = sum(
        float(e.get("dur", 0)) for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES
    )  # type: ignore[arg-type]
    assert p.totals.device_us == pytest.approx(device_us, rel=1e-6, abs=1e-3)
    assert sum(r.metrics.self_device_us for r in p.op_rows) == pytest.approx(device_us, rel=1e-6, abs=1e-3)


def test_alexnet_every_kernel_finds_its_launching_op(real_traces: Path) -> None:
    """Older Kineto writes the runtime call's correlation into kernels' External id: kernels link
    through the runtime call to the op around it."""
    p = ls.load(real_traces / "cuda_alexnet.json.gz")
    assert not [e for e in p.unattributed if e.label == LABEL_UNLINKED_DEVICE]
    conv = [r for r in p.ops(group_by=("name",)) if r.name == "aten::cudnn_convolution"]
    assert conv and conv[0].metrics.device_us > 0


def test_backward_device_time_goes_to_backward_nodes(real_traces: Path) -> None:
    for name in ("cuda_nccl_distributed.json.gz", "amd_mi250_train.json.gz"):
        p = ls.load(real_traces / name)
        backward = [e for e in p.unattributed if e.phase is ls.Phase.BACKWARD]
        assert backward, name
        assert sum(e.metrics.device_us for e in backward) > 0, name
        forward_like = [e for e in p.unattributed if e.phase is ls.Phase.OTHER]
        assert sum(e.metrics.device_us for e in forward_like) > 0, name


def test_amd_trace_flops_and_shapes(real_traces: Path) -> None:
    p = ls.load(real_traces / "amd_mi250_train.json.gz")
    addmm = [r for r in p.ops(group_by=("name", "input_shapes")) if r.name == "aten::addmm"]
    assert addmm and all(r.input_shapes for r in addmm)
    assert p.totals.flops > 0  # torch's formulas over the recorded shapes
    assert len(p.steps) == 2 and all(s.wall_us > 0 for s in p.steps)


def test_kernel_kinds_of_every_real_kernel_name(real_traces: Path, golden: Any) -> None:
    """The kernel classifier against every distinct kernel name in the real traces: a table reviewed
    once by hand (tests/golden/kernel_kinds.tsv); a change of kind shows up as a diff there."""
    import gzip

    import orjson

    from layerscope.analysis.device import kernel_kind
    from layerscope.events.table import EventKind

    names: set[str] = set()
    for path in sorted(real_traces.rglob("*.json*")):
        raw = path.read_bytes()
        data = orjson.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
        events = data.get("traceEvents", []) if isinstance(data, dict) else []
        names.update(e["name"] for e in events if isinstance(e, dict) and e.get("cat") == "kernel")
    table = "".join(f"{kernel_kind(n, int(EventKind.KERNEL))}\t{n}\n" for n in sorted(names))
    golden("kernel_kinds.tsv", table)
