"""The HTML report's device section, from a profile's device summary (``Profile.meta.device``,
analysis/device_summary.py): busy and idle time by cause, overlap, streams, copies, step verdicts.
Static tables, every value escaped."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from layerscope.model.meta import DeviceSummary
from layerscope.render.html_tables import static_table
from layerscope.units import fmt_bytes, fmt_time_us


def _us(value: float | None) -> str:
    if value is None:
        return ""
    return fmt_time_us(value) if value else "0"


def _share(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def device_section_html(device: DeviceSummary) -> str:
    """The ``<section id="device">`` of the report."""
    idle = device.idle
    lines = [
        f"Device busy {_us(device.busy_us)} of {_us(device.window_us)} "
        f"({_share(device.utilisation)}); {device.launches} kernel launches, "
        f"{device.tiny_kernels} under 10 µs, {device.launch_bound} shorter than their launch call.",
        f"Device idle (no stream busy): host wait (nothing queued) {_us(idle.host_wait_us)}, "
        f"launch gaps {_us(idle.kernel_wait_us)}, queued wait (events, other streams, syncs) "
        f"{_us(idle.other_us)}.",
    ]
    if device.comm_compute_overlap is not None:
        lines.append(f"Communication overlapped by computation: {_share(device.comm_compute_overlap)}.")
    parts = [f"<p>{html.escape(line)}</p>" for line in lines]
    parts.append("<h3>Streams (idle time per stream, HTA's definitions)</h3>")
    parts.append(_streams_table(device.streams))
    if device.copies:
        copies = [
            [
                c["kind"],
                str(c["count"]),
                fmt_bytes(c["bytes"]),
                _us(c["time_us"]),
                "" if c["gb_per_s"] is None else f"{c['gb_per_s']:.1f}",
            ]
            for c in device.copies
        ]
        parts.append("<h3>Memory copies</h3>")
        parts.append(static_table(["Copy", "Count", "Bytes", "Time", "GB/s"], copies, styled=False))
    if device.steps:
        steps = [
            [
                str(s["step"]),
                _us(s["wall_us"]),
                _us(s["device_busy_us"]),
                _share(s["utilisation"]),
                _us(s["host_wait_us"]),
                _us(s["other_us"]),
                _share(s["comm_overlap"]),
                s["verdict"],
            ]
            for s in device.steps
        ]
        headers = [
            "Step",
            "Wall",
            "Device busy",
            "Busy",
            "Host wait",
            "Queued wait",
            "Comm overlap",
            "Verdict",
        ]
        parts.append("<h3>Steps: what bounds each (device idle time, no stream busy)</h3>")
        parts.append(static_table(headers, steps, styled=False))
    return '<section id="device"><h2>Device</h2>' + "".join(parts) + "</section>"


def _streams_table(streams_data: Sequence[Mapping[str, Any]]) -> str:
    """Per stream: kernels, busy, idle by cause, queue, launch delay, time at a full queue."""
    streams = [
        [
            f"{s['device']}/{s['stream']}",
            str(s["kernels"]),
            _us(s["busy_us"]),
            _us(s["host_wait_us"]),
            _us(s["kernel_wait_us"]),
            _us(s["other_us"]),
            "" if s["queue_mean"] is None else f"{s['queue_mean']:.1f}/{s['queue_max']}",
            _us(s["launch_delay_median_us"]),
            _us(s["launch_delay_p95_us"]),
            _us(s.get("full_queue_us", 0.0)),
        ]
        for s in streams_data
    ]
    return static_table(
        [
            "Stream",
            "Kernels",
            "Busy",
            "Host wait",
            "Launch gaps",
            "Queued wait",
            "Queue mean/max",
            "Launch delay p50",
            "p95",
            "Queue full",
        ],
        streams,
        styled=False,
    )
