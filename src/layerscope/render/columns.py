"""The column specs of the console tables: the module tree, the op table and the step table.

One :class:`~layerscope.render.table_fit.Column` per column, in display order: its cell function,
whether the data has anything for it, and its drop rank (1 leaves first when the terminal is too
narrow; columns without one always stay).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.text import Text

from layerscope.analysis.frames import achieved_flops_per_s
from layerscope.analysis.peaks import choose_peak, module_peak_rates
from layerscope.analysis.steps import Spread, StepRow, module_spread
from layerscope.model.memory import MemoryReport
from layerscope.model.metrics import Metrics
from layerscope.model.profile import OpStats, Profile
from layerscope.render.table_fit import Column
from layerscope.units import fmt_bytes, fmt_shapes, fmt_share, fmt_si, fmt_time_us


@dataclass(frozen=True)
class TreeView:
    """What the tree table's columns need to know about the whole (folded) profile."""

    device: bool
    memory: bool
    flops: bool
    peak_rate: float | None
    share_field: str
    whole: float
    steps: int
    per_step: bool
    #: Whether any module has recorded output shapes (the "Output" column).
    shapes: bool = False
    #: Which peak the MFU column compares against (empty without one).
    peak_note: str = ""
    #: FLOP/s peaks by module path in a mixed-dtype run (``analysis/peaks.module_peak_rates``).
    module_peaks: dict[str, float] = field(default_factory=dict)
    spread: dict[str, Spread] = field(default_factory=dict)
    #: Bytes saved for backward by each module and its children (memory watch), by path.
    saved: dict[str, int] = field(default_factory=dict)

    def saved_cell(self, path: str | None) -> str:
        """The "Saved" cell: tensors the module's ops saved for backward, per step when the table is."""
        found = self.saved.get(path) if path is not None else None
        if not found:
            return ""
        return fmt_bytes(found / self.steps if self.per_step else found)

    def spread_cell(self, path: str | None) -> str:
        """The "± step" cell: the relative standard deviation of the module's time across steps."""
        found = self.spread.get(path) if path is not None else None
        return f"±{100 * found.relative:.0f}%" if found is not None and found.mean_us > 0 else ""

    def calls_cell(self, calls: int) -> str:
        """A call count, per step when the table is."""
        return f"{calls / self.steps:g}" if self.per_step else str(calls)

    def mfu_cell(self, both: Metrics, path: str | None = None) -> str:
        """Achieved FLOP/s over the peak: the module's own (its dtype mix) where known, else the run's."""
        rate = achieved_flops_per_s(both)
        peak = self.module_peaks.get(path, self.peak_rate) if path is not None else self.peak_rate
        return f"{100 * rate / peak:.1f}%" if rate is not None and peak else ""


@dataclass(frozen=True, slots=True)
class TreeRow:
    """One row of the tree table; ``fwd``/``bwd``/``both`` are per step when the table is."""

    label: Text
    type_name: str
    calls: str
    params: str
    fwd: Metrics
    bwd: Metrics
    both: Metrics
    share: str
    path: str | None
    output: str = ""  # the output shapes of the module's first call, compact


def _flop_rate(both: Metrics) -> str:
    rate = achieved_flops_per_s(both)
    return fmt_si(rate, "/s") if rate is not None else ""


def tree_columns(v: TreeView) -> tuple[Column[TreeRow], ...]:
    """The tree table's columns; ``drop`` ranks which leave first when the terminal is narrow."""
    return (
        Column("module", "Module", lambda r: r.label, justify="left"),
        Column("type", "Type", lambda r: r.type_name, justify="left", style="cyan", drop=9),
        Column("calls", "Calls", lambda r: r.calls, drop=10),
        Column("output", "Output", lambda r: r.output, justify="left", drop=0, shown=v.shapes),
        Column("fwd_self", "Fwd self", lambda r: fmt_time_us(r.fwd.self_cpu_us), drop=6),
        Column("fwd_total", "Fwd total", lambda r: fmt_time_us(r.fwd.cpu_us)),
        Column("bwd_self", "Bwd self", lambda r: fmt_time_us(r.bwd.self_cpu_us), drop=7),
        Column("bwd_total", "Bwd total", lambda r: fmt_time_us(r.bwd.cpu_us)),
        Column("fwd_device", "Fwd device", lambda r: fmt_time_us(r.fwd.device_us), drop=14, shown=v.device),
        Column("bwd_device", "Bwd device", lambda r: fmt_time_us(r.bwd.device_us), drop=13, shown=v.device),
        Column(
            "alloc",
            "Alloc f+b",
            lambda r: fmt_bytes(r.both.cpu_alloc_bytes + r.both.device_alloc_bytes),
            drop=12,
            shown=v.memory,
        ),
        Column("net_alloc", "Fwd net", lambda r: fmt_bytes(r.fwd.net_bytes), drop=5, shown=v.memory),
        Column("saved", "Saved", lambda r: v.saved_cell(r.path), drop=1, shown=v.memory and bool(v.saved)),
        Column(
            "peak",
            "Peak f/b",
            lambda r: fmt_bytes(max(r.both.cpu_relative_peak_bytes, r.both.device_relative_peak_bytes)),
            drop=8,
            shown=v.memory,
        ),
        Column("flops", "FLOPs", lambda r: fmt_si(r.both.flops), drop=11, shown=v.flops),
        Column("flop_rate", "FLOP/s", lambda r: _flop_rate(r.both), drop=2, shown=v.flops),
        Column(
            "mfu", "MFU", lambda r: v.mfu_cell(r.both, r.path), drop=3, shown=v.flops and bool(v.peak_rate)
        ),
        Column("params", "Params", lambda r: r.params, drop=4),
        Column("share", "Share", lambda r: r.share, style="bold"),
        Column("step_spread", "± step", lambda r: v.spread_cell(r.path), shown=bool(v.spread)),
    )


def tree_row(
    v: TreeView,
    label: Text,
    type_name: str,
    calls: str,
    fwd: Metrics,
    bwd: Metrics,
    params: str = "",
    path: str | None = None,
    output: str | None = None,
) -> TreeRow:
    """A row; the share is of the whole run, the other figures per step when the table is."""
    share = fmt_share(getattr(fwd, v.share_field) + getattr(bwd, v.share_field), v.whole)
    if v.per_step:
        fwd, bwd = fwd.scaled(1.0 / v.steps), bwd.scaled(1.0 / v.steps)
    cell = fmt_shapes(output)
    cell = cell if len(cell) <= 28 else cell[:27] + "…"
    return TreeRow(label, type_name, calls, params, fwd, bwd, fwd.merged(bwd), share, path, cell)


def tree_view(view: Profile, per_step: bool, peak_tflops: float | None) -> TreeView:
    """Which optional columns the profile has data for, and the whole the shares are of."""
    device = view.has_device_time
    flops = view.totals.flops > 0
    share_field = "device_us" if device else "cpu_us"
    steps = len(view.steps)
    per_step = bool(per_step) and steps > 1
    peak = choose_peak(view.meta, peak_tflops) if flops else None
    return TreeView(
        device=device,
        memory=view.has_memory,
        flops=flops,
        peak_rate=peak.flops_per_s if peak is not None else None,
        peak_note=f"MFU against {peak.description}" if peak is not None else "",
        module_peaks=module_peak_rates(view.meta, peak_tflops) if peak is not None else {},
        share_field=share_field,
        whole=float(getattr(view.totals, share_field)),
        steps=steps,
        per_step=per_step,
        shapes=any(node.output_shapes for node in view.modules()),
        spread=module_spread(view),
        saved=_saved_inclusive(view.meta.memory),
    )


def _saved_inclusive(report: MemoryReport | None) -> dict[str, int]:
    """Saved-for-backward bytes per module path, each module's own plus its children's."""
    own = report.saved if report is not None else {}
    out: dict[str, int] = {}
    for path, figures in own.items():
        nbytes = sum(int(v) for v in figures.values())
        parts = path.split(".") if path else []
        for k in range(len(parts) + 1):
            ancestor = ".".join(parts[:k])
            out[ancestor] = out.get(ancestor, 0) + nbytes
    return out


def _op_phase(r: OpStats) -> str:
    return r.phase.value if r.phase is not None else ""


def _op_module(r: OpStats) -> str:
    return _clip(r.module if r.module is not None else (f"[{r.scope}]" if r.scope else ""), 32)


def _op_source(r: OpStats) -> str:
    """Like torch's "Source Location": one frame per line, innermost first."""
    return "\n".join(_clip(frame, 60) for frame in r.stack)


def _op_mean(r: OpStats) -> str:
    return fmt_time_us(r.metrics.cpu_us / r.calls) if r.calls else ""


def _op_self_alloc(r: OpStats) -> str:
    return fmt_bytes(r.metrics.self_cpu_alloc_bytes + r.metrics.self_device_alloc_bytes)


def _op_alloc(r: OpStats) -> str:
    return fmt_bytes(r.metrics.cpu_alloc_bytes + r.metrics.device_alloc_bytes)


def op_columns(rows: Sequence[OpStats], whole: float) -> tuple[Column[OpStats], ...]:
    """The op table's columns: optional ones only when some row has data for them."""
    phases = any(r.phase is not None for r in rows)
    modules = any(r.module is not None or r.scope for r in rows)
    shapes = any(r.input_shapes for r in rows)
    stacks = any(r.stack for r in rows)
    device = any(r.metrics.device_us for r in rows)
    memory = any(r.metrics.cpu_alloc_bytes or r.metrics.device_alloc_bytes for r in rows)
    flops = any(r.metrics.flops for r in rows)
    return (
        Column("op", "Op", lambda r: r.name, "left"),
        Column("phase", "Phase", _op_phase, "left", drop=6, shown=phases),
        Column("module", "Module", _op_module, "left", style="cyan", drop=7, shown=modules),
        Column(
            "input_shapes",
            "Input shapes",
            lambda r: _clip(r.input_shapes or "", 40),
            "left",
            drop=5,
            shown=shapes,
        ),
        Column("source", "Source location", _op_source, "left", drop=12, shown=stacks),
        Column("calls", "Calls", lambda r: str(r.calls)),
        Column("self_cpu", "Self CPU", lambda r: fmt_time_us(r.metrics.self_cpu_us)),
        Column("self_share", "Self %", lambda r: fmt_share(r.metrics.self_cpu_us, whole), drop=3),
        Column("cpu_total", "CPU total", lambda r: fmt_time_us(r.metrics.cpu_us), drop=8),
        Column("cpu_avg", "CPU avg", _op_mean, drop=1),
        Column(
            "self_device",
            "Self device",
            lambda r: fmt_time_us(r.metrics.self_device_us),
            drop=4,
            shown=device,
        ),
        Column(
            "device_total", "Device total", lambda r: fmt_time_us(r.metrics.device_us), drop=11, shown=device
        ),
        Column("self_alloc", "Self alloc", _op_self_alloc, drop=2, shown=memory),
        Column("alloc", "Alloc", _op_alloc, drop=9, shown=memory),
        Column("flops", "FLOPs", lambda r: fmt_si(r.metrics.flops), drop=10, shown=flops),
    )


def _step_note(r: StepRow) -> str:
    if not r.outlier:
        return ""
    return f"slow: {r.cause}" + (f" (+{fmt_time_us(r.cause_excess_us)})" if r.cause_excess_us else "")


def step_columns(rows: Sequence[StepRow]) -> tuple[Column[StepRow], ...]:
    """The step table's columns; outlier steps' numbers in bold red."""
    memory = any(r.absolute_peak_bytes is not None for r in rows)  # steps of a profile with memory
    return (
        Column(
            "step",
            "Step",
            lambda r: Text(str(r.step), style="bold red") if r.outlier else str(r.step),
            justify="left",
        ),
        Column("wall", "Wall", lambda r: fmt_time_us(r.wall_us)),
        Column("cpu", "CPU", lambda r: fmt_time_us(r.cpu_us), drop=2),
        Column(
            "device",
            "Device",
            lambda r: fmt_time_us(r.device_us),
            drop=1,
            shown=any(r.device_us for r in rows),
        ),
        Column("forward", "Forward", lambda r: fmt_time_us(r.forward_us), drop=4),
        Column("backward", "Backward", lambda r: fmt_time_us(r.backward_us), drop=3),
        Column("peak", "Peak live", lambda r: fmt_bytes(r.absolute_peak_bytes or 0), drop=6, shown=memory),
        Column("net", "Net", lambda r: fmt_bytes(r.net_bytes or 0), drop=5, shown=memory),
        Column("vs_median", "vs median", lambda r: f"{r.ratio_to_median:.2f}x"),
        Column("note", "Note", _step_note, justify="left"),
    )


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
