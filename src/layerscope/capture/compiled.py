"""torch.compile: which module each kernel of a compiled graph comes from, learnt while Inductor
generates the graph's code.

Inside a compiled region the module hooks do not run (they are traced away), so the module of every
kernel has to come from the compiler. While Inductor emits a kernel call it calls
``torch._inductor.debug.set_kernel_post_grad_provenance_tracing(nodes, kernel_name)`` with the
post-grad FX nodes the kernel computes, whether provenance tracking is on or not. We wrap that
function: each node's ``meta["nn_module_stack"]`` names the module of forward nodes, and backward
nodes carry the ``seq_nr`` of the forward op they differentiate, which leads back to that module.
A kernel fused from nodes of several modules goes to their deepest common ancestor.

Kernels are recorded per graph, in the order the generated wrapper calls them; attribution later
matches them, in order, with the children of each ``## Call CompiledFxGraph ##`` range.

Only compilation that happens while collecting is seen. Around it a few Inductor flags are set and
restored: CPU kernels get profiler ranges (``cpp.enable_kernel_profile``, otherwise they are
invisible to the profiler) and the FX-graph and AOTAutograd caches are bypassed (a cache hit skips
code generation, so nothing could be learnt). The generated code computes the same values either way.
"""

from __future__ import annotations

import itertools
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from layerscope.attribution.compiled import kernel_key

_PROVENANCE_FUNCTION = "set_kernel_post_grad_provenance_tracing"
# The modules that hold a reference to the function (the codegens import it by name).
_HOLDERS = ("torch._inductor.debug", "torch._inductor.codegen.cpp", "torch._inductor.codegen.triton")
#: Graphs kept per process (oldest dropped first): each is a few hundred bytes per kernel.
MAX_GRAPHS = 512

_ROOT_TOKEN = re.compile(r"^(?:L\[['\"][^'\"]*['\"]\]|L__self__|self)(?=\.|$|\[|_modules)")
_GETATTR = re.compile(r"getattr\(([^()]*?),\s*['\"]([^'\"]+)['\"]\)")
_SUBSCRIPT = re.compile(r"(?:\._modules)?\[['\"]?([^'\"\]]+)['\"]?\]")


def module_path(stack_entry: str) -> str:
    """The module path relative to the compiled root from an ``nn_module_stack`` entry:
    ``L['self'].blocks[0].up`` / ``getattr(L['self'].blocks, '0').up`` -> ``blocks.0.up``."""
    text = stack_entry.strip()
    while True:
        found = _GETATTR.search(text)
        if found is None:
            break
        text = f"{text[: found.start()]}{found.group(1)}.{found.group(2)}{text[found.end() :]}"
    text = _ROOT_TOKEN.sub("", text, count=1)
    text = _SUBSCRIPT.sub(lambda m: "." + m.group(1), text)
    return text.strip(".")


def inductor_kernel_key(name: str) -> str:
    """Inductor's name for a kernel call as the profiler will show it (see
    ``attribution.compiled.kernel_key``): ``extern_kernels.mm`` / ``torch.ops.aten.mm.default`` ->
    ``mm``; generated kernels keep their name (``cpp_fused_gelu_0``)."""
    if name.startswith("extern_kernels."):
        return name[len("extern_kernels.") :]
    if name.startswith("torch.ops."):
        parts = name.split(".")
        return parts[3] if len(parts) > 3 else parts[-1]
    return kernel_key(name)


def common_ancestor(paths: list[str]) -> str:
    """The deepest module path that contains every path (``""`` is the compiled root)."""
    if not paths:
        return ""
    parts = [p.split(".") if p else [] for p in paths]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if all(x == level[0] for x in level):
            common.append(level[0])
        else:
            break
    return ".".join(common)


@dataclass
class _Kernel:
    key: str
    modules: list[str]  # forward nodes' module paths
    seqs: list[int]  # backward nodes' sequence numbers (resolved through forward nodes)


@dataclass
class _Graph:
    kernels: list[_Kernel] = field(default_factory=list)


class _Collector:
    """Graphs seen while collecting, by the identity of the GraphLowering that generated them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.graphs: dict[int, _Graph] = {}
        self.order: list[int] = []
        self.module_of_seq: dict[int, str] = {}

    def record(self, node_schedule: Any, kernel_name: str, is_extern: bool) -> None:
        nodes = _origin_nodes(node_schedule, is_extern)
        modules: list[str] = []
        seqs: list[int] = []
        for node in nodes:
            meta = getattr(node, "meta", None) or {}
            stack = meta.get("nn_module_stack")
            seq = meta.get("seq_nr")
            if stack:
                path = module_path(str(list(stack.values())[-1][0]))
                modules.append(path)
                if isinstance(seq, int):
                    self.module_of_seq.setdefault(seq, path)
            elif isinstance(seq, int):
                seqs.append(seq)
        graph_id = _current_graph_id()
        with self.lock:
            graph = self.graphs.get(graph_id)
            if graph is None:
                graph = self.graphs[graph_id] = _Graph()
                self.order.append(graph_id)
            graph.kernels.append(_Kernel(inductor_kernel_key(kernel_name), modules, seqs))

    def finished(self) -> list[dict[str, Any]]:
        """Every graph as saved beside a trace: ``{"kernels": [[key, module path], ...]}``, module paths
        relative to the compiled root (a fused kernel: its modules' deepest common ancestor)."""
        result = []
        for graph_id in self.order:
            kernels = []
            for k in self.graphs[graph_id].kernels:
                paths = k.modules + [self.module_of_seq[s] for s in k.seqs if s in self.module_of_seq]
                kernels.append([k.key, common_ancestor(paths)])
            result.append({"kernels": kernels})
        return result


def _origin_nodes(node_schedule: Any, is_extern: bool) -> list[Any]:
    """The post-grad FX nodes behind one kernel call (as torch's own provenance tracing finds them)."""
    if is_extern:
        origin = getattr(node_schedule, "origin_node", None)
        return [origin] if origin is not None else list(getattr(node_schedule, "origins", ()))
    nodes: list[Any] = []
    for snode in node_schedule or ():
        ir_node = getattr(snode, "node", None)
        if ir_node is not None:
            nodes.extend(getattr(ir_node, "origins", ()))
    return nodes


_graph_ids = itertools.count(1)
_GRAPH_ID_ATTRIBUTE = "_layerscope_graph_id"


def _current_graph_id() -> int:
    """A number for the graph being generated: stored on Inductor's GraphLowering object, since
    ``id()`` of a freed lowering is soon reused by the next one."""
    try:
        from torch._inductor.virtualized import V

        graph = V.graph
    except Exception:  # outside a graph lowering: one anonymous graph
        return 0
    found = getattr(graph, _GRAPH_ID_ATTRIBUTE, None)
    if found is None:
        found = next(_graph_ids)
        setattr(graph, _GRAPH_ID_ATTRIBUTE, found)
    return int(found)


#: Why watching compilation failed on this torch, once per attempt (empty: it works).
_unsupported: list[str] = []
_registry_lock = threading.Lock()
_registry: list[dict[str, Any]] = []
_active: list[_Collector] = []


def known_graphs() -> list[dict[str, Any]]:
    """Every graph whose kernels' modules layerscope learnt in this process (oldest first), those of
    blocks still collecting included (a schedule's cycle ends inside the block)."""
    with _registry_lock:
        return list(_registry) + [g for c in _active for g in c.finished()]


def should_collect() -> bool:
    """Collect only when torch.compile is in use in this process (importing Inductor takes seconds)."""
    return "torch._dynamo" in sys.modules


@contextmanager
def collecting_compile_info() -> Iterator[None]:
    """While open, compilation records which module each kernel comes from (see the module doc);
    the graphs join :func:`known_graphs` when it closes. Flags and functions are restored on exit,
    exceptions and interrupts included."""
    collector = _Collector()
    with ExitStack() as undo:
        watching = True
        try:
            _watch_compilation(undo, collector)
        except (AttributeError, ImportError, KeyError, RuntimeError) as exc:
            # An older or newer torch without what this needs: profiling goes on; compiled regions
            # then stay whole (their kernels with the compiled module), as for code compiled unwatched.
            undo.close()
            _unsupported.append(f"{type(exc).__name__}: {exc}")
            del _unsupported[:-10]
            watching = False
        if not watching:
            yield
            return
        with _registry_lock:
            _active.append(collector)
        try:
            yield
        finally:
            graphs = collector.finished()
            with _registry_lock:
                _active.remove(collector)
                _registry.extend(graphs)
                del _registry[: max(0, len(_registry) - MAX_GRAPHS)]


def _watch_compilation(undo: ExitStack, collector: _Collector) -> None:
    """Set the Inductor flags and wrap the provenance hook (undone by ``undo``)."""
    import importlib

    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    undo.enter_context(inductor_config.patch({"cpp.enable_kernel_profile": True, "fx_graph_cache": False}))
    undo.enter_context(functorch_config.patch({"enable_autograd_cache": False}))
    # Import every holder before patching: a codegen imported while the function is patched
    # would bind our wrapper for good.
    holders = []
    for holder_name in _HOLDERS:
        try:
            holders.append(importlib.import_module(holder_name))
        except Exception:  # a codegen that cannot load here (no Triton): nothing to patch
            continue
    debug = importlib.import_module("torch._inductor.debug")
    original = getattr(debug, _PROVENANCE_FUNCTION)

    def traced(node_schedule: Any, kernel_name: str, is_extern: bool = False) -> int | None:
        with suppress(Exception):  # never let bookkeeping break a compilation
            collector.record(node_schedule, kernel_name, is_extern)
        return original(node_schedule, kernel_name, is_extern)  # type: ignore[no-any-return]

    for holder in holders:
        if getattr(holder, _PROVENANCE_FUNCTION, None) is original:
            setattr(holder, _PROVENANCE_FUNCTION, traced)
            undo.callback(setattr, holder, _PROVENANCE_FUNCTION, original)


def compile_info() -> Any:
    """``with layerscope.compile_info(): model(x)``: learn the modules of the kernels of graphs that
    compile in this block (e.g. a warm-up before a long job), for profiles taken later. Compilation
    inside ``layerscope.profile`` is covered without it."""
    return collecting_compile_info()


# ----- compiled modules ---------------------------------------------------------------------------


def unwrap_compiled(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile(model)`` wrapper (``OptimizedModule``) compiles, else ``model``."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) and type(model).__name__ == "OptimizedModule" else model


def is_compiled(model: nn.Module | None) -> bool:
    """Whether ``model`` is, or contains, a compiled module (``torch.compile(m)``, ``m.compile()``)."""
    if model is None:
        return False
    if unwrap_compiled(model) is not model:
        return True
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())
