"""Module scopes as marks on torch's clock instead of profiler ranges (when the native module is built).

A profiler range is one profiler event per module call, charged what torch charges every event. A
mark is ``c10::getApproximateTime()`` plus a code in a per-thread C++ buffer (``native_reader.cpp``);
converted at the end the way torch converts its own events, marks order correctly against torch's
events (``benchmarks/clock_marks.py`` measures the margin; docs/benchmarks.md). After the block, each
enter/exit pair becomes a span with the very name and kind a range would have had
(``ls:<path>:<Type>``, a CPU op), so attribution, saved profiles and exported traces cannot tell the
two apart.

One marks session serves a whole block: the scopes' marks and the memory watch's points
(:meth:`ModuleMarks.watch_point`) go into the same buffers; ``instruments.py`` is the one place that
starts it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from layerscope.capture.clock_anchors import ANCHOR_NAME, Alignment, Anchor, Stamped, alignment
from layerscope.events.table import EventKind, EventTable


class ModuleMarks:
    """Codes for range names, the session's start and stop, and the spans the marks make."""

    def __init__(self, native_module: Any) -> None:
        self._native = native_module
        self.mark = native_module.mark  # the hot call: mark(code) opens, mark(-code) closes
        self._codes: dict[str, int] = {}
        self._names: list[str] = []
        # The module calls the marks make, as columns (one entry per call).
        self.span_name: list[str] = []
        self.span_tid: list[int] = []  # torch's thread id (what its events carry)
        self.span_os_tid: list[int] = []  # the thread id in Chrome traces
        self.span_start: list[int] = []  # Unix ns, on torch's event clock
        self.span_dur: list[int] = []
        self.unmatched = 0  # marks without their other half (a call still running at the end)
        self.running = False
        #: Watch points (code 0, see :meth:`watch_point`) per OS thread: (torch thread id, Unix ns).
        self.watch_points: dict[int, list[tuple[int, int]]] = {}
        #: Clock anchors taken as sessions start and stop (``clock_anchors.py``), and the OS thread
        #: of each torch thread that took one (Chrome traces name threads by OS id).
        self.anchors: list[Anchor] = []
        self._anchor_os_tid: dict[int, int] = {}
        self._anchor_codes = (
            getattr(native_module, "ANCHOR_BEFORE", None),
            getattr(native_module, "ANCHOR_AFTER", None),
        )

    def watch_point(self) -> None:
        """A point on torch's clock with no scope (code 0), for records made in Python (memory watch
        snapshots) to be placed among torch's events; returned by :meth:`stop` in call order."""
        self.mark(0)

    def code(self, name: str) -> int:
        """The positive code of a range name (its negation closes the scope)."""
        found = self._codes.get(name)
        if found is None:
            self._names.append(name)
            found = self._codes[name] = len(self._names)
        return found

    def start(self) -> None:
        """Start recording (inside the profiler session)."""
        self._native.marks_start()
        self._native.clock_anchor()
        self._native.clock_anchor()  # the first of a thread brackets loosely (clock_anchors.py)
        self.running = True

    def take_watch_points(self) -> dict[int, list[tuple[int, int]]]:
        """The watch points so far, handed over (a running session is stopped and started again
        to read them: a schedule's cycle ends inside the block)."""
        if self.running:
            self.stop()
            self.start()
        points, self.watch_points = self.watch_points, {}
        return points

    def stop(self) -> None:
        """Stop recording and pair every thread's marks into spans (again: nothing more)."""
        if not self.running:
            return
        self.running = False
        self._native.clock_anchor()
        before_code, after_code = self._anchor_codes
        for tid, os_tid, raw_times, raw_codes in self._native.marks_stop():
            times = np.frombuffer(raw_times, dtype=np.int64).tolist()
            codes = np.frombuffer(raw_codes, dtype=np.int64).tolist()
            open_calls: list[tuple[int, int]] = []  # (code, start) of calls open on this thread
            points = self.watch_points.setdefault(os_tid, [])
            anchored = 0
            for at, code in zip(times, codes, strict=True):
                if code == before_code:
                    anchored = at
                    continue
                if code == after_code:
                    self.anchors.append(Anchor(tid, anchored, at))
                    self._anchor_os_tid[tid] = os_tid
                    continue
                if code == 0:
                    points.append((tid, at))
                    continue
                if code > 0:
                    open_calls.append((code, at))
                    continue
                if not (open_calls and open_calls[-1][0] == -code):  # not the innermost open call
                    if not any(opened == -code for opened, _ in open_calls):
                        self.unmatched += 1
                        continue
                    while open_calls[-1][0] != -code:  # a child's lost end: drop the child
                        open_calls.pop()
                        self.unmatched += 1
                opened, start = open_calls.pop()
                self.span_name.append(self._names[opened - 1])
                self.span_tid.append(tid)
                self.span_os_tid.append(os_tid)
                self.span_start.append(start)
                self.span_dur.append(at - start)
            # A call still running when the block ended has no end: like a profiler range, no span.
            self.unmatched += len(open_calls)

    def add_to(self, table: EventTable) -> None:
        """Append the spans to ``table`` as the CPU-op ranges they stand for, on the threads torch
        recorded (without ``all_threads`` torch records only some threads; a range on another thread
        would not have been recorded either)."""
        stamps = table.clock_stamps  # the native live reader leaves the anchors out of the spans
        if stamps is None:  # the bindings reader keeps them as spans
            threads_of, starts, durations = (table.array(c) for c in ("span_tid", "span_ts", "span_dur"))
            rows = table.drop_clock_anchors()  # the columns read above still hold them
            ends = (starts + durations)[rows].tolist()
            stamps = list(zip(threads_of[rows].tolist(), starts[rows].tolist(), ends, strict=True))
        stamped = [Stamped(*stamp) for stamp in stamps]
        span_tid = table.array("span_tid")
        threads = set(self.span_tid)
        recorded = {tid for tid in threads if bool((span_tid == tid).any())}
        kept: list[int] | None = None  # the common case: every span kept, in order
        names, tids = self.span_name, self.span_tid
        if recorded != threads:
            kept = [i for i, tid in enumerate(self.span_tid) if tid in recorded]
            names, tids = [self.span_name[i] for i in kept], [self.span_tid[i] for i in kept]
        start, dur = self._aligned(alignment(self.anchors, stamped), kept)
        table.append_spans(names, EventKind.CPU_OP, list(tids), start, dur)

    def _aligned(self, shift: Alignment | None, rows: list[int] | None) -> tuple[list[int], list[int]]:
        """The starts and durations of the spans at ``rows`` (None: every span), shifted onto torch's
        clock (when the anchors say the converters disagree)."""
        start = np.array(self.span_start if rows is None else [self.span_start[i] for i in rows], np.int64)
        dur = np.array(self.span_dur if rows is None else [self.span_dur[i] for i in rows], np.int64)
        if shift is not None:
            begin, end = shift.apply(start), shift.apply(start + dur)
            start, dur = begin, end - begin
        return start.tolist(), dur.tolist()

    def stamped_in_trace(
        self, events: list[dict[str, Any]], base_ns: int
    ) -> tuple[list[dict[str, Any]], list[Stamped]]:
        """A Chrome trace's events without the anchors' ranges, and those ranges as torch stamped them
        (threads mapped back to torch's ids through the anchors we took)."""
        by_os = {os_tid: tid for tid, os_tid in self._anchor_os_tid.items()}
        kept, stamped = [], []
        for event in events:
            if event.get("name") != ANCHOR_NAME:
                kept.append(event)
                continue
            tid = by_os.get(event.get("tid"))  # type: ignore[arg-type]
            if tid is not None:
                start = base_ns + round(float(event["ts"]) * 1000)
                stamped.append(Stamped(tid, start, start + round(float(event.get("dur", 0)) * 1000)))
        return kept, stamped

    def trace_events(
        self, base_ns: int, os_tids: set[int], stamped: list[Stamped] | None = None
    ) -> list[dict[str, Any]]:
        """The spans on the OS threads in ``os_tids`` (those torch's trace has events of) as Chrome
        trace events, as torch writes its ranges (``ts`` in µs after the trace's
        ``baseTimeNanoseconds``, on the process and OS thread that ran them)."""
        pid = os.getpid()
        rows = [i for i, os_tid in enumerate(self.span_os_tid) if os_tid in os_tids]
        starts, durations = self._aligned(alignment(self.anchors, stamped or []), rows)
        return [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": self.span_name[i],
                "pid": pid,
                "tid": self.span_os_tid[i],
                "ts": round((start - base_ns) / 1000, 3),
                "dur": round(dur / 1000, 3),
                "args": {},
            }
            for i, start, dur in zip(rows, starts, durations, strict=True)
        ]
