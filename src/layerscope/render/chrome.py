"""Chrome/Perfetto traces: torch's trace of the run plus where each module's backward ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from layerscope.attribution.backward_ranges import backward_ranges
from layerscope.events.chrome import table_from_trace
from layerscope.model.serialize import encode_json

BACKWARD_TRACK = "modules (backward)"


def with_backward_tracks(trace: dict[str, Any]) -> dict[str, Any]:
    """``trace`` (a parsed torch.profiler Chrome trace) with a "modules (backward)" track per process:
    one range per run of backward work that a module owns, so the trace shows which layer's backward
    runs when (forward module ranges are already there: layerscope's ``ls:`` ranges)."""
    table = table_from_trace(trace)
    added: list[dict[str, Any]] = []
    pids: set[Any] = set()
    for path, tid, start, end in backward_ranges(table):
        pid = table.threads.get(tid, (0, 0))[0]
        pids.add(pid)
        added.append(
            {
                "ph": "X",
                "cat": "layerscope",
                "name": path or "(root)",
                "pid": pid,
                "tid": BACKWARD_TRACK,
                "ts": start / 1000.0,
                "dur": (end - start) / 1000.0,
                "args": {"module": path, "phase": "backward"},
            }
        )
    for pid in pids:
        added.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": BACKWARD_TRACK,
                "args": {"name": BACKWARD_TRACK},
            }
        )
    return {**trace, "traceEvents": [*trace["traceEvents"], *added]}


def write_trace(trace: dict[str, Any], path: Path) -> Path:
    """Write a trace as .json, or gzipped when the name ends in .gz (atomically)."""
    from layerscope.render.writers import commit_files

    return commit_files([(Path(path), encode_json(Path(path), trace))])[0]
