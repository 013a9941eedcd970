"""torch.compile (CPU Inductor, C++ kernels): per-module profiles of compiled models, forward and
backward, that change nothing in the compiled program.

Each scenario compiles twice: once unprofiled (the baseline: Dynamo's counters and the outputs) and
once with the first call inside ``layerscope.profile``. Compiles are the slow part (seconds each), so
every scenario is one module-scoped fixture shared by its tests.
"""

from __future__ import annotations

import copy
import gzip
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
import torch._inductor.debug
from torch import nn
from torch._dynamo.utils import counters

import layerscope as ls
from layerscope.attribution.compiled import LABEL_COMPILING, kernel_key
from layerscope.capture import compile_watch
from layerscope.capture.compiled import common_ancestor, inductor_kernel_key, module_path
from layerscope.model.meta import CompileReport
from tests.fixtures.models import WideAmongNarrow
from tests.test_recording import assert_same_tree

# Older torch has no per-kernel provenance hook in Inductor: there compiled regions stay whole.
HAS_PROVENANCE = hasattr(torch._inductor.debug, "set_kernel_post_grad_provenance_tracing")
needs_provenance = pytest.mark.skipif(
    not HAS_PROVENANCE, reason=f"torch {torch.__version__} has no Inductor provenance hook"
)

STEPS = 2
HEAVIEST = "wide.mid"


def _inputs() -> torch.Tensor:
    # big enough that the compiled region's own runtime (guards, wrappers: ~1 ms a call) is small
    return torch.randn(1024, 32, generator=torch.Generator().manual_seed(1))


def _dynamo_counts() -> dict[str, Any]:
    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "unique_graphs": counters["stats"]["unique_graphs"],
        "calls_captured": counters["stats"]["calls_captured"],
    }


def _train_steps(model: nn.Module, x: torch.Tensor) -> None:
    for _ in range(STEPS):
        model(x).sum().backward()


@dataclass
class Scenario:
    profile: ls.Profile
    session: ls.profile
    baseline_counts: dict[str, Any]
    profiled_counts: dict[str, Any]
    baseline_output: torch.Tensor
    profiled_output: torch.Tensor
    model: nn.Module
    compiled_calls: dict[str, Any]  # path -> the module's own compiled call, before profiling


def _run(compile_model: Callable[[nn.Module], nn.Module]) -> Scenario:
    torch.manual_seed(0)
    weights = WideAmongNarrow()
    x = _inputs()

    torch._dynamo.reset()
    counters.clear()
    baseline = compile_model(copy.deepcopy(weights))
    _train_steps(baseline, x)
    baseline_counts = _dynamo_counts()
    with torch.no_grad():
        baseline_output = baseline(x)

    torch._dynamo.reset()
    counters.clear()
    model = compile_model(copy.deepcopy(weights))
    compiled_calls = {
        path: m._compiled_call_impl for path, m in model.named_modules() if m._compiled_call_impl is not None
    }
    with ls.profile(model) as session:
        _train_steps(model, x)
    profiled_counts = _dynamo_counts()
    with torch.no_grad():
        profiled_output = model(x)
    return Scenario(
        session.profile,
        session,
        baseline_counts,
        profiled_counts,
        baseline_output,
        profiled_output,
        model,
        compiled_calls,
    )


@pytest.fixture(scope="module")
def eager() -> ls.Profile:
    torch.manual_seed(0)
    model = WideAmongNarrow()
    with ls.profile(model) as session:
        _train_steps(model, _inputs())
    return session.profile


@pytest.fixture(scope="module")
def whole() -> Scenario:
    return _run(lambda m: torch.compile(m))


def _regional(model: nn.Module) -> nn.Module:
    for block in (*model.narrow, model.wide, model.tail):
        block.compile()
    return model


@pytest.fixture(scope="module")
def regional() -> Scenario:
    return _run(_regional)


SCENARIOS = ["whole", "regional"]


@pytest.fixture(params=SCENARIOS)
def scenario(request: pytest.FixtureRequest) -> Scenario:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


def _leaf_total_cpu(profile: ls.Profile) -> dict[str, float]:
    return {n.path: n.total.cpu_us for n in profile.modules() if not n.children}


@needs_provenance
def test_profiling_changes_nothing_in_the_compiled_program(scenario: Scenario) -> None:
    assert scenario.profiled_counts == scenario.baseline_counts
    assert scenario.profiled_counts["graph_breaks"] == 0
    assert torch.equal(scenario.profiled_output, scenario.baseline_output)


@needs_provenance
def test_the_tree_has_the_eager_paths_and_validates(scenario: Scenario, eager: ls.Profile) -> None:
    profile = scenario.profile
    profile.validate()
    paths = {n.path for n in profile.modules()}
    assert {n.path for n in eager.modules()} <= paths
    assert not any("_orig_mod" in p for p in paths)
    assert profile.root.type_name == "WideAmongNarrow"
    assert profile.find("wide.mid").calls == STEPS


@needs_provenance
def test_most_time_lands_below_the_root_and_the_heaviest_module_matches_eager(
    scenario: Scenario, eager: ls.Profile
) -> None:
    profile = scenario.profile
    root = profile.root
    below = sum(c.total.cpu_us for c in root.children)
    # ~90% on a quiet machine (benchmarks/compile.py); the root's Python glue grows under load (69% seen
    # with the suite beside other work), so the bound is generous
    assert below >= 0.6 * root.total.cpu_us, (below, root.total.cpu_us)
    # every matmul is placed, the backward's too (a gradient addition fused into an addmm has no
    # module metadata: it takes its operands' modules)
    on_root = {r.name for r in profile.ops(group_by=("name", "module")) if r.module == ""}
    assert not on_root & {"aten::addmm", "aten::mm"}, on_root
    compiled_leaves, eager_leaves = _leaf_total_cpu(profile), _leaf_total_cpu(eager)
    assert max(eager_leaves, key=eager_leaves.__getitem__) == HEAVIEST
    assert max(compiled_leaves, key=compiled_leaves.__getitem__) == HEAVIEST
    mid = profile.find(HEAVIEST)
    assert mid.forward.self_cpu_us > 0 and mid.backward.self_cpu_us > 0
    assert mid.forward.flops == eager.find(HEAVIEST).forward.flops


@needs_provenance
def test_kernels_show_in_the_op_table_under_their_module(scenario: Scenario) -> None:
    rows = scenario.profile.ops(group_by=("name", "module", "phase"))
    by_module = {(r.module, str(r.phase)) for r in rows}
    assert (HEAVIEST, "forward") in by_module and (HEAVIEST, "backward") in by_module
    # Inductor's own C++ kernels are visible (profiler ranges) and owned by modules
    fused = [r for r in rows if r.name.startswith("graph_") and "cpp_fused" in r.name]
    assert fused and all(r.module is not None for r in fused)


@needs_provenance
def test_compiling_is_its_own_entry_with_no_flops(scenario: Scenario) -> None:
    entry = next(u for u in scenario.profile.unattributed if u.label == LABEL_COMPILING)
    assert entry.metrics.cpu_us > 0
    assert entry.metrics.flops == 0
    # compiling never counts as module time
    assert entry.metrics.cpu_us > scenario.profile.root.total.cpu_us


@needs_provenance
def test_hooks_and_compiled_calls_are_restored(regional: Scenario) -> None:
    model = regional.model
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    assert len(regional.compiled_calls) == 4  # the four compiled blocks
    for path, compiled_call in regional.compiled_calls.items():
        assert model.get_submodule(path)._compiled_call_impl is compiled_call  # our wrapper is gone


@needs_provenance
def test_inductor_flags_are_restored(whole: Scenario) -> None:
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    assert inductor_config.cpp.enable_kernel_profile is False
    assert inductor_config.fx_graph_cache is True
    assert functorch_config.enable_autograd_cache is True
    import torch._inductor.codegen.cpp as cpp_codegen
    import torch._inductor.debug as inductor_debug

    # the provenance hook is torch's own again everywhere (a codegen imported while it was wrapped
    # once kept the wrapper, and later profiles saw no C++ kernel)
    name = "set_kernel_post_grad_provenance_tracing"
    assert getattr(cpp_codegen, name) is getattr(inductor_debug, name)
    assert getattr(inductor_debug, name).__module__ == "torch._inductor.debug"


@needs_provenance
def test_a_saved_trace_keeps_the_mapping(whole: Scenario, tmp_path: Path) -> None:
    path = whole.session.export_chrome_trace(tmp_path / "compiled.json")
    loaded = ls.load(path)
    loaded.validate()
    mid = loaded.find(HEAVIEST)
    assert mid.forward.self_cpu_us > 0 and mid.backward.self_cpu_us > 0
    assert loaded.meta.compiled.mapped_graph_calls == loaded.meta.compiled.graph_calls


@needs_provenance
def test_cycle_traces_of_a_compiled_model_read_back_to_its_tree(whole: Scenario, tmp_path: Path) -> None:
    """save_to(trace=True) under a schedule: the cycle's trace carries the compiled-graph header, so
    reading it back places the compiled kernels in the modules the saved profile has."""
    handler = ls.save_to(tmp_path, trace=True)
    x = _inputs()
    schedule = ls.schedule(wait=0, warmup=1, active=STEPS)
    with ls.profile(whole.model, schedule=schedule, on_trace_ready=handler) as prof:
        for _ in range(STEPS + 1):
            whole.model(x).sum().backward()
            prof.step()
    (trace_path,) = [p for p in handler.written if p.name.endswith(".pt.trace.json.gz")]  # type: ignore[attr-defined]
    profile_path = trace_path.with_name(trace_path.name.replace(".pt.trace.json.gz", ".json.gz"))
    live = ls.load(profile_path)
    assert_same_tree(live, ls.load(trace_path))
    assert live.find(HEAVIEST).forward.self_cpu_us > 0 and live.find(HEAVIEST).backward.self_cpu_us > 0
    header = orjson.loads(gzip.decompress(trace_path.read_bytes()))["layerscope"]
    assert header["compiled_graphs"] and ["wide.mid", "Linear"] in header["modules"]


@needs_provenance
def test_code_compiled_before_the_block_gives_an_honest_tree(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compile_watch.forget_graphs()  # nothing learnt yet in this process
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.compile(WideAmongNarrow())
    x = _inputs()
    _train_steps(model, x)  # compiled here, unwatched
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ls.profile(model) as session:
            _train_steps(model, x)
        profile = session.profile
    profile.validate()
    notes = [w for w in caught if issubclass(w.category, ls.CompileInfoWarning)]
    message = str(notes[0].message)
    assert len(notes) == 1 and "layerscope.watch_compiles()" in message and "torch._dynamo.reset()" in message
    assert notes[0].filename == __file__  # the user's line that asked for the profile
    assert profile.meta.compiled.mapped_graph_calls == 0
    # the compiled region is one node holding its kernels: nothing placed in a wrong module
    assert profile.root.forward.self_cpu_us > 0
    assert all(n.total.cpu_us == 0 for n in profile.modules() if n.path)


@needs_provenance
def test_compile_info_learns_graphs_for_later_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    compile_watch.forget_graphs()
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.compile(WideAmongNarrow())
    x = _inputs()
    with ls.compile_info():
        _train_steps(model, x)
    with ls.profile(model) as session:
        _train_steps(model, x)
    profile = session.profile
    assert profile.meta.compiled.mapped_graph_calls == profile.meta.compiled.graph_calls > 0
    assert profile.find(HEAVIEST).forward.self_cpu_us > 0


@pytest.mark.parametrize(
    ("entry", "path"),
    [
        ("L['self'].narrow.0.up", "narrow.0.up"),
        ("L['self'].layers[3].attn", "layers.3.attn"),
        ("getattr(L['self'].layers, '3').attn", "layers.3.attn"),
        ("L['self']._modules['wide']._modules['mid']", "wide.mid"),
        ("L['self']", ""),
        ("L['mod'].up", "up"),
        ("G['model'].wide.mid", "wide.mid"),  # a compiled function calling a global model
        ("L['self'].forward._torchdynamo_inline.__self__.head", "head"),  # Lightning's compiled forward
        # a forward behind `*args, **kwargs` decorators: the wrapper is the compiled frame
        ("L['args'][0].blocks.0.up", "blocks.0.up"),
        ("L['args'][0]", ""),
        ("L['f'].__self__.model.layers.0", "model.layers.0"),  # a decorated bound forward
        ("L['f'].__self__", ""),
        ("L['kwargs']['self'].head", "head"),
        ("L['s'].net.layers.0", "net.layers.0"),  # an undecorated root calling a decorated child
        ("L['fn'].2.0", "2.0"),  # a compiled Sequential
        ("L['self'][0]", "0"),  # `self` is never a container
    ],
)
def test_module_paths_from_dynamo_stacks(entry: str, path: str) -> None:
    assert module_path(entry) == path


def test_kernel_names_meet_on_both_sides() -> None:
    assert kernel_key("graph_0_cpp_fused_gelu_0") == "cpp_fused_gelu_0"
    assert kernel_key("aten::addmm") == "addmm"
    assert inductor_kernel_key("extern_kernels.addmm") == "addmm"
    assert inductor_kernel_key("torch.ops.aten.mm.default") == "mm"
    assert common_ancestor(["wide.act", "wide.up"]) == "wide"
    assert common_ancestor(["wide.act", "narrow.0"]) == ""
    assert common_ancestor([]) == ""


def test_triton_kernels_follow_the_mapping_on_a_real_cuda_trace(real_traces: Path, tmp_path: Path) -> None:
    """The GPU route through the same mapping: a real trace of a Triton kernel launched by a compiled
    region (../shared/traces/cuda_triton), wrapped in a module range and a graph call as layerscope
    records them, with the mapping layerscope saves beside such a trace."""
    import gzip

    import orjson

    from layerscope.events.names import module_range_name

    trace = orjson.loads(gzip.decompress((real_traces / "cuda_triton.json.gz").read_bytes()))
    region = next(e for e in trace["traceEvents"] if e.get("name") == "Torch-Compiled Region: 0/0")
    launcher = next(e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and "triton" in e["name"])
    kernel = next(e for e in trace["traceEvents"] if e.get("cat") == "kernel")
    where = {"pid": region["pid"], "tid": region["tid"], "ph": "X", "cat": "cpu_op"}
    trace["traceEvents"] += [
        {**where, "name": module_range_name("", "Net"), "ts": region["ts"] - 1, "dur": region["dur"] + 2},
        {
            **where,
            "name": "## Call CompiledFxGraph k ##",
            "ts": launcher["ts"] - 1,
            "dur": launcher["dur"] + 2,
        },
    ]
    graph = {"kernels": [[launcher["name"], "rotary"]]}
    saved = {"layerscope": {"compiled_graphs": [graph], "modules": [["", "Net"], ["rotary", "Rotary"]]}}
    path = tmp_path / "triton.json"
    path.write_bytes(orjson.dumps({**saved, **trace}))
    profile = ls.load(path)
    profile.validate()
    rotary = profile.find("rotary")
    assert rotary.forward.self_device_us == pytest.approx(kernel["dur"])
    assert profile.root.forward.self_device_us == 0
    assert profile.meta.compiled == CompileReport(
        graph_calls=1, mapped_graph_calls=1, kernels_matched=1, kernels_placed=1
    )


def test_a_torch_without_the_provenance_hook_still_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Older torch (2.4) has no set_kernel_post_grad_provenance_tracing: profiling must go on, with
    compiled regions kept whole, and nothing left patched. The installation is tried at the start of
    the first compilation in the block (without the hook this torch's Inductor cannot compile, so
    only the start Dynamo announces is played)."""
    import torch._inductor.config as inductor_config
    import torch._inductor.debug as inductor_debug

    try:
        from torch._dynamo.callback import CallbackTrigger, callback_handler
    except ImportError:  # an older torch without compile callbacks: the installation is tried at once
        callback_handler = None

    monkeypatch.delattr(inductor_debug, "set_kernel_post_grad_provenance_tracing", raising=False)
    compile_watch._unsupported.clear()
    model = nn.Linear(8, 8)
    with ls.profile(model) as prof:
        if callback_handler is not None:
            with callback_handler.install_callbacks(CallbackTrigger.DYNAMO, "0/0"):
                pass  # what Dynamo runs around a compilation
        model(torch.randn(4, 8)).sum().backward()
    prof.profile.validate()
    assert compile_watch._unsupported  # why watching failed is kept (a missing hook or config key)
    assert inductor_config.cpp.enable_kernel_profile is False  # flags set before the failure are undone
    assert not compile_watch._installation.holders
    if callback_handler is not None:  # the trigger left with the block
        assert compile_watch._installation._on_compile_start not in callback_handler.start_callbacks
