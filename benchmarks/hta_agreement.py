"""Our device figures over the window Holistic Trace Analysis (HTA 0.5.0) analyses, for the
agreement table in docs/compared.md.

HTA leaves out the last ProfilerStep of a trace with two or more step names: it keeps the device
work launched by CPU events that start before the last step begins (``_filter_irrelevant_gpu_kernels``).
This script applies the same cut, then prints per trace: busy time, HTA's kernel split
(communication, computation, memory: copies and sets), communication/computation overlap, kernels
shorter than their launch call (ours: graph launches left out) and HTA's "short kernels" (device work
launched by HTA_LAUNCHES whose launch call is ≤ 50 µs and longer than the work), and kernels under
10 µs. HTA reads times in whole
microseconds (start rounded up, end down), so on traces with sub-µs times each kernel reads up to
1 µs shorter there: ``--hta-rounding`` does the same.

    python benchmarks/hta_agreement.py ../shared/traces/*.json.gz ../shared/traces/two_ranks/*.json.gz \
        tests/fixtures/gpu/*[a-z].json.gz
    python benchmarks/hta_agreement.py --hta-rounding ...   # HTA's whole-µs times: its figures exactly
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from layerscope.analysis.device import TINY_KERNEL_US, is_graph_launch, kernel_kind
from layerscope.analysis.streams import overlap_share
from layerscope.errors import TraceFormatError
from layerscope.events.intervals import union_length
from layerscope.events.steps import step_windows
from layerscope.events.table import EventKind, EventTable
from layerscope.loading import _read

#: The launch calls HTA's launch statistics read (kernels, copies and sets; not ``cuLaunchKernel``).
HTA_LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync"})


def _rounded(ts: int, dur: int) -> int:
    """A duration (ns) between HTA's whole-µs start (rounded up) and end (rounded down)."""
    return ((ts + dur) // 1000 - -(-ts // 1000)) * 1000


def hta_kept(table: EventTable, device: np.ndarray) -> np.ndarray:
    """Which of the device work HTA keeps: launched before the last step's start (all with < 2 steps)."""
    windows = step_windows(table)
    if len(windows) < 2:
        return np.ones(device.size, dtype=bool)
    cut = windows[-1].start
    kinds = table.array("span_kind")
    launch_ts = {
        table.span_corr[i]: table.span_ts[i]
        for i in np.flatnonzero(kinds == EventKind.RUNTIME).tolist()
        if table.span_corr[i] > 0
    }
    return np.asarray([launch_ts.get(table.span_corr[k], cut) < cut for k in device.tolist()], dtype=bool)


def figures(table: EventTable, hta_rounding: bool = False) -> dict[str, float | int | None]:
    kinds = table.array("span_kind")
    device = np.flatnonzero((kinds >= EventKind.KERNEL) & (kinds <= EventKind.MEMSET))
    device = device[hta_kept(table, device)]
    ts, dur = table.array("span_ts"), table.array("span_dur")
    start, end = ts[device], ts[device] + dur[device]
    if hta_rounding:  # HTA reads times in whole µs: start rounded up, end down
        start = -(-start // 1000) * 1000  # integer ceil: float division loses ns at epoch scale
        end = np.maximum(end // 1000 * 1000, start)
    names = table.names
    split = {"communication": np.zeros(device.size, bool), "memory": np.zeros(device.size, bool)}
    for j, k in enumerate(device.tolist()):
        if kinds[k] != EventKind.KERNEL:
            split["memory"][j] = True
        elif kernel_kind(names[table.span_name[k]], EventKind.KERNEL) == "communication":
            split["communication"][j] = True
    computation = ~(split["communication"] | split["memory"])
    runtime = {
        table.span_corr[i]: i
        for i in np.flatnonzero(kinds == EventKind.RUNTIME).tolist()
        if table.span_corr[i] > 0
    }
    ours_bound = hta_short = 0
    for k in device.tolist():
        launcher = runtime.get(table.span_corr[k])
        if launcher is None:
            continue
        call, kernel = table.span_dur[launcher], table.span_dur[k]
        launch_name = names[table.span_name[launcher]]
        if kinds[k] == EventKind.KERNEL:
            ours_bound += kernel < call and not is_graph_launch(launch_name)
        if launch_name in HTA_LAUNCHES:
            if hta_rounding:
                call, kernel = _rounded(table.span_ts[launcher], call), _rounded(table.span_ts[k], kernel)
            hta_short += kernel < call and call <= 50_000
    comm = (start[split["communication"]], end[split["communication"]])
    overlap = overlap_share(comm, (start[computation], end[computation]))

    def total(mask: np.ndarray) -> float:
        return float((end[mask] - start[mask]).sum()) / 1000.0

    return {
        "busy_us": union_length(start, end) / 1000.0,
        "communication_us": total(split["communication"]),
        "computation_us": total(computation),
        "memory_us": total(split["memory"]),
        "overlap_pct": None if overlap is None else 100 * overlap,
        "launch_bound": ours_bound,
        "hta_short_kernels": hta_short,
        "tiny_kernels": int(
            ((dur[device] < TINY_KERNEL_US * 1000) & (kinds[device] == EventKind.KERNEL)).sum()
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument(
        "--hta-rounding", action="store_true", help="round kernel times to whole µs as HTA does"
    )
    args = parser.parse_args()
    columns = ("busy_us", "communication_us", "computation_us", "memory_us", "overlap_pct")
    counts = ("launch_bound", "hta_short_kernels", "tiny_kernels")
    print("| trace | busy | comm | comp | memory | overlap | launch-bound | HTA short | < 10 µs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for path in args.traces:
        try:
            read = _read(Path(path), None, False)
        except TraceFormatError as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            continue
        if not isinstance(read, EventTable):
            continue
        found = figures(read, args.hta_rounding)
        cells = [
            "" if found[c] is None else f"{found[c]:.0f}" if c != "overlap_pct" else f"{found[c]:.2f}%"
            for c in columns
        ]
        cells += [str(found[c]) for c in counts]
        print(f"| {path} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
