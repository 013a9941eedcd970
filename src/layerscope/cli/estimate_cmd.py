"""``layerscope estimate [FACTORY]``: predict a step's time and memory on a device without running it."""

from __future__ import annotations

import argparse
from typing import Any

from layerscope.cli.outputs import add_output_options, requested_outputs
from layerscope.cli.profile_cmd import BUILTIN_MODELS, parse_shape, resolve_factory
from layerscope.cli.views import add_view_options, check_view_options, print_profile, report_written
from layerscope.errors import UsageError
from layerscope.render.writers import check_outputs, write_outputs
from layerscope.units import fmt_bytes

HELP = "predict a step's time and memory on a device, without running it"
DESCRIPTION = (
    "Estimate one training step (forward, sum loss, backward, optimizer step) or, with --eval, one "
    "forward, on fake tensors: nothing of the model's size is allocated (the model is built on the "
    "meta device). Prints the module tree with predicted time and memory and whether the predicted "
    "peak fits the device. FACTORY is as for 'layerscope profile'."
)
EXAMPLES = """\
examples:
  layerscope estimate                                   # the built-in ResNet-18 on an H100
  layerscope estimate gpt --device a100-80gb --dtype bfloat16 --max-batch
  layerscope estimate gpt --input 64x1024:int64 --device l4 --fit   # what to checkpoint
  layerscope estimate model.py:build --input 8x3x224x224 --device cpu -o estimate.html"""

ESTIMATE_DTYPES = ("float32", "bfloat16", "float16", "float64")
OPTIMIZER_CHOICES = ("adamw", "adam", "sgd", "sgd-momentum", "none")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``estimate`` command's arguments."""
    parser.add_argument(
        "factory",
        nargs="?",
        default="resnet18",
        metavar="FACTORY",
        help="package.module:callable, path/to/file.py:callable or a built-in name "
        f"({', '.join(BUILTIN_MODELS)}); default resnet18",
    )
    parser.add_argument(
        "--input",
        action="append",
        metavar="SHAPE[:DTYPE]",
        help="an input shape such as 8x3x224x224 (repeat for several inputs)",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=ESTIMATE_DTYPES,
        help="cast floating parameters and inputs to this dtype (default: as built)",
    )
    parser.add_argument(
        "--device",
        default="h100-sxm",
        help="a device spec key (h100-sxm, a100-80gb, ...) or cpu (this machine, "
        "measured once); default h100-sxm",
    )
    parser.add_argument(
        "--eval",
        dest="train",
        action="store_false",
        default=True,
        help="one forward under no_grad instead of a training step",
    )
    parser.add_argument(
        "--optimizer",
        default="adamw",
        choices=OPTIMIZER_CHOICES,
        help="the training step's optimizer (default adamw)",
    )
    parser.add_argument(
        "--max-batch",
        action="store_true",
        help="also search the largest batch (first input dimension) that fits",
    )
    parser.add_argument(
        "--fit",
        action="store_true",
        help="when the step does not fit: the modules to checkpoint so that it does, their cost "
        "in time, and what bfloat16 or a smaller batch would give",
    )
    parser.add_argument(
        "--reserve",
        type=float,
        default=None,
        metavar="GIB",
        help="memory kept back from the device's (default 5%% + 0.5 GiB)",
    )
    add_output_options(
        parser,
        output_help="save the estimate to PATH (.json, .html, ...; a folder: estimate.json.gz in it)",
        html_help="also write the HTML report",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the fits line")
    add_view_options(parser)


def _build(factory: Any, name: str) -> Any:
    import torch

    try:
        with torch.device("meta"):  # nothing of the model's size is allocated
            model = factory()
    except Exception as exc:
        raise UsageError(f"calling {name} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{name} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _inputs(parsed: list[tuple[list[int], str]], batch: int | None = None) -> tuple[Any, ...]:
    import torch

    return tuple(
        torch.empty(
            [batch, *dims[1:]] if batch is not None else dims, dtype=getattr(torch, dtype), device="meta"
        )
        for dims, dtype in parsed
    )


def fits_line(profile: Any, max_batch: int | None, at_limit: bool = False) -> str:
    """``fits: predicted peak ... of ... usable on ...`` (or ``does not fit``), with the max batch."""
    info = profile.meta.estimate
    verdict = "fits" if info.fits else "does not fit"
    line = (
        f"{verdict}: predicted peak {fmt_bytes(info.peak_bytes)} of {fmt_bytes(info.usable_bytes)} "
        f"usable on {info.device_name}"
    )
    if max_batch is not None:
        line += f"; max batch {max_batch}{' or more' if at_limit else ''}"
    return line


def run(args: argparse.Namespace) -> int:
    """Build on meta, estimate, print and save."""
    check_view_options(args)
    check_outputs(requested_outputs(args, "estimate"))
    factory = resolve_factory(args.factory)
    shapes = args.input or (BUILTIN_MODELS[args.factory][1] if args.factory in BUILTIN_MODELS else None)
    if not shapes:
        raise UsageError("give the model's input shape(s) with --input, e.g. --input 8x3x224x224")
    parsed = [parse_shape(s, "float32") for s in shapes]
    reserve = int(args.reserve * 2**30) if args.reserve is not None else None
    if reserve is not None and reserve < 0:
        raise UsageError(f"--reserve must be >= 0, not {args.reserve}")
    optimizer = None if args.optimizer == "none" else args.optimizer
    model = _build(factory, args.factory)

    from layerscope.estimates import estimate, fit, search_batch

    options: dict[str, Any] = {
        "train": args.train,
        "optimizer": optimizer,
        "dtype": args.dtype,
        "device": args.device,
        "reserve_bytes": reserve,
    }
    profile = estimate(model, _inputs(parsed), **options)
    found = search_batch(model, lambda b: _inputs(parsed, b), **options) if args.max_batch else None
    written = write_outputs(profile, requested_outputs(args, "estimate"))
    if not args.quiet:
        print_profile(profile, args)
    print(fits_line(profile, found.max_batch if found else None, found.at_limit if found else False))
    if args.fit and args.train:
        options.pop("train")
        batch = parsed[0][0][0] if parsed[0][0] else 1
        plan = fit(model, lambda b: _inputs(parsed, b), batch=batch, **options)
        header = "it fits as is:" if plan.as_is.fits else "what would make it fit:"
        print("\n".join([header, *plan.lines()]))
    elif args.fit:
        print("--fit plans a training step; --eval has nothing saved for backward to drop")
    report_written(written, quiet=args.quiet)
    return 0
