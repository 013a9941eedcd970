"""EventTable: the columnar, torch-free form of profiler events that attribution reads.

Both sources fill it: the live path from Kineto's results (``capture/kineto.py``) and the file path
from Chrome trace JSON (``events/chrome.py``). Columns are plain Python lists because the attribution
sweep is a Python loop and list indexing is the fastest thing it can do; names are interned into
``names`` so every per-event comparison is an int comparison.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from layerscope.events.call_lines import CallLines


class EventKind(IntEnum):
    """What a span event is. CPU-side kinds come first; ``is_device`` marks device activity."""

    CPU_OP = 0
    USER_ANNOTATION = 1  # record_function ranges: ours (module scopes), ProfilerStep#N, user ranges
    RUNTIME = 2  # cuda_runtime / cuda_driver / privateuse1 runtime: CPU time spent launching
    PYTHON = 3  # with_stack python frames; not nested into CPU time
    KERNEL = 4
    MEMCPY = 5
    MEMSET = 6
    DEVICE_OTHER = 7  # gpu_user_annotation and other device-timeline markers; not device work

    @property
    def is_device(self) -> bool:
        """Device work that counts as device time (kernels, memcpy, memset)."""
        return EventKind.KERNEL <= self <= EventKind.MEMSET


#: Kinds whose spans nest into CPU time (exclusive time, module scopes, op rows).
CPU_KINDS = frozenset({EventKind.CPU_OP, EventKind.USER_ANNOTATION, EventKind.RUNTIME})
DEVICE_WORK_KINDS = frozenset({EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET})


#: The profiler range of layerscope's clock anchors (``capture/clock_anchors.py``): never the user's
#: op; dropped from live tables once the marks are aligned, and from traces as they are read.
CLOCK_ANCHOR_NAME = "layerscope::clock"

#: The per-span and per-allocation columns of an :class:`EventTable`.
SPAN_COLUMNS = (
    "span_name",
    "span_kind",
    "span_tid",
    "span_ts",
    "span_dur",
    "span_seq",
    "span_fwd_tid",
    "span_corr",
    "span_ext",
    "span_shapes",
    "span_flops",
)
MEMORY_COLUMNS = ("mem_tid", "mem_ts", "mem_bytes", "mem_on_device", "mem_addr")
_COLUMNS = frozenset(SPAN_COLUMNS + MEMORY_COLUMNS)


@dataclass(frozen=True)
class OutOfMemory:
    """An allocation the allocator refused: who asked (thread, time), for how much, on which device
    class, and how much it had allocated then (0 where the source does not say)."""

    tid: int
    ts: int
    requested_bytes: int
    on_device: bool
    allocated_bytes: int = 0


@dataclass
class EventTable:
    """Profiler events in columns. Times are integer nanoseconds on one clock.

    Span columns (``span_*``) have one entry per complete event. ``span_fwd_tid`` is 0 for forward
    ops and, for autograd backward nodes, the thread (in this table's tid space) that ran the
    forward op with the same ``span_seq``. Device work links to the CPU side two ways:
    ``span_corr`` pairs it with the runtime call that launched it (a runtime span holds its own
    correlation id), ``span_ext`` with the op (a CPU op holds its own external id). Either may be 0
    when the source lacks it; the runtime link wins when both exist.
    ``span_shapes`` is an index into ``names`` (the input-shapes string) or -1.
    """

    names: list[str] = field(default_factory=list)
    span_name: list[int] = field(default_factory=list)
    span_kind: list[int] = field(default_factory=list)
    span_tid: list[int] = field(default_factory=list)
    span_ts: list[int] = field(default_factory=list)
    span_dur: list[int] = field(default_factory=list)
    span_seq: list[int] = field(default_factory=list)
    span_fwd_tid: list[int] = field(default_factory=list)
    span_corr: list[int] = field(default_factory=list)
    span_ext: list[int] = field(default_factory=list)
    span_shapes: list[int] = field(default_factory=list)
    span_flops: list[int] = field(default_factory=list)
    mem_tid: list[int] = field(default_factory=list)
    mem_ts: list[int] = field(default_factory=list)
    mem_bytes: list[int] = field(default_factory=list)
    mem_on_device: list[bool] = field(default_factory=list)
    #: The allocation's address (an allocation and its free share it); 0 where the source lacks it.
    mem_addr: list[int] = field(default_factory=list)
    #: ``cuda_sync`` spans that wait on a recorded CUDA event (``Event Sync``, ``Stream Wait Event``):
    #: span -> (stream waited on, correlation id of the ``cudaEventRecord`` call; -1 unknown).
    sync_waits: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: Allocations refused (torch's ``[OutOfMemory]`` events), in the order recorded.
    out_of_memory: list[OutOfMemory] = field(default_factory=list)
    #: Trace-level facts: device properties, distributed info, window start/end (ns), source.
    meta: dict[str, Any] = field(default_factory=dict)
    #: For trace files: this table's thread id -> the trace's (pid, tid); on GPU events the pid is
    #: the device and the tid the stream.
    threads: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    #: Live captures read natively: each span's RecordFunction handle as read (0 for non-ops); spans
    #: appended later (marks) have none. What call lines are matched against.
    op_handles: np.ndarray | None = None
    #: The dtype (a name id; -1 none) of each FLOP-counted span's first typed input (int32 from trace
    #: files, int64 from live captures: ids only, never arithmetic).
    span_dtype: np.ndarray | None = None
    #: Op spans' input dtypes (a name id of :func:`~layerscope.events.shapes.dtypes_key`'s form;
    #: -1 none), where shapes were recorded: what bytes per op are computed from (roofline). Its
    #: integer type as ``span_dtype``'s.
    span_dtypes: np.ndarray | None = None
    #: Call lines recorded with ``lines=True`` (``events/call_lines.py``), else None.
    call_lines: CallLines | None = None
    #: The clock anchors' ranges (:data:`CLOCK_ANCHOR_NAME`) as (thread, start, end) where the reader
    #: left them out of the spans (the native live reader), else None: they are spans then, for
    #: :meth:`drop_clock_anchors` to remove.
    clock_stamps: list[tuple[int, int, int]] | None = None
    _name_ids: dict[str, int] = field(default_factory=dict, repr=False)
    _arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    _derived: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes the instance lacks: a column that set_columns left as an
        # array becomes its list here, once, the first time it is read as a list.
        found = self.__dict__.get("_arrays", {}).get(name) if name in _COLUMNS else None
        if found is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        values = self.__dict__[name] = found.tolist()
        return values

    def array(self, column: str) -> np.ndarray:
        """A column as a numpy array (int64, or bool for ``mem_on_device``), converted once.

        Call only once the table is complete: later appends are not seen by a cached array.
        """
        found = self._arrays.get(column)
        if found is None:
            dtype = bool if column == "mem_on_device" else np.int64
            found = self._arrays[column] = np.asarray(getattr(self, column), dtype=dtype)
        return found

    def derived(self, what: str, make: Callable[[EventTable], Any]) -> Any:
        """``make(self)``, made once per table size: what several readers of a complete table derive
        from it (the step windows: attribution, the verdicts and the device report)."""
        key = (what, self.span_count, len(self.names))
        made = self.__dict__.setdefault("_derived", {})  # a table unpickled from before it had none
        if key not in made:
            made[key] = make(self)
        return made[key]

    def name_id(self, name: str) -> int | None:
        """The id of ``name`` in the string table, or None when no event uses it."""
        return self._name_ids.get(name)

    def intern(self, name: str) -> int:
        """The id of ``name`` in the string table, adding it if new."""
        ids = self._name_ids
        found = ids.get(name)
        if found is None:
            found = ids[name] = len(self.names)
            self.names.append(name)
        return found

    def add_span(
        self,
        name: str,
        kind: EventKind,
        tid: int,
        ts: int,
        dur: int,
        seq: int = -1,
        fwd_tid: int = 0,
        corr: int = 0,
        ext: int = 0,
        shapes: str | None = None,
        flops: int = 0,
    ) -> int:
        """Append one span (used by readers and hand-built test traces); returns its index."""
        self.span_name.append(self.intern(name))
        self.span_kind.append(int(kind))
        self.span_tid.append(tid)
        self.span_ts.append(ts)
        self.span_dur.append(dur)
        self.span_seq.append(seq)
        self.span_fwd_tid.append(fwd_tid)
        self.span_corr.append(corr)
        self.span_ext.append(ext)
        self.span_shapes.append(-1 if shapes is None else self.intern(shapes))
        self.span_flops.append(flops)
        return len(self.span_ts) - 1

    def append_spans(
        self, names: list[str], kind: EventKind, tids: list[int], starts: list[int], durations: list[int]
    ) -> None:
        """Append spans of one kind with no sequence number, links, shapes or FLOPs (module marks);
        span arrays converted before grow with them, and a column held only as an array stays one."""
        count = len(names)
        ids = {name: self.intern(name) for name in dict.fromkeys(names)}  # first-seen order, as one by one
        added: dict[str, list[int]] = {
            "span_name": [ids[n] for n in names],
            "span_kind": [int(kind)] * count,
            "span_tid": tids,
            "span_ts": starts,
            "span_dur": durations,
            "span_seq": [-1] * count,
            "span_fwd_tid": [0] * count,
            "span_corr": [0] * count,
            "span_ext": [0] * count,
            "span_shapes": [-1] * count,
            "span_flops": [0] * count,
        }
        for column, values in added.items():
            listed = self.__dict__.get(column)
            if listed is not None:
                listed.extend(values)
            found = self._arrays.get(column)
            if found is not None:
                self._arrays[column] = np.concatenate([found, np.asarray(values, dtype=np.int64)])

    def add_memory(self, tid: int, ts: int, nbytes: int, on_device: bool = False, addr: int = 0) -> None:
        """Append one allocation (positive bytes) or free (negative bytes) event."""
        self.mem_tid.append(tid)
        self.mem_ts.append(ts)
        self.mem_bytes.append(nbytes)
        self.mem_on_device.append(on_device)
        self.mem_addr.append(addr)

    def length(self, column: str) -> int:
        """The number of rows of ``column``, without making a list of a column held as an array."""
        found = self.__dict__.get(column)
        return len(found) if found is not None else len(self._arrays[column])

    @property
    def span_count(self) -> int:
        """Number of span events."""
        return self.length("span_ts")

    @property
    def memory_count(self) -> int:
        """Number of memory (allocation and free) events."""
        return self.length("mem_ts")

    @property
    def event_count(self) -> int:
        """Spans plus memory events (the unit of the post-processing benchmark)."""
        return self.span_count + self.memory_count

    def set_columns(self, arrays: dict[str, np.ndarray]) -> None:
        """Set whole columns from arrays (a reader that made them in numpy). The arrays are kept for
        :meth:`array`; a column becomes a list only when first read as one (``__getattr__``)."""
        for column in arrays:
            if column not in _COLUMNS:
                raise ValueError(f"not a column: {column}")
            self.__dict__.pop(column, None)
        self._arrays.update(arrays)

    def drop_spans(self, rows: np.ndarray) -> None:
        """Remove the spans at ``rows`` (indices) from every per-span column and index (the clock
        anchors' ranges, once the marks are aligned with them). A live build drops a few rows of
        many: the kept runs between them are copied whole (a boolean mask costs ~10x more per span)."""
        if rows.size == 0:
            return
        dropped = np.unique(rows)
        bounds = [-1, *dropped.tolist(), self.span_count]
        runs = [slice(a + 1, b) for a, b in itertools.pairwise(bounds) if b > a + 1]

        def kept(values: np.ndarray) -> np.ndarray:
            return np.concatenate([values[run] for run in runs]) if runs else values[:0].copy()

        self.set_columns({column: kept(self.array(column)) for column in SPAN_COLUMNS})
        for per_span in ("op_handles", "span_dtype", "span_dtypes"):
            found = getattr(self, per_span)
            if found is not None:
                setattr(self, per_span, kept(found))
        if self.sync_waits:
            gone = set(dropped.tolist())
            moved = {i: i - int(np.searchsorted(dropped, i)) for i in self.sync_waits if i not in gone}
            self.sync_waits = {moved[i]: wait for i, wait in self.sync_waits.items() if i in moved}
        self._derived.clear()

    def drop_clock_anchors(self) -> np.ndarray:
        """Remove the clock anchors' ranges (:data:`CLOCK_ANCHOR_NAME`); their rows as they were."""
        found = self.name_id(CLOCK_ANCHOR_NAME)
        if found is None:
            return np.zeros(0, dtype=np.int64)
        rows = np.flatnonzero(self.array("span_name") == found)
        self.drop_spans(rows)
        return rows

    def check(self) -> None:
        """Raise ValueError if the columns have different lengths (a reader bug)."""
        for columns in (SPAN_COLUMNS, MEMORY_COLUMNS):
            n = self.length(columns[0])
            for name in columns:
                if self.length(name) != n:
                    raise ValueError(f"column {name} has {self.length(name)} rows, expected {n}")
