"""The device report's figures a profile keeps (``ProfileMeta.device``, a
:class:`~layerscope.model.meta.DeviceSummary`): made here, the same way for a live capture
(``capture/recording.py``) and a trace (``loading.py``), saved with the profile, read by
``to_pandas("streams")``, ``to_pandas("device_steps")``, the HTML report's device section and rank
merging.

Times are in µs, shares 0-1, None where there is nothing to measure (no communication, no launch
calls on a stream)."""

from __future__ import annotations

from layerscope.analysis.device import DeviceReport, device_report
from layerscope.analysis.streams import IdleTime
from layerscope.events.table import EventTable
from layerscope.model.meta import DeviceSummary, IdleSplit


def summarize_device(table: EventTable) -> tuple[DeviceReport | None, DeviceSummary | None]:
    """The device report of ``table``'s events and its summary (None, None: no device work)."""
    report = device_report(table)
    return report, device_summary(report) if report is not None else None


def _idle(idle: IdleTime) -> dict[str, float]:
    return {
        "host_wait_us": idle.host_wait_us,
        "kernel_wait_us": idle.kernel_wait_us,
        "other_us": idle.other_us,
    }


def device_summary(report: DeviceReport) -> DeviceSummary:
    """The report's figures (top kernels and sync points left out: the op table has them)."""
    return DeviceSummary(
        window_us=report.window_us,
        busy_us=report.busy_us,
        utilisation=report.utilisation,
        idle=IdleSplit(**_idle(report.idle)),
        comm_compute_overlap=report.comm_compute_overlap,
        launches=report.launches,
        tiny_kernels=report.tiny_kernels,
        launch_bound=report.launch_bound,
        by_kind=dict(report.by_kind),
        streams=tuple(
            {
                "device": s.device,
                "stream": s.stream,
                "kernels": s.kernels,
                "work": s.work,
                "busy_us": s.busy_us,
                **_idle(s.idle),
                "queue_mean": s.queue_mean,
                "queue_max": s.queue_max,
                "launch_delay_median_us": s.launch_delay_median_us,
                "launch_delay_p95_us": s.launch_delay_p95_us,
                "full_queue_us": s.full_queue_us,
            }
            for s in report.streams
        ),
        copies=tuple(
            {"kind": c.kind, "count": c.count, "bytes": c.bytes, "time_us": c.time_us, "gb_per_s": c.gb_per_s}
            for c in report.copies
        ),
        collectives=tuple((c.name, c.start_us, c.end_us, c.step) for c in report.collectives),
        steps=tuple(
            {
                "step": s.step,
                "wall_us": s.wall_us,
                "device_busy_us": s.device_busy_us,
                "utilisation": s.utilisation,
                **_idle(s.idle),
                "comm_overlap": s.comm_overlap,
                "devices": s.devices,
                "verdict": s.verdict,
            }
            for s in report.steps
        ),
    )
