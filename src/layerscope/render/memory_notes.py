"""One-line notes under the tree for what a user must not miss: allocations refused (out of memory)
and a block that raised."""

from __future__ import annotations

from layerscope.model.meta import ProfileMeta
from layerscope.units import fmt_bytes


def memory_notes(meta: ProfileMeta) -> list[str]:
    """``out of memory in blocks.3.mlp.fc forward (aten::mm): asked for 1.0 TiB with 42.5 MB
    live`` per refused allocation, and ``the block raised X in <module>: <message>``."""
    notes = []
    report = meta.memory
    for oom in report.out_of_memory if report is not None else ():
        where = f"{oom.module} {oom.phase}".strip() or "(outside ops)"
        asked = fmt_bytes(oom.requested_bytes) if oom.requested_bytes else "an unknown size"
        live = f" with {fmt_bytes(oom.live_bytes)} live" if oom.live_bytes is not None else ""
        device = " on the device" if oom.device else ""
        notes.append(f"out of memory{device} in {where} ({oom.op}): asked for {asked}{live}")
    error = meta.capture.block_error if meta.capture is not None else None
    if error is not None:
        inside = f" in {error.module}" if error.module else ""
        notes.append(f"the block raised {error.type}{inside}: {error.message[:160]}")
    return notes
