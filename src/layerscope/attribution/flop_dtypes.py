"""FLOPs by the dtype they ran in, for MFU against the peak of each dtype (``analysis/peaks.py``).

Capture records the dtype of each FLOP-counted op's first typed input, as torch spells it
(``float``, ``c10::BFloat16``...). Only FLOPs that count (outermost: ``outermost_flops``) are summed,
so the classes add up to the profile's FLOPs; FLOPs of ops without a recorded dtype are ``unknown``.
fp32 convolutions are their own class, ``fp32-conv``: cuDNN runs them in TF32 unless
``torch.backends.cudnn.allow_tf32`` is off, while fp32 matmuls follow
``torch.get_float32_matmul_precision()``.
"""

from __future__ import annotations

import numpy as np

from layerscope.attribution.buckets import Buckets
from layerscope.attribution.catalog import ModuleInfo
from layerscope.events.table import EventTable
from layerscope.model.meta import FlopsByDtype
from layerscope.model.profile import ModuleNode

#: torch's dtype spellings (``Input type`` in traces) -> the class peaks are quoted for.
DTYPE_CLASSES = {
    "float": "fp32",
    "c10::complex<float>": "fp32",
    "double": "fp64",
    "c10::complex<double>": "fp64",
    "c10::BFloat16": "bf16",
    "c10::Half": "fp16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
    "signed char": "int8",
    "unsigned char": "int8",
}


def flops_split(
    table: EventTable,
    counted: np.ndarray,
    bucket: np.ndarray,
    buckets: Buckets,
    catalog: list[ModuleInfo],
    root: ModuleNode,
) -> FlopsByDtype | None:
    """The run's FLOPs per dtype class and, in a mixed run, each module's (its MFU is held to its own
    mix; with one class every module's is the run's); None without FLOPs."""
    by_dtype = flops_by_dtype(table, counted)
    if not by_dtype:
        return None
    if len(by_dtype) == 1:
        return FlopsByDtype(by_dtype)
    paths = [
        catalog[buckets.module_of(b)].path if buckets.is_module(b) else None for b in range(buckets.count)
    ]
    return FlopsByDtype(by_dtype, flops_by_dtype_per_module(table, counted, bucket, paths, root))


def dtype_class(dtype: str) -> str:
    """The peak class of torch's dtype spelling (``int`` for other integers, else ``unknown``)."""
    found = DTYPE_CLASSES.get(dtype)
    if found is not None:
        return found
    return "int" if dtype in ("int", "long int", "short int", "bool") else "unknown"


def flops_by_dtype(table: EventTable, counted: np.ndarray) -> dict[str, int]:
    """The FLOPs that count (``counted``, per span) summed per dtype class, largest first; empty
    when the source recorded no dtypes (older captures, traces without shapes)."""
    found = _class_sums(table, counted, np.zeros(table.span_count, dtype=np.int64))
    return _largest_first(found.get(0, {}))


def flops_by_dtype_per_module(
    table: EventTable,
    counted: np.ndarray,
    bucket: np.ndarray,
    path_of_bucket: list[str | None],
    root: ModuleNode,
) -> dict[str, dict[str, int]]:
    """Each module's FLOPs (forward and backward, children included, as ``node.total.flops``) per
    dtype class, by path, for modules with FLOPs: a module's MFU is held to the peaks of the dtypes
    its own work ran in. ``bucket`` is the span's bucket, ``path_of_bucket`` a bucket's module path
    (None for label buckets)."""
    own: dict[str, dict[str, int]] = {}
    for b, sums in _class_sums(table, counted, bucket).items():
        path = path_of_bucket[b] if 0 <= b < len(path_of_bucket) else None
        if path is not None:
            _add_into(own.setdefault(path, {}), sums)
    inclusive: dict[str, dict[str, int]] = {}
    for node in reversed(list(root.walk())):  # children before their parents
        mine = dict(own.get(node.path, {}))
        for child in node.children:
            _add_into(mine, inclusive.get(child.path, {}))
        if mine:
            inclusive[node.path] = mine
    return {path: _largest_first(sums) for path, sums in inclusive.items()}


def _class_sums(table: EventTable, counted: np.ndarray, group: np.ndarray) -> dict[int, dict[str, int]]:
    """Counted FLOPs summed per (group, dtype class); {} without dtypes."""
    dtypes = table.span_dtype
    if dtypes is None or not counted.any():
        return {}
    with_flops = np.flatnonzero(counted)
    ids = np.full(table.span_count, -1, dtype=np.int64)
    ids[: min(dtypes.size, table.span_count)] = dtypes[: table.span_count]
    # one key per distinct (group, dtype, op name): a handful per group, whatever the span count
    distinct, index = _unique_rows(group[with_flops], ids[with_flops], table.array("span_name")[with_flops])
    sums_per_key = np.zeros(len(distinct[0]), dtype=np.int64)
    np.add.at(sums_per_key, index, counted[with_flops].astype(np.int64))
    found: dict[int, dict[str, int]] = {}
    rows = zip(*(d.tolist() for d in distinct), sums_per_key.tolist(), strict=True)
    for g, dtype_id, name_id, flops in rows:
        key = dtype_class(table.names[dtype_id]) if dtype_id >= 0 else "unknown"
        if key == "fp32" and "conv" in table.names[name_id]:
            key = "fp32-conv"
        sums = found.setdefault(int(g), {})
        sums[key] = sums.get(key, 0) + int(flops)
    return found


def _unique_rows(*columns: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """``np.unique(np.stack(columns, 1), axis=0, return_inverse=True)`` as columns, by one 1-D unique of
    the rows' ranks packed into one int64 (the same sorted order; a 2-D unique sorts rows as records,
    many times slower)."""
    values, ranks = [], []
    for column in columns:
        found, rank = np.unique(column, return_inverse=True)
        values.append(found)
        ranks.append(rank.reshape(-1))
    if float(np.prod([v.size + 1.0 for v in values])) >= 2.0**62:  # would not pack: rows
        rows, inverse = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
        return list(rows.T), inverse.reshape(-1)
    key = np.zeros(columns[0].size, dtype=np.int64)
    for found, rank in zip(values, ranks, strict=True):
        key = key * found.size + rank
    keys, inverse = np.unique(key, return_inverse=True)
    distinct = []
    for found in reversed(values):
        distinct.append(found[keys % found.size])
        keys = keys // found.size
    return distinct[::-1], inverse.reshape(-1)


def _add_into(into: dict[str, int], sums: dict[str, int]) -> None:
    for key, flops in sums.items():
        into[key] = into.get(key, 0) + flops


def _largest_first(sums: dict[str, int]) -> dict[str, int]:
    return dict(sorted(sums.items(), key=lambda item: -item[1]))
