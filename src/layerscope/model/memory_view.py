"""What was live at the peak of memory, as users read it: :meth:`Profile.memory_at_peak`.

The figures are built once, when the profile is (``attribution/memory/report.py``), and kept in
``meta.memory`` (a :class:`~layerscope.model.memory.MemoryReport`), so a saved profile answers
the same.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from layerscope.errors import LayerscopeError
from layerscope.model.memory import BEFORE_BLOCK, UNPAIRED, MemoryReport, MemoryRow

__all__ = ["BEFORE_BLOCK", "UNPAIRED", "MemoryAtPeak", "MemoryRow", "memory_at_peak"]


@dataclass(frozen=True)
class MemoryAtPeak:
    """The highest live memory of one device class over the recording and what made it up.

    ``absolute_peak_bytes``: ``baseline_bytes`` (what was live when recording began) plus what
    the recording added by then. ``time_us`` is measured from the first event of the recording;
    ``where`` names the module path, phase and op running when the peak was reached.
    """

    device: bool
    absolute_peak_bytes: int
    baseline_bytes: int
    time_us: float | None
    where: dict[str, str] | None
    rows: tuple[MemoryRow, ...]
    #: Bytes saved for backward per keeping module: {"activation", "parameter", "input"} each.
    saved: dict[str, dict[str, int]]
    #: Whether layerscope's memory watch named the categories (a live capture with ``memory=True``);
    #: without it (a trace file), live memory is only "temporary" or "other".
    categorised: bool
    #: Of the baseline: the bytes of the storages the watch saw (every live tensor's, scanned at
    #: the start), and the allocator's own figure where it gave one (CUDA's
    #: ``memory_allocated()``, a trace's "Total Allocated"), else None. The baseline is the larger.
    baseline_seen_bytes: int | None = None
    baseline_allocator_bytes: int | None = None

    @property
    def total_bytes(self) -> int:
        """Deprecated name of :attr:`absolute_peak_bytes`."""
        warnings.warn("MemoryAtPeak.total_bytes is now absolute_peak_bytes", DeprecationWarning, stacklevel=2)
        return self.absolute_peak_bytes

    def by_category(self) -> dict[str, int]:
        """Bytes live at the peak per category, largest first."""
        out: dict[str, int] = {}
        for row in self.rows:
            out[row.category] = out.get(row.category, 0) + row.bytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def memory_at_peak(report: MemoryReport | None, device: str | bool | None = None) -> MemoryAtPeak:
    """The :class:`MemoryAtPeak` of a profile's memory report; ``device`` None picks the accelerator's when
    it recorded memory, else the CPU's; ``"cpu"``/False and ``"device"``/``"cuda"``/True choose."""
    if report is None or not report.classes:
        raise LayerscopeError("this profile has no memory figures (profile with memory=True)")
    if device is None:
        chosen = report.main_class()
    else:
        want = device if isinstance(device, bool) else str(device).lower() not in ("cpu", "host")
        chosen = next((c for c in report.classes if c.device == want), None)
        if chosen is None:
            raise LayerscopeError(f"no {'device' if want else 'CPU'} memory was recorded")
    assert chosen is not None  # classes is not empty
    start, ts = report.start_ns, chosen.peak_ts_ns
    time_us = (ts - start) / 1000.0 if ts is not None and start is not None else None
    return MemoryAtPeak(
        device=chosen.device,
        absolute_peak_bytes=chosen.absolute_peak_bytes,
        baseline_bytes=chosen.baseline_bytes,
        time_us=time_us,
        where=dict(chosen.where) if chosen.where is not None else None,
        rows=chosen.rows,
        saved={m: dict(f) for m, f in report.saved.items()},
        categorised=report.watched,
        baseline_seen_bytes=chosen.baseline_seen_bytes,
        baseline_allocator_bytes=chosen.baseline_allocator_bytes,
    )
