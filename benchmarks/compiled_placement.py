"""How much of a compiled model the tree places below its root, on the shapes that once defeated
the mapping (issue 35): a ``forward`` behind ``*args, **kwargs`` decorators, a tiny Llama (plain,
and behind transformers' ``@deprecate_kwarg`` as 4.4x-4.5x shipped it), a conv-bn-relu net's
backward (``aten::convolution_backward`` as a fallback kernel), and the ResNet-18 layout at 1/8 width
(batch norms whose running statistics are copied back at the forward graph's end).

Each model is compiled whole (``torch.compile(model)``) while compiles are watched, warmed up for
two training steps, then profiled ``--rounds`` times for ``--steps`` steps. Per model: graph calls
mapped, kernel spans placed of those matched (``meta.compiled``, last round), the share of the
root's CPU time below it (median of the rounds: this machine is shared, single rounds vary) and of
its FLOPs, the
``aten::convolution_backward`` calls left on the root, and the warnings the profile raised.
Runs against any layerscope checkout (``PYTHONPATH=<checkout>/src``), to compare before and after.

    python benchmarks/compiled_placement.py [--steps 2] [--rounds 3] [--only decorated,conv,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.compiled_models import (
    ConvBnRelu,
    DecoratedNet,
    conv_inputs,
    decorated_inputs,
    llama_inputs,
    tiny_llama,
)
from tests.fixtures.models import tiny_resnet

import layerscope as ls
from layerscope.capture.compile_watch import CompileWatch
from layerscope.errors import LayerscopeWarning
from layerscope.model.meta import CompileReport


def _loss(model: nn.Module, x: torch.Tensor, llama: bool) -> torch.Tensor:
    if llama:
        return model(input_ids=x, labels=x).loss  # type: ignore[no-any-return]
    return model(x).sum()


def measure(
    name: str, make: Callable[[], nn.Module], x: torch.Tensor, steps: int, rounds: int, llama: bool
) -> None:
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = torch.compile(make())
    with CompileWatch():
        for _ in range(2):
            _loss(model, x, llama).backward()
    shares: list[float] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(rounds):
            with ls.profile(model) as session:
                for _ in range(steps):
                    _loss(model, x, llama).backward()
            profile = session.profile
            profile.validate()
            root = profile.root
            shares.append(sum(c.total.cpu_us for c in root.children) / root.total.cpu_us)
    flops_below = sum(c.total.flops for c in root.children) / max(root.total.flops, 1)
    compiled = profile.meta.compiled or CompileReport()
    conv_bwd = [r for r in profile.ops(group_by=("name", "module")) if r.name == "aten::convolution_backward"]
    on_root = sum(r.calls for r in conv_bwd if r.module == "")
    all_conv = sum(r.calls for r in conv_bwd)
    conv_note = f"; convolution_backward on the root {on_root}/{all_conv}" if conv_bwd else ""
    ours = sorted({w.category.__name__ for w in caught if issubclass(w.category, LayerscopeWarning)})
    print(
        f"{name:<16} graph calls mapped {compiled.mapped_graph_calls}/{compiled.graph_calls}, "
        f"kernel spans placed {compiled.kernels_placed}/{compiled.kernels_matched}; "
        f"below the root: CPU time median "
        f"{statistics.median(shares):.1%} (min {min(shares):.1%}), FLOPs {flops_below:.1%}{conv_note}; "
        f"warnings: {ours or 'none'}"
    )


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor], bool]] = {
    "decorated": (DecoratedNet, decorated_inputs, False),
    "llama": (lambda: tiny_llama(decorated=False), llama_inputs, True),
    "llama-decorated": (tiny_llama, llama_inputs, True),
    "conv": (ConvBnRelu, conv_inputs, False),
    "resnet": (
        tiny_resnet,
        lambda: torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(1)),
        False,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    args = parser.parse_args()
    print(f"torch {torch.__version__}")
    for name in args.only.split(","):
        make, inputs, llama = CASES[name]
        measure(name, make, inputs(), args.steps, args.rounds, llama)


if __name__ == "__main__":
    main()
