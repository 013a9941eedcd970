"""Stacks from a tree of (frame, parent) nodes: with_stack stacks and call lines are both stored so,
since a training loop repeats the same few hundred paths."""

from __future__ import annotations

from collections.abc import Callable


class FrameChains:
    """Each node's stack as a tuple of frame labels, innermost first; a node's tuple is its label
    plus its parent's, so every node is built once."""

    def __init__(self, parents: list[int], label: Callable[[int], str]) -> None:
        self._parents = parents
        self._label = label
        self._tuples: dict[int, tuple[str, ...]] = {}

    def of(self, node: int) -> tuple[str, ...]:
        """The stack of ``node`` (-1: the empty stack)."""
        tuples, parents = self._tuples, self._parents
        chain: list[int] = []
        n = node
        while n >= 0 and n not in tuples:
            chain.append(n)
            n = parents[n]
        tail = tuples[n] if n >= 0 else ()
        for m in reversed(chain):
            tail = tuples[m] = (self._label(m), *tail)
        return tail if node < 0 else tuples[node]
