"""Feasibility of module boundaries without profiler events: timestamps on torch's own clock.

A module scope today is one profiler range per module call (~0.85 µs alone, ~2-3 µs between real ops
on this VM: docs/benchmarks.md). The alternative measured here: the wrapper takes a raw timestamp with
``c10::getApproximateTime()`` (the TSC read torch stamps its events with) and converts it at the end
with its own ``c10::ApproximateClockToUnixTimeConverter``, as torch converts its events. For that to
replace ranges, converted marks must order exactly against torch's event times. This compiles a tiny
extension (the native reader's compile recipe), then, inside a profile, puts marks right outside an
op and right inside a ``_RecordFunctionFast`` range, and reports the gaps (negative = misordered).

    python benchmarks/clock_marks.py [--pairs 20000]
    python benchmarks/clock_marks.py --sessions 600   # the module's own marks, one offset per session

``--sessions`` asks another question: whether the two converters (ours, made at ``marks_start`` and
finished at ``marks_stop``; torch's, made when its profiler starts and finished when it stops) agree
in every session, not just on average. Each of N short profiler sessions puts 20 marks right before
and after a ``torch.add`` through the native module's own ``marks_start``/``mark``/``marks_stop``;
a session whose converters disagree shows as a shift of all its gaps together (the median gap of
the session), which a single long session cannot show.
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
from layerscope.capture.clock_anchors import ANCHOR_NAME, Anchor, Stamped, alignment

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


def session_offsets(sessions: int) -> None:
    """Per session, the median gap from a mark to the op right after it and from the op's end to the
    mark right after it (both positive when the converters agree: a shift moves them in opposite
    directions); as converted, and after the clock anchors' alignment (``capture/clock_anchors.py``)."""
    module = native.load()
    if module is None:
        raise SystemExit("the native module is not built: python -m layerscope native build")
    a, b = torch.ones(8), torch.ones(8)
    medians: dict[str, list[tuple[float, float]]] = {"as converted": [], "aligned": []}
    for _ in range(sessions):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            module.marks_start()
            module.clock_anchor()
            module.clock_anchor()  # as ModuleMarks.start: the thread's first range brackets loosely
            for _ in range(20):
                module.mark(1)
                torch.add(a, b)
                module.mark(-1)
            module.clock_anchor()
            threads = module.marks_stop()
        events = prof.profiler.kineto_results.events()
        ops = [e for e in events if e.name() == "aten::add"]
        tid = threads[0][0]
        times = np.frombuffer(threads[0][2], dtype=np.int64)
        codes = np.frombuffer(threads[0][3], dtype=np.int64)
        anchors = [Anchor(tid, int(t0), int(t1)) for t0, t1 in times[codes < -(2**62)].reshape(-1, 2)]
        stamped = [
            Stamped(tid, e.start_ns(), e.start_ns() + e.duration_ns())
            for e in events
            if e.name() == ANCHOR_NAME
        ]
        marks = times[codes > -(2**62)]
        shift = alignment(anchors, stamped)
        start = np.array([e.start_ns() for e in ops])
        end = start + np.array([e.duration_ns() for e in ops])
        if len(ops) != len(marks) // 2:
            continue
        for kind, at in (("as converted", marks), ("aligned", shift.apply(marks) if shift else marks)):
            medians[kind].append((float(np.median(start - at[0::2])), float(np.median(at[1::2] - end))))
    for kind, found in medians.items():
        before, after = np.array(found).T
        shifted = int(((before < 0) | (after < 0)).sum())
        print(f"{len(found)} sessions of 20 (mark, aten::add, mark), {kind}; per-session median gaps (ns):")
        for label, values in (("mark -> op start", before), ("op end -> mark", after)):
            low, p1, mid, p99, high = np.percentile(values, [0, 1, 50, 99, 100])
            figures = f"min {low:7.0f}  p1 {p1:6.0f}  median {mid:6.0f}  p99 {p99:6.0f}  max {high:7.0f}"
            print(f"  {label:<18} {figures}")
        print(f"  sessions whose converters disagree past a gap (a median gap < 0): {shifted}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--sessions", type=int, default=0, help="per-session offsets instead (see above)")
    args = parser.parse_args()
    if args.sessions:
        session_offsets(args.sessions)
        return
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
