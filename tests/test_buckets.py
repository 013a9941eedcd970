"""Bucket numbering: every way of naming a bucket agrees with every way of reading one back."""

from __future__ import annotations

import numpy as np

from layerscope.attribution.buckets import Buckets
from layerscope.model.profile import Phase


def test_module_buckets_round_trip() -> None:
    buckets = Buckets(3)
    assert buckets.module_bucket_count == 6 and buckets.count == 6
    seen = set()
    for m in range(3):
        fwd, bwd = buckets.forward(m), buckets.backward(m)
        seen |= {fwd, bwd}
        assert buckets.is_forward(fwd) and not buckets.is_backward(fwd)
        assert buckets.is_backward(bwd) and not buckets.is_forward(bwd)
        assert buckets.module_of(fwd) == buckets.module_of(bwd) == m
        assert buckets.with_phase(m, buckets.phase_bit(fwd)) == fwd
        assert buckets.with_phase(m, buckets.phase_bit(bwd)) == bwd
        assert buckets.phase_of(fwd) is Phase.FORWARD and buckets.phase_of(bwd) is Phase.BACKWARD
        assert buckets.forward_buckets()[m] == fwd
        assert buckets.backward_of_module()[fwd] == buckets.backward_of_module()[bwd] == bwd
    assert seen == set(range(buckets.module_bucket_count))
    assert not buckets.is_module(-1) and not buckets.is_forward(-1) and not buckets.is_backward(-1)


def test_label_buckets_follow_modules() -> None:
    buckets = Buckets(2)
    a = buckets.unattributed("a", Phase.OTHER)
    b = buckets.unattributed("b", Phase.BACKWARD, count=3)
    assert buckets.unattributed("a", Phase.OTHER) == a
    assert [a, b] == [buckets.label_bucket(0), buckets.label_bucket(1)]
    assert buckets.label_index(b) == 1 and buckets.occurrences == [2, 3]
    assert not buckets.is_module(a) and buckets.count == buckets.module_bucket_count + 2
    assert buckets.phase_of(b) is Phase.BACKWARD


def test_slices_pick_each_phase_in_catalog_order() -> None:
    buckets = Buckets(4)
    buckets.unattributed("x", Phase.OTHER)
    per_bucket = np.arange(buckets.count)
    assert per_bucket[buckets.forward_slice].tolist() == [buckets.forward(m) for m in range(4)]
    assert per_bucket[buckets.backward_slice].tolist() == [buckets.backward(m) for m in range(4)]
