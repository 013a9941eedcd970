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

from layerscope.attribution.buckets import ROLE_BACKWARD_NODE
from layerscope.events.names import REENTRANT_CHECKPOINT_NODE
from layerscope.events.table import EventTable

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
    when it carries FLOPs, its derivative saves only inputs, and every op run under that node ran in
    the forward too, in the same order, names and shapes, one after the other (a recomputation; a
    double backward runs its derivatives' formulas, which do not repeat the forward). Assumes
    torch's default early stop: ``set_checkpoint_early_stop(False)`` around the block is recorded
    and then nothing is taken out; turned off per call or inside the block it is not seen.
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
    # the re-run ops under each backward node, in the order they started
    ts = table.array("span_ts")
    by_node = rerun[np.lexsort((ts[rerun], above[rerun]))]
    nodes = above[by_node]
    cuts = np.flatnonzero(nodes[1:] != nodes[:-1]) + 1
    names = table.names
    shapes = table.array("span_shapes")
    forward = np.flatnonzero(recorded & (above < 0))
    forward = forward[np.argsort(ts[forward], kind="stable")]
    forward_keys = list(zip(span_name[forward].tolist(), shapes[forward].tolist(), strict=True))
    starts: dict[tuple[int, int], list[int]] = {}
    for position, k in enumerate(forward_keys):
        starts.setdefault(k, []).append(position)
    stopped = np.zeros(parent.size, dtype=bool)
    for group in np.split(by_node, cuts):
        last = int(group[-1])
        if (
            flops[last] > 0
            and names[span_name[last]] not in SAVES_OUTPUTS
            # reentrant checkpointing re-runs the whole region, with no early stop
            and names[span_name[above[last]]] != REENTRANT_CHECKPOINT_NODE
            and _reruns_forward(
                list(zip(span_name[group].tolist(), shapes[group].tolist(), strict=True)),
                forward_keys,
                starts,
            )
        ):
            stopped[last] = True
    return stopped if stopped.any() else None


def _reruns_forward(
    keys: list[tuple[int, int]], forward_keys: list[tuple[int, int]], starts: dict[tuple[int, int], list[int]]
) -> bool:
    """Whether ``keys`` (op name and shapes, in order) ran in the forward as one unbroken run: what a
    recomputation does, and a double backward's own ops (a derivative's formula) do not."""
    n = len(keys)
    return any(forward_keys[p : p + n] == keys for p in starts.get(keys[0], ()))
