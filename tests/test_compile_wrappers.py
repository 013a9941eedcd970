"""torch.compile on the shapes that once left the tree empty or the backward on the root (issue 35):
a ``forward`` behind ``*args, **kwargs`` decorators (Dynamo names the model ``L['args'][0]``), a
tiny Llama behind transformers' ``@deprecate_kwarg``, and a conv-bn-relu net whose compiled
backward calls ``aten::convolution_backward`` as a fallback kernel. Where placement still fails, one
warning says so.

Each model compiles once (module-scoped fixtures: compiles take seconds), under
``ls.compile_info()``; then two unprofiled steps and two profiled ones, whose losses and gradients
must be the same bits.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import layerscope as ls
from layerscope.capture import compiled as compiled_capture
from layerscope.capture import recording
from layerscope.capture.compile_watch import known_graphs
from tests.fixtures.compiled_models import (
    ConvBnRelu,
    DecoratedNet,
    conv_inputs,
    decorated_inputs,
    llama_inputs,
    tiny_llama,
)
from tests.test_compile import needs_provenance

STEPS = 2
Loss = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def _sum(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).sum()


def _lm_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, labels=x).loss  # type: ignore[no-any-return]


def _dynamo_counts() -> dict[str, Any]:
    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "unique_graphs": counters["stats"]["unique_graphs"],
    }


def _steps(model: nn.Module, x: torch.Tensor, loss: Loss) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Losses and accumulated gradients of STEPS steps, from zeroed gradients."""
    model.zero_grad(set_to_none=True)
    losses = []
    for _ in range(STEPS):
        value = loss(model, x)
        value.backward()
        losses.append(value.detach().clone())
    return losses, [p.grad.clone() for p in model.parameters() if p.grad is not None]


@dataclass
class Run:
    profile: ls.Profile
    model: nn.Module
    inputs: torch.Tensor
    loss: Loss
    ours: list[warnings.WarningMessage]  # layerscope's warnings while profiling
    counts: tuple[dict[str, Any], dict[str, Any]]  # Dynamo's, before and after the profile
    same_losses: bool
    same_grads: bool


def _run(make: Callable[[], nn.Module], x: torch.Tensor, loss: Loss) -> Run:
    # One thread: Inductor's CPU kernels then add in a fixed order (with two, the compiled embedding
    # backward's parallel adds made two unprofiled runs differ in the last bits now and then).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_on_one_thread(make, x, loss)
    finally:
        torch.set_num_threads(threads)


def _run_on_one_thread(make: Callable[[], nn.Module], x: torch.Tensor, loss: Loss) -> Run:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = torch.compile(make())
    with ls.compile_info():  # compiles the forward and the backward, learning their kernels
        loss(model, x).backward()
    before = _dynamo_counts()
    plain, again = _steps(model, x, loss), _steps(model, x, loss)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ls.profile(model) as session:
            profiled = _steps(model, x, loss)
        profile = session.profile
    ours = [w for w in caught if issubclass(w.category, ls.CompileInfoWarning)]
    return Run(
        profile,
        model,
        x,
        loss,
        ours,
        (before, _dynamo_counts()),
        all(torch.equal(a, b) for a, b in zip(plain[0], profiled[0], strict=True)),
        _same_grads(plain[1], again[1], profiled[1]),
    )


def _same_grads(plain: list[torch.Tensor], again: list[torch.Tensor], profiled: list[torch.Tensor]) -> bool:
    """The same bits as the unprofiled runs (which must agree with each other first)."""
    if not len(plain) == len(again) == len(profiled):
        return False
    return all(
        torch.equal(p, a) and torch.equal(p, q) for p, a, q in zip(plain, again, profiled, strict=True)
    )


@pytest.fixture(scope="module")
def decorated() -> Run:
    return _run(DecoratedNet, decorated_inputs(), _sum)


@pytest.fixture(scope="module")
def llama() -> Run:
    try:
        return _run(tiny_llama, llama_inputs(), _lm_loss)
    except ImportError as exc:  # transformers missing, or refusing this torch
        pytest.skip(f"transformers: {str(exc)[:80]}")


@pytest.fixture(scope="module")
def conv() -> Run:
    return _run(ConvBnRelu, conv_inputs(), _sum)


@pytest.fixture(params=["decorated", "llama", "conv"])
def run(request: pytest.FixtureRequest) -> Run:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


def _placed_share(profile: ls.Profile) -> float:
    """Kernel spans of compiled graphs placed below the compiled module, of those matched."""
    compiled = profile.meta.compiled
    assert compiled is not None
    assert compiled.mapped_graph_calls == compiled.graph_calls == 2 * STEPS  # forward, backward
    return compiled.kernels_placed / compiled.kernels_matched


def _flops_below_root(profile: ls.Profile) -> float:
    root = profile.root
    return sum(c.total.flops for c in root.children) / root.total.flops


@needs_provenance
def test_profiling_changes_nothing_validates_and_warns_not(run: Run) -> None:
    run.profile.validate()
    before, after = run.counts
    assert after == before  # no recompilation, no graph break
    assert run.same_losses and run.same_grads
    assert not run.ours, [str(w.message) for w in run.ours]
    assert run.profile.meta.compiled is not None and not run.profile.meta.compiled.paths_not_in_tree


@needs_provenance
def test_a_forward_behind_args_kwargs_decorators_is_placed(decorated: Run) -> None:
    profile = decorated.profile
    # 0 of 46 before: Dynamo named the model L['args'][0] and no kernel found its module
    assert _placed_share(profile) >= 0.8
    assert _flops_below_root(profile) == 1.0  # every matmul is a Linear's
    for path in ("blocks.0.up", "blocks.1.down", "head"):
        node = profile.find(path)
        assert node.calls == STEPS
        assert node.forward.self_cpu_us > 0 and node.backward.self_cpu_us > 0
        assert node.forward.flops > 0 and node.backward.flops > 0


@needs_provenance
def test_a_tiny_llama_behind_deprecate_kwarg_is_placed(llama: Run) -> None:
    profile = llama.profile
    assert _placed_share(profile) >= 0.8  # 0 of 150 before
    assert _flops_below_root(profile) >= 0.99
    root = profile.root
    # CPU time too (generous: the compiled runtime's own wrappers stay on the root; ~90% here)
    assert sum(c.total.cpu_us for c in root.children) >= 0.5 * root.total.cpu_us
    for layer in ("model.layers.0", "model.layers.1"):
        attention = profile.find(f"{layer}.self_attn.q_proj")
        assert attention.calls == STEPS and attention.backward.flops > 0
        assert profile.find(f"{layer}.mlp.down_proj").forward.flops > 0


@needs_provenance
def test_compiled_convolution_backward_lands_on_its_convolution(conv: Run) -> None:
    profile = conv.profile
    rows = [r for r in profile.ops(group_by=("name", "module")) if r.name == "aten::convolution_backward"]
    by_module = {r.module: r.calls for r in rows}
    # 4 of 6 sat on the root: the fallback kernel's origins hold the batch norm and ReLU backward too
    assert by_module == {"conv1": STEPS, "conv2": STEPS, "conv3": STEPS}, by_module
    assert profile.root.backward.self_flops == 0 and profile.root.forward.self_flops == 0
    assert _flops_below_root(profile) == 1.0
    for path in ("conv1", "conv2", "conv3"):
        node = profile.find(path)
        assert node.backward.flops > 0 and node.forward.flops > 0


@needs_provenance
def test_module_paths_not_in_the_model_give_one_warning(
    decorated: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrapper whose naming layerscope cannot read: the kernels stay with the compiled module,
    and one warning says which paths, why, and what to do."""
    mangled = [
        {"kernels": [[key, f"mystery.{path}" if path else path] for key, path in graph["kernels"]]}
        for graph in known_graphs()
    ]
    monkeypatch.setattr(recording, "known_graphs", lambda: mangled)
    with pytest.warns(ls.CompileInfoWarning) as caught:
        with ls.profile(decorated.model) as session:
            decorated.loss(decorated.model, decorated.inputs).backward()
        profile = session.profile
    profile.validate()
    ours = [w for w in caught if issubclass(w.category, ls.CompileInfoWarning)]
    assert len(ours) == 1
    message = str(ours[0].message)
    assert "'mystery.blocks" in message and "DecoratedNet" in message and "block.compile()" in message
    assert profile.meta.compiled.kernels_placed == 0
    assert profile.meta.compiled.note == message
    assert all(p.startswith("mystery.") for p in profile.meta.compiled.paths_not_in_tree)


@needs_provenance
def test_paths_folded_by_depth_go_to_their_ancestor_without_a_warning(decorated: Run) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ls.CompileInfoWarning)
        with ls.profile(decorated.model, depth=1) as session:
            decorated.loss(decorated.model, decorated.inputs).backward()
        profile = session.profile
    profile.validate()
    assert {n.path for n in profile.modules()} == {"", "blocks", "head"}
    assert profile.find("blocks").total.flops > 0
    assert "blocks.0.up" in profile.meta.compiled.paths_not_in_tree  # folded, and said so


_PLACEHOLDER = SimpleNamespace(op="placeholder", target="primals_1", meta={}, all_input_nodes=[], args=())


def _node(
    target: Any,
    stack_path: str | None,
    seq: int | None = None,
    inputs: tuple[Any, ...] = (_PLACEHOLDER,),
    backward: bool = False,
) -> Any:
    """An FX node as the collector reads it: a forward node's ``nn_module_stack``, or (backward) the
    ``fwd_nn_module_stack`` of the forward op it differentiates."""
    meta: dict[str, Any] = {"seq_nr": seq} if seq is not None else {}
    if stack_path is not None:
        meta["fwd_nn_module_stack" if backward else "nn_module_stack"] = {
            "k": (f"L['self'].{stack_path}", nn.Module)
        }
    return SimpleNamespace(
        op="call_function", target=target, meta=meta, all_input_nodes=list(inputs), args=inputs
    )


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> compiled_capture.Collector:
    """A collector outside any graph lowering: every kernel recorded goes to one graph."""
    monkeypatch.setattr(compiled_capture, "_current_graph_id", lambda: 1)
    return compiled_capture.Collector()


def _fused(*nodes: Any) -> list[Any]:
    """A fused kernel's node schedule as Inductor hands it to the provenance hook."""
    return [SimpleNamespace(node=SimpleNamespace(origins=list(nodes)))]


def test_a_fallback_kernel_takes_its_own_ops_module_not_its_inputs(
    collector: compiled_capture.Collector,
) -> None:
    aten = torch.ops.aten
    own = _node(aten.convolution_backward.default, "conv2", backward=True)
    folded = _node(aten.mul.Tensor, "bn2", backward=True)
    kernel = SimpleNamespace(origin_node=None, origins=[folded, own])
    collector.record(kernel, "torch.ops.aten.convolution_backward.default", True)
    assert collector.finished() == [{"kernels": [["convolution_backward", "conv2"]]}]


def test_a_shared_constant_does_not_widen_a_fused_kernel(collector: compiled_capture.Collector) -> None:
    """The zeros of every ReLU backward are one node, carrying the module of its first user
    (the last block's ReLU): the fused batch-norm and ReLU backward of another block stays there."""
    aten = torch.ops.aten
    zeros = _node(aten.full.default, "layer4.1.relu", inputs=(), backward=True)
    where = _node(aten.where.self, "layer3.1.relu", inputs=(_PLACEHOLDER, zeros), backward=True)
    grad = _node(aten.mul.Tensor, "layer3.1.bn1", inputs=(where,), backward=True)
    collector.record(_fused(zeros, where, grad), "cpp_fused_threshold_backward_4", False)
    collector.record(_fused(zeros), "cpp_fused_full_5", False)  # alone, it is all there is
    assert collector.finished() == [
        {"kernels": [["cpp_fused_threshold_backward_4", "layer3.1"], ["cpp_fused_full_5", "layer4.1.relu"]]}
    ]


def test_a_forward_copy_back_goes_to_the_module_that_computed_it(
    collector: compiled_capture.Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch norm's running statistics copied back at the forward graph's end carry the last
    forward op's sequence number (another module's): they belong to the batch norm."""
    aten = torch.ops.aten
    monkeypatch.setattr(compiled_capture, "_in_backward_graph", lambda: False, raising=False)
    last = _node(aten.convolution.default, "conv3", seq=20)
    collector.record(SimpleNamespace(origin_node=last), "extern_kernels.convolution", True)
    stats = _node(aten.add.Tensor, "bn1", seq=15)
    copy = _node(aten.copy_.default, None, seq=20, inputs=(_PLACEHOLDER, stats))
    root_op = _node(aten.relu.default, None, seq=12)  # the root's own code: no module
    collector.record(_fused(stats, copy, root_op), "cpp_fused_1", False)
    assert collector.finished() == [{"kernels": [["convolution", "conv3"], ["cpp_fused_1", "bn1"]]}]
