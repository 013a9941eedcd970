"""Time intervals: how much of the timeline a set of spans covers."""

from __future__ import annotations

import numpy as np


def union_length(starts: np.ndarray, ends: np.ndarray) -> int:
    """Total length covered by intervals ``[starts[k], ends[k])`` (overlaps counted once)."""
    if not starts.size:
        return 0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    running_end = np.maximum.accumulate(e)
    # an interval starts a new block when it begins after everything before it ended
    new_block = np.empty(s.size, dtype=bool)
    new_block[0] = True
    new_block[1:] = s[1:] > running_end[:-1]
    block_id = np.cumsum(new_block) - 1
    block_start = s[new_block]
    block_end = np.zeros(block_start.size, dtype=np.int64)
    np.maximum.at(block_end, block_id, e)
    return int((block_end - block_start).sum())
