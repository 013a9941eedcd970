"""Attribution alone: ``build_profile`` on one pickled capture, so that two trees of the code can be
timed on the very same events (the capture itself varies from run to run).

    python benchmarks/attribution.py record capture.pkl          # 20 MLP training steps, memory on
    python benchmarks/attribution.py time capture.pkl            # best and median of 7 builds
    PYTHONPATH=/other/tree/src python benchmarks/attribution.py time capture.pkl

The pickle holds an ``EventTable`` and the module catalog; both trees must be able to unpickle them.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def record(path: Path, steps: int) -> None:
    """Profile ``steps`` training steps of the MLP workload and pickle what ``build_profile`` got."""
    import torch

    import layerscope as ls
    from layerscope.capture import recording
    from overhead import tiny_transformer_mlps

    model, x = tiny_transformer_mlps(), torch.randn(1, 64)
    saved: list[bytes] = []
    real = recording.build_profile

    def keep(table: Any, catalog: Any = None, meta: Any = None, compiled_graphs: Any = None) -> Any:
        saved.append(pickle.dumps((table, catalog)))
        return real(table, catalog, meta, compiled_graphs=compiled_graphs)

    recording.build_profile = keep  # type: ignore[assignment]
    try:
        with ls.profile(model, memory=True) as prof:
            for _ in range(steps):
                model(x).sum().backward()
                prof.step()
        prof.profile  # noqa: B018 - builds it, which pickles the inputs
    finally:
        recording.build_profile = real
    path.write_bytes(saved[0])
    print(f"recorded {pickle.loads(saved[0])[0].event_count} events into {path}")


def time_builds(path: Path, rounds: int) -> None:
    """Best and median wall time of ``build_profile`` over ``rounds`` fresh copies of the capture."""
    from layerscope.attribution.attribute import build_profile

    raw = path.read_bytes()
    seconds: list[float] = []
    for _ in range(rounds):
        table, catalog = pickle.loads(raw)
        gc.collect()
        gc.disable()
        start = time.perf_counter()
        build_profile(table, catalog)
        seconds.append(time.perf_counter() - start)
        gc.enable()
    seconds.sort()
    print(f"build_profile: best {seconds[0] * 1e3:.1f} ms, median {seconds[len(seconds) // 2] * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("record", "time"))
    parser.add_argument("path", type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.action == "record":
        record(args.path, args.steps)
    else:
        time_builds(args.path, args.rounds)


if __name__ == "__main__":
    main()
