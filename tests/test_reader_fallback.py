"""Reading torch's profiler results where the bindings name no activity (torch < 2.12).

The events are a real CUDA capture on torch 2.11 (tests/fixtures/kineto_events_cuda.json.gz, written
by tests/fixtures/dump_kineto_events.py on an H100), each with the activity name that the Kineto
headers give its number (the ground truth): the bindings reader, shown those events as torch 2.11
shows them, must give every span the kind that name means, and link kernels to their launching ops.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch

from layerscope.analysis.device import device_report
from layerscope.capture.bindings_reader import table_from_bindings
from layerscope.capture.device_streams import STREAM_TID_BASE
from layerscope.capture.event_columns import guess_activities, kind_of_activity
from layerscope.events.table import EventKind

DUMP = Path(__file__).parent / "fixtures" / "kineto_events_cuda.json.gz"


class _OldEvent:
    """One dumped event, answering the accessors torch 2.11's ``_KinetoEvent`` has (no activity_type)."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.row = row

    def name(self) -> str:
        return str(self.row["name"])

    def device_type(self) -> int:
        return int(self.row["device_type"])

    def is_user_annotation(self) -> bool:
        # not in the dump: the ground truth says which spans are user annotations, as 2.11 does
        return self.row["activity"] in ("user_annotation", "gpu_user_annotation")

    def __getattr__(self, accessor: str) -> Any:
        if accessor not in self.row or accessor in ("activity", "device_type"):
            raise AttributeError(accessor)
        value = self.row[accessor]
        return lambda: value


def _old_event_type(row_keys: set[str]) -> type:
    """A class with exactly the dumped accessors as methods (the readers map over unbound methods)."""
    methods: dict[str, Any] = {}
    for key in row_keys - {"activity"}:
        methods[key] = (lambda k: lambda self: self.row[k])(key)
    methods["device_type"] = lambda self: int(self.row["device_type"])
    methods["is_user_annotation"] = _OldEvent.is_user_annotation
    methods["__init__"] = _OldEvent.__init__
    return type("OldKinetoEvent", (), methods)


class _Results:
    def __init__(self, events: list[Any]) -> None:
        self._events = events

    def events(self) -> list[Any]:
        return self._events


@pytest.fixture(scope="module")
def dump() -> dict[str, Any]:
    return orjson.loads(gzip.decompress(DUMP.read_bytes()))


def test_the_dump_is_what_torch_2_11_gives(dump: dict[str, Any]) -> None:
    assert dump["torch"].startswith("2.11") and dump["accessors_missing"] == ["activity_type"]
    activities = {row["activity"] for row in dump["events"]}
    assert {"kernel", "cuda_runtime", "cpu_op", "gpu_user_annotation", "overhead"} <= activities


def test_bindings_reader_gives_every_span_its_true_kind(dump: dict[str, Any]) -> None:
    rows = dump["events"]
    event_type = _old_event_type(set(rows[0]))
    assert not hasattr(event_type, "activity_type")
    table = table_from_bindings(_Results([event_type(r) for r in rows]), None, shapes=False)
    spans = [r for r in rows if r["activity"] is not None]
    assert len(table.span_kind) == len(spans)
    expected = [int(kind_of_activity(r["activity"])) for r in spans]
    assert table.span_kind == expected
    # every kernel links to the op that launched it (its linked correlation id is an op's id)
    op_ids = {ext for ext, k in zip(table.span_ext, table.span_kind, strict=True) if k == EventKind.CPU_OP}
    kernel_links = [
        ext for ext, k in zip(table.span_ext, table.span_kind, strict=True) if k == EventKind.KERNEL
    ]
    assert kernel_links and all(ext in op_ids for ext in kernel_links)


def test_guess_without_the_annotation_flag_finds_device_copies_of_annotations(dump: dict[str, Any]) -> None:
    spans = [r for r in dump["events"] if r["activity"] is not None]
    guessed = guess_activities(
        [r["name"] for r in spans],
        [r["device_type"] != 0 for r in spans],
        None,
        [r["device_index"] for r in spans],
    )
    wrong = {(r["activity"], g) for r, g in zip(spans, guessed, strict=True) if r["activity"] != g}
    # without the flag a host user annotation reads as an op (both are attributed by name alike)
    assert wrong <= {("user_annotation", "cpu_op")}
    assert guessed.count("gpu_user_annotation") == 1


@pytest.mark.skipif(
    not hasattr(torch._C._autograd._KinetoEvent, "activity_type"),
    reason="needs torch >= 2.12's activity names",
)
def test_guess_names_python_functions_of_a_stack_capture() -> None:
    model = torch.nn.Linear(4, 4)
    with torch.profiler.profile(with_stack=True) as prof:
        model(torch.randn(2, 4)).sum().backward()
    events = [e for e in prof.profiler.kineto_results.events() if not e.nbytes()]
    guessed = guess_activities(
        [e.name() for e in events],
        [False] * len(events),
        [e.is_user_annotation() for e in events],
        [e.device_index() for e in events],
    )
    truth = [e.activity_type() for e in events]
    assert "python_function" in truth
    assert guessed == truth


def test_device_work_moves_onto_its_stream_thread(dump: dict[str, Any]) -> None:
    """The dumped kernels carry the thread id of the op that launched them (1: forward, 2: autograd's
    backward thread), as torch hands them over; with the bindings' ``device_resource_id`` (not in
    the dump: stream 7 given here, the stream the capture's trace names) the reader puts all of them
    on one thread for (device 0, stream 7), and leaves the CPU spans on their threads."""
    rows = [dict(r, device_resource_id=7) for r in dump["events"]]
    spans = [r for r in rows if r["activity"] is not None]
    assert {r["start_thread_id"] for r in spans if r["device_type"] != 0} == {1, 2}
    event_type = _old_event_type(set(rows[0]))
    table = table_from_bindings(_Results([event_type(r) for r in rows]), None, shapes=False)
    assert table.threads == {STREAM_TID_BASE: (0, 7)}
    expected = [STREAM_TID_BASE if r["device_type"] != 0 else r["start_thread_id"] for r in spans]
    assert table.span_tid == expected
    report = device_report(table)  # what the live device summary is computed from
    assert report is not None and [(s.device, s.stream) for s in report.streams] == [("0", "7")]
