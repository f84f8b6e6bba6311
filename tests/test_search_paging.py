"""Property: on every store (MemoryStore, a SQLite file, PostgreSQL), paging through
``list_runs`` with any filter (``search`` terms of every operator and kind, ``status``,
``workflow``) and any page size gives exactly the unpaged list, and the unpaged list is
exactly the runs the reference semantics (``_search_terms.matches``) keep, oldest
``(created_at, id)`` first. Runs share creation instants, so ties go by id."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_kit import T0, Backend, collated_database, mk, put

from flowkit import RunStatus
from flowkit._core.search_terms import matches, parse_filter
from flowkit.stores import SqlStore

VALUES: list[Any] = ["a", "b", "B", "é", 0, 1, 2.5, -3, True, False]
RUNS = [
    dataclasses.replace(
        mk(
            f"r{i:02d}{'xyz'[i % 3]}",
            t=T0 + i // 3,  # (three runs per instant)
            wf="wf" if i % 4 else "other",
            status=RunStatus.COMPLETED if i % 2 else RunStatus.PENDING,
        ),
        search={k: VALUES[(i * (j + 3)) % len(VALUES)] for j, k in enumerate("pqr") if (i + j) % 5},
    )
    for i in range(30)
]

TERM = st.tuples(
    st.sampled_from("pqrs"),
    st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "in"]),
    st.sampled_from(VALUES),
    st.lists(st.sampled_from(VALUES), max_size=3),
)


def _spec(terms: list[tuple[str, str, Any, list[Any]]]) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for name, op, value, alts in terms:
        if op in ("<", "<=", ">", ">=") and isinstance(value, bool):
            op = "=="
        spec[name] = (op, alts) if op == "in" else (op, value)
    return spec


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    terms=st.lists(TERM, max_size=2),
    size=st.integers(1, 7),
    status=st.sampled_from([None, RunStatus.COMPLETED]),
    workflow=st.sampled_from([None, "wf"]),
)
async def test_pages_add_up_to_the_unpaged_list(
    backend: Backend,
    terms: list[tuple[str, str, Any, list[Any]]],
    size: int,
    status: RunStatus | None,
    workflow: str | None,
) -> None:
    store = backend.store
    if not await store.list_runs(limit=1):
        for r in RUNS:
            await put(store, r)
    search = parse_filter(_spec(terms))
    want = [
        r.id
        for r in sorted(RUNS, key=lambda r: (r.created_at, r.id))
        if matches(r.search, search)
        and (status is None or r.status == status)
        and (workflow is None or r.workflow == workflow)
    ]
    base = {"search": search, "status": status, "workflow": workflow}
    assert [r.id for r in await store.list_runs(**base)] == want
    got: list[str] = []
    page = await store.list_runs(**base, limit=size)
    while page:
        assert len(page) <= size
        got += [r.id for r in page]
        last = page[-1]
        page = await store.list_runs(**base, limit=size, after=(last.created_at, last.id))
    assert got == want


@pytest.mark.postgres
async def test_string_ranges_go_by_code_point_under_a_language_locale(pg_server: str) -> None:
    """A database whose default collation is a language locale (ICU en-US) still compares
    search strings by code point, as ``matches`` does (``"B" < "a"``, ``"é" > "z"``)."""
    store = SqlStore(collated_database(pg_server))
    try:
        for i, text in enumerate(["a", "B", "z", "é"]):
            await put(store, dataclasses.replace(mk(f"c{i}", t=T0 + i), search={"s": text}))
        got = await store.list_runs(search=parse_filter({"s": ("<", "a")}))
        assert [r.search["s"] for r in got] == ["B"]
        got = await store.list_runs(search=parse_filter({"s": (">", "z")}))
        assert [r.search["s"] for r in got] == ["é"]
    finally:
        store.close()
