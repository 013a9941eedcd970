"""``layerscope.load``: a saved profile or any torch.profiler trace file, as a Profile."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerscope.analysis.advice import Advice, advise
from layerscope.analysis.device import DeviceReport, device_report
from layerscope.build.attribute import build_profile
from layerscope.errors import TraceFormatError
from layerscope.events.chrome import FlopCounter, table_from_trace
from layerscope.model.profile import SCHEMA_VERSION, Profile
from layerscope.model.serialize import FORMAT_TAG, profile_from_dict, read_json


def _flop_counter() -> FlopCounter | None:
    """torch's FLOP formulas when torch is installed; otherwise traces keep their own ``flops``."""
    try:
        from layerscope.capture.flops import FlopCalculator
    except ImportError:
        return None
    calculator = FlopCalculator()

    def count(name: str, dims: list[Any], concrete: list[Any]) -> int:
        return calculator.count(name, dims, concrete) if calculator.needs(name) else 0

    return count


def load(path: str | Path) -> Profile:
    """Load a profile saved by :meth:`Profile.save`, or build one from a Chrome trace written by
    torch.profiler (``export_chrome_trace``, ``tensorboard_trace_handler``; .json or .json.gz)."""
    path = Path(path)
    data = read_json(path)
    if isinstance(data, dict) and data.get("format") == FORMAT_TAG:
        try:
            return profile_from_dict(data)
        except TraceFormatError as exc:
            raise TraceFormatError(f"{path}: {exc}") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceFormatError(f"{path}: neither a layerscope profile nor a torch.profiler trace")
    table = table_from_trace(data, flops=_flop_counter(), source=str(path))
    if not table.span_count and not table.mem_ts:
        raise TraceFormatError(f"{path}: the trace holds no profiler events")
    meta = {
        "schema_version": SCHEMA_VERSION,
        "source": "trace",
        "trace_file": str(path),
        "model": None,
        "options": {"memory": bool(table.mem_ts)},
    }
    return build_profile(table, None, meta)


@dataclass(frozen=True)
class Analysis:
    """A trace (or saved profile) analysed: its Profile, device report and advice."""

    source: str
    profile: Profile
    device: DeviceReport | None
    advice: tuple[Advice, ...]


TRACE_SUFFIXES = (".json", ".json.gz")


def trace_files(path: str | Path) -> list[Path]:
    """The files ``analyze`` reads for PATH: the file itself, or a folder's traces (TensorBoard logs
    ``*.pt.trace.json[.gz]`` first, else every ``.json``/``.json.gz``), sorted by name."""
    path = Path(path)
    if path.is_dir():
        tensorboard = sorted(p for p in path.rglob("*.pt.trace.json*") if p.name.endswith(TRACE_SUFFIXES))
        found = tensorboard or sorted(p for p in path.iterdir() if p.name.endswith(TRACE_SUFFIXES))
        if not found:
            raise TraceFormatError(f"{path}: no .json or .json.gz trace in this folder")
        return found
    return [path]


def analyze(path: str | Path) -> Analysis:
    """Analyse one trace file (or saved profile): Profile + device report + advice."""
    path = Path(path)
    data = read_json(path)
    if isinstance(data, dict) and data.get("format") == FORMAT_TAG:
        profile = profile_from_dict(data)
        return Analysis(str(path), profile, None, tuple(advise(profile, None)))
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceFormatError(f"{path}: neither a layerscope profile nor a torch.profiler trace")
    table = table_from_trace(data, flops=_flop_counter(), source=str(path))
    if not table.span_count and not table.mem_ts:
        raise TraceFormatError(f"{path}: the trace holds no profiler events")
    meta = {
        "schema_version": SCHEMA_VERSION,
        "source": "trace",
        "trace_file": str(path),
        "model": None,
        "options": {"memory": bool(table.mem_ts)},
    }
    profile = build_profile(table, None, meta)
    device = device_report(table)
    return Analysis(str(path), profile, device, tuple(advise(profile, device)))
