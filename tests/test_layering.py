"""The package's layering: lower layers never import higher ones (see docs/architecture.md).

Walks every module's imports with ``ast``. Module-level imports must point down (or sideways, within
a layer); an import inside a function may point up only where it is listed in ``LAZY_UPWARD`` with
its reason (convenience methods such as ``Profile.ops`` / ``print(p)``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "layerscope"

# Lowest first. A unit is a subpackage or a top-level module of layerscope.
LAYERS: list[set[str]] = [
    {"errors", "units", "gcpause", "version"},
    {"model"},
    {"events"},
    {"attribution"},
    {"analysis"},
    {"render"},
    {"capture", "loading", "filemap", "merging", "handlers", "models"},
    {"cli", "integrations", "compat", "__init__", "__main__"},
]
LAYER_OF = {unit: level for level, units in enumerate(LAYERS) for unit in units}

# (importing file, imported unit): why a function-level import may point up.
LAZY_UPWARD: dict[tuple[str, str], str] = {
    ("model/profile.py", "analysis"): "Profile.ops() convenience",
    ("model/profile.py", "render"): "print(profile) / rich rendering / notebook convenience",
    ("analysis/ops.py", "render"): "notebooks show p.ops() as a table",
    ("analysis/diff.py", "render"): "notebooks show a diff as tables",
    ("analysis/lines.py", "render"): "notebooks show p.lines() as a table",
}


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "layerscope":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(tree: ast.Module) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every ``layerscope`` import, TYPE_CHECKING blocks
    left out (they never run)."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, top) for alias in child.names if _unit(alias.name))
            elif isinstance(child, ast.ImportFrom) and child.module and _unit(child.module):
                found.append((child.module, top))
            inner = top and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, inner)

    visit(tree, True)
    return found


def _violations(package: Path = PACKAGE) -> list[str]:
    bad: list[str] = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        own = rel.split("/")[0].removesuffix(".py")
        assert own in LAYER_OF, f"{rel}: add {own!r} to LAYERS in this test and to docs/architecture.md"
        for module, top in _imports(ast.parse(path.read_text(), filename=str(path))):
            target = _unit(module)
            if target is None or target == own:
                continue
            assert target in LAYER_OF, f"{rel} imports unknown unit {target!r}"
            if LAYER_OF[target] <= LAYER_OF[own]:
                continue
            if not top and (rel, target) in LAZY_UPWARD:
                continue
            where = "at module level" if top else "inside a function"
            bad.append(f"{rel} imports {module} ({where}): layer {LAYER_OF[own]} -> {LAYER_OF[target]}")
    return bad


def test_imports_point_down() -> None:
    assert _violations() == []


def test_the_check_catches_an_upward_import() -> None:
    tree = ast.parse(
        "import os\nfrom layerscope.render.console import tree_table\ndef f():\n    import layerscope.cli\n"
    )
    assert _imports(tree) == [("layerscope.render.console", True), ("layerscope.cli", False)]


def test_the_check_reports_a_model_that_imports_a_renderer(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "profile.py").write_text(
        "from layerscope.errors import UsageError\nfrom layerscope.render.console import tree_table\n"
    )
    assert _violations(tmp_path) == [
        "model/profile.py imports layerscope.render.console (at module level): layer 1 -> 5"
    ]


def test_every_lazy_exception_is_still_needed() -> None:
    used = set()
    for rel, target in LAZY_UPWARD:
        tree = ast.parse((PACKAGE / rel).read_text())
        if any(_unit(m) == target and not top for m, top in _imports(tree)):
            used.add((rel, target))
    assert used == set(LAZY_UPWARD)
