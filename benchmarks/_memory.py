"""Peak-RSS measurement for benchmarks (Linux: /proc/self/status, resettable through clear_refs)."""

from __future__ import annotations

import contextlib
from pathlib import Path


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak() -> int:
    """Reset the process's peak RSS to its current RSS (Linux >= 4.0); returns the current RSS in MiB."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS") // 1024


def peak_mib() -> int:
    """Peak RSS since the last reset, in MiB."""
    return _status_kib("VmHWM") // 1024
