"""torch.compile: which module each kernel of a compiled graph comes from, learnt while Inductor
generates the graph's code.

Inside a compiled region the module hooks do not run (they are traced away), so the module of every
kernel has to come from the compiler. While Inductor emits a kernel call it calls
``torch._inductor.debug.set_kernel_post_grad_provenance_tracing(nodes, kernel_name)`` with the
post-grad FX nodes the kernel computes, whether provenance tracking is on or not. We wrap that
function: each node's ``meta["nn_module_stack"]`` names the module of forward nodes; backward nodes
carry the forward op's stack (``fwd_nn_module_stack``) or its ``seq_nr``, which leads back to that
module; a node a pass made without metadata (a gradient addition fused into a matmul) takes the
modules of the nodes it computes from. A kernel fused from nodes of several modules goes to their
deepest common ancestor; constants (shared by every user in a graph) count only where a kernel has
nothing else, and a fallback kernel (``aten::convolution_backward`` in a compiled backward) is the
node of its own op, not those Inductor folded into its inputs. Module paths are relative to the
compiled root however Dynamo names it (``L['self']``, ``L['args'][0]`` behind a decorator).

Kernels are recorded per graph, in the order the generated wrapper calls them; attribution later
matches them, in order, with the children of each ``## Call CompiledFxGraph ##`` range.

Only compilation that happens while collecting is seen (``compile_watch.py`` decides when). Around
it a few Inductor flags are set and restored: CPU kernels get profiler ranges
(``cpp.enable_kernel_profile``, otherwise they are invisible to the profiler) and the FX-graph and
AOTAutograd caches are bypassed (a cache hit skips code generation, so nothing could be learnt).
The generated code computes the same values either way.
"""

from __future__ import annotations

import itertools
import re
import threading
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from typing import Any

from layerscope.attribution.compiled import kernel_key

_PROVENANCE_FUNCTION = "set_kernel_post_grad_provenance_tracing"
# The modules that hold a reference to the function (the codegens import it by name).
_HOLDERS = ("torch._inductor.debug", "torch._inductor.codegen.cpp", "torch._inductor.codegen.triton")
#: Graphs kept per process (oldest dropped first): each is a few hundred bytes per kernel.
MAX_GRAPHS = 512

# The compiled root: a local or global of the compiled frame (``L['self']``, ``L['fn']``, a compiled
# function's ``L['model']``, ``G['model']``), or an item of one: a ``*args, **kwargs`` decorator on
# ``forward`` makes the wrapper the compiled frame, with ``self`` in its varargs (``L['args'][0]``,
# also through several decorators; ``L['kwargs']['self']``). Dynamo writes a module's children as
# attributes (``L['fn'].0``), so an item directly after a local is never a child; ``self`` is
# never a container. A decorator applied to the instance's bound ``forward`` closes over it: the
# model is then that method's ``__self__`` (``L['f'].__self__``).
_ROOT_TOKEN = re.compile(
    r"^(?:L\[['\"]self['\"]\]|[LG]\[['\"][^'\"]*['\"]\](?:\[(?:\d+|'[^']*'|\"[^\"]*\")\])*|L__self__|self)"
    r"(?:\.__self__)?(?=\.|$|\[|_modules)"
)
_GETATTR = re.compile(r"getattr\(([^()]*?),\s*['\"]([^'\"]+)['\"]\)")
# A method Dynamo wrapped on the instance (Lightning's compiled forward) leads back to the module.
_WRAPPED_METHOD = re.compile(r"\.?[A-Za-z_]\w*\._torchdynamo_(?:inline|orig_callable)\.__self__")
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
    text = _WRAPPED_METHOD.sub("", text)
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


class Collector:
    """Graphs seen while collecting, by the identity of the GraphLowering that generated them (the
    newest :data:`MAX_GRAPHS`: a process-wide watch collects for as long as the process runs)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.graphs: dict[int, _Graph] = {}
        self.module_of_seq: dict[int, str] = {}

    def record(self, node_schedule: Any, kernel_name: str, is_extern: bool) -> None:
        backward = _in_backward_graph()
        modules: list[str] = []
        seqs: list[int] = []
        constants: list[str] = []
        for node in _origin_nodes(node_schedule, kernel_name, is_extern):
            found = self._modules_of(node, backward)
            if isinstance(found, int):
                seqs.append(found)
            elif _is_constant(node):
                # A constant (the zeros of every ReLU backward) is made once per graph and shared,
                # carrying the module of its first user: it says nothing about this kernel's.
                constants.extend(found)
            else:
                modules.extend(found)
        if not modules and not seqs:
            modules = constants
        graph_id = _current_graph_id()
        with self.lock:
            graph = self.graphs.get(graph_id)
            if graph is None:
                graph = self.graphs[graph_id] = _Graph()
                while len(self.graphs) > MAX_GRAPHS:
                    del self.graphs[next(iter(self.graphs))]
            graph.kernels.append(_Kernel(inductor_kernel_key(kernel_name), modules, seqs))

    def _modules_of(self, node: Any, backward: bool) -> list[str] | int:
        """The module paths one FX node computes for, or the sequence number of a backward node
        that has only that (resolved when the graphs are read: its forward may come later)."""
        meta = getattr(node, "meta", None) or {}
        path = _stack_path(meta.get("nn_module_stack"))
        seq = meta.get("seq_nr")
        if path is not None:
            if isinstance(seq, int):
                if len(self.module_of_seq) >= _MAX_SEQUENCE_NUMBERS:
                    self.module_of_seq.clear()  # a process-wide watch runs for ever
                self.module_of_seq.setdefault(seq, path)
            return [path]
        # a backward node: the module of the forward op it differentiates
        path = _stack_path(meta.get("fwd_nn_module_stack"))
        if path is not None:
            return [path]
        if isinstance(seq, int) and backward:
            return seq
        if backward or seq is None or _op_name(getattr(node, "target", None)) == "copy_":
            return self._modules_of_inputs(node)
        # A forward op of the compiled root's own code: no module. In a forward graph a sequence
        # number names no module: a mutation copied back at the graph's end (a batch norm's
        # running statistics) carries the last forward op's, so a copy goes to the module that
        # computed the value copied.
        return []

    def clear(self) -> None:
        """Forget every graph recorded so far."""
        with self.lock:
            self.graphs.clear()
            self.module_of_seq.clear()

    def _modules_of_inputs(self, node: Any) -> list[str]:
        """A node Inductor's passes made without metadata (e.g. a backward ``addmm`` fusing a
        gradient addition into a matmul) computes from nodes that have it: their modules. For the
        matmuls only the product's operands count (the addend is a gradient from elsewhere)."""
        inputs = list(getattr(node, "all_input_nodes", ()))
        target = str(getattr(node, "target", ""))
        if _MATMUL_WITH_ADDEND.search(target):
            args = getattr(node, "args", ())
            inputs = [a for a in args[1:3] if hasattr(a, "meta")] or inputs
        found: list[str] = []
        for source in inputs:
            meta = getattr(source, "meta", None) or {}
            path = _stack_path(meta.get("nn_module_stack"))
            if path is None:
                path = _stack_path(meta.get("fwd_nn_module_stack"))
            seq = meta.get("seq_nr")
            if path is None and isinstance(seq, int):
                path = self.module_of_seq.get(seq)
            if path is not None:
                found.append(path)
        return [common_ancestor(found)] if found else []

    def finished(self) -> list[dict[str, Any]]:
        """Every graph as saved beside a trace: ``{"kernels": [[key, module path], ...]}``, module paths
        relative to the compiled root (a fused kernel: its modules' deepest common ancestor)."""
        result = []
        with self.lock:
            graphs = list(self.graphs.values())
        for graph in graphs:
            kernels = []
            for k in graph.kernels:
                paths = k.modules + [self.module_of_seq[s] for s in k.seqs if s in self.module_of_seq]
                kernels.append([k.key, common_ancestor(paths)])
            result.append({"kernels": kernels})
        return result


_MAX_SEQUENCE_NUMBERS = 1 << 20
_MATMUL_WITH_ADDEND = re.compile(r"\b(?:addmm|baddbmm)\b")


def _stack_path(stack: Any) -> str | None:
    """The innermost module of an ``nn_module_stack`` (a dict, outermost first), relative to the
    compiled root; None without one."""
    if not stack:
        return None
    try:
        return module_path(str(list(stack.values())[-1][0]))
    except (AttributeError, IndexError, TypeError):
        return None


def _origin_nodes(node_schedule: Any, kernel_name: str, is_extern: bool) -> list[Any]:
    """The post-grad FX nodes behind one kernel call (as torch's own provenance tracing finds them).

    An extern kernel without an ``origin_node`` (a fallback op such as a compiled backward's
    ``aten::convolution_backward``) lists as ``origins`` every node folded into its inputs too (the
    batch-norm and ReLU backward before a convolution's): its own op's nodes are what it computes."""
    if is_extern:
        origin = getattr(node_schedule, "origin_node", None)
        if origin is not None:
            return [origin]
        origins = list(getattr(node_schedule, "origins", ()))
        key = inductor_kernel_key(kernel_name)
        own = [n for n in origins if _op_name(getattr(n, "target", None)) == key]
        return own or origins
    nodes: list[Any] = []
    for snode in node_schedule or ():
        ir_node = getattr(snode, "node", None)
        if ir_node is not None:
            nodes.extend(getattr(ir_node, "origins", ()))
    return nodes


def _is_constant(node: Any) -> bool:
    """Whether an FX node computes from no other node (``full``, ``arange``, ``scalar_tensor``)."""
    return getattr(node, "op", None) == "call_function" and not getattr(node, "all_input_nodes", True)


def _op_name(target: Any) -> str | None:
    """An FX node's aten op name (``aten.convolution_backward.default`` -> ``convolution_backward``)."""
    parts = str(target).split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "aten" else None


def _in_backward_graph() -> bool:
    """Whether Inductor is generating a backward graph now (AOTAutograd's lazy backward compile)."""
    try:
        from torch._inductor.virtualized import V

        return bool(getattr(V.graph, "is_backward", True))
    except Exception:  # outside a graph lowering: read sequence numbers as before
        return True


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


class CompileFlags:
    """The Inductor flags collecting needs, set around each compilation in the thread that compiles
    (torch keeps config per thread, and the lazy backward compile may run on autograd's thread), by
    Dynamo's compile start/end callbacks. ``torch._dynamo.reset()`` clears those callbacks:
    :meth:`ensure` registers them again (each new watcher calls it)."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.handler: Any = None

    def flags(self) -> ExitStack:
        """The flags set, in this thread, until the returned stack closes."""
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config

        stack = ExitStack()
        stack.enter_context(
            inductor_config.patch({"cpp.enable_kernel_profile": True, "fx_graph_cache": False})
        )
        stack.enter_context(functorch_config.patch({"enable_autograd_cache": False}))
        return stack

    def started(self, _args: object) -> None:
        stacks = self.local.__dict__.setdefault("stacks", [])
        stacks.append(self.flags())

    def ended(self, _args: object) -> None:
        stacks = self.local.__dict__.get("stacks")
        if stacks:
            stacks.pop().close()

    def ensure(self) -> None:
        """Register the callbacks unless they are (again after a ``torch._dynamo.reset()``)."""
        handler = self.handler
        if handler is not None and self.started not in handler.start_callbacks:
            handler.register_start_callback(self.started)
            handler.register_end_callback(self.ended)

    def install(self, undo: ExitStack) -> None:
        """Set the flags around every compilation from now on (undone by ``undo``); on a torch without
        compile callbacks, in this thread for as long as ``undo`` is open."""
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            undo.enter_context(self.flags())
            return
        self.handler = callback_handler
        self.ensure()
        undo.callback(self._remove)

    def _remove(self) -> None:
        with suppress(ValueError):  # already cleared by torch._dynamo.reset()
            self.handler.remove_start_callback(self.started)
        with suppress(ValueError):
            self.handler.remove_end_callback(self.ended)


def install(undo: ExitStack, collector: Collector, flags: CompileFlags) -> None:
    """Set the Inductor flags around compilations and wrap the provenance hook so that ``collector``
    records every kernel generated (undone by ``undo``). Raises when this torch lacks what it needs."""
    import importlib

    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    # fail early, before anything is installed, on a torch without one of the flags
    for config, name in ((inductor_config, "fx_graph_cache"), (functorch_config, "enable_autograd_cache")):
        getattr(config, name)
    inductor_config.cpp.enable_kernel_profile  # noqa: B018
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
    flags.install(undo)

    def traced(node_schedule: Any, kernel_name: str, is_extern: bool = False) -> int | None:
        with suppress(Exception):  # never let bookkeeping break a compilation
            collector.record(node_schedule, kernel_name, is_extern)
        return original(node_schedule, kernel_name, is_extern)  # type: ignore[no-any-return]

    for holder in holders:
        if getattr(holder, _PROVENANCE_FUNCTION, None) is original:
            setattr(holder, _PROVENANCE_FUNCTION, traced)
            undo.callback(setattr, holder, _PROVENANCE_FUNCTION, original)
