"""Feasibility of module boundaries without profiler events: timestamps on torch's own clock.

A module scope today is one profiler range per module call (~0.85 µs alone, ~2-3 µs between real ops
on this VM: docs/benchmarks.md). The alternative measured here: the wrapper takes a raw timestamp with
``c10::getApproximateTime()`` (the TSC read torch stamps its events with) and converts it at the end
with its own ``c10::ApproximateClockToUnixTimeConverter``, as torch converts its events. For that to
replace ranges, converted marks must order exactly against torch's event times. This compiles a tiny
extension (the native reader's compile recipe), then, inside a profile, puts marks right outside an
op and right inside a ``_RecordFunctionFast`` range, and reports the gaps (negative = misordered).

    python benchmarks/clock_marks.py [--pairs 20000]
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import subprocess
import tempfile
import timeit
from pathlib import Path
from typing import Any

import numpy as np
import torch

from layerscope.capture import native

SOURCE = r"""
#include <pybind11/pybind11.h>
#include <c10/util/ApproximateClock.h>
#include <memory>
#include <vector>
namespace py = pybind11;
static std::unique_ptr<c10::ApproximateClockToUnixTimeConverter> converter;
static std::vector<c10::approx_time_t> marks;
static void start() {
  converter = std::make_unique<c10::ApproximateClockToUnixTimeConverter>();
  marks.clear();
}
static void mark() { marks.push_back(c10::getApproximateTime()); }
static py::list finish() {
  auto convert = converter->makeConverter();
  py::list out;
  for (auto m : marks) out.append(convert(m));
  return out;
}
PYBIND11_MODULE(clock_marks, m) {
  m.def("start", &start);
  m.def("mark", &mark);
  m.def("finish", &finish);
}
"""


def build(folder: Path) -> Any:
    source = folder / "clock_marks.cpp"
    source.write_text(SOURCE)
    output = folder / "clock_marks.so"
    command = [
        str(source) if part.endswith("native_reader.cpp") else part
        for part in native.compile_command(output)
        if not part.startswith("-DTORCH_EXTENSION_NAME")
    ]
    subprocess.run(command, check=True)
    loader = importlib.machinery.ExtensionFileLoader("clock_marks", str(output))
    spec = importlib.util.spec_from_file_location("clock_marks", output, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def gaps(label: str, values: np.ndarray) -> dict[str, Any]:
    return {
        "gap": label,
        "min_ns": int(values.min()),
        "p1_ns": float(np.percentile(values, 1)),
        "median_ns": float(np.median(values)),
        "misordered": int((values < 0).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        marks = build(Path(folder))
        marks.start()
        mark_us = min(timeit.repeat(marks.mark, number=100_000, repeat=5)) / 100_000 * 1e6
        x = torch.randn(4)
        record = torch._C._profiler._RecordFunctionFast
        with torch.profiler.profile(record_shapes=True) as prof:
            marks.start()
            for _ in range(args.pairs):
                marks.mark()
                torch.add(x, 1)
                marks.mark()
                with record("range"):
                    marks.mark()
                    torch.mul(x, 2)
                    marks.mark()
            stamps = np.array(marks.finish(), dtype=np.int64).reshape(-1, 4)
    events = prof.profiler.kineto_results.events()
    ops = [e for e in events if e.name() == "aten::add"]
    ranges = [e for e in events if e.name() == "range"]
    op_start = np.array([e.start_ns() for e in ops])
    op_end = op_start + np.array([e.duration_ns() for e in ops])
    range_start = np.array([e.start_ns() for e in ranges])
    range_end = range_start + np.array([e.duration_ns() for e in ranges])
    rows = [
        gaps("mark -> op start", op_start - stamps[:, 0]),
        gaps("op end -> mark", stamps[:, 1] - op_end),
        gaps("range start -> mark", stamps[:, 2] - range_start),
        gaps("mark -> range end", range_end - stamps[:, 3]),
    ]
    print(f"one mark: {mark_us:.3f} µs (a profiler range pair: ~0.85 µs alone)")
    print(f"{'gap':<22}{'min':>8}{'p1':>8}{'median':>9}{'misordered':>12}   ({args.pairs} pairs)")
    for r in rows:
        print(
            f"{r['gap']:<22}{r['min_ns']:>6}ns{r['p1_ns']:>6.0f}ns{r['median_ns']:>7.0f}ns{r['misordered']:>12}"
        )
    summary = {"benchmark": "clock_marks", "torch": torch.__version__, "mark_us": mark_us, "gaps": rows}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
