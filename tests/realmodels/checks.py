"""The zoo's checks, each a function of one :class:`ZooRun` that returns a :class:`Check`: passed or
not (None: does not apply to this case), the figure behind it, and the detail a failure shows.

The tests (``test_zoo.py``) assert them; ``benchmarks/zoo.py`` prints them as a table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.profiler._memory_profiler import Action, MemoryProfile
from torch.utils.flop_counter import mm_flop

from layerscope.events.table import CLOCK_ANCHOR_NAME
from tests.realmodels.models import LAYERS, Case
from tests.realmodels.runs import StepResult, ZooRun

FLOP_TOLERANCE = 0.01
PLACED_SHARE = 0.8
SELF_CPU_TOLERANCE = 0.02  # as tests/test_torch_agreement.py: the same events, summed per op name
# Step ranges are no op rows of ours; torch lists our module ranges (where they are ranges), the
# [memory] markers and our clock anchors (capture/clock_anchors.py) as rows too.
SKIPPED = ("ls:", "ProfilerStep", "[memory]", CLOCK_ANCHOR_NAME)

#: Ops whose FLOPs layerscope counts and FlopCounterMode does not (it has no formula for them and
#: reads 0), left out of the FLOPs comparison with the reason. Compared is layerscope's total less
#: these ops' inclusive FLOPs, against FlopCounterMode's total.
FLOP_COUNTER_MISSES: dict[str, str] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": (
        "CPU flash attention: FlopCounterMode has no formula for it; layerscope uses torch's SDPA "
        "formula (docs/usage.md)"
    ),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "its backward, likewise",
    "aten::_grouped_mm": (
        "MoE experts (Mixtral): FlopCounterMode has no formula for _grouped_mm and reads 0; on CPU the "
        "kernel runs one aten::mm per expert group, which the profiler records and layerscope counts"
    ),
}


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``ok`` None where it does not apply; ``figure`` for the table."""

    ok: bool | None
    figure: str = ""
    detail: str = ""


NOT_APPLICABLE = Check(None, "—")


def _failed_runs(run: ZooRun, *needed: str) -> Check | None:
    missing = [what for what in needed if what in run.errors]
    if missing:
        return Check(False, f"{missing[0]} raised", run.errors[missing[0]])
    return None


def check_runs(run: ZooRun) -> Check:
    """No crash, and both profiles pass ``Profile.validate()``."""
    if run.errors:
        what = next(iter(run.errors))
        return Check(False, f"{what} raised", run.errors[what])
    for profile in (run.profile, run.memory_profile):
        assert profile is not None
        try:
            profile.validate()
        except Exception as error:
            return Check(False, "validate() failed", repr(error))
    return Check(True, "")


def _differences(a: StepResult, b: StepResult) -> list[str]:
    return [name for name, value in a.values.items() if b.values.get(name) != value]


def check_identical(run: ZooRun) -> Check:
    """Loss, logits, every gradient and the RNG states after the step bit-identical to the
    unprofiled run's (equal bytes: stricter than torch.equal, which calls -0.0 and 0.0 equal)."""
    failed = _failed_runs(run, "unprofiled run", "profiled run")
    if failed:
        return failed
    assert run.reference is not None and run.profiled is not None
    found = _differences(run.reference, run.profiled)
    if found:
        return Check(False, f"{len(found)} differ", ", ".join(found[:8]))
    grads = sum(name.startswith("grad ") for name in run.reference.values)
    return Check(True, f"{grads} grads")


def check_code_paths(run: ZooRun) -> Check:
    """Checkpointing still recomputes: the counted module inside each layer runs twice per layer
    (forward and recomputation), profiled as unprofiled. Compiled: the unprofiled run after the
    profiled one compiles nothing (profiling left Dynamo's guards as they were)."""
    failed = _failed_runs(run, "unprofiled run", "profiled run")
    if failed:
        return failed
    ref, prof = run.reference, run.profiled
    assert ref is not None and prof is not None
    if run.case.checkpointed:
        counts = f"{prof.counted_calls} calls profiled, {ref.counted_calls} unprofiled"
        ok = ref.counted_calls == 2 * LAYERS and prof.counted_calls == ref.counted_calls
        return Check(ok, counts, f"{run.case.counted} forward calls: {counts} (2 per layer expected)")
    if run.case.compiled:
        ok = prof.compiled_frames > 0 and ref.compiled_frames == 0
        figure = f"{ref.compiled_frames} recompiles"
        return Check(ok, figure, f"graphs compiled: {prof.compiled_frames} profiled, then {figure}")
    return NOT_APPLICABLE


def misnested(events: Any) -> set[str]:
    """Names of events whose children in torch's own tree overlap one another: ranges that do not
    nest, and their names (Dynamo's ``PythonDispatchMode`` range, opened while compiling, ends
    inside the ``aot_collect_metadata_data: ...`` range opened after it). torch subtracts the
    overlap from the parent's self time twice; layerscope nests one range in the other. The three
    names' self times depend on that choice."""
    found: set[str] = set()
    for event in events:
        before = None
        for child in sorted(event.cpu_children, key=lambda c: c.time_range.start):
            if before is not None and child.time_range.start < before.time_range.end:
                found.update((event.name, before.name, child.name))
            before = child
    return found


def module_hosts(events: Any) -> set[str]:
    """Names of ranges that run module calls inside them: activation checkpointing's
    ``CheckpointFunction`` and the backward nodes a recomputation runs in (found by the forward ops,
    autograd-recorded, among their descendants). With marks, a module's time between its ops is the
    module's self time for layerscope and the enclosing range's for torch (torch never sees the
    marks): their self times differ by design, their calls do not."""
    found: set[str] = set()
    for event in events:
        name = event.name
        if name == "CheckpointFunction":  # reentrant: its forward runs without grad (no sequence numbers)
            found.add(name)
        if name.startswith(("aten::", "ls:")):
            continue
        pending = list(event.cpu_children)
        while pending:
            child = pending.pop()
            if child.sequence_nr >= 0 and not child.fwd_thread and child.name.startswith("aten::"):
                found.add(name)
                break
            pending.extend(child.cpu_children)
    return found


def check_self_cpu(run: ZooRun) -> Check:
    """Op self CPU time and calls per op name equal torch's ``key_averages()`` of the same capture
    (calls exactly, self time within 2%), as tests/test_torch_agreement.py compares them; the self
    time of :func:`misnested` ranges is left out of the per-name comparison."""
    failed = _failed_runs(run, "profiled run")
    if failed:
        return failed
    profile = run.profile
    assert profile is not None
    torch_profiler = run.session.torch_profiler
    averages = [e for e in torch_profiler.key_averages() if not e.key.startswith(SKIPPED)]
    events = torch_profiler.events()
    overlapping = misnested(events) | module_hosts(events)
    ours: dict[str, tuple[int, float]] = {}
    for row in profile.ops(group_by=("name",)):
        calls, self_us = ours.get(row.name, (0, 0.0))
        ours[row.name] = (calls + row.calls, self_us + row.metrics.self_cpu_us)
    wrong = []
    for e in averages:
        calls, self_us = ours.get(e.key, (0, 0.0))
        theirs = e.self_cpu_time_total
        if calls != e.count or not (e.key in overlapping or _close(self_us, theirs)):
            wrong.append(f"{e.key}: {calls} calls {self_us:.1f} us, torch {e.count} calls {theirs:.1f} us")
    extra = set(ours) - {e.key for e in averages} - {n for n in ours if n.startswith(SKIPPED)}
    wrong += [f"{name}: {ours[name][0]} calls, not in torch's table" for name in sorted(extra)]
    hosts = module_hosts(events)
    theirs_ops = sum(e.self_cpu_time_total for e in averages if e.key not in hosts)
    kept = [r for r in profile.op_rows if not r.name.startswith(SKIPPED) and r.name not in hosts]
    ours_ops = sum(r.metrics.self_cpu_us for r in kept)
    ratio = ours_ops / theirs_ops if theirs_ops else float("nan")
    figure = f"{ratio:.4f}"
    if wrong or abs(ratio - 1) > SELF_CPU_TOLERANCE:
        return Check(False, f"{figure}, {len(wrong)} ops differ", "; ".join(wrong[:6]))
    left_out = f", self time of {len(overlapping)} misnested ranges left out" if overlapping else ""
    return Check(True, figure, f"{len(averages)} names{left_out}")


def _close(ours: float, theirs: float) -> bool:
    return abs(ours - theirs) <= SELF_CPU_TOLERANCE * theirs + 0.01


def _flops_left_out(run: ZooRun) -> int:
    """FLOPs of the ops FlopCounterMode misses: layerscope's own for the ops it counts by name, and
    for ``_grouped_mm`` the ``aten::mm`` calls the profiler recorded inside it, counted with torch's
    mm formula from torch's own events."""
    assert run.profile is not None
    named = sum(r.metrics.flops for r in run.profile.ops(group_by=("name",)) if r.name in FLOP_COUNTER_MISSES)
    nested = 0
    for event in run.session.torch_profiler.events():
        if event.name == "aten::_grouped_mm":
            for child in event.cpu_children:
                if child.name == "aten::mm":
                    nested += int(mm_flop(child.input_shapes[0], child.input_shapes[1]))
    return named + nested


def check_flops(run: ZooRun) -> Check:
    """Total FLOPs of the step (forward, recomputation, backward) within 1% of FlopCounterMode's,
    the ops of :data:`FLOP_COUNTER_MISSES` left out."""
    failed = _failed_runs(run, "profiled run", "FlopCounterMode run")
    if failed:
        return failed
    assert run.profile is not None and run.flop_counter_total
    left_out = _flops_left_out(run)
    counted = run.flop_counter_total
    ours = run.profile.totals.flops - left_out
    ratio = ours / counted
    # with the ops it misses, how far FlopCounterMode's total is from layerscope's
    figure = f"{ratio:.4f}" + (f" (all ops {(ours + left_out) / counted:.2f}x)" if left_out else "")
    detail = f"ours {ours:,} (+{left_out:,} in ops FlopCounterMode misses), FlopCounterMode {counted:,}"
    return Check(abs(ratio - 1) <= FLOP_TOLERANCE, figure, detail)


@dataclass(frozen=True)
class TorchMemory:
    """torch's MemoryProfile of a capture, replayed the way its own ``MemoryProfileTimeline`` does
    (CPU only): the live total after each event, and the storages it saw."""

    times: list[int]
    totals: list[int]
    seen: set[int]
    #: bytes torch calls pre-existing that were not live when the capture began: a tensor over
    #: NumPy's memory (``torch.tensor(array)`` wraps it first, Wav2Vec2's masks) has no allocation
    #: event, and no free either
    foreign: int

    def at(self, t_ns: int) -> int:
        """The live total at ``t_ns``."""
        found = 0
        for t, total in zip(self.times, self.totals, strict=True):
            if t > t_ns:
                break
            found = total
        return found


def torch_memory(memory_profile: Any, alive_at_entry: dict[int, int]) -> TorchMemory:
    """Replays ``memory_profile``'s timeline, leaving out what torch calls pre-existing but was
    not live at entry (see :attr:`TorchMemory.foreign`)."""
    times: list[int] = []
    totals: list[int] = []
    seen: set[int] = set()
    foreign_keys: set[Any] = set()
    foreign = live = 0
    for t, action, (key, _version), nbytes in memory_profile.timeline:
        if key.device.type != "cpu" or action == Action.INCREMENT_VERSION or key in foreign_keys:
            continue  # a new version of the same storage: its bytes stay live
        storage = getattr(key, "storage", None)  # a bare Key: an allocation no tensor was seen in
        if storage is not None:
            seen.add(storage.ptr)
        if action == Action.PREEXISTING and (storage is None or storage.ptr not in alive_at_entry):
            foreign_keys.add(key)
            foreign += nbytes
            continue
        live += nbytes if action in (Action.PREEXISTING, Action.CREATE) else -nbytes
        times.append(t)
        totals.append(live)
    return TorchMemory(times, totals, seen, foreign)


def check_peak(run: ZooRun) -> Check:
    """The absolute CPU peak (memory=True) equals torch's MemoryProfile of the same capture plus
    the storages live at entry that no op touched (torch sees only tensors its events show: Llama's
    ``original_inv_freq`` buffer, kept for rotary scaling, is never read): at our peak's time, and
    torch's own highest total."""
    failed = _failed_runs(run, "memory run")
    if failed:
        return failed
    profile = run.memory_profile
    assert profile is not None
    at_peak = profile.memory_at_peak(device=False)
    peak_ns = next(c for c in profile.meta.memory.classes if not c.device).peak_ts_ns
    # torch's MemoryProfile of the capture's results: what ``_memory_profile()`` returns, without
    # its demand for stacks (they name categories; the totals compared here do not need them)
    results = run.memory_session.torch_profiler.profiler.kineto_results
    theirs = torch_memory(MemoryProfile(results), run.alive_at_entry)
    unseen = sum(n for ptr, n in run.alive_at_entry.items() if ptr not in theirs.seen)
    theirs_then = (theirs.at(peak_ns) if peak_ns is not None else 0) + unseen
    theirs_max = max(theirs.totals, default=0) + unseen
    ours = at_peak.absolute_peak_bytes
    figure = f"{ours:,} B" if ours == theirs_then == theirs_max else f"{ours:,} / torch {theirs_max:,} B"
    detail = (
        f"ours {ours:,} (baseline {at_peak.baseline_bytes:,}), torch then {theirs_then:,}, torch's max "
        f"{theirs_max:,} (with {unseen:,} B live at entry that no op touched; {theirs.foreign:,} B of "
        "NumPy memory left out)"
    )
    return Check(ours == theirs_then == theirs_max, figure, detail)


#: torch.compile's runtime ranges: guards, Dynamo's and AOTAutograd's wrappers, the graph call. They
#: are the compiled root's own time by right (on a tiny model more than its kernels: docs/compared.md),
#: not op time: placement is measured over the ops and kernels.
COMPILED_RUNTIME = (
    "Torch-Compiled Region",
    "Pregraph bytecode",
    "AOTDispatcher Runtime Wrapper",
    "CompiledFunction",
    "autograd::engine::evaluate_function: CompiledFunction",
    "## Call CompiledFxGraph",
)


def check_placement(run: ZooRun) -> Check:
    """Compiled: at least 80% of the compiled graphs' kernel spans are placed below the root
    (``meta.compiled``: a count, so the machine's load cannot move it), and no FLOP-counted op
    (matmul, convolution, forward or backward) is left on the root's own time. The share of op time
    below the root (device time where there is some, else CPU, :data:`COMPILED_RUNTIME` left out)
    is reported beside it."""
    if not run.case.compiled:
        return NOT_APPLICABLE
    failed = _failed_runs(run, "profiled run")
    if failed:
        return failed
    profile = run.profile
    assert profile is not None
    root = profile.root
    field = "device_us" if profile.has_device_time else "cpu_us"
    below = sum(getattr(c.total, field) for c in root.children)
    rows = profile.ops(group_by=("name", "module"))
    on_root = sum(
        getattr(r.metrics, f"self_{field}")
        for r in rows
        if r.module == "" and not r.name.startswith(COMPILED_RUNTIME)
    )
    share = below / (below + on_root) if below + on_root else 0.0
    compiled = profile.meta.compiled
    placed = compiled.kernels_placed / (compiled.kernels_matched or 1) if compiled is not None else 0.0
    flops = root.forward.self_flops + root.backward.self_flops
    figure = f"{placed:.0%} of kernels ({share:.0%} of op time)" + (
        f", {flops / (root.total.flops or 1):.0%} of FLOPs on the root" if flops else ""
    )
    detail = (
        f"{share:.0%} of op time below the root ({on_root:.0f} us of ops on it), {flops:,} FLOPs on it; "
        f"compiled: {compiled}"
    )
    return Check(placed >= PLACED_SHARE and flops == 0, figure, detail)


CHECKS: dict[str, Callable[[ZooRun], Check]] = {
    "runs": check_runs,
    "identical": check_identical,
    "code-paths": check_code_paths,
    "self-cpu": check_self_cpu,
    "flops": check_flops,
    "peak": check_peak,
    "placement": check_placement,
}


def applies(case: Case, check: str) -> bool:
    """Whether ``check`` says something about ``case`` (the others return :data:`NOT_APPLICABLE`)."""
    if check == "code-paths":
        return case.checkpointed or case.compiled
    if check == "placement":
        return case.compiled
    return True
