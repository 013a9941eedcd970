"""The package's layering (see docs/architecture.md): lower layers never import higher ones, and no
modules import each other in a circle.

Walks every module's imports with ``ast``: at module level, inside functions, and under
``if TYPE_CHECKING:`` alike. Every import must point down or sideways (within a layer), with no
exception: convenience methods on the data model (``Profile.ops()``, ``print(p)``, notebook
display) are served by a higher layer that registers itself at ``import layerscope``
(render/profile_views.py), not by imports that climb. Imports between modules form no cycle: a
function-level import counts when it crosses units (one unit asking another in a circle is a
layering problem deferred, not solved); inside one unit, a method handing its work to a sibling
module (``Profile.validate`` -> model/validate.py) runs after both are loaded and is left out.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "layerscope"

# Lowest first, one concept each. A unit is a subpackage or a top-level module of layerscope; a layer
# imports only from its own layer and the ones below it.
LAYERS: list[tuple[str, set[str]]] = [
    ("foundation", {"errors", "units", "gcpause", "version"}),
    ("data model", {"model"}),
    ("events", {"events"}),
    ("attribution", {"attribution"}),
    ("analysis", {"analysis"}),
    ("render", {"render"}),
    ("capture", {"capture"}),
    ("estimates", {"estimates"}),
    ("file fan-out", {"filemap"}),
    ("loading", {"loading"}),
    ("rank merging", {"merging"}),
    ("handlers", {"handlers"}),
    ("demo models", {"models"}),
    ("front ends", {"cli", "integrations", "compat", "__init__", "__main__"}),
]
LAYER_OF = {unit: level for level, (_, units) in enumerate(LAYERS) for unit in units}

# Cycles known and owned by another change: frozenset of files -> who removes it. The test fails
# when one is gone, so the entry is removed with the cycle. (The last one, attribution/buckets.py <->
# attribution/compiled.py, went when events/names.py took the event-name prefixes.)
KNOWN_CYCLES: dict[frozenset[str], str] = {}


@dataclass(frozen=True)
class Import:
    """One import of a layerscope module: the module, and where it runs (``module``: at module
    level, ``function``: inside a function, ``type_checking``: under ``if TYPE_CHECKING:``)."""

    module: str
    where: str


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "layerscope":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _module_of(rel: str) -> str:
    """``model/profile.py`` -> ``layerscope.model.profile`` (a package's ``__init__`` -> the package)."""
    parts = ["layerscope", *rel.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, modules: Collection[str] = ()) -> list[Import]:
    """Every ``layerscope`` import of a module's tree. ``from layerscope.x import y`` names
    ``layerscope.x.y`` when that is one of ``modules`` (a submodule), else ``layerscope.x``."""
    found: list[Import] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(child, "type_checking")
                continue
            if isinstance(child, ast.Import):
                found.extend(Import(alias.name, where) for alias in child.names if _unit(alias.name))
            elif isinstance(child, ast.ImportFrom) and child.module and _unit(child.module):
                subs = [
                    f"{child.module}.{a.name}" for a in child.names if f"{child.module}.{a.name}" in modules
                ]
                found.extend(Import(sub, where) for sub in subs)
                if len(subs) < len(child.names):
                    found.append(Import(child.module, where))
            inner = where
            if where == "module" and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                inner = "function"
            visit(child, inner)

    visit(tree, "module")
    return found


def _package_imports(package: Path) -> dict[str, list[Import]]:
    """Each file (relative path) -> its layerscope imports."""
    files = {path.relative_to(package).as_posix(): path for path in sorted(package.rglob("*.py"))}
    modules = {_module_of(rel) for rel in files}
    return {
        rel: _imports(ast.parse(path.read_text(), filename=str(path)), modules) for rel, path in files.items()
    }


def _violations(package: Path = PACKAGE) -> list[str]:
    """Every import that points up a layer, wherever it runs."""
    bad: list[str] = []
    for rel, imports in _package_imports(package).items():
        own = rel.split("/")[0].removesuffix(".py")
        assert own in LAYER_OF, f"{rel}: add {own!r} to LAYERS in this test and to docs/architecture.md"
        for imp in imports:
            target = _unit(imp.module)
            if target is None or target == own:
                continue
            assert target in LAYER_OF, f"{rel} imports unknown unit {target!r}"
            if LAYER_OF[target] > LAYER_OF[own]:
                where = {"module": "at module level", "function": "inside a function"}.get(
                    imp.where, "under TYPE_CHECKING"
                )
                bad.append(
                    f"{rel} imports {imp.module} ({where}): layer {LAYERS[LAYER_OF[own]][0]} -> "
                    f"{LAYERS[LAYER_OF[target]][0]}"
                )
    return bad


def _graph(package: Path) -> dict[str, set[str]]:
    """File -> the files it imports (see the module's docstring for which imports count)."""
    imports = _package_imports(package)
    file_of = {_module_of(rel): rel for rel in imports}
    graph: dict[str, set[str]] = {rel: set() for rel in imports}
    for rel, found in imports.items():
        for imp in found:
            target = file_of.get(imp.module)
            if target is None or target == rel:
                continue
            if imp.where == "function" and _unit(imp.module) == rel.split("/")[0].removesuffix(".py"):
                continue
            graph[rel].add(target)
    return graph


def _cycles(package: Path = PACKAGE) -> list[frozenset[str]]:
    """The strongly connected groups of files (more than one file: a cycle), Tarjan's algorithm."""
    graph = _graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[frozenset[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return groups


def _describe(group: frozenset[str], package: Path = PACKAGE) -> str:
    graph = _graph(package)
    edges = [f"{a} -> {b}" for a in sorted(group) for b in sorted(graph[a] & group)]
    return "cycle: " + "; ".join(edges)


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "layerscope"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.cpp"))
    return copy


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_imports_point_down() -> None:
    assert _violations() == []


def test_no_import_cycles() -> None:
    unknown = [_describe(group) for group in _cycles() if group not in KNOWN_CYCLES]
    assert unknown == []


def test_every_known_cycle_is_still_there() -> None:
    # a cycle removed by the change that owns it takes its entry in KNOWN_CYCLES with it
    assert set(KNOWN_CYCLES) <= set(_cycles())


def test_every_unit_has_one_layer() -> None:
    units = [unit for _, layer in LAYERS for unit in layer]
    assert len(units) == len(set(units))
    on_disk = {
        p.name.removesuffix(".py")
        for p in PACKAGE.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert on_disk <= set(units)


def test_the_check_reads_every_kind_of_import() -> None:
    tree = ast.parse(
        "import os\nfrom typing import TYPE_CHECKING\nfrom layerscope.render.console import tree_table\n"
        "from layerscope import units\nif TYPE_CHECKING:\n"
        "    from layerscope.analysis.report import ReportData\n"
        "def f():\n    import layerscope.cli\n"
    )
    assert _imports(tree, {"layerscope.units"}) == [
        Import("layerscope.render.console", "module"),
        Import("layerscope.units", "module"),
        Import("layerscope.analysis.report", "type_checking"),
        Import("layerscope.cli", "function"),
    ]


def test_the_check_reports_a_model_that_imports_a_renderer(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    _append(
        copy / "model" / "metrics.py",
        "\n\ndef _planted() -> None:\n    from layerscope.render import console\n",
    )
    assert _violations(copy) == [
        "model/metrics.py imports layerscope.render.console (inside a function): layer data model -> render"
    ]


def test_the_check_reports_a_type_checking_import_across_layers(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    _append(
        copy / "model" / "tables.py",
        "\nimport typing\n\nif typing.TYPE_CHECKING:\n"
        "    from layerscope.analysis.report import ReportData\n",
    )
    assert _violations(copy) == [
        "model/tables.py imports layerscope.analysis.report (under TYPE_CHECKING): "
        "layer data model -> analysis"
    ]


def test_the_check_reports_a_cycle_between_units(tmp_path: Path) -> None:
    # two units of one layer asking each other, one of them inside a function: no arrow points up,
    # so only the cycle check sees it
    copy = _copy(tmp_path)
    _append(copy / "version.py", "\n\ndef _planted() -> None:\n    from layerscope import gcpause\n")
    _append(copy / "gcpause.py", "\nfrom layerscope.version import __version__\n")
    assert _violations(copy) == []
    planted = frozenset({"gcpause.py", "version.py"})
    assert planted in _cycles(copy)
    assert _describe(planted, copy) == "cycle: gcpause.py -> version.py; version.py -> gcpause.py"


def test_the_check_reports_a_cycle_inside_a_unit(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    _append(copy / "model" / "metrics.py", "\nfrom layerscope.model.display import NotebookDisplay\n")
    _append(copy / "model" / "display.py", "\nfrom layerscope.model import metrics\n")
    assert _violations(copy) == []
    assert frozenset({"model/metrics.py", "model/display.py"}) in _cycles(copy)


def test_the_tree_is_clean_in_a_copy(tmp_path: Path) -> None:
    # the planted tests above start from a copy that passes: what they find is what they planted
    copy = _copy(tmp_path)
    assert _violations(copy) == []
    assert set(_cycles(copy)) == set(KNOWN_CYCLES)
