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
