"""Comparing two profiles: total change, then the modules and ops that changed most."""

from __future__ import annotations

from dataclasses import dataclass

from layerscope.errors import UsageError
from layerscope.model.display import NotebookDisplay
from layerscope.model.metrics import ADDITIVE_PAIRS, metric_name
from layerscope.model.profile import Profile

#: Metrics a diff can compare (the inclusive names; ops use their ``self_`` counterpart).
DIFF_METRICS = tuple(total for _, total in ADDITIVE_PAIRS)
#: A change is beyond noise when it is more than this share of the row's baseline...
NOISE_SHARE_OF_ROW = 0.05
#: ...and more than this share of the baseline's total (small rows jitter by large percentages).
NOISE_SHARE_OF_TOTAL = 0.005


@dataclass(frozen=True, slots=True)
class DiffRow:
    """One module or op in both (or one) of the profiles. ``a``/``b`` are None where absent."""

    kind: str  # "module" or "op"
    key: str  # module path, or op name (with input shapes when both profiles have them)
    a: float | None
    b: float | None

    @property
    def delta(self) -> float:
        """b - a (absent counts as 0)."""
        return (self.b or 0.0) - (self.a or 0.0)

    @property
    def percent(self) -> float | None:
        """Change relative to a, in percent (None when a is absent or 0)."""
        if not self.a:
            return None
        return 100.0 * self.delta / self.a

    @property
    def status(self) -> str:
        """``new``, ``vanished`` or ``changed``."""
        if self.a is None:
            return "new"
        if self.b is None:
            return "vanished"
        return "changed"


@dataclass(frozen=True, slots=True)
class ProfileDiff(NotebookDisplay):
    """The comparison of profile ``a`` (baseline) with profile ``b``; a notebook shows the summary
    and the largest changes as tables (drawn by render/html_tables.py)."""

    metric: str
    per_step: bool  # values are means per step (both profiles had several steps)
    total_a: float
    total_b: float
    modules: tuple[DiffRow, ...]
    ops: tuple[DiffRow, ...]
    #: every module of either profile, unchanged ones too, in tree order: b's as b nests them, each
    #: module only in a placed after b's children of its parent (the HTML page draws it)
    tree: tuple[DiffRow, ...] = ()

    def beyond_noise(self, row: DiffRow) -> bool:
        """Whether ``row``'s change is more than noise: over :data:`NOISE_SHARE_OF_ROW` of its
        baseline (any change of a new or vanished row) and over :data:`NOISE_SHARE_OF_TOTAL` of the
        baseline's total."""
        of_row = row.a is None or row.b is None or abs(row.delta) > NOISE_SHARE_OF_ROW * abs(row.a)
        return of_row and abs(row.delta) > NOISE_SHARE_OF_TOTAL * abs(self.total_a)

    @property
    def total_delta(self) -> float:
        """total_b - total_a."""
        return self.total_b - self.total_a

    @property
    def total_percent(self) -> float | None:
        """Total change in percent of a (None when a's total is 0)."""
        return 100.0 * self.total_delta / self.total_a if self.total_a else None

    def regressed(self, threshold_percent: float) -> bool:
        """True when b's total exceeds a's by more than ``threshold_percent``."""
        pct = self.total_percent
        if pct is None:
            return self.total_b > 0
        return pct > threshold_percent


def diff(a: Profile, b: Profile, metric: str = "cpu_us") -> ProfileDiff:
    """Compare ``b`` against baseline ``a``. Modules are matched by path (forward + backward,
    inclusive), ops by name and input shapes when both profiles recorded shapes (else by name),
    using their self figure. Rows are sorted by absolute change, largest first. When both profiles
    hold several steps, values are means per step, so runs of different lengths compare."""
    metric = metric_name(metric)
    if metric not in DIFF_METRICS:
        raise UsageError(f"cannot diff on {metric!r}; choose from {', '.join(DIFF_METRICS)}")
    per_step = len(a.steps) > 1 and len(b.steps) > 1
    scale_a = 1.0 / len(a.steps) if per_step else 1.0
    scale_b = 1.0 / len(b.steps) if per_step else 1.0

    def module_values(p: Profile, scale: float) -> dict[str, float]:
        return {node.path: float(getattr(node.total, metric)) * scale for node in p.modules()}

    with_shapes = any(r.input_shapes for r in a.op_rows) and any(r.input_shapes for r in b.op_rows)
    group = ("name", "input_shapes") if with_shapes else ("name",)
    self_metric = f"self_{metric}"

    def op_values(p: Profile, scale: float) -> dict[str, float]:
        values: dict[str, float] = {}
        for row in p.ops(group_by=group, sort_by=self_metric):
            name = row.name
            key = f"{name} {row.input_shapes}" if with_shapes and row.input_shapes else name
            values[key] = values.get(key, 0.0) + float(getattr(row.metrics, self_metric)) * scale
        return values

    values_a, values_b = module_values(a, scale_a), module_values(b, scale_b)
    modules = _rows("module", values_a, values_b)
    ops = _rows("op", op_values(a, scale_a), op_values(b, scale_b))
    tree = tuple(DiffRow("module", p, values_a.get(p), values_b.get(p)) for p in tree_order(a, b))
    return ProfileDiff(
        metric,
        per_step,
        float(getattr(a.totals, metric)) * scale_a,
        float(getattr(b.totals, metric)) * scale_b,
        modules,
        ops,
        tree,
    )


def tree_order(a: Profile, b: Profile) -> list[str]:
    """Every module path of ``a`` and ``b`` in one tree's order: siblings as ``b`` orders them, then
    those only ``a`` has, as ``a`` orders them."""
    rank: dict[str, int] = {}
    for offset, profile in ((len(list(a.modules())) + 1, a), (0, b)):  # b's ranks win
        for node in profile.modules():
            for k, child in enumerate(node.children):
                rank[child.path] = offset + k

    def key(path: str) -> tuple[int, ...]:
        parts = path.split(".") if path else []
        return tuple(rank.get(".".join(parts[: i + 1]), 0) for i in range(len(parts)))

    return sorted(dict.fromkeys([*(n.path for n in b.modules()), *(n.path for n in a.modules())]), key=key)


def _rows(kind: str, a: dict[str, float], b: dict[str, float]) -> tuple[DiffRow, ...]:
    keys = list(dict.fromkeys([*a, *b]))
    rows = [DiffRow(kind, k, a.get(k), b.get(k)) for k in keys]
    rows = [r for r in rows if r.delta != 0 or r.status != "changed"]
    rows.sort(key=lambda r: -abs(r.delta))
    return tuple(rows)
