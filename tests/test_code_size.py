"""Small modules with one job: no module of the package over 400 lines, no function over 80.

A guard the capture redesign (issue 20) set; a change that needs more splits the code instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "layerscope"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def oversized(root: Path) -> list[str]:
    """Every module and function under ``root`` over its limit, as ``path[:line] name length``."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        name = path.relative_to(root).as_posix()
        if lines > MAX_MODULE_LINES:
            found.append(f"{name} {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}() {length} lines")
    return found


def test_no_module_or_function_is_too_long() -> None:
    assert oversized(PACKAGE) == []


def test_the_check_catches_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{k} = {k}" for k in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def long() -> None:\n{body}\n")
    assert oversized(tmp_path) == [f"long.py:1 long() {MAX_FUNCTION_LINES + 1} lines"]
