"""Call lines as torch-free data: which stack of the user's call lines each top-level op ran under,
keyed by the op's RecordFunction handle (the id torch's profiler keeps on the op's event).

Made by ``capture/call_lines.py``; read by ``attribution/call_lines.py``. Frames are spelled as torch's
tracer spells them, ``/path/file.py(LINE): function``, innermost first, but LINE is the line that
was executing in that frame (the call), not the function's first line.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np

from layerscope.events.frame_chains import FrameChains


@dataclass(frozen=True)
class CallLines:
    """Recorded ops (``handles``, sorted) and the stack each ran under (``stack_ids`` into ``stacks``)."""

    handles: np.ndarray
    stack_ids: np.ndarray
    stacks: list[tuple[str, ...]]

    @classmethod
    def from_nodes(
        cls,
        handles: np.ndarray,
        nodes: np.ndarray,
        node_code: np.ndarray,
        node_line: np.ndarray,
        node_parent: np.ndarray,
        files: list[str],
        functions: list[str],
    ) -> CallLines:
        """From the recorder's tree of (code, line, parent) nodes: each distinct node ops ran under
        becomes one stack (built once; a node's tuple is its frame plus its parent's)."""
        codes, lines = node_code.tolist(), node_line.tolist()
        chains = FrameChains(
            node_parent.tolist(), lambda m: f"{files[codes[m]]}({lines[m]}): {functions[codes[m]]}"
        )

        distinct, stack_ids = np.unique(nodes, return_inverse=True)
        stacks = [chains.of(int(n)) for n in distinct.tolist()]
        order = np.argsort(handles, kind="stable")
        return cls(handles[order], stack_ids.reshape(-1)[order].astype(np.int64), stacks)

    def to_saved(self) -> dict[str, Any]:
        """JSON-ready form, saved in the header of exported Chrome traces (``"layerscope"``)."""
        return {
            "handles": self.handles.tolist(),
            "stack_ids": self.stack_ids.tolist(),
            "stacks": [list(stack) for stack in self.stacks],
        }

    @classmethod
    def from_saved(cls, saved: Any) -> CallLines | None:
        """What :meth:`to_saved` wrote, or None when ``saved`` is not that (a foreign or damaged
        header loses the lines, not the trace)."""
        try:
            handles = np.asarray(saved["handles"], dtype=np.int64)
            stack_ids = np.asarray(saved["stack_ids"], dtype=np.int64)
            stacks = [tuple(str(frame) for frame in stack) for stack in saved["stacks"]]
            if not all(isinstance(stack, list) for stack in saved["stacks"]):
                return None
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        valid = handles.ndim == 1 and handles.shape == stack_ids.shape
        if not valid or (stack_ids.size and (stack_ids.min() < 0 or stack_ids.max() >= len(stacks))):
            return None
        order = np.argsort(handles, kind="stable")
        return cls(handles[order], stack_ids[order], stacks)

    @property
    def op_count(self) -> int:
        """How many ops were recorded with a line."""
        return int(self.handles.size)

    def stacks_of(self, op_handles: np.ndarray) -> np.ndarray:
        """The stack id of each handle in ``op_handles`` (-1 where none was recorded; 0 is no op)."""
        out = np.full(op_handles.size, -1, dtype=np.int64)
        if not self.handles.size or not op_handles.size:
            return out
        at = np.searchsorted(self.handles, op_handles)
        at_clipped = np.minimum(at, self.handles.size - 1)
        found = (self.handles[at_clipped] == op_handles) & (op_handles != 0)
        out[found] = self.stack_ids[at_clipped[found]]
        return out


class HandleColumn:
    """Op spans' RecordFunction ids as a trace is read (torch writes "Record function id" on every
    op): two packed int64 arrays, not a dict, since a big trace has millions of ops."""

    def __init__(self) -> None:
        self.spans = array("q")
        self.handles = array("q")

    def add(self, span: int, value: Any) -> None:
        """Keep ``span``'s id; a missing, zero or malformed one is no id (the event stays good)."""
        if isinstance(value, int) and value > 0 and not isinstance(value, bool) and value < 2**63:
            self.spans.append(span)
            self.handles.append(value)


def saved_call_lines(
    header: dict[str, Any], column: HandleColumn, span_count: int
) -> tuple[CallLines | None, np.ndarray | None]:
    """The call lines a trace's layerscope header saved, and each span's op handle (0: none) from
    the ids read per span; (None, None) when the trace has no lines, or when none of the saved
    handles is an op of this trace (a header pasted from another run, ids stripped): no lines is
    better than every op under the no-line row or a wrong line."""
    lines = CallLines.from_saved(header["call_lines"]) if "call_lines" in header else None
    if lines is None:
        return None, None
    op_handles = np.zeros(span_count, dtype=np.int64)
    spans = np.frombuffer(column.spans, dtype=np.int64)
    op_handles[spans] = np.frombuffer(column.handles, dtype=np.int64)
    if lines.handles.size and not np.isin(lines.handles, op_handles).any():
        return None, None
    return lines, op_handles
