"""Forward ops by (thread, sequence number): what backward nodes, saved tensors and call lines point at.

Sequence numbers never repeat on a thread, and a backward node always starts after its forward op.
Where several ops share a number (``aten::linear`` and the ``aten::t`` inside), the innermost, which
ran last, wins; both sit in the same module. Kept as sorted int64 keys so that a whole column of
(thread, sequence number) pairs is looked up at once; the dict form is made only for code that looks
up one pair at a time (the Python sweep, the memory watch's snapshots).
"""

from __future__ import annotations

import numpy as np

from layerscope.attribution import nest_native
from layerscope.events.table import EventTable


class ForwardOps:
    """The last forward op (in time order) of each (thread, sequence number)."""

    def __init__(self, tids: np.ndarray, seqs: np.ndarray, ops: np.ndarray) -> None:
        """``tids``, ``seqs`` and ``ops``: the forward ops' threads, sequence numbers (>= 0) and span
        indices, in time order."""
        self._tids = nest_native.unique(tids)[0]
        self._width = int(seqs.max()) + 1 if seqs.size else 1
        key = np.searchsorted(self._tids, tids) * self._width + seqs
        # the last op of each key: the first of the reversed keys
        self._keys, last, _ = nest_native.unique(key[::-1])
        self._ops = ops[::-1][last]
        self._first_seen = nest_native.unique(key)[1]  # per key, its first op (dict order)
        self._tid_of, self._seq_of = tids, seqs
        self._mapping: dict[tuple[int, int], int] | None = None

    @staticmethod
    def of(table: EventTable, order: np.ndarray) -> ForwardOps:
        """The forward ops of ``table``'s CPU spans ``order`` (in time order): the spans with a
        sequence number and no forward thread of their own (not backward work)."""
        seq = table.array("span_seq")
        is_forward_op = (seq >= 0) & (table.array("span_fwd_tid") == 0)
        ops = order[is_forward_op[order]]
        return ForwardOps(table.array("span_tid")[ops], seq[ops], ops)

    def __len__(self) -> int:
        return int(self._keys.size)

    def lookup(self, tids: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """The forward op of each (thread, sequence number) pair, -1 where there is none."""
        tids, seqs = np.asarray(tids, dtype=np.int64), np.asarray(seqs, dtype=np.int64)
        out = np.full(tids.size, -1, dtype=np.int64)
        if not self._keys.size or not tids.size:
            return out
        t = np.searchsorted(self._tids, tids)
        ok = (t < self._tids.size) & (seqs >= 0) & (seqs < self._width)
        ok[ok] = self._tids[t[ok]] == tids[ok]
        asked = np.flatnonzero(ok)
        key = t[asked] * self._width + seqs[asked]
        at = np.minimum(np.searchsorted(self._keys, key), self._keys.size - 1)
        hit = self._keys[at] == key
        out[asked[hit]] = self._ops[at[hit]]
        return out

    def mapping(self) -> dict[tuple[int, int], int]:
        """As a dict, keys in the order each was first seen (made once)."""
        if self._mapping is None:
            first = np.sort(self._first_seen)
            ops = self.lookup(self._tid_of[first], self._seq_of[first])
            keys = zip(self._tid_of[first].tolist(), self._seq_of[first].tolist(), strict=True)
            self._mapping = dict(zip(keys, ops.tolist(), strict=True))
        return self._mapping
