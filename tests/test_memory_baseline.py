"""The absolute baseline counts every tensor alive when recording begins, not only the model's state
and the root's inputs (issue 35, item 3): a plain tensor attribute, a loss target, a cache. Each
storage counts once however many tensors view it; the scan holds no tensor and changes nothing in
the program. Byte counts are computed from the shapes by hand."""

from __future__ import annotations

import gc
import warnings
import weakref
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.capture import native
from layerscope.capture.live_tensors import scan_live
from layerscope.model.memory_view import BEFORE_BLOCK
from layerscope.model.meta import CaptureInfo, ProfileMeta, SavedOptions
from tests.test_memory_peak import _torch_categories_at

F32 = 4
MIB = 2**20
TABLE = 32 * MIB  # a plain tensor attribute (no parameter, no buffer)
TARGET = 8 * MIB  # a loss target made before the block
BATCH, WIDTH = 16, 64


class _WithTable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.table = torch.randn(TABLE // F32)
        # views of the table: they share its storage, which counts once
        self.head = self.table[:WIDTH]
        self.grid = self.table.view(1024, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.head.sum() + self.table.sum()


def _baseline_of_a_tiny_block() -> int:
    """What was live at the start of a block that touches nothing: every tensor of the process."""
    with ls.profile(None, memory=True) as prof:
        torch.ones(4).sum()
    prof.profile.validate()
    return prof.profile.memory_at_peak("cpu").baseline_bytes


def _params(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.fixture(scope="module")
def table_run() -> dict[str, Any]:
    """The model with a 32 MiB attribute, an 8 MiB target made before the block (both used in it),
    recorded with stacks so torch's MemoryProfile can replay the same events."""
    gc.collect()  # garbage of earlier tests is live memory until collected: keep it out
    untouched = _baseline_of_a_tiny_block()
    torch.manual_seed(0)
    model = _WithTable()
    x = torch.randn(BATCH, WIDTH)
    target = torch.randn(TARGET // F32)
    alias = torch.empty(0).set_(target.untyped_storage())  # another tensor on the target's storage
    with ls.profile(model, memory=True, with_stack=True) as prof:
        loss = model(x).sum() + target.sum()
        loss.backward()
    profile = prof.profile
    profile.validate()
    return {"model": model, "x": x, "alias": alias, "prof": prof, "profile": profile, "untouched": untouched}


def test_tensors_alive_at_entry_are_in_the_absolute_peak(table_run: dict[str, Any]) -> None:
    model, at_peak = table_run["model"], table_run["profile"].memory_at_peak("cpu")
    x_bytes = BATCH * WIDTH * F32
    live_at_entry = _params(model) + TABLE + TARGET + x_bytes
    assert at_peak.absolute_peak_bytes >= live_at_entry
    # Exactly what a block touching nothing saw before, plus what this test made: the views and
    # the alias add nothing, the input (also scanned) counts once.
    assert at_peak.baseline_bytes == table_run["untouched"] + live_at_entry
    before = {r.category: r.bytes for r in at_peak.rows if r.module == BEFORE_BLOCK}
    assert before["other"] == table_run["untouched"] + TABLE + TARGET
    assert before["parameter"] == _params(model) and before["input"] == x_bytes
    assert at_peak.baseline_seen_bytes == at_peak.baseline_bytes
    assert at_peak.baseline_allocator_bytes is None  # the CPU allocator gives no figure


def test_the_baseline_agrees_with_torchs_memory_profile(table_run: dict[str, Any]) -> None:
    """torch's MemoryProfile sees the tensors the block's ops use (the attribute and the target,
    which it calls inputs) but not those it never touches: the same total less those, the same
    parameters and gradients."""
    profile, prof = table_run["profile"], table_run["prof"]
    peak_ns = profile.meta.memory.classes[0].peak_ts_ns
    theirs = _torch_categories_at(prof.torch_profiler._memory_profile(), peak_ns)
    at_peak = profile.memory_at_peak("cpu")
    ours = at_peak.by_category()
    assert sum(theirs.values()) == at_peak.absolute_peak_bytes - table_run["untouched"]
    assert ours["parameter"] == theirs["parameter"] and ours["gradient"] == theirs["gradient"]
    assert theirs["input"] == ours["input"] + TABLE + TARGET


def test_the_scan_counts_each_storage_once() -> None:
    """Views, tensors set on one storage, and numpy-backed tensors inside one array: each byte once."""
    gc.collect()
    before = sum(e.nbytes for e in scan_live().entries)
    base = torch.zeros(1024, 256)  # 1 MiB
    views = [base[1:], base.t(), base.view(-1), base[::2, ::3]]
    shared = torch.empty(0).set_(base.untyped_storage())
    array = np.zeros(2**18, dtype=np.float32)  # 1 MiB outside torch's allocator
    whole, inner, tail = (
        torch.from_numpy(array),
        torch.from_numpy(array[1000:2000]),
        torch.from_numpy(array[-10:]),
    )
    halves = np.zeros(2**18, dtype=np.float32)  # 1 MiB seen only as two overlapping tensors
    left, right = torch.from_numpy(halves[: 2**17 + 100]), torch.from_numpy(halves[2**17 - 100 :])
    scan = scan_live()
    assert sum(e.nbytes for e in scan.entries) - before == 3 * MIB
    assert len({(e.on_device, e.addr) for e in scan.entries}) == len(scan.entries)
    del views, shared, whole, inner, tail, left, right


def test_the_native_filter_finds_what_the_python_one_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan's filter in C++ and its Python fallback find the same storages and optimizers
    (exact types only: a Parameter, a tensor subclass and an optimizer subclass are found)."""

    from torch._subclasses.fake_tensor import FakeTensorMode

    class Marked(torch.Tensor):
        pass

    class Wrapper(torch.Tensor):  # a wrapper subclass: its storage refuses access
        @staticmethod
        def __new__(cls, inner: torch.Tensor) -> Wrapper:
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)  # type: ignore[attr-defined,no-any-return]

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            raise NotImplementedError(func)

    model = nn.Linear(8, 8)
    marked = torch.randn(64).as_subclass(Marked)
    optimizer = torch.optim.AdamW(model.parameters())
    with FakeTensorMode():
        fake = torch.empty(1000)
    odd = [Wrapper(torch.randn(4)), torch.randn(3, 3).to_sparse(), torch.empty(0), fake]
    if native.load() is None:
        pytest.skip("the native module is not built")
    gc.collect()
    with_native = scan_live(model, optimizers=True)
    monkeypatch.setenv("LAYERSCOPE_NATIVE", "0")
    native.forget()
    try:
        assert native.load() is None
        in_python = scan_live(model, optimizers=True)
    finally:
        monkeypatch.delenv("LAYERSCOPE_NATIVE")
        native.forget()
    assert with_native.entries == in_python.entries and with_native.tensors == in_python.tensors
    assert with_native.optimizers == in_python.optimizers == [optimizer]
    addresses = {e.addr for e in with_native.entries}
    assert marked.untyped_storage().data_ptr() in addresses
    assert model.weight.untyped_storage().data_ptr() in addresses
    del odd


def test_the_scan_holds_nothing_and_changes_nothing() -> None:
    """No reference to any tensor survives the block, the collector's state and thresholds are
    as they were, and nothing warns: objects that warn on ``__class__`` (torch.distributed.reduce_op),
    FakeTensors that warn when asked for their address."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = nn.Linear(4, 4)
    with FakeTensorMode():  # torch.compile leaves such tensors alive: their address must not be asked
        fake = torch.empty(1000)
    kept = torch.randn(1000)
    ref = weakref.ref(kept)
    thresholds = gc.get_threshold()
    was_enabled = gc.isenabled()
    try:
        for enabled in (False, True):
            (gc.enable if enabled else gc.disable)()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with ls.profile(model, memory=True) as prof:
                    model(torch.randn(2, 4)).sum().backward()
            assert [str(w.message) for w in caught] == []
            assert gc.isenabled() == enabled and gc.get_threshold() == thresholds
            prof.profile.validate()
            assert prof.profile.meta.capture is not None and not prof.profile.meta.capture.memory_watch_errors
        gc.disable()  # freed by reference counting alone
        del kept
        assert ref() is None
        del fake
    finally:
        (gc.enable if was_enabled else gc.disable)()


def test_a_scheduled_cycle_counts_what_was_made_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor made during the wait step, before the recorded one, is in its baseline: scanned at
    the end of the warmup step (outside the recording), not only before the block."""
    from layerscope.capture import memory_watch

    model = nn.Linear(WIDTH, WIDTH)
    x = torch.randn(BATCH, WIDTH)
    made: list[torch.Tensor] = []
    found: list[ls.Profile] = []
    scanned_at: list[int] = []  # the session's step count at each scan (-1: before it started)
    session: dict[str, ls.profile] = {}
    real_scan = memory_watch.scan_live

    def counted(*args: Any, **kwargs: Any) -> Any:
        scanned_at.append(session["prof"].step_count if session else -1)
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(memory_watch, "scan_live", counted)
    gc.collect()
    schedule = ls.schedule(wait=1, warmup=1, active=1, repeat=1)
    with ls.profile(
        model, memory=True, schedule=schedule, on_trace_ready=lambda c: found.append(c.profile)
    ) as prof:
        session["prof"] = prof
        for step in range(3):
            if step == 0:
                made.append(torch.randn(TARGET // F32))
            model(x).sum().backward()
            prof.step()
    (profile,) = found
    profile.validate()
    before = profile.memory_at_peak("cpu").rows
    assert sum(r.bytes for r in before if r.module == BEFORE_BLOCK and r.category == "other") >= TARGET
    assert scanned_at == [-1, 1]  # before the profiler started, and when the warmup step ended


def test_a_baseline_storage_is_freed_when_an_allocation_lands_inside_it() -> None:
    """On the CPU a storage from before the block is freed with no event: an allocation anywhere
    in its bytes (not only at its address) says it is gone, so it is not counted twice."""
    from layerscope.attribution import ModuleInfo, build_profile, module_range_name
    from layerscope.events import EventKind, EventTable
    from layerscope.events.memory_snapshots import Snapshot, StorageEntry

    us = 1000
    table = EventTable()
    table.add_span(module_range_name("", "Net"), EventKind.CPU_OP, 1, 0, 100 * us)
    table.add_memory(1, 10 * us, 200, addr=5000)  # a new storage: 100 + 200 live
    table.add_memory(1, 20 * us, 50, addr=1040)  # inside the baseline storage [1000, 1100): it was freed
    table.add_memory(1, 30 * us, 30, addr=2000)  # at the other one's address: freed too
    start = Snapshot(
        "start", [StorageEntry(1000, 100, "other", False), StorageEntry(2000, 40, "other", False)], ts=1
    )
    catalog = [ModuleInfo(path="", type_name="Net", parent=None, params=0, params_total=0)]
    profile = build_profile(
        table, catalog, ProfileMeta(capture=CaptureInfo(options=SavedOptions(memory=True))), snapshots=[start]
    )
    profile.validate()
    at_peak = profile.memory_at_peak("cpu")
    assert at_peak.baseline_bytes == 140
    assert at_peak.absolute_peak_bytes == 340  # after the first allocation; later ones replace freed bytes
    assert [(r.category, r.module, r.bytes) for r in at_peak.rows if r.module == BEFORE_BLOCK] == [
        ("other", BEFORE_BLOCK, 140)
    ]


def test_the_walk_of_the_collectors_lists_finds_what_get_objects_finds() -> None:
    """The native walk of the collector's lists (no list of every object made) finds exactly the
    objects of the wanted types that ``gc.get_objects()`` lists: in every generation, none of the
    frozen ones, a tensor made a moment ago included."""
    module = native.load()
    if module is None:
        pytest.skip("the native module is not built")
    wanted = {torch.Tensor, nn.Parameter, torch.optim.AdamW}
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        frozen = torch.randn(3)
        gc.freeze()  # in no generation: neither lists it
        oldest = [torch.randn(4)]
        gc.collect()  # now in the oldest generation
        middle = [torch.randn(5)]
        gc.collect(0)  # now in the middle one
        young = [torch.randn(6), nn.Parameter(torch.randn(2))]
        walked = module.tracked_of_types(wanted)
        if walked is None:
            pytest.skip("this Python's collector cannot be walked natively")
        listed = [obj for obj in gc.get_objects() if type(obj) in wanted]
        assert sorted(map(id, walked)) == sorted(map(id, listed))
        assert len({id(obj) for obj in walked}) == len(walked)
        ids = {id(obj) for obj in walked}
        assert all(id(t) in ids for t in (*oldest, *middle, *young)) and id(frozen) not in ids
        assert module.tracked_of_types({list}) is not None  # its own result is not in it
    finally:
        gc.unfreeze()
        (gc.enable if was_enabled else gc.disable)()


def test_the_interpreters_walk_finds_what_get_objects_finds() -> None:
    """Where the collector's layout is not the one mirrored (3.13+, free-threaded builds, a failed
    check), the walk is the interpreter's (``PyUnstable_GC_VisitObjects``, 3.12+): it finds what
    ``gc.get_objects()`` lists too, frozen objects excluded."""
    module = native.load()
    if module is None:
        pytest.skip("the native module is not built")
    wanted = {torch.Tensor, nn.Parameter}
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        frozen = torch.randn(3)
        gc.freeze()
        young = [torch.randn(6), nn.Parameter(torch.randn(2))]
        walked = module.tracked_of_types(wanted, visit=True)
        if walked is None:
            pytest.skip("PyUnstable_GC_VisitObjects needs Python 3.12")
        assert module.walk_stats()[2] == "visit"
        listed = [obj for obj in gc.get_objects() if type(obj) in wanted]
        assert sorted(map(id, walked)) == sorted(map(id, listed))
        ids = {id(obj) for obj in walked}
        assert all(id(t) in ids for t in young) and id(frozen) not in ids
    finally:
        gc.unfreeze()
        (gc.enable if was_enabled else gc.disable)()


def test_native_storage_entries_are_the_python_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """``storage_entries`` in C++ and in Python: the same entries, in order, for plain tensors,
    views, parameters, a subclass, and the ones that hold no memory (skipped)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from layerscope.capture.live_tensors import storage_entries

    class Marked(torch.Tensor):
        pass

    with FakeTensorMode():
        fake = torch.empty(10)
    base = torch.randn(16, 16)
    tensors = [
        base,
        base[2:],
        None,
        nn.Parameter(torch.randn(3)),
        torch.randn(5).as_subclass(Marked),
        torch.randn(3, 3).to_sparse(),
        torch.empty(0),
        fake,
        "not a tensor",
    ]
    if native.load() is None:
        pytest.skip("the native module is not built")
    with_native = storage_entries(tensors, "parameter", 7)
    monkeypatch.setenv("LAYERSCOPE_NATIVE", "0")
    native.forget()
    try:
        assert native.load() is None
        in_python = storage_entries(tensors, "parameter", 7)
    finally:
        monkeypatch.delenv("LAYERSCOPE_NATIVE")
        native.forget()
    assert with_native == in_python and len(in_python) == 4
    assert in_python[0].addr == in_python[1].addr == base.untyped_storage().data_ptr()
