"""The flight recorder's cost step by step after its entry: which steps a round's "steady state" may
count. Each round runs ``--steps`` plain steps, then enters the light recorder and runs as many
recorded steps; per step index, the median over rounds of the recorded/plain CPU-time ratio.

    python benchmarks/flight_first_steps.py [--rounds 30] [--steps 6]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import layerscope as ls
from flight import make_loop


def main() -> None:
    """Run the rounds and print one line per step index."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, step = make_loop(20, 4, "cpu")
    for _ in range(3):
        step()
    plain: list[list[float]] = []
    light: list[list[float]] = []
    with tempfile.TemporaryDirectory() as out:
        for _ in range(args.rounds):
            gc.collect()
            row = []
            for _ in range(args.steps):
                start = time.process_time()
                step()
                row.append(time.process_time() - start)
            plain.append(row)
            gc.collect()
            row = []
            with ls.flight_recorder(model, out=out, slow=None) as rec:
                for _ in range(args.steps):
                    start = time.process_time()
                    step()
                    rec.step()
                    row.append(time.process_time() - start)
            light.append(row)
    for k in range(args.steps):
        ratio = statistics.median(lit[k] / pla[k] for lit, pla in zip(light, plain, strict=True))
        plain_ms = statistics.median(r[k] for r in plain) * 1000
        print(f"step {k} after entry: plain {plain_ms:.1f} ms CPU, recorded/plain {ratio:.4f}")


if __name__ == "__main__":
    main()
