"""Module scopes: a named scope ``ls:<path>:<Type>`` around every module call, as the plan says.

``scope_plan.py`` decides each module's mechanism and clock; this module carries that out and undoes
it: class wrappers (``forward_ranges.py``, marks or ranges), per-module hooks, torch's global hooks,
and the wrapper around a ``module.compile()``d call. Hooks open torch's C++ ``_RecordFunctionFast``
ranges (``record_function`` also records its own enter/exit ops); the pre-hook opens the range, the
forward hook (``always_call=True``) closes it even when the forward raises. Open ranges live on a
per-thread stack, so two threads can run the model.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from layerscope.attribution.catalog import ModuleInfo
from layerscope.capture.compiled_modules import global_mode_paths
from layerscope.capture.forward_ranges import ForwardRanges
from layerscope.capture.module_catalog import RawShapes, global_catalog, model_catalog, shapes_of
from layerscope.capture.module_marks import ModuleMarks
from layerscope.capture.options import ModuleSelection
from layerscope.capture.scope_plan import (
    CLASS_WRAPPER,
    COMPILED_CALL,
    HOOKS,
    ScopePlan,
    marks_blocker,
    plan_scopes,
)
from layerscope.events.names import module_range_name

_RecordFunctionFast = torch._C._profiler._RecordFunctionFast
# Inside a region torch.compile traces, the hooks must do nothing: Dynamo folds this call to True and
# traces no range (a range there would be a graph break). Such modules are named by the compiler's
# module stacks instead (capture/compiled.py).
_is_compiling = torch.compiler.is_compiling


class ModuleScopes:
    """Installs and removes the scopes of one :class:`ScopePlan`; knows every scoped module's path.

    With a model, the plan lists its modules. In global mode, torch's global module hooks name
    modules as they are first called: a module called with no layerscope scope open is a top-level
    root named by its class; children are named by their attribute path under it.
    """

    def __init__(self, plan: ScopePlan, marks: ModuleMarks | None = None) -> None:
        if plan.marks and marks is None:
            raise ValueError("the plan uses marks: pass the ModuleMarks that record them")
        self.plan = plan
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
        self._installed = False
        # Not a bound method of ours: the class wrappers must not hold this object (and through its
        # plan the model) in a reference cycle.
        first_forward = _FirstForward(self._paths, self._first_shapes)
        self._forward_ranges = ForwardRanges(first_forward, marks if plan.marks else None)
        #: Called before a top-level module call (no layerscope scope open on the thread), in global
        #: mode; ``layerscope run`` ends deferred training steps there.
        self.before_top_level_call: Callable[[], None] | None = None

    @classmethod
    def for_model(
        cls, model: nn.Module, module_scopes: str = "auto", marks: ModuleMarks | None = None
    ) -> ModuleScopes:
        """Scopes for ``model`` planned outside a session (benchmarks, tests): class wrappers use
        ``marks`` when given (and ``module_scopes`` is ``auto``), else ranges."""
        blocker = marks_blocker(module_scopes, False, False) if module_scopes != "auto" else None
        if marks is None and blocker is None:
            blocker = "no marks given"
        plan = plan_scopes(model, ModuleSelection(), module_scopes, blocker)
        return cls(plan, marks=marks)

    # ----- install / remove ----------------------------------------------------------------------
    @property
    def installed(self) -> bool:
        """Whether the plan's scopes are in place (between :meth:`install` and :meth:`remove`)."""
        return self._installed

    def install(self) -> None:
        """Install every scope of the plan (call :meth:`remove` in a ``finally``); again after
        :meth:`remove` too (a schedule's wait steps run without scopes)."""
        self._installed = True
        if self.plan.global_mode:
            from torch.nn.modules import module as module_mod

            self._handles.append(module_mod.register_module_forward_pre_hook(self._global_pre))
            self._handles.append(module_mod.register_module_forward_hook(self._post, always_call=True))
            return
        for planned in self.plan:
            if not planned.in_catalog:
                continue
            scope, module = planned.scope, planned.module
            # in the catalog: the plan kept it (folded modules are not)
            self._register(module, scope.path, True, scope.type_name, planned.params_from)
            if scope.mechanism == HOOKS:
                self._hook(module)
            elif scope.mechanism == COMPILED_CALL:
                self._wrap_compiled_call(module)
            elif scope.mechanism == CLASS_WRAPPER:
                assert planned.owner is not None
                self._forward_ranges.add(module, self._name_of(module), planned.owner)

    def _hook(self, module: nn.Module) -> None:
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
        self._installed = False
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
        self,
        module: nn.Module,
        path: str,
        kept: bool,
        type_name: str | None = None,
        params_from: nn.Module | None = None,
    ) -> None:
        self._paths[id(module)] = path
        if kept:
            self._names[id(module)] = module_range_name(path, type_name or type(module).__name__)
            self._modules[path] = params_from if params_from is not None else module
        else:
            self._names[id(module)] = None

    def _name_of(self, module: nn.Module) -> str:
        name = self._names[id(module)]
        assert name is not None, "only kept modules are scoped"
        return name

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

    def _global_pre(self, module: nn.Module, args: Any) -> None:
        if _is_compiling():
            return
        if self.before_top_level_call is not None and not self._stack():
            self.before_top_level_call()
            if not self._handles:  # the session stopped there: this call runs unprofiled
                return
        if id(module) not in self._names:
            with self._lock:
                if id(module) not in self._names:
                    self._name_new_module(module)
        self._pre(module, args)

    def _name_new_module(self, module: nn.Module) -> None:
        stack = self._stack()
        parent_path: str | None = self._paths.get(stack[-1][0]) if stack else None
        taken = self._root_names if parent_path is None else self._modules
        name, found = global_mode_paths(
            module, parent_path, taken.__contains__, lambda m: id(m) in self._names
        )
        if parent_path is None:
            self._root_names.add(name)
        for entry, path in found:
            kept = self.plan.why_folded(path) is None  # the plan's rule, for a module found now
            self._register(entry.scoped, path, kept, type(entry.inner).__name__, entry.inner)
            if entry.is_wrapper:
                # The wrapper's range stands for the module it compiles; were that module ever run
                # eagerly (a graph break), its children's ranges still name their paths.
                self._paths[id(entry.inner)] = path
                self._names[id(entry.inner)] = None

    # ----- results -----------------------------------------------------------------------------
    def catalog(self) -> list[ModuleInfo]:
        """The module catalog for attribution (root first); call after the run."""
        if self.plan.global_mode:
            return global_catalog(dict(self._modules), self._root_names, self._first_shapes)
        return model_catalog(self._modules, self._first_shapes)

    def called_modules(self) -> list[tuple[str, str]]:
        """(path, type) of every module with a row; in global mode, those called so far."""
        return [(p, type(m).__name__) for p, m in self._modules.items()]


class _FirstForward:
    """A class-wrapped module's first call: its scoped forward, plus its input and output shapes
    (written into the scopes' ``first_shapes`` by the module's path)."""

    def __init__(self, paths: dict[int, str], first_shapes: dict[str, tuple[RawShapes, RawShapes]]) -> None:
        self._paths = paths
        self._first_shapes = first_shapes

    def __call__(
        self,
        module: nn.Module,
        scoped_forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run ``scoped_forward`` for ``module``'s first call, keeping its input and output shapes."""
        path = self._paths[id(module)]
        inputs = shapes_of(args)
        self._first_shapes[path] = (inputs, None)
        output = scoped_forward(module, *args, **kwargs)
        self._first_shapes[path] = (inputs, shapes_of(output))
        return output
