"""Record small real GPU traces, each with one case the trace analysis must get right.

Run on a CUDA machine; writes gzipped Chrome traces (torch.profiler's own export) into FOLDER:

    python benchmarks/gpu_traces.py FOLDER

- ``train_resnet``: training steps (forward, backward, SGD) of the ResNet-18 layout, 4 ProfilerSteps.
- ``host_bound``: tiny kernels with the CPU sleeping between launches: the GPU idles with nothing
  queued (a CPU-bound step).
- ``queued_wait``: a side stream waits on an event behind a long kernel on the main stream: the side
  stream idles with kernels queued (waiting on a dependency, not on the CPU).
- ``copies``: host-to-device and device-to-host copies, pinned and pageable, and device-to-device.
- ``cuda_graph``: a captured CUDA graph replayed (kernels launched by ``cudaGraphLaunch``).
- ``nccl_one_rank``: an NCCL all-reduce in a one-rank process group beside computation on another
  stream (skipped where NCCL is missing).
- ``memory_oom``: layerscope with memory on, a GPT-style block whose last layer runs out of device
  memory (a per-process memory cap); the layerscope profile is saved beside the trace.

These traces are the GPU ground truth for tests/test_gpu_traces.py and for the HTA comparison
(docs/compared.md); small on purpose (a few MB each).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import layerscope as ls
from layerscope.models import resnet18

ACTIVITIES = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]


def save(prof: torch.profiler.profile, folder: Path, name: str) -> None:
    plain = folder / f"{name}.json"
    prof.export_chrome_trace(str(plain))
    with plain.open("rb") as src, gzip.open(folder / f"{name}.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()
    print(f"wrote {name}.json.gz", flush=True)


def train_resnet(folder: Path) -> None:
    model = resnet18().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 3, 112, 112, device="cuda")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()

    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=ACTIVITIES, record_shapes=True) as prof:
        for _ in range(4):
            step()
            prof.step()
        torch.cuda.synchronize()
    save(prof, folder, "train_resnet")


def host_bound(folder: Path) -> None:
    x = torch.randn(256, 256, device="cuda")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=ACTIVITIES) as prof:
        for step in range(1, 4):
            with torch.profiler.record_function(f"ProfilerStep#{step}"):
                for _ in range(20):
                    x = torch.tanh(x)
                    time.sleep(0.0005)  # the CPU is the bottleneck: the GPU has nothing queued
            prof.step()
        torch.cuda.synchronize()
    save(prof, folder, "host_bound")


def queued_wait(folder: Path) -> None:
    big = torch.randn(8192, 8192, device="cuda")
    small = torch.randn(256, 256, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=ACTIVITIES) as prof:
        for _ in range(3):
            done = torch.cuda.Event()
            for _ in range(4):
                big = big @ big / 8192.0  # a long kernel on the main stream
            done.record()
            with torch.cuda.stream(side):
                side.wait_event(done)  # queued behind the main stream's work
                for _ in range(20):
                    small = torch.tanh(small)
            torch.cuda.current_stream().wait_stream(side)
            prof.step()
        torch.cuda.synchronize()
    save(prof, folder, "queued_wait")


def copies(folder: Path) -> None:
    pageable = torch.randn(64 * 1024 * 1024 // 4)
    pinned = pageable.pin_memory()
    on_device = torch.empty_like(pageable, device="cuda")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=ACTIVITIES) as prof:
        for _ in range(3):
            on_device.copy_(pinned, non_blocking=True)
            on_device.copy_(pageable)
            pinned.copy_(on_device, non_blocking=True)
            pageable.copy_(on_device)
            on_device.clone()
        torch.cuda.synchronize()
    save(prof, folder, "copies")


def cuda_graph(folder: Path) -> None:
    model = nn.Sequential(*(nn.Linear(512, 512) for _ in range(8))).cuda()
    x = torch.randn(64, 512, device="cuda")
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm), torch.no_grad():
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        model(x)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=ACTIVITIES) as prof:
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
    save(prof, folder, "cuda_graph")


def nccl_one_rank(folder: Path) -> None:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        print("nccl_one_rank: NCCL not available, skipped", flush=True)
        return
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29531", rank=0, world_size=1)
    try:
        grads = torch.randn(16 * 1024 * 1024, device="cuda")
        a = torch.randn(4096, 4096, device="cuda")
        comm = torch.cuda.Stream()
        dist.all_reduce(grads)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=ACTIVITIES) as prof:
            for _ in range(3):
                with torch.cuda.stream(comm):
                    work = dist.all_reduce(grads, async_op=True)
                for _ in range(3):
                    a = a @ a / 4096.0
                assert work is not None
                work.wait()
                prof.step()
            torch.cuda.synchronize()
        save(prof, folder, "nccl_one_rank")
    finally:
        dist.destroy_process_group()


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


class _Huge(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_empty(1 << 40)  # 4 TiB of float32: more than any device has


def memory_oom(folder: Path) -> None:
    model = nn.Sequential(_Block(1024), _Block(1024), _Huge()).cuda()
    x = torch.randn(64, 128, 1024, device="cuda")
    model[:2](x).sum().backward()
    torch.cuda.synchronize()
    prof = ls.profile(model, memory=True)
    try:
        with prof:
            model(x)
    except torch.OutOfMemoryError as exc:
        print(f"memory_oom: out of memory as planned ({str(exc).splitlines()[0][:80]})", flush=True)
    profile = prof.profile
    profile.save(folder / "memory_oom.layerscope.json.gz")
    with ls.profile(model[:2], memory=True) as ok:
        model[:2](x).sum().backward()
        torch.cuda.synchronize()
    ok.profile.validate()
    ok.profile.save(folder / "memory_block.layerscope.json.gz")
    ok.export_chrome_trace(str(folder / "memory_block.json"))
    with (
        (folder / "memory_block.json").open("rb") as src,
        gzip.open(folder / "memory_block.json.gz", "wb") as dst,
    ):
        shutil.copyfileobj(src, dst)
    (folder / "memory_block.json").unlink()
    print("wrote memory_oom.layerscope.json.gz, memory_block.*", flush=True)


CASES: dict[str, Callable[[Path], None]] = {
    "train_resnet": train_resnet,
    "host_bound": host_bound,
    "queued_wait": queued_wait,
    "copies": copies,
    "cuda_graph": cuda_graph,
    "nccl_one_rank": nccl_one_rank,
    "memory_oom": memory_oom,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_traces.py: needs a CUDA device")
    args.folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    failed = 0
    for name, record in CASES.items():
        if args.only and name not in args.only:
            continue
        try:
            record(args.folder)
        except Exception as exc:  # one failing case must not lose the others' traces
            failed += 1
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
