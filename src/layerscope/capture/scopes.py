"""Module scopes: a named scope ``ls:<path>:<Type>`` around every module call.

With the native module built, class-wrapped modules are scoped by two marks on torch's clock
(``capture/module_marks.py``); everywhere else, and without it, by a profiler range.

Ranges are torch's C++ ``_RecordFunctionFast`` (about 0.7 µs a pair under the profiler, against ~11 µs
for ``record_function``, which also records its own enter/exit ops). Two ways to open them:

- eager models (the common case): the forward of each module's class is wrapped for the block
  (``capture/forward_ranges.py``, ~1.1-1.6 µs per module call);
- hooks, where a class wrapper cannot serve or is unsafe: global mode (``model=None``: modules are
  not known in advance), models with compiled parts (Dynamo guards on the functions it inlined, so a
  patched class would cost recompiles), scripted modules and modules whose instance carries its own
  ``forward``. The pre-hook opens the range, the forward hook (``always_call=True``) closes it even
  when the forward raises. Open ranges live on a per-thread stack, so two threads can run the model.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from layerscope.attribution.catalog import ModuleInfo
from layerscope.capture.compiled import unwrap_compiled
from layerscope.capture.forward_ranges import ForwardRanges
from layerscope.capture.module_marks import ModuleMarks
from layerscope.events.module_ranges import module_range_name

_RecordFunctionFast = torch._C._profiler._RecordFunctionFast
# Inside a region torch.compile traces, the hooks must do nothing: Dynamo folds this call to True and
# traces no range (a range there would be a graph break). Such modules are named by the compiler's
# module stacks instead (capture/compiled.py).
_is_compiling = torch.compiler.is_compiling
GLOBAL_ROOT_TYPE = "(all modules)"


#: Tensor shapes as taken on a module's first call; formatted only when the catalog is made.
RawShapes = list[torch.Size] | None


def shapes_of(value: Any) -> RawShapes:
    """Shapes of the tensors in a hook's args/output (None when no tensor). Kept raw: formatting them
    is most of the cost, and it can wait until the block has ended (:func:`format_shapes`)."""
    found: list[torch.Size] = []

    def visit(v: Any, depth: int) -> None:
        if isinstance(v, torch.Tensor):
            found.append(v.shape)
        elif depth < 3 and isinstance(v, list | tuple):
            for item in v:
                visit(item, depth + 1)
        elif depth < 3 and isinstance(v, dict):
            for item in v.values():
                visit(item, depth + 1)

    visit(value, 0)
    return found or None


def format_shapes(shapes: RawShapes) -> str | None:
    """The compact string of :func:`shapes_of`'s result: ``[[2, 3], [4]]``."""
    return str([list(s) for s in shapes]) if shapes else None


class ModuleScopes:
    """Installs and removes the range hooks; knows every hooked module's qualified path.

    With ``model`` given, hooks go on the model's modules (each instance once, under its first path).
    With ``model=None``, torch's global module hooks name modules as they are first called: a module
    called with no layerscope scope open is a top-level root named by its class; children are named
    by their attribute path under it.
    """

    def __init__(
        self,
        model: nn.Module | None,
        paths: Iterable[str] | None = None,
        depth: int | None = None,
        marks: ModuleMarks | None = None,
    ) -> None:
        self.model = model
        self.paths = tuple(paths) if paths is not None else None
        self.depth = depth
        self._local = threading.local()
        self._handles: list[RemovableHandle] = []
        self._compiled_calls: list[tuple[nn.Module, Any]] = []  # (module, its own compiled call)
        self._names: dict[int, str | None] = {}  # id(module) -> range name (None: folded, no range)
        self._paths: dict[int, str] = {}  # id(module) -> qualified path
        self._modules: dict[str, nn.Module] = {}  # path -> module (kept for params at the end)
        self._first_shapes: dict[str, tuple[RawShapes, RawShapes]] = {}
        self._seen: set[int] = set()  # modules whose first call's input shapes are recorded
        self._awaiting_output: set[int] = set()  # ... and whose output shapes are still to come
        self._lock = threading.Lock()
        self._root_names: set[str] = set()
        # Class-wrapped modules get marks when given (module_marks.py); hooked ones always ranges.
        self._forward_ranges = ForwardRanges(self._first_forward, marks)
        self._hooked_callable = 0  # hooked modules that can run (their scopes are ranges)
        self._marks_on = marks is not None
        #: Called before a top-level module call (no layerscope scope open on the thread), in global
        #: mode; ``layerscope run`` ends deferred training steps there.
        self.before_top_level_call: Callable[[], None] | None = None

    # ----- selection --------------------------------------------------------------------------------
    def keeps(self, path: str) -> bool:
        """Whether ``path`` gets its own row (``depth`` and ``paths`` fold the others upwards)."""
        if path == "":
            return True
        if self.depth is not None and path.count(".") + 1 > self.depth:
            return False
        if self.paths is None:
            return True
        return any(path == p or path.startswith(p + ".") or p.startswith(path + ".") for p in self.paths)

    # ----- install / remove ----------------------------------------------------------------------
    def install(self, force_hooks: bool = False) -> None:
        """Open ranges on the modules (call :meth:`remove` in a ``finally``).

        ``force_hooks`` uses hooks even where class wrappers could serve (benchmarks, tests).
        """
        if self.model is None:
            from torch.nn.modules import module as module_mod

            self._handles.append(module_mod.register_module_forward_pre_hook(self._global_pre))
            self._handles.append(module_mod.register_module_forward_hook(self._post, always_call=True))
            return
        model = self.model
        inner = unwrap_compiled(model)
        whole_model_compiled = inner is not model
        if whole_model_compiled:
            # torch.compile(model): the wrapper's hooks run outside the compiled region and open the
            # root's range; the modules inside keep their eager paths (no "_orig_mod." prefix).
            self._register(model, "", type_name=type(inner).__name__, params_from=inner)
            self._hook(model)
        compiled_roots: list[str] = []  # modules with their own compiled call (module.compile())
        # Class wrappers only where nothing is compiled: Dynamo guards on the forward functions it
        # inlined, and a patched class would make compiled code recompile.
        wrap_classes = (
            not force_hooks
            and not whole_model_compiled
            and not any(getattr(m, "_compiled_call_impl", None) is not None for m in inner.modules())
        )
        for path, module in inner.named_modules():
            if not self.keeps(path) or (whole_model_compiled and path == ""):
                continue
            if isinstance(module, torch.jit.ScriptModule):
                # TorchScript runs no Python hooks and takes no patches: a scripted submodule's work
                # stays in its parent's self time; a scripted root is a tree of the root alone.
                if not path:
                    self._register(module, path)
                continue
            self._register(module, path)
            # Modules that run inside compiled code get no hooks: they would not run there, and Dynamo
            # guards on the hooks' ids (different per module), so hooks would cost recompiles.
            inside = whole_model_compiled or any(
                path != root and (root == "" or path.startswith(f"{root}.")) for root in compiled_roots
            )
            if inside:
                continue
            if getattr(module, "_compiled_call_impl", None) is not None:
                compiled_roots.append(path)
                self._wrap_compiled_call(module)
            elif not wrap_classes:
                self._hook(module)
            else:
                name = self._names[id(module)]
                if name is not None and not self._forward_ranges.add(module, name):
                    self._hook(module)

    def scope_kinds(self) -> str:
        """How module calls are scoped, once installed: ``"ranges"``, ``"marks"`` (marks are on and
        every scoped module is class-wrapped) or ``"marks and ranges"`` (some need hooks)."""
        wrapped = self._forward_ranges.module_count if self._marks_on else 0
        hooked = bool(self._hooked_callable or self._compiled_calls or self.model is None)
        if not wrapped:
            return "ranges"
        return "marks and ranges" if hooked else "marks"

    def _hook(self, module: nn.Module) -> None:
        # Containers without a forward (ModuleList, ModuleDict) get hooks that never run.
        self._hooked_callable += type(module).forward is not nn.Module.forward
        self._handles.append(module.register_forward_pre_hook(self._pre))
        self._handles.append(module.register_forward_hook(self._post, always_call=True))

    def _wrap_compiled_call(self, module: nn.Module) -> None:
        """``module.compile()``: its hooks run inside the compiled call, so open its range around it."""
        compiled: Callable[..., Any] = module._compiled_call_impl  # type: ignore[assignment]
        pre, post = self._pre, self._post

        def call(*args: Any, **kwargs: Any) -> Any:
            pre(module, args)
            try:
                output = compiled(*args, **kwargs)
            except BaseException:
                post(module, args, None)
                raise
            post(module, args, output)
            return output

        module._compiled_call_impl = call
        self._compiled_calls.append((module, compiled))

    def remove(self) -> None:
        """Remove every hook and class wrapper; close ranges this thread still has open (after an
        interrupt)."""
        self._forward_ranges.remove()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        while self._compiled_calls:
            module, compiled = self._compiled_calls.pop()
            module._compiled_call_impl = compiled
        stack: list[tuple[int, Any]] | None = getattr(self._local, "stack", None)
        while stack:
            stack.pop()[1].__exit__(None, None, None)

    def _register(
        self, module: nn.Module, path: str, type_name: str | None = None, params_from: nn.Module | None = None
    ) -> None:
        self._paths[id(module)] = path
        if self.keeps(path):
            self._names[id(module)] = module_range_name(path, type_name or type(module).__name__)
            self._modules[path] = params_from if params_from is not None else module
        else:
            self._names[id(module)] = None

    # ----- hooks (hot path: keep them lean) ------------------------------------------------------
    def _stack(self) -> list[tuple[int, Any]]:
        local = self._local
        try:
            return local.stack  # type: ignore[no-any-return]
        except AttributeError:
            local.stack = []
            return local.stack  # type: ignore[no-any-return]

    def _pre(self, module: nn.Module, args: Any) -> None:
        if _is_compiling():
            return
        key = id(module)
        name = self._names[key]
        if name is None:
            return
        record = _RecordFunctionFast(name)
        record.__enter__()
        self._stack().append((key, record))
        if key not in self._seen:
            self._seen.add(key)
            self._awaiting_output.add(key)
            self._first_shapes[self._paths[key]] = (shapes_of(args), None)

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if _is_compiling():
            return
        key = id(module)
        stack = self._stack()
        if stack and stack[-1][0] == key:  # the common case: this module's range is on top
            stack.pop()[1].__exit__(None, None, None)
        elif self._names.get(key) is None or not any(k == key for k, _ in stack):
            return  # a folded module, or hooks installed while this call was already running
        else:
            # Pop down to this module's range: a child whose hook never ran must not stay open.
            while stack:
                top_key, record = stack.pop()
                record.__exit__(None, None, None)
                if top_key == key:
                    break
        if key in self._awaiting_output:
            self._awaiting_output.discard(key)
            path = self._paths[key]
            self._first_shapes[path] = (self._first_shapes[path][0], shapes_of(output))

    def _first_forward(
        self,
        module: nn.Module,
        scoped_forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """A class-wrapped module's first call: its scoped forward, plus its input and output shapes."""
        path = self._paths[id(module)]
        inputs = shapes_of(args)
        self._first_shapes[path] = (inputs, None)
        output = scoped_forward(module, *args, **kwargs)
        self._first_shapes[path] = (inputs, shapes_of(output))
        return output

    def _global_pre(self, module: nn.Module, args: Any) -> None:
        if _is_compiling():
            return
        if self.before_top_level_call is not None and not self._stack():
            self.before_top_level_call()
        if id(module) not in self._names:
            with self._lock:
                if id(module) not in self._names:
                    self._name_new_module(module)
        self._pre(module, args)

    def _name_new_module(self, module: nn.Module) -> None:
        stack = self._stack()
        parent_path: str | None = self._paths.get(stack[-1][0]) if stack else None
        if parent_path is None:
            base = type(module).__name__
            name, k = base, 1
            while name in self._root_names:
                name, k = f"{base}_{k}", k + 1
            self._root_names.add(name)
            for sub, child in module.named_modules(prefix=name):
                if id(child) not in self._names:
                    self._register(child, sub)
            return
        # Not a registered child of the open module: name it by class under that module.
        base = f"{parent_path}.{type(module).__name__}"
        name, k = base, 1
        while name in self._modules:
            name, k = f"{base}_{k}", k + 1
        for sub, child in module.named_modules(prefix=name):
            if id(child) not in self._names:
                self._register(child, sub)

    # ----- results -----------------------------------------------------------------------------
    def catalog(self) -> list[ModuleInfo]:
        """The module catalog for attribution (root first); call after the run."""
        infos: list[ModuleInfo] = []
        if self.model is not None:
            kept = list(self._modules)
            parent_of = {p: _nearest_kept_parent(p, self._modules) for p in kept}
            totals = {p: _param_count(self._modules[p], recurse=True) for p in kept}
            children_total: dict[str, int] = {}
            for c in kept:
                if c:
                    children_total[parent_of[c]] = children_total.get(parent_of[c], 0) + totals[c]
            for p in kept:
                own = totals[p] - children_total.get(p, 0)
                shapes = self._first_shapes.get(p, (None, None))
                infos.append(
                    ModuleInfo(
                        path=p,
                        type_name=type(self._modules[p]).__name__,
                        parent=None if p == "" else parent_of[p],
                        params=max(own, 0),
                        params_total=totals[p],
                        input_shapes=format_shapes(shapes[0]),
                        output_shapes=format_shapes(shapes[1]),
                        source=forward_source(self._modules[p]),
                    )
                )
            return infos
        # Global mode: a synthetic root "" holds the top-level modules.
        called = dict(self._modules)
        totals = {p: _param_count(m, recurse=True) for p, m in called.items()}
        root_total = sum(totals[r] for r in self._root_names if r in totals)
        infos.append(
            ModuleInfo(path="", type_name=GLOBAL_ROOT_TYPE, parent=None, params=0, params_total=root_total)
        )
        for p, m in called.items():
            parent = _nearest_kept_parent(p, called) if p not in self._root_names else ""
            shapes = self._first_shapes.get(p, (None, None))
            infos.append(
                ModuleInfo(
                    path=p,
                    type_name=type(m).__name__,
                    parent=parent,
                    params=_param_count(m, recurse=False),
                    params_total=totals[p],
                    input_shapes=format_shapes(shapes[0]),
                    output_shapes=format_shapes(shapes[1]),
                    source=forward_source(m),
                )
            )
        return infos


def forward_source(module: nn.Module) -> str | None:
    """Where ``module``'s class defines ``forward``: ``path/file.py:LINE``, the path relative to
    the sys.path entry it was imported from (as torch's tracer writes frames); None when unknown."""
    owner_forward = getattr(type(module), "forward", None)
    if owner_forward is None:
        return None
    # inside the block the class may carry layerscope's wrapper, which names the original
    code = getattr(inspect.unwrap(owner_forward), "__code__", None)
    if code is None:
        return None
    return f"{_short_path(code.co_filename)}:{code.co_firstlineno}"


def _short_path(filename: str) -> str:
    best = ""
    for entry in sys.path:
        root = os.path.join(os.path.abspath(entry or "."), "")
        if filename.startswith(root) and len(root) > len(best):
            best = root
    return filename[len(best) :] if best else filename


def _nearest_kept_parent(path: str, kept: dict[str, Any]) -> str:
    p = path
    while p:
        p = p.rpartition(".")[0]
        if p in kept:
            return p
    return ""


def _param_count(module: nn.Module, recurse: bool) -> int:
    return sum(p.numel() for p in module.parameters(recurse=recurse))
