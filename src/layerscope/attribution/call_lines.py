"""Call lines to every op: each span's stack of the user's call lines (``ls.profile(lines=True)``).

Capture recorded a stack for each top-level op (``events/call_lines.py``). Here every other span gets
one: an op nested in another takes its parent's (``aten::addmm`` inside ``aten::linear`` was called by
the same line), and backward work takes the stack of the forward op that created its autograd node
(sequence number and forward thread, as module ownership does), so a line has a backward too. A
backward node with no forward op (gradient accumulation) keeps the line that ran ``backward()``.
"""

from __future__ import annotations

import numpy as np

from layerscope.attribution.forward_ops import ForwardOps
from layerscope.events.table import EventTable


def call_line_stacks(
    table: EventTable,
    parent: np.ndarray,
    levels: list[np.ndarray],
    forward_op_of: ForwardOps,
) -> tuple[np.ndarray, list[tuple[str, ...]]] | None:
    """Each span's stack id (-1: none) and the stacks, or None when no call lines were recorded."""
    lines, op_handles = table.call_lines, table.op_handles
    if lines is None or op_handles is None:
        return None
    handles = np.zeros(table.span_count, dtype=np.int64)
    count = min(op_handles.size, table.span_count)  # spans appended after reading (marks) have none
    handles[:count] = op_handles[:count]
    own = lines.stacks_of(handles)
    stack = _inherited(own, parent, levels)
    seq, fwd_tid = table.array("span_seq"), table.array("span_fwd_tid")
    backward = np.flatnonzero((seq >= 0) & (fwd_tid != 0))
    if backward.size:
        owners = forward_op_of.lookup(fwd_tid[backward], seq[backward])
        has = owners >= 0
        own = own.copy()
        own[backward[has]] = stack[owners[has]]
        stack = _inherited(own, parent, levels)
    return stack, lines.stacks


def _inherited(own: np.ndarray, parent: np.ndarray, levels: list[np.ndarray]) -> np.ndarray:
    """``own`` where set, else the parent's (outermost level first, so chains resolve)."""
    stack = own.copy()
    for level in levels[1:]:
        missing = level[stack[level] < 0]
        stack[missing] = stack[parent[missing]]
    return stack
