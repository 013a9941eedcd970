"""``layerscope profile [FACTORY]``: build a model, run training (or inference) steps, profile them."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from layerscope.cli.outputs import add_output_options, requested_outputs
from layerscope.cli.quiet import ProfilerNotices
from layerscope.cli.views import (
    add_recording_options,
    add_view_options,
    check_view_options,
    print_profile,
    report_written,
)
from layerscope.errors import UsageError
from layerscope.render.writers import check_outputs, write_outputs

#: Built-in models: name -> (factory path, default inputs).
BUILTIN_MODELS: dict[str, tuple[str, list[str]]] = {
    "resnet18": ("layerscope.models:resnet18", ["5x3x224x224"]),
    "gpt": ("layerscope.models:TinyGPT", ["4x128:int64"]),
}
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32")
_INT_HIGH = 128  # random token ids / indices are drawn from [0, 128)


EXAMPLES = """\
examples:
  layerscope profile                                  # the built-in ResNet-18, one training step
  layerscope profile gpt --steps 3 --memory           # the built-in GPT, 3 steps, with allocations
  layerscope profile model.py:build --input 8x3x32x32 --eval -o run.json --html
  layerscope profile mypkg.models:Net --input 4x128:int64 --depth 2 --top 5"""


HELP = "profile a model (the built-in ResNet-18 layout by default)"
DESCRIPTION = (
    "Profile training (forward + backward of a sum loss) or inference steps of a model. "
    "FACTORY is package.module:callable, path/to/file.py:callable, or a built-in name "
    f"({', '.join(BUILTIN_MODELS)}). Default: resnet18 on 5x3x224x224."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``profile`` command's arguments."""
    parser.add_argument(
        "factory",
        nargs="?",
        default="resnet18",
        metavar="FACTORY",
        help="what builds the model: package.module:callable, path/to/file.py:callable or a built-in "
        f"name ({', '.join(BUILTIN_MODELS)}); default resnet18",
    )
    parser.add_argument(
        "--input",
        action="append",
        metavar="SHAPE[:DTYPE]",
        help="an input tensor shape such as 5x3x224x224 (repeat for several inputs); "
        "integer dtypes draw values in [0, 128)",
    )
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="default input dtype")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--train",
        dest="train",
        action="store_true",
        default=True,
        help="forward + backward of output.sum() (default)",
    )
    mode.add_argument(
        "--eval", dest="train", action="store_false", help="model.eval() and forward under torch.no_grad()"
    )
    parser.add_argument("--steps", type=int, default=1, metavar="N", help="profiled steps (default 1)")
    parser.add_argument(
        "--warmup", type=int, default=1, metavar="N", help="unprofiled steps first (default 1)"
    )
    add_recording_options(parser)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for weights and inputs")
    add_output_options(
        parser,
        output_help="save to PATH: a file whose suffix names the format (.json, .json.gz, .html, .txt, "
        ".csv, .svg, .collapsed, .parquet), or a folder (profile.json.gz in it)",
        html_help="also write the HTML report, beside -o (or profile.html here)",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print nothing, the profiler's own notices included (use with -o); errors still print",
    )
    add_view_options(parser)


def parse_shape(text: str, default_dtype: str) -> tuple[list[int], str]:
    """``"5x3x224x224"`` -> ([5, 3, 224, 224], dtype); ``"4x128:int64"`` names the dtype."""
    shape_text, _, dtype = text.partition(":")
    dtype = dtype or default_dtype
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r} in --input {text!r}; choose from {', '.join(DTYPES)}")
    try:
        dims = [int(d) for d in shape_text.lower().split("x")]
    except ValueError:
        raise UsageError(
            f"bad --input shape {text!r}: expected sizes joined by 'x', like 5x3x224x224"
        ) from None
    if not dims or any(d <= 0 for d in dims):
        raise UsageError(f"bad --input shape {text!r}: every size must be a positive integer")
    return dims, dtype


def resolve_factory(spec: str) -> Any:
    """The callable named by ``package.module:callable``, ``file.py:callable`` or a built-in name."""
    if spec in BUILTIN_MODELS:
        spec = BUILTIN_MODELS[spec][0]
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UsageError(
            f"bad FACTORY {spec!r}: expected package.module:callable, path/to/file.py:callable "
            f"or one of {', '.join(BUILTIN_MODELS)}"
        )
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise UsageError(f"FACTORY file {module_name} does not exist")
        spec_obj = importlib.util.spec_from_file_location(path.stem, path)
        if spec_obj is None or spec_obj.loader is None:
            raise UsageError(f"cannot load {module_name} as a Python module")
        module = importlib.util.module_from_spec(spec_obj)
        sys.path.insert(0, str(path.resolve().parent))
        try:
            spec_obj.loader.exec_module(module)
        except Exception as exc:
            raise UsageError(f"importing {module_name} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            sys.path.pop(0)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UsageError(f"cannot import {module_name!r}: {exc}") from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise UsageError(f"{module_name} has no callable named {attr!r}")
    return factory


def run(args: argparse.Namespace) -> int:
    """Build, warm up, profile, print and save."""
    check_view_options(args)
    check_outputs(requested_outputs(args, "profile"))
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, not {args.steps}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, not {args.warmup}")
    factory = resolve_factory(args.factory)
    shapes = args.input or (BUILTIN_MODELS[args.factory][1] if args.factory in BUILTIN_MODELS else None)
    if not shapes:
        raise UsageError("give the model's input shape(s) with --input, e.g. --input 8x3x224x224")
    parsed = [parse_shape(s, args.dtype) for s in shapes]

    import torch

    import layerscope as ls

    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise UsageError(f"unknown --device {args.device!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for, but torch sees no CUDA device here")
    torch.manual_seed(args.seed)
    try:
        model = factory()
    except Exception as exc:
        raise UsageError(f"calling {args.factory} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{args.factory} returned {type(model).__name__}, not a torch.nn.Module")
    model = model.to(device)
    model.train(args.train)
    inputs = [_make_input(dims, dtype, device) for dims, dtype in parsed]

    def step() -> None:
        if args.train:
            out = model(*inputs)
            _first_tensor(out).float().sum().backward()
        else:
            with torch.no_grad():
                model(*inputs)

    from layerscope.capture.compile_watch import CompileWatch

    # A compiled model compiles in the warm-up: watched, so that the profile places its kernels.
    with CompileWatch(), ProfilerNotices(args.quiet) as notices:
        for _ in range(args.warmup):
            step()
            model.zero_grad(set_to_none=True)
        with ls.profile(
            model, memory=args.memory, with_stack=args.with_stack, lines=args.lines, nvtx=args.nvtx
        ) as prof:
            notices.read()  # torch prepared its trace as the block began
            for k in range(args.steps):
                step()
                if k < args.steps - 1:
                    prof.step()  # ProfilerStep#N ranges: per-step means, spread and the step table
    profile = prof.profile
    written = write_outputs(profile, requested_outputs(args, "profile"))
    if not args.quiet:
        print_profile(profile, args)
    report_written(written, quiet=args.quiet)
    return 0


def _make_input(dims: list[int], dtype: str, device: Any) -> Any:
    import torch

    torch_dtype = getattr(torch, dtype)
    if torch_dtype.is_floating_point:
        return torch.randn(*dims, device=device).to(torch_dtype)
    return torch.randint(0, _INT_HIGH, dims, device=device, dtype=torch_dtype)


def _first_tensor(out: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if isinstance(out, dict) else out
    if isinstance(values, list | tuple) or hasattr(values, "__iter__"):
        for item in values:
            if isinstance(item, torch.Tensor):
                return item
    for name in ("logits", "last_hidden_state", "loss"):
        if isinstance(getattr(out, name, None), torch.Tensor):
            return getattr(out, name)
    raise UsageError(f"the model returned {type(out).__name__}; --train needs a tensor output to sum")
