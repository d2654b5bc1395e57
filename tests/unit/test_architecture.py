"""The package's shape: imports between its own modules sit at module top (a function-level one
hides a cycle), modules stay under 500 lines and functions under 80. The layer contract itself is
import-linter's (``lint-imports``, configured in pyproject.toml and run by ``make test``)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "engram_viz"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(PACKAGE.rglob("*.py"))]


def _own(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "engram_viz"
    return isinstance(node, ast.Import) and any(a.name.split(".")[0] == "engram_viz" for a in node.names)


def test_no_function_level_imports_between_own_modules():
    found = []
    for path, tree in _modules():
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{path.relative_to(PACKAGE)}:{n.lineno}" for n in ast.walk(fn) if _own(n)]
    assert not found, f"function-level imports of engram_viz modules: {found}"


def test_modules_and_functions_stay_small():
    long_modules = []
    long_functions = []
    for path, tree in _modules():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES:
            long_modules.append(f"{path.relative_to(PACKAGE)} ({n})")
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = fn.end_lineno - fn.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(PACKAGE)}:{fn.name} ({size})")
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"


def test_no_two_modules_share_a_basename():
    by_name: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"modules that share a basename: {shared}"
