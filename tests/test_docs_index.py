"""docs/README.md is the index of the docs: it links every page of docs/ exactly once."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_index_lists_each_page_once() -> None:
    rows = [
        line for line in (DOCS / "README.md").read_text().splitlines() if line.startswith("| [")
    ]
    linked = Counter(m.group(1) for row in rows if (m := re.match(r"\| \[[^]]+\]\(([^)]+)\)", row)))
    twice = sorted(page for page, n in linked.items() if n > 1)
    assert not twice, f"listed more than once in docs/README.md: {twice}"
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert not pages - set(linked), (
        f"pages missing from docs/README.md: {sorted(pages - set(linked))}"
    )
    assert not set(linked) - pages, (
        f"docs/README.md links missing pages: {sorted(set(linked) - pages)}"
    )


def test_no_file_cites_the_teams_design_notes() -> None:
    """Code, docs, tests and samples cite the docs pages a user can read, never the team's
    design notes (which users do not have)."""
    root = DOCS.parent
    word = "DESI" + "GN"  # (spelt in two parts so that this file does not cite it either)
    cite = re.compile(word + r"(\.md| *§)")
    found = []
    for folder in ("flowkit", "flowkit_testing", "tests", "docs", "samples", "bench"):
        for path in (root / folder).rglob("*"):
            if path.suffix in {".py", ".md", ".html", ".js", ".toml", ".txt"} and path.is_file():
                for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if cite.search(line):
                        found.append(f"{path.relative_to(root)}:{n}")
    for name in ("README.md", "Makefile", "pyproject.toml"):
        if cite.search((root / name).read_text()):
            found.append(name)
    assert not found, f"these cite the design notes instead of a docs page: {found}"
