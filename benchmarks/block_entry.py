"""What entering (and leaving) a ``layerscope.profile`` block costs beyond a bare ``torch.profiler``
block with the same torch options, with and without ``memory=True`` (issue 39, item 5).

Later blocks: one process, a few blocks of each kind first, then paired rounds in a shuffled order
(``gc.collect()`` before each block); each block records one training step of a GPT-style model
(~200 module calls). Reported: the median of the per-round differences, entry and exit.

The first block of a process: fresh processes (``--first``), alternating bare and layerscope, each
timing its first block's entry after the same imports and the same model; reported: the difference
of the medians, and where layerscope's entry goes (its pieces timed by wrapping them, medians).

``--scan-paths``: later blocks with ``memory=True`` only, three contenders per round in a shuffled
order: bare, layerscope, and layerscope with the scan's whole walk (every object the collector
tracks, as before the incremental walk; it still leaves the incremental walk's sentinels and weak
references behind, a few tenths of a ms): before and after, paired; also how many objects each
walk visited. On Python 3.12+ a fourth: the whole walk by ``PyUnstable_GC_VisitObjects`` (what
3.12 and 3.13 ran before the incremental walk was extended to them).

    python benchmarks/block_entry.py [--rounds 21] [--first-runs 3] [--clock wall|cpu] [--scan-paths]
                                     [--first-only]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

import layerscope as ls
from layerscope.capture import native
from layerscope.models.gpt import TinyGPT

CLOCK = time.perf_counter


def make_step() -> tuple[nn.Module, Callable[[], None]]:
    """The model and one training step (4 sequences of 64 tokens)."""
    torch.manual_seed(0)
    model = TinyGPT(vocab=512, dim=128, heads=4, layers=20, max_len=64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, 512, (4, 64))

    def step() -> None:
        model(idx).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def bare_block(memory: bool) -> Any:
    """A torch.profiler block with the options ``ls.profile(model, memory=memory)`` gives torch."""
    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, profile_memory=memory
    )


def timed_block(
    kind: str, memory: bool, model: nn.Module, step: Callable[[], None], on_entered: Callable[[], Any] = int
) -> tuple[float, float]:
    """Seconds to enter and to leave one block of ``kind`` (``bare`` or ``layerscope``) around a
    step: this thread's CPU time (``--clock cpu``, less moved by other processes on a shared machine)
    or wall time; ``on_entered`` is called once the block is entered (untimed)."""
    gc.collect()
    block = bare_block(memory) if kind == "bare" else ls.profile(model, memory=memory)
    started = CLOCK()
    block.__enter__()
    entered = CLOCK()
    on_entered()
    step()
    leaving = CLOCK()
    block.__exit__(None, None, None)
    left = CLOCK()
    return entered - started, left - leaving


def later_blocks(rounds: int) -> None:
    """Paired rounds in one process, after warm-up blocks of every kind."""
    model, step = make_step()
    kinds = [(kind, memory) for memory in (False, True) for kind in ("bare", "layerscope")]
    for kind, memory in kinds * 2:  # warm-up: torch's first start, our lazy imports, the allocator
        timed_block(kind, memory, model, step)
    for memory in (False, True):
        entry: list[float] = []
        leave: list[float] = []
        for _ in range(rounds):
            order = ["bare", "layerscope"]
            random.shuffle(order)
            times = {kind: timed_block(kind, memory, model, step) for kind in order}
            entry.append(times["layerscope"][0] - times["bare"][0])
            leave.append(times["layerscope"][1] - times["bare"][1])
        bare_entry = statistics.median(timed_block("bare", memory, model, step)[0] for _ in range(5))
        print(
            f"later blocks, memory={memory!s:5}: entry +{statistics.median(entry) * 1e3:.1f} ms beyond bare "
            f"(bare {bare_entry * 1e3:.1f} ms), exit +{statistics.median(leave) * 1e3:.1f} ms "
            f"(median of {rounds} paired rounds)"
        )


@contextmanager
def whole_walk(visit: bool = False) -> Iterator[None]:
    """The scan as it was before the incremental walk: every object the collector tracks visited;
    ``visit``: by the interpreter's walk (``PyUnstable_GC_VisitObjects``, what 3.12 used before)."""
    module = native.load()
    assert module is not None, "the native module is not built"
    walk = module.tracked_of_types
    module.tracked_of_types = lambda wanted: walk(wanted, incremental=False, visit=visit)
    try:
        yield
    finally:
        module.tracked_of_types = walk


def scan_paths(rounds: int) -> None:
    """``memory=True`` later blocks: bare, layerscope, layerscope with the whole walk, paired."""
    model, step = make_step()
    module = native.load()
    assert module is not None, "the native module is not built"
    visited: dict[str, list[int]] = {"layerscope": [], "previous": []}

    def ours(memory: bool) -> tuple[float, float]:
        times = timed_block("layerscope", memory, model, step)
        visited["layerscope"].append(module.walk_stats()[1])
        return times

    def previous(memory: bool, visit: bool = False) -> tuple[float, float]:
        with whole_walk(visit):
            times = timed_block("layerscope", memory, model, step)
        visited["visit" if visit else "previous"].append(module.walk_stats()[1])
        return times

    contenders: dict[str, Callable[[bool], tuple[float, float]]] = {
        "bare": lambda memory: timed_block("bare", memory, model, step),
        "layerscope": ours,
        "previous": previous,
    }
    if module.tracked_of_types({torch.Tensor}, visit=True) is not None:  # 3.12+
        contenders["visit"] = lambda memory: previous(memory, visit=True)
        visited["visit"] = []
    for run in list(contenders.values()) * 2:  # warm-up
        run(True)
    entry: dict[str, list[float]] = {name: [] for name in visited}
    for _ in range(rounds):
        order = list(contenders)
        random.shuffle(order)
        times = {name: contenders[name](True)[0] for name in order}
        for name in entry:
            entry[name].append(times[name] - times["bare"])
    labels = {
        "visit": "interpreter's walk",
        "previous": "before (whole walk)",
        "layerscope": "after (incremental)",
    }
    for name, label in labels.items():
        if name not in entry:
            continue
        print(
            f"later blocks, memory=True, {label}: entry +{statistics.median(entry[name]) * 1e3:.1f} ms "
            f"beyond bare (median of {rounds} paired rounds); objects visited: median "
            f"{statistics.median(visited[name][2:]):.0f}, max {max(visited[name][2:])}"
        )
    saved = [p - n for p, n in zip(entry["previous"], entry["layerscope"], strict=True)]
    print(f"saved per entry: {statistics.median(saved) * 1e3:.1f} ms (median of the per-round differences)")


#: Where a layerscope block's first entry goes: (label, owner's dotted path, attribute), timed by
#: wrapping each in the fresh process before its first block. The indented ones are parts of others:
#: the scan of the instruments' preparation, the native module's loads of whichever piece asks first.
PIECES = [
    ("torch.profiler made", "layerscope.capture.session", "make_torch_profiler"),
    ("scope plan", "layerscope.capture.session", "plan_block"),
    ("instruments prepared", "layerscope.capture.instruments.Instruments", "prepare"),
    ("torch.profiler started", "torch.profiler.profile", "__enter__"),
    ("instruments started", "layerscope.capture.instruments.Instruments", "start"),
    ("  live-tensor scan", "layerscope.capture.memory_watch", "scan_live"),
    ("  native module loads", "layerscope.capture.native", "load"),
]


def time_pieces() -> dict[str, float]:
    """Wrap each of ``PIECES`` to add its time (``CLOCK``) to the returned dict."""
    import importlib

    spent: dict[str, float] = {}
    for label, path, name in PIECES:
        module_path, _, attr = path.rpartition(".")
        try:
            owner: Any = importlib.import_module(path)
        except ModuleNotFoundError:
            owner = getattr(importlib.import_module(module_path), attr)
        original = getattr(owner, name)

        def timed(*args: Any, _original: Any = original, _label: str = label, **kwargs: Any) -> Any:
            started = CLOCK()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[_label] = spent.get(_label, 0.0) + CLOCK() - started

        setattr(owner, name, timed)
    return spent


def first_block(kind: str, memory: bool) -> None:
    """Time the first block of this (fresh) process (and for layerscope its pieces) as JSON."""
    model, step = make_step()
    spent = time_pieces() if kind == "layerscope" else {}
    at_entry: dict[str, float] = {}  # the pieces' times spent entering (the exit loads things too)
    entry, leave = timed_block(kind, memory, model, step, lambda: at_entry.update(spent))
    if at_entry:
        top = [label for label, _, _ in PIECES if not label.startswith(" ")]
        at_entry["rest"] = entry - sum(at_entry.get(label, 0.0) for label in top)
    print(json.dumps({"entry": entry, "exit": leave, "pieces": at_entry}))


def first_blocks(runs: int) -> None:
    """Fresh processes, alternating kinds: the first block's entry, median per kind; where a
    layerscope entry goes (medians of the pieces)."""
    for memory in (False, True):
        entries: dict[str, list[float]] = {"bare": [], "layerscope": []}
        exits: dict[str, list[float]] = {"bare": [], "layerscope": []}
        pieces: dict[str, list[float]] = {label: [] for label, _, _ in PIECES}
        pieces["rest"] = []
        for _ in range(runs):
            for kind in entries:
                command = [sys.executable, __file__, "--first", kind, "--memory", str(int(memory))]
                command += ["--clock", "cpu" if CLOCK is time.thread_time else "wall"]
                out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                times = json.loads(out.strip().splitlines()[-1])
                entries[kind].append(times["entry"])
                exits[kind].append(times["exit"])
                for label, seconds in times["pieces"].items():
                    pieces[label].append(seconds)
        bare, ours = (statistics.median(entries[kind]) for kind in ("bare", "layerscope"))
        bare_exit, ours_exit = (statistics.median(exits[kind]) for kind in ("bare", "layerscope"))
        print(
            f"first block,  memory={memory!s:5}: entry +{(ours - bare) * 1e3:.1f} ms beyond bare "
            f"(bare {bare * 1e3:.0f} ms, layerscope {ours * 1e3:.0f} ms); "
            f"exit bare {bare_exit * 1e3:.0f} ms, layerscope {ours_exit * 1e3:.0f} ms "
            f"(medians of {runs} processes each)"
        )
        paired = [ours - bare for bare, ours in zip(entries["bare"], entries["layerscope"], strict=True)]
        print(f"    entry beyond bare, paired: +{statistics.median(paired) * 1e3:.1f} ms (median of pairs)")
        for label, seconds in pieces.items():
            if seconds:
                print(f"    {label:26} {statistics.median(seconds) * 1e3:7.1f} ms (median)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--first-runs", type=int, default=3)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--scan-paths", action="store_true", help="before/after of the scan's walk")
    parser.add_argument("--first-only", action="store_true", help="only the first blocks (fresh processes)")
    parser.add_argument("--first", choices=["bare", "layerscope"], help=argparse.SUPPRESS)
    parser.add_argument("--memory", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.first:
        first_block(args.first, bool(args.memory))
        return
    if args.scan_paths:
        scan_paths(args.rounds)
        return
    if not args.first_only:
        later_blocks(args.rounds)
    first_blocks(args.first_runs)


if __name__ == "__main__":
    main()
