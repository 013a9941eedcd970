"""Small Chrome traces, checkable by hand, where Holistic Trace Analysis's critical path is wrong
(``tests/test_critical_better.py``; ``docs/compared.md`` has HTA's own figures on them, from
``tests/fixtures/critical_path/make_hta_reference.py --synthetic``). Times in µs, one CPU thread
(tid 1), device work on stream 7.
"""

from __future__ import annotations

from typing import Any

#: the trace header HTA's reader needs (a device, a distributed rank)
_HEADER: dict[str, Any] = {
    "schemaVersion": 1,
    "distributedInfo": {"rank": 0, "world_size": 1},
    "deviceProperties": [{"id": 0, "name": "synthetic"}],
}


def span(name: str, cat: str, ts: int, dur: int, tid: int = 1, pid: int = 1, **args: Any) -> dict[str, Any]:
    """One complete event."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def work(name: str, cat: str, ts: int, dur: int, correlation: int) -> dict[str, Any]:
    """Device work on stream 7 of device 0."""
    return span(name, cat, ts, dur, tid=7, pid=0, correlation=correlation, stream=7, device=0)


def trace(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A whole trace document."""
    return {**_HEADER, "traceEvents": events}


def blocking_copy() -> dict[str, Any]:
    """``x.item()`` after a matmul, no ``cuda_sync`` events: ``aten::mm`` (0-20) launches ``gemm``
    (15-215); ``aten::_local_scalar_dense`` (25-230) copies the result to pageable memory with
    ``cudaMemcpyAsync`` (30-228), whose copy runs after ``gemm`` (215-220) and which returns 8 µs
    after the copy ends; then ``aten::add`` (235-245). The CPU waited 185 µs for the GPU."""
    return trace(
        [
            span("ProfilerStep#1", "user_annotation", 0, 250),
            span("aten::mm", "cpu_op", 0, 20),
            span("cudaLaunchKernel", "cuda_runtime", 5, 5, correlation=1),
            work("gemm", "kernel", 15, 200, 1),
            span("aten::_local_scalar_dense", "cpu_op", 25, 205),
            span("cudaMemcpyAsync", "cuda_runtime", 30, 198, correlation=2),
            work("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 215, 5, 2),
            span("aten::add", "cpu_op", 235, 10),
        ]
    )


def cuda_graph() -> dict[str, Any]:
    """A CUDA graph replay: ``aten::fill_`` (0-10) launches ``fill`` (10-14); ``CUDAGraph::replay``
    (12-40) calls ``cudaGraphLaunch`` (15-35), which queues three kernels, ``k0`` (40-90), ``k1``
    (92-142), ``k2`` (144-194), all with the launch's correlation id (as Kineto writes graph
    kernels); ``cudaDeviceSynchronize`` (45-200, with its ``Context Sync`` event), then
    ``aten::add`` (205-215). The step is the graph's 154 µs of kernels and what leads to them."""
    return trace(
        [
            span("ProfilerStep#1", "user_annotation", 0, 220),
            span("aten::fill_", "cpu_op", 0, 10),
            span("cudaLaunchKernel", "cuda_runtime", 2, 5, correlation=3),
            work("fill", "kernel", 10, 4, 3),
            span("CUDAGraph::replay", "cpu_op", 12, 28),
            span("cudaGraphLaunch", "cuda_runtime", 15, 20, correlation=1),
            work("k0", "kernel", 40, 50, 1),
            work("k1", "kernel", 92, 50, 1),
            work("k2", "kernel", 144, 50, 1),
            span("cudaDeviceSynchronize", "cuda_runtime", 45, 155, correlation=2),
            span("Context Sync", "cuda_sync", 194, 6, tid=7, pid=0, correlation=2, stream=-1, device=0),
            span("aten::add", "cpu_op", 205, 10),
        ]
    )


def lagging_gpu() -> dict[str, Any]:
    """Step 1 (0-100) launches ``big`` (``cudaLaunchKernel`` 10-15; the kernel runs 20-250). Step 2
    (100-330): ``aten::mm`` (105-115) launches ``small`` (107-112), which waits on the stream
    behind ``big`` and runs 250-300; ``cudaDeviceSynchronize`` (120-305, ``Context Sync``), then
    ``aten::add`` (310-320). Step 2 is as long as it is because the GPU was still busy with
    step 1's kernel when it began. (Step 3, 330-360, is there for HTA, which drops a trace's
    last step.)"""
    return trace(
        [
            span("ProfilerStep#1", "user_annotation", 0, 100),
            span("aten::conv", "cpu_op", 5, 20),
            span("cudaLaunchKernel", "cuda_runtime", 10, 5, correlation=1),
            work("big", "kernel", 20, 230, 1),
            span("ProfilerStep#2", "user_annotation", 100, 230),
            span("aten::mm", "cpu_op", 105, 10),
            span("cudaLaunchKernel", "cuda_runtime", 107, 5, correlation=2),
            work("small", "kernel", 250, 50, 2),
            span("cudaDeviceSynchronize", "cuda_runtime", 120, 185, correlation=3),
            span("Context Sync", "cuda_sync", 300, 5, tid=7, pid=0, correlation=3, stream=-1, device=0),
            span("aten::add", "cpu_op", 310, 10),
            span("ProfilerStep#3", "user_annotation", 330, 30),
            span("aten::zero_", "cpu_op", 335, 5),
        ]
    )


#: name -> (trace, HTA's window: annotation and instance)
TRACES = {
    "blocking_copy": (blocking_copy, "ProfilerStep", 0),
    "cuda_graph": (cuda_graph, "ProfilerStep", 0),
    "lagging_gpu": (lagging_gpu, "ProfilerStep", 1),
}
