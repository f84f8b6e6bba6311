"""docs/architecture.md names every module of the tree, so its map cannot fall behind the code.

A module counts as named when its path relative to its package's root (``_replay/calls.py``,
``stores/sql/_wakeup.py``, ``conformance/_heads.py``) or its file name appears in the page, and
a package when its folder does; the page's module names must also exist (no module the tree no
longer has)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
PACKAGES = ("flowkit", "flowkit_testing")


def _modules() -> list[Path]:
    return sorted(
        p.relative_to(ROOT)
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if "__pycache__" not in p.parts
    )


def _named(text: str, mod: Path) -> bool:
    if mod.name == "__init__.py":
        return f"{mod.parent.name}/" in text or f"{mod.parent}/" in text
    return mod.name in text or "/".join(mod.parts[1:]) in text


def test_every_module_of_the_tree_is_named_on_the_architecture_page() -> None:
    text = PAGE.read_text()
    missing = [str(m) for m in _modules() if not _named(text, m)]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_every_module_the_page_names_exists() -> None:
    text = PAGE.read_text()
    names = {p.name for p in _modules()}
    cited = set(re.findall(r"\b(_?[a-z][a-z0-9_]*\.py)\b", text))
    gone = sorted(c for c in cited if c not in names and not c.startswith(("test_", "conftest")))
    assert not gone, f"docs/architecture.md names modules the tree does not have: {gone}"
