"""The flight recorder's light record counted in instructions, not timed: each contender's steps run
under valgrind's callgrind, which counts what the CPU executes whatever the machine's load (on this
shared 2-core VM the wall and CPU clocks of two identical loops read ±4% apart round to round).

One process: the loop plain, then for each contender the recorder entered, three steps run
uncounted, two counted (each its own dump), the recorder left and a plain step counted again (the
plain figure must come back: the contender left nothing behind). Contenders (``flight_ablation.py``
has the same ones on the clocks): ``wrappers`` (the class wrappers calling Python functions that do
nothing), ``marks`` (native marks, no node hooks), ``marks+hooks`` (no ``rec.step()``),
``light-pywrapper`` (the native mark and after-call called from a Python wrapper: the recorder
before ``flight_call``), ``light`` (the recorder as shipped). ``--cache-sim`` adds callgrind's
first-level cache simulation (data-read misses; its last level is the host's whole L3 here, so only
D1 is meaningful).

    python benchmarks/flight_instructions.py [--contenders light,marks] [--dim 32 --batch 1 --seq 16]

Needs valgrind and its headers (``callgrind.h``) and a C compiler: the steps are bracketed by
callgrind's client requests, compiled once into a small library.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

_REQUESTS = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void cg_dump(const char* s) { CALLGRIND_DUMP_STATS_AT(s); }
"""


def _requests_library(folder: Path) -> Path:
    source, library = folder / "requests.c", folder / "librequests.so"
    source.write_text(_REQUESTS)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def _inside(args: argparse.Namespace) -> None:
    """Under callgrind: run the steps, one dump per counted step."""
    import torch
    from torch import nn

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import layerscope as ls
    from flight_ablation import VARIANTS, Patched
    from layerscope.models.gpt import TinyGPT

    requests = ctypes.CDLL(args.library)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyGPT(vocab=args.vocab, dim=args.dim, heads=4, layers=args.layers, max_len=args.seq)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq))
    target = torch.randint(0, args.vocab, (args.batch, args.seq))

    def step() -> None:
        logits = model(idx)
        nn.functional.cross_entropy(logits.view(-1, args.vocab), target.view(-1)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    gc.collect()
    gc.disable()  # a collection lands in one contender's steps and not another's
    requests.cg_start()

    def counted(label: str, run: object, times: int = 2) -> None:
        for k in range(times):
            requests.cg_toggle()
            run()  # type: ignore[operator]
            requests.cg_toggle()
            requests.cg_dump(f"{label} {k}".encode())

    step()
    step()
    counted("plain", step)
    with tempfile.TemporaryDirectory() as out:
        for name in args.contenders.split(","):
            variant = VARIANTS[name]
            assert variant is not None
            rec = ls.flight_recorder(model, out=out, slow=None)
            if name != "light":
                clock = Patched()
                clock.mark_kind, clock.after_kind, clock.whole_call = variant[0], variant[1], variant[3]
                rec.clock = clock
            with rec:

                def one(rec: object = rec, with_step: bool = variant[2]) -> None:
                    step()
                    if with_step:
                        rec.step()  # type: ignore[attr-defined]

                for _ in range(3):
                    one()
                counted(name, one)
            step()
            counted(f"plain after {name}", step, 1)


def _totals(folder: Path) -> list[tuple[str, list[int], list[str]]]:
    """(label, totals, event names) of each dump (``callgrind.out.<pid>.<n>``), in order."""
    found = []
    for path in sorted(folder.glob("callgrind.out.*.*"), key=lambda p: int(p.suffix[1:])):
        text = path.read_text()
        label = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.M)
        events = re.search(r"^events: (.*)$", text, re.M)
        totals = re.search(r"^totals: (.*)$", text, re.M)
        if label and events and totals:
            found.append((label.group(1), [int(v) for v in totals.group(1).split()], events.group(1).split()))
    return found


def main() -> None:
    """Run this file under callgrind and print instructions (and D1 misses) per step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contenders", default="wrappers,marks,marks+hooks,light-pywrapper,light")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--cache-sim", action="store_true")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--library", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        _inside(args)
        return
    with tempfile.TemporaryDirectory() as folder:
        library = _requests_library(Path(folder))
        prefix = Path(folder) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            "--log-file=/dev/null",
            "--instr-atstart=no",
            "--collect-atstart=no",
            f"--cache-sim={'yes' if args.cache_sim else 'no'}",
            f"--callgrind-out-file={prefix}.%p",
            sys.executable,
            __file__,
            "--inside",
            f"--library={library}",
            *(
                f"--{k.replace('_', '-')}={v}"
                for k, v in vars(args).items()
                if k in ("contenders", "dim", "batch", "seq", "vocab", "layers")
            ),
        ]
        subprocess.run(
            command, check=True, env=os.environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        dumps = _totals(Path(folder))
    plain = [t for label, t, _ in dumps if label.startswith("plain ") and "after" not in label]
    base = sum(t[0] for t in plain) / len(plain)
    names = dumps[0][2]
    print(
        f"model: TinyGPT {args.layers} layers, dim {args.dim}, batch {args.batch} x {args.seq} tokens, "
        "one thread"
    )
    for label, totals, _ in dumps:
        line = f"{label:24s} {totals[0] / 1e6:9.3f} M instructions ({(totals[0] / base - 1) * 100:+.2f}%)"
        if "D1mr" in names:
            line += f", D1 read misses {totals[names.index('D1mr')] / 1e3:.0f} k"
        print(line)


if __name__ == "__main__":
    main()
