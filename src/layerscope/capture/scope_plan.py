"""The scope plan: before anything is installed, how each module's calls will be scoped, and why.

A module's calls are scoped by one *mechanism* on one *clock*:

- ``class wrapper``: the forward of the module's class is wrapped for the block
  (``forward_ranges.py``); the common case for eager models;
- ``hooks``: a forward pre-hook and an ``always_call`` forward hook on the instance, where a class
  wrapper cannot serve (the instance carries its own ``forward``, the model has compiled parts whose
  guards a patched class would break, or ``module_scopes="hooks"``);
- ``global hooks``: torch's global module hooks, in global mode (``model=None``), naming modules as
  they are first called;
- ``compiled call``: ``module.compile()`` runs its hooks inside the compiled call, so the scope goes
  around that call;
- ``none``: no scope (inside compiled code, where the compiler's provenance places the kernels;
  TorchScript; folded by ``depth``/``paths``).

The clock is ``marks`` (two reads of torch's event clock into a native buffer, ``module_marks.py``)
or ``ranges`` (a profiler range, an event torch records). Marks serve class wrappers only, and only
when :func:`marks_blocker` finds nothing in their way.

This module decides, once, when the block starts (:func:`plan_block`): each module's scope, which
modules fold into their ancestors (in global mode, the rule for modules found later), and whether
the scopes follow the schedule; ``scopes.py`` carries the plan out and ``Recording`` saves it in
``meta``.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from layerscope.capture import native
from layerscope.capture.compiled_modules import has_compiled_methods, is_compiled, model_modules
from layerscope.capture.options import CaptureOptions, ModuleSelection
from layerscope.model.meta import ScopePlanRecord, ScopeReason

CLASS_WRAPPER = "class wrapper"
HOOKS = "hooks"
GLOBAL_HOOKS = "global hooks"
COMPILED_CALL = "compiled call"
NO_SCOPE = "none"

MARKS = "marks"
RANGES = "ranges"


@dataclass(frozen=True)
class ModuleScope:
    """How one module's calls are scoped: mechanism, clock (None without a scope) and the reason."""

    path: str
    type_name: str
    mechanism: str
    clock: str | None
    reason: str


@dataclass(frozen=True)
class PlannedModule:
    """A module of the model with its scope; ``module`` is what the mechanism is installed on (for a
    whole-model compile, the compiled wrapper) and ``params_from`` what its parameters are read from."""

    scope: ModuleScope
    module: nn.Module
    params_from: nn.Module
    owner: type | None = None  # the class whose forward a class wrapper patches (or would have)
    in_catalog: bool = True  # gets a node in the tree (folded and TorchScript children do not)

    @property
    def runs_scope(self) -> bool:
        """Whether the scope can ever run (hooks on a container without ``forward`` never do)."""
        if self.scope.mechanism != HOOKS:
            return True
        return type(self.module).forward is not nn.Module.forward or "forward" in self.module.__dict__


@dataclass
class ScopePlan:
    """Every module's scope, decided before the block starts (global mode: modules found later)."""

    modules: list[PlannedModule] = field(default_factory=list)
    global_mode: bool = False
    marks: bool = False  # whether class wrappers use marks
    marks_reason: str = ""  # why they do, or what stood in the way
    #: Which paths get rows (``depth``/``paths``): the fold of every module, those global mode
    #: names as they are called included.
    selection: ModuleSelection = field(default_factory=ModuleSelection)

    @property
    def follows_schedule(self) -> bool:
        """Whether the scopes are removed on a schedule's wait steps. Global mode keeps torch's
        global hooks: they patch no class, and they drive the deferred steps of ``layerscope run``."""
        return not self.global_mode

    def why_folded(self, path: str) -> str | None:
        """Why ``path`` gets no row of its own, or None when it gets one."""
        return self.selection.why_folded(path)

    def __iter__(self) -> Iterator[PlannedModule]:
        return iter(self.modules)

    def kinds(self) -> str:
        """``ScopePlanRecord.kinds``: ``ranges``, ``marks`` (every scope that runs is a mark) or
        ``marks and ranges``."""
        marked = any(m.scope.clock == MARKS for m in self.modules)
        if not marked:
            return RANGES
        ranged = self.global_mode or any(m.scope.clock == RANGES and m.runs_scope for m in self.modules)
        return "marks and ranges" if ranged else MARKS

    def scopes(self, called_paths: list[tuple[str, str]] | None = None) -> list[ModuleScope]:
        """Each module's scope; in global mode, one per module called (``(path, type)`` pairs)."""
        if self.global_mode:
            reason = "global mode (model=None): torch's global module hooks name modules as they are called"
            return [ModuleScope(p, t, GLOBAL_HOOKS, RANGES, reason) for p, t in called_paths or []]
        return [m.scope for m in self.modules]

    def record(self, called_paths: list[tuple[str, str]] | None = None) -> ScopePlanRecord:
        """The plan as a profile keeps it (``ProfileMeta.capture.scope_plan``): each distinct
        reason once, each module as ``(path, type, reason index)`` in model order
        (``render/scope_table.py`` reads it)."""
        reasons: dict[ScopeReason, int] = {}
        modules: list[tuple[str, str, int]] = []
        for s in self.scopes(called_paths):
            k = reasons.setdefault(ScopeReason(s.mechanism, s.clock, s.reason), len(reasons))
            modules.append((s.path, s.type_name, k))
        return ScopePlanRecord(self.kinds(), tuple(reasons), tuple(modules))


def marks_blocker(module_scopes: str, global_mode: bool, scheduled: bool) -> str | None:
    """What keeps class wrappers from using marks, or None when marks can serve."""
    if module_scopes != "auto":
        return f"module_scopes={module_scopes!r}"
    if global_mode:
        return "global mode uses hooks"
    if scheduled:
        # Under a schedule torch drops the events of the steps it does not record; marks would have
        # to follow its cycles, and each cycle's trace comes out of torch's own exporter.
        return "a schedule: each cycle's events come from torch alone"
    if not sys.platform.startswith("linux"):
        return "not Linux (exported traces' OS thread ids are read on Linux only)"
    if native.load() is None:
        return f"the native module is not in use ({native.status().reason})"
    if not hasattr(torch._C._autograd._KinetoEvent, "activity_type"):
        return "torch < 2.5 (no native reader, and its traces' time base is not checked)"
    return None


def plan_block(model: nn.Module | None, options: CaptureOptions) -> ScopePlan:
    """The plan of one profiling block, made when it starts: global mode is ``model=None``."""
    blocker = marks_blocker(options.module_scopes, model is None, options.scheduled)
    return plan_scopes(model, options.selection, options.module_scopes, blocker)


def plan_scopes(
    model: nn.Module | None, selection: ModuleSelection, module_scopes: str, marks_blocked_by: str | None
) -> ScopePlan:
    """Decide every module's mechanism and clock (see the module docstring), installing nothing."""
    if model is None:
        return ScopePlan(global_mode=True, marks_reason=marks_blocked_by or "", selection=selection)
    plan = ScopePlan(
        marks=marks_blocked_by is None,
        marks_reason=marks_blocked_by or "the native module's marks",
        selection=selection,
    )
    class_wrappers_blocked = _class_wrappers_blocked(model, module_scopes)
    compiled_roots: list[str] = []
    for entry in model_modules(model):
        wrapper_scoped = selection.why_folded(entry.path) is None and not _inside(entry.path, compiled_roots)
        if entry.is_wrapper and wrapper_scoped:
            reason = "torch.compile(module): the wrapper's hooks run outside the compiled region"
            scope = ModuleScope(entry.path, type(entry.inner).__name__, HOOKS, RANGES, reason)
            plan.modules.append(PlannedModule(scope, entry.scoped, entry.inner))
            compiled_roots.append(entry.path)
            continue
        planned = _plan_module(
            entry.path, entry.inner, selection, plan, compiled_roots, class_wrappers_blocked
        )
        plan.modules.append(planned)
        if planned.scope.mechanism == COMPILED_CALL or has_compiled_methods(entry.inner):
            compiled_roots.append(entry.path)
    _hooks_for_watched_owners(plan)
    return plan


def _hooks_for_watched_owners(plan: ScopePlan) -> None:
    """A class wrapper patches the owner class for every module that inherits its forward: where
    one of them watches that forward (``forward_identity_watcher``), none of them may patch it."""
    watched = {m.owner for m in plan.modules if m.scope.mechanism == HOOKS and m.owner is not None}
    if not watched:
        return
    for k, m in enumerate(plan.modules):
        if m.scope.mechanism == CLASS_WRAPPER and m.owner in watched:
            assert m.owner is not None
            reason = f"{m.owner.__name__}.forward is watched by another module's class"
            scope = dataclasses.replace(m.scope, mechanism=HOOKS, clock=RANGES, reason=reason)
            plan.modules[k] = dataclasses.replace(m, scope=scope, owner=None)


def _inside(path: str, compiled_roots: list[str]) -> bool:
    """Whether ``path`` runs inside the compiled code of one of ``compiled_roots``."""
    return any(path != root and (root == "" or path.startswith(f"{root}.")) for root in compiled_roots)


def _class_wrappers_blocked(model: nn.Module, module_scopes: str) -> str | None:
    if module_scopes == "hooks":
        return "module_scopes='hooks'"
    if is_compiled(model):
        # Dynamo guards on the forward functions it inlined: a patched class would cost recompiles.
        return "the model has compiled parts (a patched class would make them recompile)"
    return None


def _plan_module(
    path: str,
    module: nn.Module,
    selection: ModuleSelection,
    plan: ScopePlan,
    compiled_roots: list[str],
    class_wrappers_blocked: str | None,
) -> PlannedModule:
    type_name = type(module).__name__

    def planned(mechanism: str, clock: str | None, reason: str, **extra: Any) -> PlannedModule:
        return PlannedModule(ModuleScope(path, type_name, mechanism, clock, reason), module, module, **extra)

    folded = selection.why_folded(path)
    if folded is not None:
        return planned(NO_SCOPE, None, folded, in_catalog=False)
    if isinstance(module, torch.jit.ScriptModule):
        # A scripted submodule's work stays in its parent's self time; a scripted root is the tree.
        return planned(NO_SCOPE, None, "TorchScript runs no Python hooks", in_catalog=path == "")
    if _inside(path, compiled_roots):
        # Hooks would not run there, and Dynamo guards on their ids (a recompile per module).
        return planned(NO_SCOPE, None, "inside compiled code: kernels placed by the compiler's provenance")
    if getattr(module, "_compiled_call_impl", None) is not None:
        why = "module.compile(): its hooks would run inside the compiled call"
        return planned(COMPILED_CALL, RANGES, why)
    if has_compiled_methods(module):
        # e.g. Lightning's from_compiled: the step that calls forward is compiled too, so even a
        # hook on this module would run inside compiled code; its graph calls go to it by the
        # compiler's provenance.
        return planned(
            NO_SCOPE, None, "forward compiled on the instance: no scope runs outside compiled code"
        )
    if class_wrappers_blocked is not None:
        return planned(HOOKS, RANGES, class_wrappers_blocked)
    owner, why_not = forward_owner(module)
    if owner is None:
        return planned(HOOKS, RANGES, why_not)
    watcher = forward_identity_watcher(type(module), owner)
    if watcher is not None:
        return planned(HOOKS, RANGES, watcher, owner=owner)  # the owner: see _hooks_for_watched_owners
    clock = MARKS if plan.marks else RANGES
    return planned(CLASS_WRAPPER, clock, plan.marks_reason, owner=owner)


def forward_owner(module: nn.Module) -> tuple[type | None, str]:
    """The class in ``module``'s MRO whose ``forward`` runs, or (None, why a class wrapper cannot
    serve): scripted modules (TorchScript calls its compiled method), modules whose instance carries
    its own ``forward`` (a class wrapper would never run for them) and modules with no forward of
    their own."""
    if isinstance(module, torch.jit.ScriptModule):
        return None, "TorchScript runs no Python hooks"
    if "forward" in module.__dict__:
        return None, "the instance carries its own forward (a class wrapper would not run)"
    if isinstance(module, torch.fx.GraphModule):
        # recompile() assigns the class's forward, and a lazy graph module's forward compares itself
        # with what its class holds (it would recurse forever under a class wrapper)
        return None, "an fx GraphModule manages its class's forward itself"
    for cls in type(module).__mro__:
        if "forward" in cls.__dict__:
            forward = cls.__dict__["forward"]
            if cls is nn.Module or not callable(forward):
                return None, "no forward of its own (a container: never called)"
            if not isinstance(forward, types.FunctionType):
                # a builtin, staticmethod or partial is not bound to self: a wrapper function would be
                return None, "its forward is not a plain function (a class wrapper would pass self to it)"
            return cls, ""
    return None, "no forward of its own (a container: never called)"


def forward_identity_watcher(cls: type, owner: type) -> str | None:
    """Why patching ``owner.forward`` would be visible to ``cls``'s own code, or None.

    A class wrapper replaces what ``type(self).forward`` is. Code that looks that up and compares it
    with itself takes another path once it is patched: transformers' gradient checkpointing
    (``GradientCheckpointingLayer``) checkpoints only when ``type(self).forward is
    forward_with_checkpointing``, so a patched class silently stops checkpointing. Such modules get
    hooks, which leave the class alone. Read from the code objects of the forward that runs (and
    every function it wraps, through ``__wrapped__``) and of any ``__call__`` the class defines: a
    function that reads ``forward`` off ``type(...)`` or ``__class__``, or that closes over itself.
    """
    functions: list[tuple[str, Any]] = [(f"{owner.__name__}.forward", owner.__dict__["forward"])]
    for base in cls.__mro__:
        if base is nn.Module:
            break
        if "__call__" in base.__dict__:
            functions.append((f"{base.__name__}.__call__", base.__dict__["__call__"]))
    for label, function in functions:
        if any(_reads_class_forward(f) for f in _wrapped_chain(function)):
            return (
                f"{label} checks which forward its class holds (a class wrapper would change "
                "what it does, e.g. turn gradient checkpointing off)"
            )
    return None


def _wrapped_chain(function: Any) -> Iterator[Any]:
    """``function`` and every function under it through ``__wrapped__`` (functools.wraps), at most
    as deep as ``inspect.unwrap`` goes; an object whose attributes raise ends the chain."""
    seen: list[Any] = []  # kept alive, so no id is reused while the chain is walked
    while function is not None and all(f is not function for f in seen) and len(seen) < 100:
        seen.append(function)
        yield function
        try:
            function = getattr(function, "__wrapped__", None)
        except Exception:
            return


def _reads_class_forward(function: Any) -> bool:
    """Whether ``function``'s code looks ``forward`` up on a class (``type(self).forward``,
    ``self.__class__.forward``, ``getattr(type(self), "forward")``) or closes over itself."""
    code = getattr(function, "__code__", None)
    if code is None:
        return False
    names = set(code.co_names) | {c for c in code.co_consts if isinstance(c, str)}
    if "forward" in names and names & {"type", "__class__"}:
        return True
    cells = getattr(function, "__closure__", None) or ()
    return any(_cell_holds(cell, function) for cell in cells)


def _cell_holds(cell: Any, value: Any) -> bool:
    """Whether closure ``cell`` holds ``value`` (an empty cell holds nothing)."""
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell (a name not bound yet)
        return False
