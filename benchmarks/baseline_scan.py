"""What the absolute-memory baseline scan costs (``capture/live_tensors.py``): one pass over the
garbage collector's objects at block entry, finding every live tensor's storage.

The process holds a large model (``--layers`` x Linear(``--width``, ``--width``): two parameters a
layer, 4000 x 256 is 8,000 parameters and 1.05 GB) with an AdamW over it (its state, 2.1 GB, made
by one step, so the scan also meets the state tensors: 32,000 tensors in all), plus ``--objects``
small Python containers standing for the rest of a real program's heap. The four passes run in a
shuffled order each round (``overhead.interleaved_rounds``, ``gc.collect()`` before each); the
median over rounds is reported:

- ``get_objects``: ``gc.get_objects()`` alone, the floor of any pass;
- ``optimizers_only``: the pass that already ran at block entry before the scan existed (finding the
  optimizers over the model's parameters);
- ``scan``: ``scan_live(model, optimizers=True)``, the pass that replaces it (optimizers and storages);
- ``prepare``: ``MemoryWatch.prepare(model)``, what ``ls.profile(memory=True)`` runs before torch starts.

    python benchmarks/baseline_scan.py [--layers 4000] [--width 256] [--objects 1000000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from layerscope.capture.live_tensors import scan_live
from layerscope.capture.memory_watch import MemoryWatch
from overhead import interleaved_rounds


def _optimizers_only(model: nn.Module) -> list[Any]:
    """The block-entry pass as it was before the scan (for comparison only)."""
    params = {id(p) for p in model.parameters()}
    found = []
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.optim.Optimizer) and any(
            id(p) in params for group in obj.param_groups for p in group["params"]
        ):
            found.append(obj)
    return found


def _seconds(work: Callable[[], Any]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def main() -> None:
    """Build the process, time each pass, print one JSON object."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=4000)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(args.width, args.width) for _ in range(args.layers)))
    optimizer = torch.optim.AdamW(model.parameters())
    for p in model.parameters():  # AdamW's state without running a forward over 4 GB
        p.grad = torch.zeros_like(p)
    optimizer.step()
    model.zero_grad(set_to_none=True)
    heap = [{"k": [i]} for i in range(args.objects)]
    gc.collect()
    scan = scan_live(model, optimizers=True)
    passes: dict[str, Callable[[], Any]] = {
        "get_objects_s": gc.get_objects,
        "optimizers_only_s": lambda: _optimizers_only(model),
        "scan_s": lambda: scan_live(model, optimizers=True),
        "prepare_s": lambda: MemoryWatch.prepare(model),
    }
    samples = interleaved_rounds(passes, args.rounds, _seconds)  # type: ignore[arg-type]
    figures = {
        "layers": args.layers,
        "parameters": len(list(model.parameters())),
        "tensor_objects": scan.tensors,
        "storages": len(scan.entries),
        "storage_gb": round(sum(e.nbytes for e in scan.entries) / 1e9, 2),
        "gc_objects": len(gc.get_objects()),
        **{name: statistics.median(times) for name, times in samples.items()},
        "torch": torch.__version__,
    }
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}))
    del heap


if __name__ == "__main__":
    main()
