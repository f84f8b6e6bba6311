"""The dashboard's reads pushed down to the store (``BrowsesRuns``, ``ChangeStamp``): on every
bundled store (memory, a SQLite file, PostgreSQL, a ``CodecStore``) ``flowkit._client.browse``
answers what its ``list_runs`` fallback answers (the capability hidden), pages included; the plans
of
the SQL statements seek on the indexes the engine keeps (no scan of every run for a page);
``flowkit runs --limit`` prints the newest runs. The store-level contract is the conformance
kit's (``flowkit_testing/conformance/_browse.py``); times go into bench/browse_bench.py."""

from __future__ import annotations

import dataclasses
from typing import Any

from search_kit import FILLED, plan

from flowkit._client import browse as _browse
from flowkit._core.run import ADMITTED_TAG, Run, RunStatus
from flowkit.events import RunStarted
from flowkit.stores import MemoryStore, SqlStore
from flowkit.stores.base import browses_runs, changes_stamped, parse_filter
from flowkit.stores.codec import AESGCMCodec, CodecStore

KEY = AESGCMCodec({"k1": b"k" * 32})

T0 = 1_767_225_600.0
S = RunStatus


class Hidden:
    """A store seen through ``list_runs`` only (``_browse`` falls back)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def list_runs(self, **kw: Any) -> Any:
        return await self._inner.list_runs(**kw)


def _run(i: int) -> Run:
    statuses = list(S)
    key = f"k{i % 3}" if i % 4 == 0 else None
    status = statuses[i % len(statuses)]
    tags: tuple[str, ...] = (f"t{i % 2}",)
    if key is not None:
        tags = (f"singleton:{key}", *tags)
        if i % 12 == 0 and status.active:
            tags = (*tags, ADMITTED_TAG)
    return Run(
        id=f"r{i:03d}",
        workflow=("a", "b")[i % 2],
        workflow_version="1",
        status=status,
        input={"i": i},
        tags=tags,
        created_at=T0 + i // 4,  # (four runs share each instant)
        updated_at=T0 + i // 4,
        singleton_key=key,
        search={"n": i % 5},
    )


def _started(run: Run) -> RunStarted:
    return RunStarted(workflow=run.workflow, version="1", input=run.input, at=run.created_at)


async def _seed(store: Any, n: int = 60) -> None:
    for i in range(n):
        run = _run(i)
        _, created = await store.create_run(run, [_started(run)])
        assert created


async def _same(store: Any) -> None:
    hidden = Hidden(store)
    assert browses_runs(store) and not browses_runs(hidden)
    for spec in (
        {},
        {"workflow": "a"},
        {"status": S.PENDING},
        {"tag": "t1"},
        {"search": parse_filter({"n": (">", 2)})},
        {"workflow": "b", "tag": "t1", "search": parse_filter({"n": 1})},
    ):
        for limit in (7, 50):
            before = None
            while True:
                fast = await _browse.page_runs(store, **spec, before=before, limit=limit)
                slow = await _browse.page_runs(hidden, **spec, before=before, limit=limit)
                assert fast == slow, (spec, before)
                if len(fast) < limit:
                    break
                before = (fast[-1].created_at, fast[-1].id)
        counted = {k: v for k, v in spec.items() if k != "status"}
        exact = await _browse.count_runs(hidden, **counted)
        assert await _browse.count_runs(store, **counted) == exact
        for cap in (0, 2, 5):  # (bounded: more than ``cap`` counts ``cap + 1``)
            want = {s: min(n, cap + 1) for s, n in exact.items()}
            assert await _browse.count_runs(store, **counted, limit=cap) == want, (spec, cap)
            assert await _browse.count_runs(hidden, **counted, limit=cap) == want
    summary = await _browse.lanes(store)
    assert summary == await _browse.lanes(hidden)
    assert summary and all(s.workflow in ("a",) for s in summary)  # (keyed runs: i % 4 == 0)
    for s in summary:
        fast_lane = await _browse.lane(store, s.workflow, s.key)
        slow_lane = await _browse.lane(hidden, s.workflow, s.key)
        assert fast_lane.holders == slow_lane.holders
        assert fast_lane.waiting == slow_lane.waiting == s.waiting
        # (the fallback keeps list_runs' order: FIFO too)
        assert [r.id for r in fast_lane.waiters] == [r.id for r in slow_lane.waiters]
        cut = await _browse.lane(store, s.workflow, s.key, limit=1)
        assert cut.waiters == fast_lane.waiters[:1] and cut.waiting == s.waiting


async def test_pushed_down_reads_answer_what_the_fallback_does(store: Any) -> None:
    await _seed(store)
    await _same(store)


async def test_a_codec_store_forwards_them(store: Any) -> None:
    codec = CodecStore(store, KEY)
    await _seed(codec)
    assert changes_stamped(codec)
    await _same(codec)
    page = await _browse.page_runs(codec, limit=5)
    assert page and all(r.input is None for r in page)
    before = await codec.change_stamp()
    run = dataclasses.replace(_run(999), id="late")
    await codec.create_run(run, [_started(run)])
    assert await codec.change_stamp() != before


async def test_without_the_capability_a_codec_store_falls_back() -> None:
    codec = CodecStore(Hidden(MemoryStore()), KEY)
    assert not browses_runs(codec) and not changes_stamped(codec)


N = FILLED


def _scans_every_run(dialect: str, text: str) -> bool:
    if dialect == "sqlite":
        return any(
            line.startswith("SCAN flowkit_runs") and "COVERING" not in line
            for line in text.splitlines()
        )
    return "Seq Scan on flowkit_runs" in text


async def test_the_pages_and_lanes_seek_on_the_engines_indexes(filled_store: SqlStore) -> None:
    """A page (first, or ``before`` a run deep down) walks ``ix_flowkit_runs_created``
    backwards; ``lane`` reads ``ix_flowkit_runs_queue``/``_waiting``/``_singleton``; the
    counts read an index only (no table rows)."""
    store = filled_store
    pg = store._db.dialect == "postgresql"
    first = plan(store, store.browse_query(limit=50))
    assert "ix_flowkit_runs_created" in first, first
    assert not pg or "Backward" in first, first
    deep = plan(store, store.browse_query(before=(T0 + 50_000, "r050000"), limit=50))
    assert "ix_flowkit_runs_created" in deep and not _scans_every_run("x", deep), deep
    if not pg:
        assert "SEARCH flowkit_runs USING INDEX ix_flowkit_runs_created (created_at<?)" in deep
    page = await store.browse_runs(before=(T0 + 50_000, "r050000"), limit=3)
    assert [r.id for r in page] == ["r049999", "r049998", "r049997"]
    holders, waiters, count, cancelling = store.lane_queries("wf", "k", 200)
    for q in (holders, waiters, count, cancelling):
        text = plan(store, q)
        assert "ix_flowkit_runs_" in text and not _scans_every_run(store._db.dialect, text), text
    lanes = plan(store, store.lanes_query())
    assert not _scans_every_run(store._db.dialect, lanes), lanes
    counts = plan(store, store.count_query())
    if not pg:
        assert "COVERING INDEX ix_flowkit_runs_due" in counts, counts
    assert sum((await store.count_runs()).values()) == N


async def test_the_counts_the_dashboard_asks_for_are_bounded(filled_store: SqlStore) -> None:
    """``count_runs(limit=...)`` (the runs page, ``flowkit runs``) seeks
    ``ix_flowkit_runs_due`` for each status and stops after ``limit + 1`` entries: its work
    does not grow with the store (the unbounded count reads every run's index entry)."""
    store = filled_store
    pg = store._db.dialect == "postgresql"
    text = plan(store, store.count_query(limit=_browse.COUNT_LIMIT))  # type: ignore[arg-type]
    if pg:
        # (each read of the runs stops at its LIMIT: an index seek by status, or, for a
        # status most runs have, the first rows of the table, where they are)
        lines = text.splitlines()
        reads = [i for i, line in enumerate(lines) if "Scan" in line and "flowkit_runs" in line]
        assert len(reads) == len(S), text
        assert all("Limit" in lines[i - 1] for i in reads), text
        assert "ix_flowkit_runs_due" in text, text
    else:
        reads = [line for line in text.splitlines() if "flowkit_runs" in line]
        assert len(reads) == len(S), text
        assert all("USING COVERING INDEX ix_flowkit_runs_due (status=?)" in r for r in reads), text
    exact = await store.count_runs()
    assert sum(exact.values()) == N
    assert await store.count_runs(limit=10) == {s: min(n, 11) for s, n in exact.items()}


def test_flowkit_runs_says_when_a_count_stopped_at_the_limit(
    tmp_path: Any, monkeypatch: Any, capsys: Any
) -> None:
    """``flowkit runs --limit N`` counts what it left out up to ``COUNT_LIMIT`` runs per
    status: beyond, its caption says "more than"."""
    import asyncio

    from flowkit.cli import main

    url = f"sqlite:///{tmp_path / 'counted.db'}"
    store = SqlStore(url)

    async def seed() -> None:
        for i in range(6):
            run = dataclasses.replace(_run(i), status=S.COMPLETED)
            await store.create_run(run, [_started(run)])

    asyncio.run(seed())
    store.close()
    monkeypatch.setenv("FORCE_COLOR", "1")  # (a terminal: the caption is printed)
    monkeypatch.setenv("COLUMNS", "200")
    for limit, want in ((10, "of 6 runs"), (3, "of more than 3 runs")):
        monkeypatch.setattr(_browse, "COUNT_LIMIT", limit)
        assert main(["--db", url, "runs", "--limit", "2"]) == 0
        assert f"the 2 most recent {want}" in capsys.readouterr().out


async def test_bounded_counts_are_exact_below_the_limit_in_each_namespace(backend: Any) -> None:
    """``count_runs(limit=...)`` on a store scoped to a namespace counts that namespace's
    runs only, exactly up to ``limit``, ``limit + 1`` past it; the unscoped store counts
    every namespace's (MemoryStore, a SQLite file, PostgreSQL)."""
    root = backend.store
    sizes = {"ns-a": 7, "ns-b": 3}
    for ns, n in sizes.items():
        scoped = backend.scoped(ns)
        for i in range(n):
            run = dataclasses.replace(_run(0), id=f"{ns}-{i}", status=S.COMPLETED, namespace=ns)
            await scoped.create_run(run, [_started(run)])
    for limit in (2, 5, 100):
        for ns, n in sizes.items():
            counted = await _browse.count_runs(backend.scoped(ns), limit=limit)
            assert counted == {s: 0 for s in S} | {S.COMPLETED: min(n, limit + 1)}, (ns, limit)
        everything = await _browse.count_runs(root, limit=limit)
        assert everything[S.COMPLETED] == min(10, limit + 1), limit
