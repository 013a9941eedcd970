"""The flight recorder's detailed steps (``detail_every``): kept as an events table, built and saved
only when a dump (or the block's end) needs them; what is kept meanwhile, and that what is built from
it is the profile torch's results give."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path

import pytest
import torch

import layerscope as ls
from layerscope.capture.flight_dump import FlightDumpWarning
from layerscope.capture.recording import Recording
from layerscope.errors import CaptureError
from tests.test_flight_recorder import Exploding, Net, loaded, train


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "flight"


def details(out: Path) -> list[str]:
    """The detailed profiles' files written so far, by name."""
    return sorted(p.name for p in out.glob("flight-detail-*"))


def test_a_dump_builds_the_kept_detailed_step_and_names_it(out: Path) -> None:
    torch.manual_seed(0)
    plain, recorded = Net(), Net()
    recorded.load_state_dict(plain.state_dict())
    plain_losses = train(plain, 11)
    with ls.flight_recorder(recorded, out=out, detail_every=3, slow=None) as rec:
        losses = train(recorded, 8, rec)  # detailed steps 3 and 6
        assert rec.flush(30.0)
        assert details(out) == []  # recorded, read, not built: no dump asked for them
        path = rec.dump()
        assert rec.flush(30.0)
        assert details(out) == ["flight-detail-step000006.json.gz"]
        again = rec.dump()  # nothing newer: the same file, not built again
        losses += train(recorded, 3, rec)  # detailed step 9, written when the block ends
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses, strict=True))
    assert details(out) == ["flight-detail-step000006.json.gz", "flight-detail-step000009.json.gz"]
    dump = loaded(path)
    assert dump.meta.flight is not None and dump.meta.flight.detail_step == 6
    assert dump.meta.flight.detail_file == str(out / "flight-detail-step000006.json.gz")
    again_flight = loaded(again).meta.flight
    assert again_flight is not None and again_flight.detail_file == dump.meta.flight.detail_file
    detail = loaded(Path(dump.meta.flight.detail_file))
    assert detail.op_rows and detail.totals.flops > 0 and detail.has_memory
    assert detail.find("blocks.2.linear").calls == 1 and len(detail.steps) <= 1
    assert rec.dumps.count(out / "flight-detail-step000006.json.gz") == 1


def test_only_the_latest_detailed_step_is_kept_and_without_torch_s_results(out: Path) -> None:
    """The memory bound: one detailed step's events table, torch's results (~3 kB per event) let
    go once the writer has read them; the step before it is dropped whole."""
    model = Net()
    with ls.flight_recorder(model, out=out, detail_every=2, slow=None) as rec:
        train(model, 3, rec)  # detailed step 2
        assert rec.flush(30.0) and len(rec._detail_kept) == 1
        first = rec._detail_kept[0][2]
        assert first.torch_profiler is None  # read into the table on the writer thread
        kept_first = weakref.ref(first)
        del first
        train(model, 2, rec)  # detailed step 4 replaces it
        assert rec.flush(30.0) and len(rec._detail_kept) == 1
        assert rec._detail_kept[0][1] == 4 and rec._detail_kept[0][2].torch_profiler is None
        gc.collect()
        assert kept_first() is None
    assert rec._detail_kept == []  # written when the block ended, then let go
    assert details(out) == ["flight-detail-step000004.json.gz"]


def test_torch_s_results_are_freed_by_reference_counting(out: Path) -> None:
    model = Net()
    was_enabled = gc.isenabled()
    gc.disable()  # freed without the cyclic collector, as a profile's results must be
    try:
        with ls.flight_recorder(model, out=out, detail_every=2, slow=None) as rec:
            train(model, 2, rec)
            session = rec._detail[0].session
            torch_profiler = weakref.ref(session.torch_profiler)
            del session
            train(model, 1, rec)  # the detailed step ends
            assert rec.flush(30.0)
            assert torch_profiler() is None
    finally:
        if was_enabled:
            gc.enable()


def test_an_exception_s_dump_writes_the_kept_detailed_step(out: Path) -> None:
    model = Net()
    boom = Exploding(ValueError("boom"))
    model.head = torch.nn.Sequential(model.head, boom)
    with pytest.raises(ValueError), ls.flight_recorder(model, out=out, detail_every=2, slow=None) as rec:
        train(model, 4, rec)  # detailed step 2 kept
        boom.armed = True
        train(model, 1, rec)
    (dump,) = [p for p in rec.dumps if "exception" in p.name]
    flight = loaded(dump).meta.flight
    assert flight is not None and flight.detail_step == 2 and flight.trigger.module == "head.1"
    assert loaded(Path(flight.detail_file or "")).find("blocks.2.linear").calls == 1


def test_a_recording_kept_as_its_table_builds_the_same_profile() -> None:
    torch.manual_seed(0)
    model = Net()
    with ls.profile(model, memory=True) as prof:
        train(model, 1)
    direct = prof.recording
    kept = Recording(prof.torch_profiler, direct.context, direct.block_us)
    kept.keep_events_only()
    assert kept.torch_profiler is None
    a, b = direct.profile, kept.profile
    b.validate()
    assert a.op_rows == b.op_rows and a.totals == b.totals and a.steps == b.steps
    assert [n.path for n in a.root.walk()] == [n.path for n in b.root.walk()]
    assert [n.total for n in a.root.walk()] == [n.total for n in b.root.walk()]
    with pytest.raises(CaptureError, match="kept only its events"):
        kept.export_chrome_trace("never.json")


def test_the_sole_owner_frees_torchs_events_and_builds_the_same_profile() -> None:
    """``keep_events_only(sole_owner=True)`` (the flight recorder's detailed steps) frees torch's
    events itself, off the GIL, after reading them: the same profile, torch's events list empty."""
    from layerscope.capture import native

    if native.load() is None:
        pytest.skip(f"native module not in use: {native.status().reason}")
    torch.manual_seed(0)
    model = Net()
    with ls.profile(model, memory=True) as prof:
        train(model, 1)
    direct = prof.recording
    a = direct.profile  # built before the events go
    results = prof.torch_profiler.profiler.kineto_results
    assert len(results.events()) > 100
    kept = Recording(prof.torch_profiler, direct.context, direct.block_us)
    kept.keep_events_only(sole_owner=True)
    assert len(results.events()) == 0 and kept.torch_profiler is None
    b = kept.profile
    b.validate()
    assert a.op_rows == b.op_rows and a.totals == b.totals and a.steps == b.steps
    assert [n.total for n in a.root.walk()] == [n.total for n in b.root.walk()]


def test_a_detailed_step_that_cannot_be_read_is_a_warning_and_a_dump_still_builds_it(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(self: Recording, sole_owner: bool = False) -> None:
        raise RuntimeError("no table")

    monkeypatch.setattr(Recording, "keep_events_only", fail)
    model = Net()
    with (
        pytest.warns(FlightDumpWarning, match="could not read detailed step 2: RuntimeError: no table"),
        ls.flight_recorder(model, out=out, detail_every=2, slow=None) as rec,
    ):
        train(model, 3, rec)
        assert rec.flush(30.0)
        path = rec.dump()  # torch's results were kept: the profile is built from them
    flight = loaded(path).meta.flight
    assert flight is not None and flight.detail_step == 2
    assert loaded(Path(flight.detail_file or "")).find("blocks.2.linear").calls == 1


def test_a_dump_is_written_before_the_detailed_step_it_names(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal whose default action ends the process waits for the dump only: a long build of the
    detailed step must come after it on the writer thread, not before."""
    release = threading.Event()
    build = Recording.build

    def held_build(self: Recording) -> object:
        assert release.wait(60.0)
        return build(self)

    monkeypatch.setattr(Recording, "build", held_build)
    model = Net()
    with ls.flight_recorder(model, out=out, detail_every=2, slow=None) as rec:
        train(model, 3, rec)  # detailed step 2 kept
        path = rec.dump()
        deadline = time.monotonic() + 30.0
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        written_first = path.exists() and details(out) == []
        release.set()  # (also when the order is wrong: the block must end)
    assert written_first
    assert details(out) == ["flight-detail-step000002.json.gz"]


def test_the_writer_leaves_the_program_s_collector_alone(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer reads and builds beside the program: pausing the cyclic GC there would be the
    program's pause (``gc.isenabled()`` False in its loop, a ``gc.disable()`` of its undone)."""
    seen: list[bool] = []
    read = Recording._read

    def watched_read(self: Recording) -> object:
        seen.append(gc.isenabled())
        return read(self)

    monkeypatch.setattr(Recording, "_read", watched_read)
    model = Net()
    assert gc.isenabled()
    with ls.flight_recorder(model, out=out, detail_every=2, slow=None) as rec:
        train(model, 3, rec)
        assert rec.flush(30.0)
        rec.dump()
    assert seen == [True]
    with ls.profile(model) as prof:  # a profile read on the program's own thread still pauses it
        train(model, 1)
    prof.profile  # noqa: B018 - built now
    assert seen == [True, False]
