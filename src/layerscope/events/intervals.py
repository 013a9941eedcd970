"""Time intervals: how much of the timeline a set of spans covers."""

from __future__ import annotations

import numpy as np


def union_length(starts: np.ndarray, ends: np.ndarray) -> int:
    """Total length covered by intervals ``[starts[k], ends[k])`` (overlaps counted once)."""
    if not starts.size:
        return 0
    if bool((starts[1:] < starts[:-1]).any()):  # most callers' intervals come in start order
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
    running_end = np.maximum.accumulate(ends)
    # an interval starts a new block when it begins after everything before it ended
    firsts = np.flatnonzero(starts[1:] > running_end[:-1])
    del running_end
    firsts += 1
    firsts = np.concatenate((np.zeros(1, firsts.dtype), firsts))
    block_end = np.maximum.reduceat(ends, firsts)
    np.maximum(block_end, 0, out=block_end)  # as a block's end was the max of 0 and its ends
    block_end -= starts[firsts]
    return int(block_end.sum())
