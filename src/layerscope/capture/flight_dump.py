"""Writing a flight recorder's dumps off the step's thread: one writer thread, one file per dump.

A dump is requested on the step's thread (or in a signal handler) with a snapshot of the ring; the
writer thread turns it into a profile (``attribution/flight_profile.py``), names the slow step's
module (``analysis/flight.py``) and saves it atomically (a temporary file renamed into place). A dump
that fails is a warning: the recorder never raises into the program it watches.
"""

from __future__ import annotations

import collections
import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from layerscope.analysis.flight import slow_step_culprit
from layerscope.attribution.flight_profile import flight_profile
from layerscope.capture.recording import Recording
from layerscope.errors import LayerscopeWarning, ValidationError
from layerscope.events.flight_records import FlightModule, FlightStep
from layerscope.model.meta import FlightInfo, ProfileMeta
from layerscope.model.profile import Profile
from layerscope.model.serialize import save_profile


class FlightDumpWarning(LayerscopeWarning):
    """A flight recorder's dump could not be written (the job goes on)."""


@dataclass
class DumpJob:
    """One dump to write: the kept steps (oldest first) with their CUDA events (start, end) or
    None, the modules, the trigger and settings, the profile meta, and where."""

    path: Path
    steps: list[FlightStep]
    events: list[tuple[Any, Any] | None]
    modules: list[FlightModule]
    flight: FlightInfo
    meta: ProfileMeta


@dataclass
class DetailJob:
    """A detailed profile to build and save beside the dumps: ``build`` makes it from what torch
    recorded (a profile block builds lazily, so the step's thread only stops the profiler)."""

    path: Path
    build: Callable[[], Profile]


@dataclass
class ReadJob:
    """A detailed step just stopped: read torch's events into its recording's table and let torch's
    results go (``Recording.keep_events_only``: ~3 kB per event kept down to ~130 B), off the step's
    thread. The profile is built only when a dump, or the block's end, needs it (``DetailJob``)."""

    step: int
    recording: Recording


Job = DumpJob | DetailJob | ReadJob


class DumpWriter:
    """The writer thread and the paths it wrote.

    Jobs can be submitted from a signal handler, which runs on the main thread between any two
    bytecodes, possibly inside a lock the main thread holds: so submitting takes no lock that is not
    reentrant (a deque's append, an ``os.write`` to wake the thread: the self-pipe idiom) and starts
    no thread (:meth:`start` does, when the recorder starts).
    """

    def __init__(self) -> None:
        self._jobs: collections.deque[Job | None] = collections.deque()
        self._thread: threading.Thread | None = None
        self._wake_read, self._wake_write = -1, -1
        self._pending = 0
        self._done = threading.Condition(threading.RLock())  # reentrant: see the class docstring
        self.written: list[Path] = []

    def start(self) -> None:
        """Start the writer thread."""
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="layerscope-flight-dumps", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``; never blocks (safe in a signal handler). Without the thread (before
        :meth:`start`, after :meth:`stop`) the job is written at once, on this thread."""
        with self._done:
            self._pending += 1
        if self._thread is None:
            self._write(job)
            return
        self._jobs.append(job)
        os.write(self._wake_write, b"j")

    @property
    def busy(self) -> bool:
        """Whether jobs are queued or being written (the writer's work slows the steps meanwhile)."""
        return self._pending > 0

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued job is written (or ``timeout`` seconds); whether all were."""
        with self._done:
            return self._done.wait_for(lambda: self._pending == 0, timeout)

    def stop(self, timeout: float | None = None) -> bool:
        """Write what is queued (waiting up to ``timeout`` seconds), then end the thread; whether
        everything was written."""
        if self._thread is None:
            return True
        written = self.flush(timeout)
        self._jobs.append(None)
        os.write(self._wake_write, b"s")
        self._thread.join(timeout=1.0 if written else 0.0)
        # a thread still writing finds the pipe closed at its next read and ends
        os.close(self._wake_write)
        os.close(self._wake_read)
        self._thread = None
        return written

    def _run(self) -> None:
        while True:
            try:
                if not os.read(self._wake_read, 1):
                    return
            except OSError:  # closed by stop() after its timeout
                return
            while self._jobs:
                job = self._jobs.popleft()
                if job is None:
                    return
                self._write(job)

    def _write(self, job: Job) -> None:
        try:
            if isinstance(job, ReadJob):
                job.recording.keep_events_only(sole_owner=True)  # the recorder's own profiler
                job.recording.own_shapes = None  # read: the shapes record goes with torch's results
                return
            if isinstance(job, DumpJob):
                write_dump(job)
            else:
                save_profile(job.build(), job.path)
            self.written.append(job.path)
        except Exception as exc:  # never into the program: a warning names the dump
            what = f"read detailed step {job.step}" if isinstance(job, ReadJob) else f"write {job.path}"
            warnings.warn(
                f"layerscope flight recorder: could not {what}: {type(exc).__name__}: {exc}",
                FlightDumpWarning,
                stacklevel=1,
            )
        finally:
            with self._done:
                self._pending -= 1
                self._done.notify_all()


def write_dump(job: DumpJob) -> Path:
    """Build the dump's profile and save it (atomically) at ``job.path``."""
    steps = [_with_device_time(step, events) for step, events in zip(job.steps, job.events, strict=True)]
    profile = flight_profile(steps, job.modules, job.flight, job.meta)
    trigger = job.flight.trigger
    if trigger.reason == "slow_step":
        culprit = slow_step_culprit(profile, trigger.step)
        if culprit is not None:
            flight = replace(job.flight, trigger=replace(trigger, module=culprit.module))
            profile = replace(profile, meta=replace(profile.meta, flight=flight))
    try:
        profile.validate()
    except ValidationError as exc:  # a dump is evidence: keep it, and say it does not add up
        warnings.warn(
            f"layerscope flight recorder: {job.path} is saved though it fails validate(): {exc}",
            FlightDumpWarning,
            stacklevel=1,
        )
    return save_profile(profile, job.path)


def _with_device_time(step: FlightStep, events: tuple[Any, Any] | None) -> FlightStep:
    """The step with the device time between its boundaries' CUDA events (waiting for the later
    one: this runs on the writer thread)."""
    if events is None or events[0] is None or events[1] is None:
        return step
    start, end = events
    try:
        end.synchronize()
        device_us = float(start.elapsed_time(end)) * 1000.0
    except Exception:  # after a CUDA error every call fails: the dump goes on without device time
        return step
    return replace(step, device_us=device_us)


def dump_path(folder: Path, step: int, reason: str, rank: int | None, taken: set[Path] | None = None) -> Path:
    """A new file in ``folder`` for a dump: ``flight-step<N>-<reason>[-rank<R>].json.gz``, with a
    counter when that name is taken (a file there, or a name in ``taken``: handed out, not yet
    written)."""
    rank_part = f"-rank{rank}" if rank is not None else ""
    stem = f"flight-step{step:06d}-{reason}{rank_part}"
    path = folder / f"{stem}.json.gz"
    k = 1
    while path.exists() or (taken is not None and path in taken):
        path = folder / f"{stem}-{k}.json.gz"
        k += 1
    return path


def detail_path(folder: Path, step: int, rank: int | None) -> Path:
    """Where the detailed profile of ``step`` is saved."""
    rank_part = f"-rank{rank}" if rank is not None else ""
    return folder / f"flight-detail-step{step:06d}{rank_part}.json.gz"


def make_folder(folder: str | os.PathLike[str]) -> Path:
    """``folder`` as a Path, created when missing."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path
