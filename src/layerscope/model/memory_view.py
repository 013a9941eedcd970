"""What was live at the peak of memory, as users read it: :meth:`Profile.memory_at_peak`.

The figures are built once, when the profile is (``attribution/memory_peak.py``), and kept in
``meta["memory"]``, so a saved profile answers the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from layerscope.errors import LayerscopeError

#: The module of storages live before the recording began.
BEFORE_BLOCK = "(before the block)"
#: The module of live bytes no address pairs with an allocation (a trace without addresses).
UNPAIRED = "(addresses not recorded)"


@dataclass(frozen=True)
class MemoryRow:
    """Bytes of one category live at the peak, by the module (or entry) whose work allocated them
    and its phase. Storages from before the block read ``(before the block)``; activations are
    charged to the module whose op allocated them (:attr:`MemoryAtPeak.saved` says who keeps them)."""

    category: str
    module: str
    phase: str
    bytes: int


@dataclass(frozen=True)
class MemoryAtPeak:
    """The highest live memory of one device class over the recording and what made it up.

    ``total_bytes`` is absolute: ``baseline_bytes`` (what was live when recording began) plus what
    the recording added by then. ``time_us`` is measured from the first event of the recording;
    ``where`` names the module path, phase and op running when the peak was reached.
    """

    device: bool
    total_bytes: int
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

    def by_category(self) -> dict[str, int]:
        """Bytes live at the peak per category, largest first."""
        out: dict[str, int] = {}
        for row in self.rows:
            out[row.category] = out.get(row.category, 0) + row.bytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def memory_at_peak(meta: dict[str, Any], device: str | bool | None = None) -> MemoryAtPeak:
    """The :class:`MemoryAtPeak` of ``meta["memory"]``; ``device`` None picks the accelerator's when
    it recorded memory, else the CPU's; ``"cpu"``/False and ``"device"``/``"cuda"``/True choose."""
    found_memory = meta.get("memory")
    memory: dict[str, Any] = found_memory if isinstance(found_memory, dict) else {}
    classes = memory.get("classes")
    if not classes:
        raise LayerscopeError("this profile has no memory figures (profile with memory=True)")
    if device is None:
        chosen = next((c for c in classes if c["device"]), classes[0])
    else:
        want = device if isinstance(device, bool) else str(device).lower() not in ("cpu", "host")
        found = [c for c in classes if bool(c["device"]) == want]
        if not found:
            raise LayerscopeError(f"no {'device' if want else 'CPU'} memory was recorded")
        chosen = found[0]
    start = memory.get("start_ns")
    ts = chosen.get("peak_ts_ns")
    time_us = (ts - start) / 1000.0 if isinstance(ts, int) and isinstance(start, int) else None
    return MemoryAtPeak(
        device=bool(chosen["device"]),
        total_bytes=int(chosen["peak_bytes"]),
        baseline_bytes=int(chosen["baseline_bytes"]),
        time_us=time_us,
        where=chosen.get("where"),
        rows=tuple(MemoryRow(str(c), str(m), str(p), int(b)) for c, m, p, b in chosen["rows"]),
        saved=dict(memory.get("saved") or {}),
        categorised=bool(memory.get("watched")),
        baseline_seen_bytes=_int_or_none(chosen.get("baseline_seen_bytes")),
        baseline_allocator_bytes=_int_or_none(chosen.get("baseline_allocator_bytes")),
    )


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None
