"""``list_runs(search=...)`` on 100,000 runs (the ``filled_store`` fixture, shared) goes through
``flowkit_search``'s indexes, not a scan of every run: the plans (``EXPLAIN QUERY PLAN`` on a
SQLite file, ``EXPLAIN`` on PostgreSQL after ``ANALYZE``) name the search index and no full
scan of ``flowkit_runs``; and the filtered pages are right. Times go into
bench/search_bench.py."""

from __future__ import annotations

from search_kit import AMOUNTS, CUSTOMERS, FILLED, plan

from flowkit.stores import SqlStore
from flowkit.stores.base import parse_filter

N = FILLED


def _full_scan(dialect: str, text: str) -> bool:
    if dialect == "sqlite":  # ("SCAN flowkit_runs" with or without an index: every run)
        return any(line.startswith("SCAN flowkit_runs") for line in text.splitlines())
    return "Seq Scan on flowkit_runs" in text or "Index Scan using ix_flowkit_runs_created" in text


SPECS = [
    ({"customer": "c-7"}, "ix_flowkit_search_text", N // CUSTOMERS),
    ({"amount": (">=", AMOUNTS - 5)}, "ix_flowkit_search_num", 5 * N // AMOUNTS),
    ({"customer": ("in", ["c-1", "c-2"])}, "ix_flowkit_search_text", 2 * N // CUSTOMERS),
    ({"customer": "c-3", "amount": ("<", 2000)}, "ix_flowkit_search", 40),
]


async def test_a_filtered_list_uses_the_search_index(filled_store: SqlStore) -> None:
    store = filled_store
    for spec, index, count in SPECS:
        terms = parse_filter(spec)
        text = plan(store, store.list_query(search=terms, limit=50))
        assert index in text, (spec, text)
        assert not _full_scan(store._db.dialect, text), (spec, text)
        found = await store.list_runs(search=terms)
        assert len(found) == count, spec
        page = await store.list_runs(search=terms, limit=50)
        assert [r.id for r in page] == [r.id for r in found[:50]]
        assert all(r.input is None for r in page)
        last = (page[-1].created_at, page[-1].id)
        nxt = await store.list_runs(search=terms, limit=50, after=last)
        assert [r.id for r in nxt] == [r.id for r in found[50:100]]


async def test_a_page_after_another_seeks_instead_of_scanning(filled_store: SqlStore) -> None:
    """Keyset paging: the page after run ``r050000`` starts with an index seek on
    ``ix_flowkit_runs_created`` (no OFFSET, no scan of the runs before it)."""
    store = filled_store
    first = await store.list_runs(limit=1, after=None)
    assert [r.id for r in first] == ["r000000"]
    mid = (await store.list_runs(search=parse_filter({"customer": "c-0", "amount": 0})))[10]
    assert mid.id == "r050000"
    text = plan(store, store.list_query(limit=50, after=(mid.created_at, mid.id)))
    if store._db.dialect == "sqlite":
        assert "SEARCH flowkit_runs USING INDEX ix_flowkit_runs_created (created_at>?)" in text
    else:
        assert "ix_flowkit_runs_created" in text and "Index Cond" in text, text
        assert "Seq Scan on flowkit_runs" not in text, text
    page = await store.list_runs(limit=3, after=(mid.created_at, mid.id))
    assert [r.id for r in page] == ["r050001", "r050002", "r050003"]
