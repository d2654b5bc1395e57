"""docs/ARCHITECTURE.md is the map of the package: every module is named in it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_is_on_the_architecture_map():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    modules = sorted(p for p in (ROOT / "engram_viz").rglob("*.py") if p.name != "__init__.py")
    missing = [str(p.relative_to(ROOT)) for p in modules if f"{p.name}`" not in text]
    assert not missing, f"modules missing from docs/ARCHITECTURE.md: {missing}"
