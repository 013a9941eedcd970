"""Compiled graphs: the kernels run inside a ``## Call CompiledFxGraph ##`` range go to their modules.

Inside a compiled region no module range exists, so after the sweep every kernel there sits in the
bucket of the module whose compiled call runs the graph (the compiled root). When capture learnt the
graph at compile time (``compiled_graphs``: per graph, its kernels in call order, each with
the module path relative to the compiled root), the direct children of each graph range are matched,
in order, against those kernels and moved to ``<root path>.<kernel's module>`` in the same phase;
their own children follow them. Which graph a range ran is found by matching too (the profiler names
every graph call alike when Inductor's cache is off): the graph that matches the most kernels wins.

The rule for a kernel fused from nodes of several modules is decided at capture: the deepest common
ancestor of their modules. Everything still adds up: only the bucket of whole spans changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from layerscope.attribution.buckets import Buckets
from layerscope.attribution.catalog import GLOBAL_ROOT_TYPE, ModuleInfo
from layerscope.model.meta import CompileReport
from layerscope.model.profile import Phase

LABEL_COMPILING = "(torch.compile: compiling)"
_GRAPH_PREFIX = re.compile(r"graph_\d+_")
# How far ahead a matched kernel may be: extern kernels that record no op of their own are skipped.
_LOOKAHEAD = 8


def kernel_key(name: str) -> str:
    """A profiler span's kernel name as capture recorded it (``graph_0_cpp_fused_gelu_0`` ->
    ``cpp_fused_gelu_0``, ``aten::mm`` -> ``mm``)."""
    if "::" in name:
        return name.rsplit("::", 1)[1]
    found = _GRAPH_PREFIX.match(name)
    return name[found.end() :] if found else name


@dataclass(frozen=True)
class CompiledGraph:
    """One compiled graph: its kernels' keys and module paths (relative to the compiled root)."""

    keys: tuple[str, ...]
    modules: tuple[str, ...]

    @staticmethod
    def from_meta(entry: Any) -> CompiledGraph | None:
        """Read one entry of a ``compiled_graphs`` list; None when malformed."""
        try:
            kernels = [(str(k), str(m)) for k, m in entry["kernels"]]
        except (KeyError, TypeError, ValueError):
            return None
        return CompiledGraph(tuple(k for k, _ in kernels), tuple(m for _, m in kernels))


def graphs_from_meta(entries: Any) -> list[CompiledGraph]:
    """The well-formed graphs of a ``compiled_graphs`` list (anything else: none)."""
    if not isinstance(entries, list):
        return []
    found = (CompiledGraph.from_meta(e) for e in entries)
    return [g for g in found if g is not None and g.keys]


def _match(child_keys: tuple[str, ...], graph: CompiledGraph) -> list[int]:
    """For each child, the index of the graph kernel it is (-1: not a kernel of the graph), greedy
    in call order."""
    result = [-1] * len(child_keys)
    j = 0
    keys = graph.keys
    for c, key in enumerate(child_keys):
        for k in range(j, min(j + _LOOKAHEAD, len(keys))):
            if keys[k] == key:
                result[c] = k
                j = k + 1
                break
    return result


def _best_graph(
    child_keys: tuple[str, ...], graphs: list[CompiledGraph]
) -> tuple[CompiledGraph, list[int]] | None:
    """The graph a call ran: most of its kernels must be among the call's children, in order; the
    most kernels matched wins, then the fewest of the graph's kernels left unmatched, then the most
    recently compiled graph (a process may hold graphs of other models with the same kernels)."""
    best: tuple[tuple[int, int, int], CompiledGraph, list[int]] | None = None
    for position, graph in enumerate(graphs):
        matched = _match(child_keys, graph)
        score = sum(1 for m in matched if m >= 0)
        if not score or score * 2 < len(graph.keys):
            continue
        rank = (score, score - len(graph.keys), position)
        if best is None or rank > best[0]:
            best = (rank, graph, matched)
    return None if best is None else (best[1], best[2])


def resolve_path(path: str, index: dict[str, int]) -> int:
    """The catalog index of ``path``, or of its deepest ancestor in the catalog."""
    p = path
    while True:
        found = index.get(p)
        if found is not None:
            return found
        if not p:
            return -1
        p = p.rpartition(".")[0]


@dataclass
class CompiledAttribution:
    """What moving kernels to their modules did: spans moved, graph calls matched or not."""

    moved: int = 0
    graph_calls: int = 0
    matched_calls: int = 0
    #: kernel spans matched to a kernel of their graph (``moved`` of them left the compiled module)
    matched_kernels: int = 0
    #: module paths kernels were learnt for that have no node of their own in the tree (folded by
    #: ``depth``/``paths``, or not a module of this model), with how many kernel spans named each;
    #: those kernels went to the nearest ancestor in the tree
    not_in_tree: dict[str, int] = field(default_factory=dict)

    def report(self) -> CompileReport:
        """What a profile keeps of it (``ProfileMeta.compiled``): graph calls, those matched, kernel
        spans matched, those placed below the compiled module, and the paths not in the tree (the
        most named first, at most :data:`MAX_PATHS_SAVED`)."""
        ranked = sorted(self.not_in_tree.items(), key=lambda item: (-item[1], item[0]))
        return CompileReport(
            graph_calls=self.graph_calls,
            mapped_graph_calls=self.matched_calls,
            kernels_matched=self.matched_kernels,
            kernels_placed=self.moved,
            kernels_not_in_tree=sum(self.not_in_tree.values()),
            paths_not_in_tree=dict(ranked[:MAX_PATHS_SAVED]),
        )


#: Paths not in the tree kept in a profile's meta (the rest are counted only).
MAX_PATHS_SAVED = 8


def attribute_compiled_kernels(
    table: Any,
    order: np.ndarray,
    parents: np.ndarray,
    buckets_of: np.ndarray,
    graph_spans: list[int],
    graphs: list[CompiledGraph],
    catalog: list[ModuleInfo],
    buckets: Buckets,
    module_calls: list[int],
) -> CompiledAttribution:
    """Move the kernels of every matched graph call to their modules (``buckets_of``, each span's
    bucket, is changed in place, children follow their parents) and count a call for each module
    that ran a kernel."""
    result = CompiledAttribution(graph_calls=len(graph_spans))
    if not graph_spans or not graphs:
        return result
    # as lists: the matching below reads and changes one span at a time
    parent, bucket = parents.tolist(), buckets_of.tolist()
    index = {info.path: i for i, info in enumerate(catalog)}
    names = table.names
    span_name = table.span_name
    in_time_order = order.tolist()
    children = _graph_children(in_time_order, parent, graph_spans)
    cache: dict[tuple[str, ...], tuple[CompiledGraph, list[int]] | None] = {}
    changed: dict[int, tuple[int, int]] = {}  # span -> (old bucket, new bucket)
    # Graph calls outside every scope go to the model's root only where the root's own scope never
    # ran (a model called only from compiled code); otherwise they are someone else's (a compiled loss).
    model_root = (
        bool(catalog)
        and catalog[0].path == ""
        and catalog[0].type_name != GLOBAL_ROOT_TYPE
        and not module_calls[0]
    )
    for g in graph_spans:
        kids = children[g]
        keys = tuple(kernel_key(names[span_name[c]]) for c in kids)
        if keys not in cache:
            cache[keys] = _best_graph(keys, graphs)
        found = cache[keys]
        placement = _compiled_root(bucket[g], buckets, model_root)
        if found is None or placement is None:
            continue
        graph, matched = found
        root, phase_bit, scoped = placement
        root_path = catalog[root].path
        if not scoped and not (any(graph.modules) and all(not m or m in index for m in graph.modules)):
            continue  # outside every module and not a graph of this model's modules
        result.matched_calls += 1
        called: set[int] = set()
        for child, k in zip(kids, matched, strict=True):
            if k < 0:
                continue
            result.matched_kernels += 1
            rel = graph.modules[k]
            path = f"{root_path}.{rel}" if root_path and rel else root_path or rel
            target = resolve_path(path, index)
            if target < 0:
                continue
            if catalog[target].path != path:
                result.not_in_tree[path] = result.not_in_tree.get(path, 0) + 1
            new_bucket = buckets.with_phase(target, phase_bit)
            if new_bucket != bucket[child]:
                changed[child] = (bucket[child], new_bucket)
                bucket[child] = new_bucket
                result.moved += 1
            called.add(target)
        # a forward graph call is one call of each module it ran kernels of (and of the root, when
        # no scope of its own ran)
        if phase_bit == 0:
            for m in _with_ancestors(called, catalog, index, root):
                module_calls[m] += 1
            if not scoped:
                module_calls[root] += 1
    if changed:
        _children_follow(in_time_order, parent, bucket, changed)
        buckets_of[:] = bucket
    return result


def _graph_children(order: list[int], parent: list[int], graph_spans: list[int]) -> dict[int, list[int]]:
    """Each graph call's children, in time order."""
    children: dict[int, list[int]] = {g: [] for g in graph_spans}
    for i in order:
        p = parent[i]
        if p in children:
            children[p].append(i)
    return children


def _compiled_root(graph_bucket: int, buckets: Buckets, model_root: bool) -> tuple[int, int, bool] | None:
    """Which module a graph call's kernels are placed under, the phase bit, and whether that module's
    scope holds the call: the module whose scope the call ran in, else (``model_root``: a model
    compiled where no scope of ours can run, called from a compiled function or training step) the
    model's root, in the backward inside autograd's nodes and in the forward elsewhere."""
    if buckets.is_module(graph_bucket):
        return buckets.module_of(graph_bucket), buckets.phase_bit(graph_bucket), True
    if not model_root or graph_bucket < 0:
        return None
    return 0, int(buckets.phase_of(graph_bucket) == Phase.BACKWARD), False


def _with_ancestors(
    modules: set[int], catalog: list[ModuleInfo], index: dict[str, int], root: int
) -> set[int]:
    """The modules and their ancestors below the compiled root (which has its own range)."""
    found: set[int] = set()
    for m in modules:
        while m >= 0 and m != root and m not in found:
            found.add(m)
            parent_path = catalog[m].parent
            m = index.get(parent_path, -1) if parent_path is not None else -1
    return found


def _children_follow(
    order: list[int], parent: list[int], bucket: list[int], changed: dict[int, tuple[int, int]]
) -> None:
    """Spans nested in a moved span that had inherited its old bucket take its new one."""
    for i in order:  # parents come before their children in time order
        p = parent[i]
        if p >= 0 and i not in changed:
            move = changed.get(p)
            if move is not None and bucket[i] == move[0]:
                changed[i] = (move[0], move[1])
                bucket[i] = move[1]
