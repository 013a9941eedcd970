"""The real-model zoo's checks as a Markdown table (model × check), for docs/compared.md.

Runs every case of ``tests/realmodels`` (Hugging Face transformers families with tiny random
configs, checkpointed and compiled variants) and every check that applies, exactly as the tests do
(``tests/realmodels/checks.py``), and prints one row per case: ✓ or ✗ with the figure behind it,
— where a check does not apply. Then the failures' details and the time each case took.

    python benchmarks/zoo.py [--cases llama,mixtral]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.realmodels

from tests.realmodels.checks import CHECKS, COMPILED_RUNTIME, Check
from tests.realmodels.models import CASES
from tests.realmodels.runs import ZooRun, run_case

TITLES = {
    "runs": "runs, validate()",
    "identical": "outputs, grads, RNG bit-identical",
    "code-paths": "code paths (recomputes / no recompile)",
    "self-cpu": "op self CPU / key_averages",
    "flops": "FLOPs / FlopCounterMode",
    "peak": "absolute peak / MemoryProfile",
    "placement": "compiled: kernels placed below the root",
}


def cell(check: Check) -> str:
    """✓ or ✗ and the figure; — where the check does not apply."""
    if check.ok is None:
        return "—"
    mark = "✓" if check.ok else "✗"
    return f"{mark} {check.figure}".strip()


def summary(check: Check) -> str:
    """One line of a failure's detail: a traceback's last line (the exception), else the first."""
    lines = check.detail.strip().splitlines() or [check.figure]
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]


def compiled_runtime(run: ZooRun) -> str:
    """How the compiled root's own time compares with its ops: why placement leaves the runtime's
    ranges out (``COMPILED_RUNTIME``)."""
    profile = run.profile
    if profile is None:
        return f"{run.case.id}: no profile"
    rows = profile.ops(group_by=("name", "module"))
    runtime = sum(
        r.metrics.self_cpu_us for r in rows if r.module == "" and r.name.startswith(COMPILED_RUNTIME)
    )
    below = sum(c.total.cpu_us for c in profile.root.children)
    ms = f"{runtime / 1000:.1f} ms in torch.compile's runtime ranges, {below / 1000:.1f} ms below"
    return f"{run.case.id}: {ms}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", help="comma-separated case ids (default: all)")
    args = parser.parse_args()
    wanted = set(args.cases.split(",")) if args.cases else None
    header = ["model", "kind", *TITLES.values()]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    failures: list[str] = []
    timings: list[str] = []
    runtimes: list[str] = []
    for case in CASES:
        if wanted is not None and case.id not in wanted:
            continue
        start = time.perf_counter()
        run = run_case(case)
        results = {name: check(run) for name, check in CHECKS.items()}
        timings.append(f"{case.id} {time.perf_counter() - start:.1f} s")
        cells = " | ".join(cell(results[name]) for name in TITLES)
        print(f"| {case.id} | {case.kind} | {cells} |", flush=True)
        failures += [f"- {case.id} {n}: {summary(r)}" for n, r in results.items() if r.ok is False]
        if case.compiled:
            runtimes.append(compiled_runtime(run))
        run.release()
        del run
        if case.compiled:
            torch._dynamo.reset()
        gc.collect()
    print("\nFailures:\n" + ("\n".join(failures) or "none"))
    print("\nCompiled roots' own time (CPU), the step with the first call:\n" + "\n".join(runtimes))
    print("\nSeconds per case (run and checks): " + ", ".join(timings))


if __name__ == "__main__":
    main()
