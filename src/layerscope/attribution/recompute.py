"""Activation checkpointing's recomputation: what in the backward pass re-ran forward work.

``torch.utils.checkpoint`` re-runs a region's forward during the backward pass. Module calls made
there are the recomputation, not the forward: the sweep (``nesting.py``) puts them in the module's
backward bucket and counts them as ``recompute_calls``, so ``calls`` counts forward calls only.

Non-reentrant checkpointing (``use_reentrant=False``, what transformers uses) stops the
recomputation early by default: the saved-tensor hook raises once the last tensor the forward saved
is saved again. The op that saves it has been recorded by the profiler, but when its derivative
saves only inputs (``addmm``, ``mm``, convolutions...) the hook fires before its kernel runs: the
op never computed, and its FLOPs are not work done (``FlopCounterMode`` does not count them either).
"""

from __future__ import annotations

import numpy as np

from layerscope.attribution.buckets import BACKWARD_NODE_PREFIX, ROLE_BACKWARD_NODE
from layerscope.events.table import EventTable

#: The backward node of reentrant checkpointing: it re-runs the whole region, with no early stop.
REENTRANT_NODE = f"{BACKWARD_NODE_PREFIX}CheckpointFunctionBackward"

#: FLOP-counted ops whose derivative also saves an output: their last save comes after the kernel,
#: so an early stop there still ran them.
SAVES_OUTPUTS = frozenset(
    {
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_flash_attention_forward",
        "aten::_efficient_attention_forward",
    }
)


def backward_node_above(parent: np.ndarray, levels: list[np.ndarray], is_node: np.ndarray) -> np.ndarray:
    """Per span, the nearest enclosing backward-node span (-1 where none), a nesting level at a time."""
    above = np.full(parent.size, -1, dtype=np.int64)
    for level in levels[1:]:
        p = parent[level]
        above[level] = np.where(is_node[p], p, above[p])
    return above


def stopped_recompute_ops(
    table: EventTable, roles: list[int], parent: np.ndarray, levels: list[np.ndarray]
) -> np.ndarray | None:
    """A mask of the ops a non-reentrant recomputation stopped in before they computed, or None.

    Per backward node that re-ran forward work (ops autograd recorded, running inside it), the last
    of those ops to start is where the recomputation stopped. It is taken as never having computed
    when it carries FLOPs, its derivative saves only inputs, and the forward ran the same op on the
    same shapes (what a recomputation does; a double backward's own ops are not re-runs of forward
    ops). Assumes torch's default early stop (``set_checkpoint_early_stop(False)`` turns it off:
    capture records that, and then nothing is taken out).
    """
    flops = table.array("span_flops")
    if not flops.any():
        return None
    span_name = table.array("span_name")
    role = np.asarray(roles, dtype=np.int64)[span_name]
    above = backward_node_above(parent, levels, role == ROLE_BACKWARD_NODE)
    recorded = (table.array("span_seq") >= 0) & (table.array("span_fwd_tid") == 0)
    rerun = np.flatnonzero(recorded & (above >= 0))
    if not rerun.size:
        return None
    # the last re-run op to start under each backward node
    ts = table.array("span_ts")[rerun]
    by_node = np.lexsort((ts, above[rerun]))
    nodes = above[rerun][by_node]
    last = rerun[by_node][np.append(nodes[1:] != nodes[:-1], True)]
    names = table.names
    shapes = table.array("span_shapes")
    forward = recorded & (above < 0)
    forward_calls = set(zip(span_name[forward].tolist(), shapes[forward].tolist(), strict=True))
    stopped = np.zeros(parent.size, dtype=bool)
    for i in last.tolist():
        name = names[span_name[i]]
        if (
            flops[i] > 0
            and name not in SAVES_OUTPUTS
            and names[span_name[above[i]]] != REENTRANT_NODE
            and (int(span_name[i]), int(shapes[i])) in forward_calls
        ):
            stopped[i] = True
    return stopped if stopped.any() else None
