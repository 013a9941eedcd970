"""Views of an analysis: the device section and the advice list."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from layerscope.analysis.advice import Advice
from layerscope.analysis.device import DeviceReport
from layerscope.render.console import _FittedTable, _wants_ascii
from layerscope.units import fmt_bytes, fmt_share, fmt_time_us


def device_section(report: DeviceReport, top: int = 10, ascii_only: bool | None = None) -> RenderableType:
    """Busy/idle, time by kernel kind, top kernels, synchronisations, and the per-step verdict."""
    if ascii_only is None:
        ascii_only = _wants_ascii()
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
    parts.append(
        _FittedTable(
            headers=["Kind", "Time", "Share"],
            sections=[[(k, fmt_time_us(v), fmt_share(v, report.busy_us)) for k, v in kinds]],
            ascii_only=ascii_only,
            caption="",
            drop_order=[],
        )
    )
    parts.append(
        _FittedTable(
            headers=["Kernel", "Kind", "Launches", "Total", "Mean"],
            sections=[
                [
                    (k.name, k.kind, str(k.launches), fmt_time_us(k.total_us), fmt_time_us(k.mean_us))
                    for k in report.kernels[:top]
                ]
            ],
            ascii_only=ascii_only,
            caption="",
            drop_order=["Kind", "Mean"],
            text_columns={"Kind"},
        )
    )
    if report.syncs:
        parts.append(
            _FittedTable(
                headers=["Synchronisation", "In op", "Count", "Total"],
                sections=[
                    [(s.call, s.op, str(s.count), fmt_time_us(s.total_us)) for s in report.syncs[:top]]
                ],
                ascii_only=ascii_only,
                caption="",
                drop_order=["In op"],
                text_columns={"In op"},
            )
        )
    if report.steps:
        parts.append(
            _FittedTable(
                headers=["Step", "Wall", "Device busy", "Busy %", "Verdict"],
                sections=[
                    [
                        (
                            str(s.step),
                            fmt_time_us(s.wall_us),
                            fmt_time_us(s.device_busy_us),
                            f"{100 * s.utilisation:.0f}%",
                            s.verdict,
                        )
                        for s in report.steps
                    ]
                ],
                ascii_only=ascii_only,
                caption="",
                drop_order=[],
                text_columns={"Verdict"},
            )
        )
    return Group(*parts)


def communication_table(records: Sequence[dict[str, Any]], ascii_only: bool | None = None) -> RenderableType:
    """Collectives recorded by ``record_param_comms``: calls, bytes moved, CPU time, by process group."""
    if ascii_only is None:
        ascii_only = _wants_ascii()
    body = [
        (
            str(r["collective"]),
            f"{r['group']} ({r['group_size']})",
            str(r["dtype"]),
            str(r["calls"]),
            fmt_bytes(r["bytes"]),
            fmt_bytes(r["bytes"] / r["calls"]) if r["calls"] else "",
            fmt_time_us(r["cpu_us"]),
        )
        for r in records
    ]
    return _FittedTable(
        headers=["Collective", "Group (size)", "Dtype", "Calls", "Bytes", "Per call", "CPU"],
        sections=[body],
        ascii_only=ascii_only,
        caption="",
        drop_order=["Dtype", "Per call"],
        text_columns={"Group (size)", "Dtype"},
    )


def advice_list(advice: Sequence[Advice], ascii_only: bool | None = None) -> RenderableType:
    """One line per finding: the rule, what to do, where."""
    if ascii_only is None:
        ascii_only = _wants_ascii()
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
