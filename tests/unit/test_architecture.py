"""The package's shape: imports between its own modules sit at module top (a function-level one
hides a cycle), modules stay under 500 lines and functions under 80. The layer contract itself is
import-linter's (``lint-imports``, configured in pyproject.toml and run by ``make test``).

One documented exception: the command line (``cli.py``) and the front door (``__init__.py``) import
the package's modules by name with ``importlib`` when a sub-command runs or a name is first used, so
that ``engram-viz --help`` and ``import engram_viz`` load no torch; nowhere else may a function
call ``importlib.import_module``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "engram_viz"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
# engram_viz/cli.py and engram_viz/__init__.py (see above), and the app's server, whose loading page
# answers before torch and the model code are imported
LAZY_IMPORTERS = {"cli.py", "__init__.py", "apps/app_server.py"}


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


def _imports_by_name(node: ast.AST) -> bool:
    """``importlib.import_module(...)``, ``import_module(...)`` or ``__import__(...)``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name in ("import_module", "__import__")


def test_only_the_command_line_and_the_front_door_import_by_name():
    found = []
    for path, tree in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in LAZY_IMPORTERS:
            continue
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{rel}:{n.lineno}" for n in ast.walk(fn) if _imports_by_name(n)]
    assert not found, f"imports by name outside {sorted(LAZY_IMPORTERS)}: {found}"


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
