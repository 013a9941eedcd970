"""Device work on its streams: a live capture's device spans moved onto one thread per (device, stream).

torch hands each kernel, copy and set the thread id of the CPU thread that launched it (forward
kernels on the main thread, backward kernels on autograd's), while a trace file puts it on its
stream's track (pid: the device, tid: the stream). Stream statistics, idle time by cause and the
critical path's stream edges read ``EventTable.threads`` as a trace file's reader fills it; this
gives a live table the same threads, so both readers (native and bindings) and trace files agree.
"""

from __future__ import annotations

import numpy as np

#: The first thread id given to a stream.
STREAM_TID_BASE = 1 << 20


def stream_threads(
    tid: np.ndarray, mem_tid: np.ndarray, rows: np.ndarray, device: np.ndarray, stream: np.ndarray
) -> dict[int, tuple[int, int]]:
    """Give the spans at ``rows`` (their thread ids in ``tid``, changed in place) one thread id per
    distinct (``device``, ``stream``), numbered in the order each first occurs from
    :data:`STREAM_TID_BASE` (or from above every id in ``tid`` and ``mem_tid``). Returns the
    table's thread map for them: thread id -> (device, stream)."""
    if not rows.size:
        return {}
    # torch numbers its threads 1, 2, ... (-1: unknown); the streams' ids sit far above, out of reach
    # of a thread seen only later (module marks come from threads the reader may not have seen)
    base = max(STREAM_TID_BASE, int(tid.max(initial=0)) + 1, int(mem_tid.max(initial=0)) + 1)
    keys = np.stack([device, stream], axis=1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)  # numbered as first seen
    tid[rows] = base + rank[inverse.reshape(-1)]
    return {base + int(rank[k]): (int(device[r]), int(stream[r])) for k, r in enumerate(first.tolist())}
