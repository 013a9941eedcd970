"""Python call stacks of ops, from the Python-function spans of ``with_stack`` captures and traces.

torch's Python tracer records one span per Python (and C-builtin) call; they nest by time on their
thread, and every op runs inside the innermost one open when it starts. One sweep per thread over
those spans and the CPU ops, in time order, gives each op the chain of calls around it. Chains are
interned as a tree of nodes (frame, parent node): a training loop repeats the same few hundred
paths, so an op's stack costs one int and every distinct path is built once.

Frames are spelled as torch writes them, ``path/to/file.py(LINE): function``, with the object
addresses in builtin frames (``<built-in method t of Tensor object at 0x...>``) removed, so that
one call site is one frame. Stacks are stored whole, innermost first; which frames count as the
user's (:func:`is_internal_frame`) is decided when ops are grouped.
"""

from __future__ import annotations

import re

import numpy as np

from layerscope.events.frame_chains import FrameChains
from layerscope.events.names import NN_MODULE_EVENT_PREFIX, NN_MODULE_FRAME_PREFIX
from layerscope.events.table import EventKind, EventTable

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
#: Frames of these packages are torch's or ours, not the user's (paths as torch's tracer writes them:
#: relative to the sys.path entry they were found under).
_INTERNAL_PACKAGES = ("torch/", "layerscope/", "torchgen/", "functorch/")
_INSTALLED = re.compile(r"(?:^|/)(?:site|dist)-packages/(?:torch|layerscope|torchgen|functorch)/")


def frame_label(name: str) -> str:
    """A Python-function span's name as a stack frame (object addresses removed)."""
    return _ADDRESS.sub("", name) if " at 0x" in name else name


def is_internal_frame(frame: str) -> bool:
    """Whether ``frame`` is not a source location of the user's: C builtins, torch's ``nn.Module: X``
    markers, and code inside torch or layerscope."""
    return (
        # "layerscope(N): <module>" is the console script that `layerscope run` starts from
        frame.startswith(
            ("<built-in", NN_MODULE_EVENT_PREFIX, NN_MODULE_FRAME_PREFIX, "<frozen ", "layerscope(")
        )
        or frame.startswith(_INTERNAL_PACKAGES)
        or _INSTALLED.search(frame) is not None
    )


def user_frames(
    stack: tuple[str, ...], internal_frames: bool = False, depth: int | None = None
) -> tuple[str, ...]:
    """The frames of ``stack`` (innermost first) worth showing: the user's unless ``internal_frames``,
    the ``depth`` innermost of them."""
    frames = stack if internal_frames else tuple(f for f in stack if not is_internal_frame(f))
    return frames if depth is None else frames[:depth]


def op_stacks(table: EventTable) -> tuple[np.ndarray, list[tuple[str, ...]]] | None:
    """Each span's stack id (-1: none) and the stacks (frames innermost first), or None when the
    table has no Python-function spans."""
    kinds = table.array("span_kind")
    python = np.flatnonzero(kinds == int(EventKind.PYTHON))
    if not python.size:
        return None
    ops = np.flatnonzero(kinds == int(EventKind.CPU_OP))
    idx = np.concatenate((python, ops))
    is_op = np.concatenate((np.zeros(python.size, dtype=np.int8), np.ones(ops.size, dtype=np.int8)))
    ts = table.array("span_ts")[idx]
    dur = table.array("span_dur")[idx]
    tid = table.array("span_tid")[idx]
    # Per thread, by start; a Python span before an op starting at the same time (it is the caller),
    # and the longest first among spans starting together (the outer call).
    order = np.lexsort((-dur, is_op, ts, tid))
    idx_sorted = idx[order].tolist()
    is_op_sorted = is_op[order].tolist()

    names = table.names
    span_name, span_tid, span_ts, span_dur = table.span_name, table.span_tid, table.span_ts, table.span_dur
    frame_of_name: dict[int, int] = {}
    frames: list[str] = []
    frame_ids: dict[str, int] = {}
    node_frame: list[int] = []
    node_parent: list[int] = []
    nodes: dict[tuple[int, int], int] = {}
    stack_of = np.full(len(span_ts), -1, dtype=np.int64)
    op_node: list[int] = []
    op_span: list[int] = []
    current_tid = None
    open_end: list[int] = []
    open_node: list[int] = []

    for i, op in zip(idx_sorted, is_op_sorted, strict=True):
        t = span_tid[i]
        if t != current_tid:
            current_tid = t
            open_end, open_node = [], []
        start = span_ts[i]
        while open_end and open_end[-1] <= start:
            open_end.pop()
            open_node.pop()
        parent = open_node[-1] if open_node else -1
        if op:
            if parent >= 0:
                op_span.append(i)
                op_node.append(parent)
            continue
        name_id = span_name[i]
        frame = frame_of_name.get(name_id)
        if frame is None:
            label = frame_label(names[name_id])
            frame = frame_ids.get(label)
            if frame is None:
                frame = frame_ids[label] = len(frames)
                frames.append(label)
            frame_of_name[name_id] = frame
        key = (frame, parent)
        node = nodes.get(key)
        if node is None:
            node = nodes[key] = len(node_frame)
            node_frame.append(frame)
            node_parent.append(parent)
        open_end.append(start + span_dur[i])
        open_node.append(node)

    stack_ids, stacks = _node_stacks(op_node, node_frame, node_parent, frames)
    if op_span:
        stack_of[np.asarray(op_span, dtype=np.int64)] = [stack_ids[n] for n in op_node]
    return stack_of, stacks


def _node_stacks(
    op_node: list[int], node_frame: list[int], node_parent: list[int], frames: list[str]
) -> tuple[dict[int, int], list[tuple[str, ...]]]:
    """The stacks of the nodes ops sit in (frames innermost first), and each such node's stack id.
    Only those nodes become stacks."""
    chains = FrameChains(node_parent, lambda m: frames[node_frame[m]])
    stack_ids: dict[int, int] = {}
    stacks: list[tuple[str, ...]] = []
    for node in dict.fromkeys(op_node):
        stack_ids[node] = len(stacks)
        stacks.append(chains.of(node))
    return stack_ids, stacks
