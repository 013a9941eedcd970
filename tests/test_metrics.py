"""``own_metrics``: Metrics of a scope's own work from per-field values or per-scope columns."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.model.metrics import ADDITIVE_PAIRS, Metrics, own_metrics


def test_self_equals_inclusive_and_types_follow_units() -> None:
    m = own_metrics({"cpu_us": 1.5, "flops": 7, "net_bytes": -3.0, "device_relative_peak_bytes": 9})
    assert m == Metrics(
        self_cpu_us=1.5,
        cpu_us=1.5,
        self_flops=7,
        flops=7,
        self_net_bytes=-3,
        net_bytes=-3,
        device_relative_peak_bytes=9,
    )
    for self_name, total_name in ADDITIVE_PAIRS:
        assert getattr(m, self_name) == getattr(m, total_name)
    assert isinstance(m.device_us, float) and isinstance(m.net_bytes, int)


def test_columns_give_one_scope_per_index() -> None:
    columns = {"cpu_us": np.array([1.0, 2.0]), "cpu_alloc_bytes": np.array([0.0, 64.0]), "flops": [3, 4]}
    second = own_metrics(columns, 1)
    assert (second.cpu_us, second.cpu_alloc_bytes, second.flops) == (2.0, 64, 4)
    assert type(second.cpu_us) is float and type(second.cpu_alloc_bytes) is int
    assert own_metrics({}) == Metrics()


def test_unknown_figure_is_an_error() -> None:
    with pytest.raises(ValueError, match="self_cpu_us"):
        own_metrics({"self_cpu_us": 1.0})
