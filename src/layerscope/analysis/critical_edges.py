"""The critical path graph's edge kinds and edge batches: each part of the graph
(``critical_graph.py``, ``critical_stack.py``, ``critical_device.py``) makes its edges as arrays,
in the order the graph lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Edge types (HTA's ``CPEdgeType``).
OPERATOR, DEPENDENCY, LAUNCH, KERNEL_KERNEL, SYNC = range(5)


@dataclass(frozen=True)
class Edges:
    """A batch of edges ``src -> dst`` (node ids), each with its kind, the span its time belongs to
    (-1 none) and whether it weighs 0 whatever its kind."""

    src: np.ndarray
    dst: np.ndarray
    kind: np.ndarray
    owner: np.ndarray
    zero: np.ndarray

    @staticmethod
    def of(src: object, dst: object, kind: object, owner: object = -1, zero: object = False) -> Edges:
        """Edges from arrays (or scalars broadcast to ``src``'s length)."""
        s = np.asarray(src, dtype=np.int64).reshape(-1)

        def column(values: object, dtype: type) -> np.ndarray:
            return np.broadcast_to(np.asarray(values, dtype=dtype), s.shape).copy()

        return Edges(
            s, column(dst, np.int64), column(kind, np.int64), column(owner, np.int64), column(zero, bool)
        )

    def take(self, index: np.ndarray) -> Edges:
        """The edges at ``index`` (a mask or positions), in that order."""
        return Edges(self.src[index], self.dst[index], self.kind[index], self.owner[index], self.zero[index])

    @staticmethod
    def join(parts: list[Edges]) -> Edges:
        """``parts`` one after another."""
        if not parts:
            return Edges.of([], [], [])
        return Edges(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))


_FIELDS = ("src", "dst", "kind", "owner", "zero")


def ordered(parts: list[tuple[np.ndarray, np.ndarray, Edges]]) -> Edges:
    """Batches whose edges carry a sort key each (a position, then a rank within it), merged in
    key order: the order a loop over the positions would have added them."""
    if not parts:
        return Edges.of([], [], [])
    at = np.concatenate([p[0] for p in parts])
    rank = np.concatenate([p[1] for p in parts])
    return Edges.join([p[2] for p in parts]).take(np.lexsort((rank, at)))
