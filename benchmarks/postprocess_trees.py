"""This tree against an earlier one on the same live captures: ``check`` that the saved profiles are
identical, ``time`` the live build (reader and attribution) of each, paired.

The earlier tree is a commit's ``src`` with the package renamed to ``layerscope_base`` (``baseline``
makes it; its native module is the one its sources name, built in the cache). Both trees read the
very same torch results (one capture, built by each in one process), so a difference is the code's.

``check``: the MLP and ResNet layouts of ``postprocess.py`` with memory and shapes on and off,
``with_stack``, ``lines``; the saved profiles' dicts (``profile_to_dict``) hashed. ``time``:
``--rounds`` captures of ``postprocess.py``'s workload (``memory=True, shapes=True``), each built by
both trees in alternating order (process CPU time, the cyclic GC paused as a live build pauses it);
medians and the median of per-round ratios, against torch's first ``key_averages()`` of that capture.

    python benchmarks/postprocess_trees.py baseline 175dc31 /tmp/base
    python benchmarks/postprocess_trees.py check --baseline /tmp/base/src
    python benchmarks/postprocess_trees.py time --baseline /tmp/base/src --model mlp --rounds 7
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import io
import re
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
import torch

import layerscope as ls
from layerscope.model.serialize import profile_to_dict
from layerscope.models import resnet18
from postprocess import capture, deep_mlp

CONFIGS: dict[str, dict[str, Any]] = {
    "memory+shapes": {"memory": True, "shapes": True},
    "plain": {"memory": False, "shapes": False},
    "shapes": {"memory": False, "shapes": True},
    "memory": {"memory": True, "shapes": False},
    "memory+shapes+stack": {"memory": True, "shapes": True, "with_stack": True},
    "lines": {"memory": True, "shapes": True, "lines": True},
}


def make_baseline(commit: str, folder: Path) -> None:
    """``commit``'s ``src/layerscope`` as ``folder/src/layerscope_base``, its imports renamed (but
    ``capture/native.py``'s: its bytes name the native module, which must stay the cached one)."""
    data = subprocess.run(
        ["git", "archive", commit, "src/layerscope"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        archive.extractall(folder, filter="data")
    package = folder / "src" / "layerscope_base"
    (folder / "src" / "layerscope").rename(package)
    for path in package.rglob("*.py"):
        if path.name == "native.py":
            continue
        text = path.read_text()
        text = re.sub(r"\bfrom layerscope(\.| import)", r"from layerscope_base\1", text)
        text = re.sub(r"^(\s*)import layerscope\b", r"\1import layerscope_base", text, flags=re.M)
        text = text.replace('import_module("layerscope.', 'import_module("layerscope_base.')
        path.write_text(text.replace('": "layerscope.', '": "layerscope_base.'))
    print(f"{commit} as layerscope_base in {folder / 'src'}")


def load_baseline(src: Path) -> Any:
    """The renamed package, with what ``check`` and ``time`` use of it imported."""
    sys.path.insert(0, str(src))
    import layerscope_base.capture.recording
    import layerscope_base.model.serialize

    return layerscope_base


def baseline_recording(base: Any, recording: Any) -> Any:
    """The baseline's Recording of the same torch results and context (this tree's marks, which
    read ``clock_stamps`` off the table: a baseline's table from before that field has none)."""
    if not hasattr(base.events.table.EventTable, "clock_stamps"):
        base.events.table.EventTable.clock_stamps = None
    return base.capture.recording.Recording(
        recording.torch_profiler, recording.context, recording.block_us, recording.cycle
    )


def digest(data: dict[str, Any]) -> str:
    """A hash of a saved profile's dict (its JSON bytes, as ``Profile.save`` writes them)."""
    return hashlib.sha256(orjson.dumps(data)).hexdigest()[:16]


def without_clock(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` less the one field that differs between two builds a second apart: when the
    environment was read (``meta.environment.created_at``)."""
    environment = data["meta"].get("environment")
    if isinstance(environment, dict):
        environment["created_at"] = None
    return data


def first_difference(a: Any, b: Any, where: str = "") -> str:
    """Where two JSON-like values first differ (a path), for the report."""
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        for key in dict.fromkeys([*a, *b]):
            if key not in a or key not in b:
                return f"{where}.{key}: missing on one side"
            if a[key] != b[key]:
                return first_difference(a[key], b[key], f"{where}.{key}")
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: length {len(a)} != {len(b)}"
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{where}[{k}]")
    return f"{where}: {a!r} != {b!r}"


def workload(name: str, small: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    """``postprocess.py``'s model and input (a smaller ResNet input for ``check``)."""
    torch.manual_seed(0)
    if name == "mlp":
        model: torch.nn.Module = deep_mlp()
        x = torch.randn(40, 256)
    else:
        model = resnet18()
        x = torch.randn(2, 3, 64, 64) if small else torch.randn(5, 3, 224, 224)
    model(x).sum().backward()
    return model, x


def check_one(
    label: str, base: Any, model: torch.nn.Module, x: torch.Tensor, steps: int, options: dict[str, Any]
) -> bool:
    """Capture once, build with both trees, compare; True when identical."""
    with ls.profile(model, **options) as prof:
        for _ in range(steps):
            model(x).sum().backward()
    recording = prof.recording
    ours = recording.build()
    ours.validate()
    theirs = baseline_recording(base, recording).build()
    mine = without_clock(profile_to_dict(ours))
    old = without_clock(base.model.serialize.profile_to_dict(theirs))
    same = digest(mine) == digest(old)
    events = ours.meta.event_count
    verdict = "same" if same else f"DIFFERENT, first at {first_difference(mine, old)}"
    print(f"{label:<30}{events:>7} events  {digest(mine)} {digest(old)}  {verdict}", flush=True)
    return same


def check(args: argparse.Namespace) -> None:
    base = load_baseline(args.baseline)
    failures = 0
    for name in args.models:
        model, x = workload(name, small=True)
        for config in args.configs:
            failures += not check_one(f"{name} {config}", base, model, x, args.steps, CONFIGS[config])
    print("all identical" if not failures else f"{failures} DIFFERENT")
    sys.exit(1 if failures else 0)


def cpu_seconds(build: Any, pause_gc: bool = True) -> float:
    gc.collect()
    if pause_gc:  # as a live build runs (Recording.build pauses the cyclic GC); torch does not
        gc.disable()
    try:
        c0 = time.process_time()
        build()
        return time.process_time() - c0
    finally:
        gc.enable()


def time_trees(args: argparse.Namespace) -> None:
    base = load_baseline(args.baseline)
    model, x = workload(args.model, small=False)
    times: dict[str, list[float]] = {"baseline": [], "this": []}
    torch_s: list[float] = []
    events = 0
    for r in range(args.rounds):
        prof = capture(model, x, args.steps)
        recording = prof.recording
        torch_s.append(cpu_seconds(prof.torch_profiler.key_averages, pause_gc=False))
        builds = {"baseline": baseline_recording(base, recording)._build, "this": recording._build}
        for name in list(builds) if r % 2 == 0 else list(reversed(builds)):
            times[name].append(cpu_seconds(builds[name]))
        events = recording._build().meta.event_count
    t = statistics.median(torch_s)
    print(f"{args.model}, {events} events, {args.rounds} rounds (CPU time, medians)")
    print(f"  key_averages (first)   {t * 1e3:8.1f} ms  {t / events * 1e6:6.2f} us/event")
    for name, found in times.items():
        m = statistics.median(found)
        ratio = statistics.median(k / b for k, b in zip(torch_s, found, strict=True))
        per_event = m / events * 1e6
        print(f"  build, {name:<15} {m * 1e3:8.1f} ms  {per_event:6.2f} us/event  {ratio:5.1f}x key_averages")
    ratios = [b / a for b, a in zip(times["baseline"], times["this"], strict=True)]
    print(f"  this vs baseline: {statistics.median(ratios):.2f}x faster (median of per-round ratios)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("baseline", help="make the baseline tree")
    make.add_argument("commit")
    make.add_argument("folder", type=Path)
    same = commands.add_parser("check", help="identical saved profiles")
    same.add_argument("--baseline", type=Path, required=True, help="src folder holding layerscope_base")
    same.add_argument("--steps", type=int, default=3)
    same.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    same.add_argument("--models", nargs="*", default=["mlp", "resnet"])
    timed = commands.add_parser("time", help="the live build, paired")
    timed.add_argument("--baseline", type=Path, required=True)
    timed.add_argument("--model", choices=("mlp", "resnet"), default="mlp")
    timed.add_argument("--steps", type=int, default=20)
    timed.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.command == "baseline":
        make_baseline(args.commit, args.folder)
    elif args.command == "check":
        check(args)
    else:
        time_trees(args)


if __name__ == "__main__":
    main()
