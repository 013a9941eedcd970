"""What source lines (``lines=True``) cost, against torch's own ``with_stack=True``.

The MLP workload of ``overhead.py --only mlp`` (48 x LN+Linear+GELU+Linear at batch 1, training
steps). Three measurements:

1. Step cost, feature against feature: sessions of torch.profiler alone, with ``with_stack=True``
   (torch's Python tracer) and with layerscope's call-line recorder started inside it (exactly what
   ``lines=True`` adds to capture), then the same three as layerscope profiles (``ls.profile``,
   ``lines=True``, ``with_stack=True``). Each session runs two warm-up steps, then the median of
   ``--steps`` individually timed steps; sessions are interleaved in a shuffled order per round,
   ``gc.collect()`` before each, and the paired ratio (same round) is the median over rounds.
   Session start and stop are not in these figures (the build is measurement 2).
2. The build: ms from the block's end to the built Profile after the same steps, lines against
   with_stack.
3. The recorder's own cost per top-level op: started and stopped in alternation inside one
   torch.profiler session.

    python benchmarks/lines_cost.py [--rounds 25] [--steps 10]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch import nn

import layerscope as ls
from layerscope.capture import native
from layerscope.capture.call_lines import CallLineRecorder, supported
from overhead import interleaved_rounds, tiny_transformer_mlps

Factory = Callable[[], AbstractContextManager[Any]]


def session_step_medians(
    step: Callable[[], None], configs: dict[str, Factory], rounds: int, steps: int
) -> dict[str, list[float]]:
    """Per configuration and round: the median seconds of ``steps`` steps inside one session."""

    def timed() -> float:
        start = time.perf_counter()
        step()
        return time.perf_counter() - start

    def session_median(make: Factory) -> float:
        with make():
            timed(), timed()
            return statistics.median(timed() for _ in range(steps))

    return interleaved_rounds(configs, rounds, session_median)


def lines_cost(rounds: int, steps: int) -> dict[str, Any]:
    """The three measurements of the module docstring, as one dict."""
    model, x = tiny_transformer_mlps(), torch.randn(1, 64)
    module = native.load()
    if not supported(module):
        raise SystemExit("call lines need the native module on CPython 3.11/3.12")
    assert module is not None
    torch_kwargs: dict[str, Any] = {"record_shapes": True, **ls.profile(model).profiler_kwargs}

    @contextmanager
    def torch_with_recorder() -> Iterator[None]:
        recorder = CallLineRecorder(module)
        with torch.profiler.profile(**torch_kwargs):
            recorder.start()
            try:
                yield
            finally:
                recorder.stop()
                recorder.take()

    configs: dict[str, Factory] = {
        "torch.profiler": lambda: torch.profiler.profile(**torch_kwargs),
        "torch with_stack": lambda: torch.profiler.profile(with_stack=True, **torch_kwargs),
        "torch + line recorder": torch_with_recorder,
        "layerscope": lambda: ls.profile(model),
        "layerscope lines": lambda: ls.profile(model, lines=True),
        "layerscope with_stack": lambda: ls.profile(model, with_stack=True),
    }
    samples = session_step_medians(lambda: model(x).sum().backward(), configs, rounds, steps)

    def paired(a: str, b: str) -> float:
        return round(statistics.median(p / q for p, q in zip(samples[a], samples[b], strict=True)), 4)

    return {
        "model": "48 x LN+Linear+GELU+Linear (1x64), training steps",
        "rounds": rounds,
        "steps": steps,
        "step_ms": {k: round(statistics.median(v) * 1000, 3) for k, v in samples.items()},
        "paired": {
            "with_stack_vs_torch": paired("torch with_stack", "torch.profiler"),
            "recorder_vs_torch": paired("torch + line recorder", "torch.profiler"),
            "recorder_vs_with_stack": paired("torch + line recorder", "torch with_stack"),
            "layerscope_vs_torch": paired("layerscope", "torch.profiler"),
            "ls_lines_vs_layerscope": paired("layerscope lines", "layerscope"),
            "ls_with_stack_vs_layerscope": paired("layerscope with_stack", "layerscope"),
            "ls_lines_vs_ls_with_stack": paired("layerscope lines", "layerscope with_stack"),
            "ls_lines_vs_torch": paired("layerscope lines", "torch.profiler"),
        },
        "build_ms": build_ms(model, x, steps, max(3, rounds // 3)),
        "recorder_us_per_op": recorder_us_per_op(model, x, module, rounds),
    }


def recorder_us_per_op(model: nn.Module, x: torch.Tensor, module: Any, rounds: int) -> float:
    """µs the call-line recorder adds per top-level op, inside one torch.profiler session: the
    recorder started and stopped in alternation (paired), over the step's recorded op count."""

    def step() -> float:
        start = time.perf_counter()
        model(x).sum().backward()
        return time.perf_counter() - start

    recorder = CallLineRecorder(module)
    bare: list[float] = []
    lined: list[float] = []
    with torch.profiler.profile(record_shapes=True, **ls.profile(model).profiler_kwargs):
        step()
        for _ in range(rounds * 2):
            bare.append(statistics.median(step() for _ in range(10)))
            recorder.start()
            lined.append(statistics.median(step() for _ in range(10)))
            recorder.stop()
        recorder.take()
        recorder.start()
        step()
        recorder.stop()
        ops = recorder.take().op_count  # the records of that one step
    paired = statistics.median(a - b for a, b in zip(lined, bare, strict=True))
    return round(paired * 1e6 / ops, 3)


def build_ms(model: nn.Module, x: torch.Tensor, steps: int, repeats: int) -> dict[str, float]:
    """Median ms from the block's end to the built Profile, for ``steps`` steps, lines vs stacks."""
    found: dict[str, list[float]] = {"lines": [], "with_stack": []}
    for _ in range(repeats):
        for key in found:
            with ls.profile(model, lines=key == "lines", with_stack=key == "with_stack") as prof:
                for _ in range(steps):
                    model(x).sum().backward()
            gc.collect()
            start = time.perf_counter()
            prof.profile  # noqa: B018 - building it is what is timed
            found[key].append((time.perf_counter() - start) * 1000)
    return {k: round(statistics.median(v), 1) for k, v in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    found = lines_cost(args.rounds, args.steps)
    print(json.dumps({"benchmark": "lines-cost", "torch": torch.__version__, **found}, indent=1))


if __name__ == "__main__":
    main()
