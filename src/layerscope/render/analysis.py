"""Views of an analysis: the device section and the advice list."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from layerscope.analysis.advice import Advice
from layerscope.analysis.device import CopyStats, DeviceReport, KernelStats, SyncPoint
from layerscope.analysis.streams import IdleTime, StreamStats
from layerscope.analysis.verdict import StepVerdict
from layerscope.model.meta import DeviceSummary
from layerscope.render.table_fit import Column, FittedTable, wants_ascii
from layerscope.units import fmt_bytes, fmt_share, fmt_time_us

KERNEL_COLUMNS: tuple[Column[KernelStats], ...] = (
    Column("kernel", "Kernel", lambda k: k.name, "left"),
    Column("kind", "Kind", lambda k: k.kind, "left", drop=1),
    Column("launches", "Launches", lambda k: str(k.launches)),
    Column("total", "Total", lambda k: fmt_time_us(k.total_us)),
    Column("mean", "Mean", lambda k: fmt_time_us(k.mean_us), drop=2),
)
SYNC_COLUMNS: tuple[Column[SyncPoint], ...] = (
    Column("call", "Synchronisation", lambda s: s.call, "left"),
    Column("op", "In op", lambda s: s.op, "left", drop=1),
    Column("count", "Count", lambda s: str(s.count)),
    Column("total", "Total", lambda s: fmt_time_us(s.total_us)),
)


def step_columns(steps: Sequence[StepVerdict]) -> tuple[Column[StepVerdict], ...]:
    """The step table's columns; communication overlap only when a step ran communication."""
    has_comm = any(s.comm_overlap is not None for s in steps)
    overlap: Column[StepVerdict] = Column(
        "comm_overlap",
        "Comm overlap",
        lambda s: "" if s.comm_overlap is None else f"{100 * s.comm_overlap:.1f}%",
        drop=1,
        shown=has_comm,
    )
    return (*STEP_COLUMNS[:-1], overlap, STEP_COLUMNS[-1])


STEP_COLUMNS: tuple[Column[StepVerdict], ...] = (
    Column("step", "Step", lambda s: str(s.step), "left"),
    Column("wall", "Wall", lambda s: fmt_time_us(s.wall_us)),
    Column("busy", "Device busy", lambda s: fmt_time_us(s.device_busy_us)),
    Column("busy_share", "Busy %", lambda s: f"{100 * s.utilisation:.0f}%"),
    Column("idle_host", "Host wait", lambda s: fmt_time_us(s.idle.host_wait_us), drop=2),
    Column("idle_other", "Queued wait", lambda s: fmt_time_us(s.idle.other_us), drop=2),
    Column("verdict", "Verdict", lambda s: s.verdict, "left"),
)


def _optional_us(value: float | None) -> str:
    return "" if value is None else _us(value)


def _us(value: float) -> str:
    """A time that may be zero (fmt_time_us leaves zero blank, as tables of metrics want)."""
    return fmt_time_us(value) if value else "0"


STREAM_COLUMNS: tuple[Column[StreamStats], ...] = (
    Column("stream", "Stream", lambda s: f"{s.device}/{s.stream}", "left"),
    Column("kernels", "Kernels", lambda s: str(s.kernels)),
    Column("busy", "Busy", lambda s: fmt_time_us(s.busy_us)),
    Column("host_wait", "Host wait", lambda s: fmt_time_us(s.idle.host_wait_us)),
    Column("kernel_wait", "Launch gaps", lambda s: fmt_time_us(s.idle.kernel_wait_us), drop=2),
    Column("other", "Queued wait", lambda s: fmt_time_us(s.idle.other_us)),
    Column(
        "queue",
        "Queue mean/max",
        lambda s: "" if s.queue_mean is None else f"{s.queue_mean:.1f}/{s.queue_max}",
    ),
    Column(
        "delay",
        "Launch delay p50/p95",
        lambda s: (
            ""
            if s.launch_delay_median_us is None
            else f"{_optional_us(s.launch_delay_median_us)}/{_optional_us(s.launch_delay_p95_us)}"
        ),
        drop=1,
    ),
)


def stream_columns(streams: Sequence[StreamStats]) -> tuple[Column[StreamStats], ...]:
    """The streams table's columns; time at a full launch queue only when some stream had it."""
    full: Column[StreamStats] = Column(
        "full_queue",
        "Queue full",
        lambda s: fmt_time_us(s.full_queue_us),
        shown=any(s.full_queue_us > 0 for s in streams),
    )
    return (*STREAM_COLUMNS[:7], full, *STREAM_COLUMNS[7:])


COPY_COLUMNS: tuple[Column[CopyStats], ...] = (
    Column("kind", "Copy", lambda c: c.kind, "left"),
    Column("count", "Count", lambda c: str(c.count)),
    Column("bytes", "Bytes", lambda c: fmt_bytes(c.bytes) if c.bytes else ""),
    Column("time", "Time", lambda c: fmt_time_us(c.time_us)),
    Column("bandwidth", "GB/s", lambda c: "" if c.gb_per_s is None else f"{c.gb_per_s:.1f}"),
)


def idle_line(idle: IdleTime, overlap: float | None) -> str:
    """Idle time between work by cause, and communication/computation overlap when there is any."""
    text = (
        f"Device idle (no stream busy): {_us(idle.total_us)} — host wait (nothing queued) "
        f"{_us(idle.host_wait_us)}, launch gaps {_us(idle.kernel_wait_us)}, queued wait (events, other "
        f"streams, syncs) {_us(idle.other_us)}"
    )
    if overlap is not None:
        text += f"; communication overlapped by computation {100 * overlap:.1f}%"
    return text


COMMUNICATION_COLUMNS: tuple[Column[dict[str, Any]], ...] = (
    Column("collective", "Collective", lambda r: str(r["collective"]), "left"),
    Column("group", "Group (size)", lambda r: f"{r['group']} ({r['group_size']})", "left"),
    Column("dtype", "Dtype", lambda r: str(r["dtype"]), "left", drop=1),
    Column("calls", "Calls", lambda r: str(r["calls"])),
    Column("bytes", "Bytes", lambda r: fmt_bytes(r["bytes"])),
    Column(
        "per_call", "Per call", lambda r: fmt_bytes(r["bytes"] / r["calls"]) if r["calls"] else "", drop=2
    ),
    Column("cpu", "CPU", lambda r: fmt_time_us(r["cpu_us"])),
)


def kind_columns(whole_us: float) -> tuple[Column[tuple[str, float]], ...]:
    """Device time by kernel kind: each kind's share of ``whole_us`` (the kinds' summed time)."""
    return (
        Column("kind", "Kind", lambda kv: kv[0], "left"),
        Column("time", "Time", lambda kv: fmt_time_us(kv[1])),
        Column("share", "Share", lambda kv: fmt_share(kv[1], whole_us), style="bold"),
    )


def device_summary_section(summary: DeviceSummary, ascii_only: bool | None = None) -> RenderableType:
    """What a saved profile keeps of its device report: busy/idle, launches, time by kernel kind (the
    kernels, syncs and streams tables need the trace)."""
    if ascii_only is None:
        ascii_only = wants_ascii()
    idle = max(0.0, summary.window_us - summary.busy_us)
    kinds = sorted(summary.by_kind.items(), key=lambda kv: -kv[1])
    busy = max(sum(summary.by_kind.values()), summary.busy_us)
    return Group(
        Text(
            f"Device: busy {fmt_time_us(summary.busy_us)} of {fmt_time_us(summary.window_us)} "
            f"({100 * summary.utilisation:.1f}%), idle {fmt_time_us(idle)}; "
            f"{summary.launches} kernel launches, {summary.tiny_kernels} under 10 µs, "
            f"{summary.launch_bound} shorter than their launch call",
            style="bold",
        ),
        FittedTable(kind_columns(busy), [kinds], ascii_only=ascii_only),
        Text(
            idle_line(
                IdleTime(summary.idle.host_wait_us, summary.idle.kernel_wait_us, summary.idle.other_us),
                summary.comm_compute_overlap,
            )
        ),
        Text(
            "(a saved profile keeps the device summary: analyze the trace for kernels and syncs)", style="dim"
        ),
    )


def device_section(report: DeviceReport, top: int = 10, ascii_only: bool | None = None) -> RenderableType:
    """Busy/idle, time by kernel kind, top kernels, synchronisations, and the per-step verdict."""
    if ascii_only is None:
        ascii_only = wants_ascii()
    parts: list[RenderableType] = [
        Text(
            f"Device: busy {fmt_time_us(report.busy_us)} of {fmt_time_us(report.window_us)} "
            f"({100 * report.utilisation:.1f}%), idle {fmt_time_us(report.idle_us)}; "
            f"{report.launches} kernel launches, {report.tiny_kernels} under 10 µs, "
            f"{report.launch_bound} shorter than their launch call",
            style="bold",
        )
    ]
    kinds = sorted(report.by_kind.items(), key=lambda kv: -kv[1])
    summed = sum(report.by_kind.values())
    parts.append(FittedTable(kind_columns(max(summed, report.busy_us)), [kinds], ascii_only=ascii_only))
    # Kernels on concurrent streams overlap: busy time counts them once, kinds each, so shares of
    # busy time would add up past 100%. Shares are of the kinds' sum, and a line says by how much
    # that exceeds busy time. Without overlap the sum is the busy time and nothing changes.
    if summed > report.busy_us * (1 + 1e-4):
        parts.append(
            Text(
                f"Shares are of {fmt_time_us(summed)} summed over kinds: kernels on concurrent streams "
                f"overlap for {fmt_time_us(summed - report.busy_us)}, counted once in busy time.",
                style="dim",
            )
        )
    parts.append(FittedTable(KERNEL_COLUMNS, [report.kernels[:top]], ascii_only=ascii_only))
    if report.streams:
        parts.append(Text(idle_line(report.idle, report.comm_compute_overlap)))
        parts.append(
            FittedTable(stream_columns(report.streams), [report.streams[:top]], ascii_only=ascii_only)
        )
    if any(c.bytes for c in report.copies):
        parts.append(FittedTable(COPY_COLUMNS, [report.copies], ascii_only=ascii_only))
    if report.syncs:
        parts.append(FittedTable(SYNC_COLUMNS, [report.syncs[:top]], ascii_only=ascii_only))
    if report.steps:
        parts.append(FittedTable(step_columns(report.steps), [report.steps], ascii_only=ascii_only))
    return Group(*parts)


def communication_table(records: Sequence[dict[str, Any]], ascii_only: bool | None = None) -> RenderableType:
    """Collectives recorded by ``record_param_comms``: calls, bytes moved, CPU time, by process group."""
    if ascii_only is None:
        ascii_only = wants_ascii()
    return FittedTable(COMMUNICATION_COLUMNS, [records], ascii_only=ascii_only)


def advice_list(advice: Sequence[Advice], ascii_only: bool | None = None) -> RenderableType:
    """One line per finding: the rule, what to do, where."""
    if ascii_only is None:
        ascii_only = wants_ascii()
    if not advice:
        return Text("Advice: no rule fired on this trace.")
    bullet = "-" if ascii_only else "•"
    lines = [Text("Advice:", style="bold")]
    for a in advice:
        line = Text(f"{bullet} [{a.rule}] ", style="bold")
        line.append(a.message)
        line.append(f"  (at {a.where})", style="dim")
        lines.append(line)
    return Group(*lines)
