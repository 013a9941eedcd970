"""A memory watch snapshot as columns: what attribution matches against torch's memory events."""

from __future__ import annotations

import numpy as np

from layerscope.events.memory_snapshots import CATEGORIES, Snapshot, StorageEntry


def test_columns_keep_entry_order_and_categories() -> None:
    snap = Snapshot(
        "start", [StorageEntry(4096, 64, "parameter", False), StorageEntry(8192, 8, "weird", True, 7)]
    )
    cols = snap.columns()
    assert cols.addr.tolist() == [4096, 8192]
    assert cols.nbytes.tolist() == [64, 8]
    assert cols.category.tolist() == [CATEGORIES.index("parameter"), len(CATEGORIES)]
    assert cols.on_device.tolist() == [False, True]
    assert cols.seq.tolist() == [-1, 7]
    assert snap.columns() is cols  # made once


def test_a_tagged_pointer_at_or_above_2_63_wraps_like_torchs_signed_address() -> None:
    tagged = (0xB4 << 56) | 0x7F00_1234_5000  # a top-byte tag with its high bit set (ARM TBI/MTE)
    snap = Snapshot(
        "start", [StorageEntry(tagged, 16, "activation", False), StorageEntry(4096, 8, "input", False)]
    )
    addr = snap.columns().addr
    assert addr.dtype == np.int64
    assert addr.tolist() == [tagged - (1 << 64), 4096]
    assert int(addr[:1].view(np.uint64)[0]) == tagged  # the same 64 bits
    assert Snapshot("end", []).columns().addr.size == 0
