"""The poller's reads (``due_runs``, ``next_due_at``, ``next_due_after``) on SQLite and
PostgreSQL: the same answers as ``MemoryStore`` (``rules.claimable`` / ``rules.due_time``) on
random runs of every status, lease and wake time, and plans that go through indexes (no scan
of every active run: an idle worker reads them at least once a second, so their cost must not
grow with the parked runs). Their times go into bench/million_bench.py and bench/idle_bench.py."""

from __future__ import annotations

import random
from typing import Any

import pytest
import sqlalchemy as sa
from search_kit import run_row
from store_kit import T0, Backend, mk, put

from flowkit import Run, RunStatus
from flowkit.stores import MemoryStore, SqlStore
from flowkit.stores.sql._schema import runs

TIMES = [T0 + d for d in (-4, 0, 1, 2, 3, 5, 8, 13)]


def _random_run(rng: random.Random, i: int) -> Run:
    lease = rng.random() < 0.4
    return mk(
        f"r{i:03d}",
        t=rng.choice(TIMES),
        updated_at=rng.choice(TIMES),
        wf=rng.choice(["wf", "other"]),
        status=rng.choice(list(RunStatus)),
        wake_at=rng.choice([None, *TIMES]),
        lease_owner=rng.choice(["w1", "w2", ""]) if lease else None,
        lease_expires=rng.choice([None, *TIMES]) if lease else None,
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_poll_reads_match_memory_store(sql_backend: Backend, seed: int) -> None:
    """Every part of ``rules.due_time`` (leased runs, pending, running, cancelling with and
    without a wake time, parked runs) and the exclusion of the poller's own leases."""
    rng = random.Random(seed)
    mem, sql = MemoryStore(), sql_backend.store
    for i in range(120):
        run = _random_run(rng, i)
        await put(mem, run)
        await put(sql, run)
    nows = [T0 - 5, *TIMES, T0 + 20, *(t + 0.5 for t in TIMES)]
    for excl in ((), ("w1",), ("w1", "w2"), ("",)):
        assert await sql.next_due_at(excl) == await mem.next_due_at(excl), excl
        for now in nows:
            got = await sql.next_due_after(now, excl)
            assert got == await mem.next_due_after(now, excl), (now, excl)
    for now in nows:
        for limit in (1000, 5):
            for wfs in (None, ["wf"]):
                assert await sql.due_runs(now, limit, wfs) == await mem.due_runs(now, limit, wfs)
            vers = [("wf", "1")]
            assert await sql.due_runs(now, limit, versions=vers) == await mem.due_runs(
                now, limit, versions=vers
            )


async def test_nothing_due_reads_none(sql_backend: Backend) -> None:
    store = sql_backend.store
    assert await store.next_due_at() is None
    assert await store.next_due_after(T0) is None
    await put(store, mk("done", status=RunStatus.COMPLETED))
    await put(store, mk("waits", status=RunStatus.SUSPENDED))  # a signal: no wake time
    assert await store.next_due_after(T0) is None
    await put(store, mk("sleeps", status=RunStatus.SUSPENDED, wake_at=T0 + 60))
    assert await store.next_due_after(T0) == T0 + 60
    assert await store.next_due_after(T0 + 60) is None


# -- the plans --------------------------------------------------------------------------------

PARKED = 20_000


def _fill(store: SqlStore) -> None:
    """``PARKED`` sleeping runs, as many settled ones and a few in flight; then ``ANALYZE``."""
    rows = []
    for i in range(2 * PARKED + 20):
        r = run_row(i)
        r.update(search=None, wake_at=None, lease_owner=None, lease_expires=None)
        if i < PARKED:
            r.update(status="suspended", wake_at=T0 + 10_000 + i)
        elif i >= 2 * PARKED:
            r.update(status="running", lease_owner="w", lease_expires=T0 + 30)
        rows.append(r)
    with store._db.tx() as conn:
        conn.execute(runs.insert(), rows)
    with store._db.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("ANALYZE"))


def _plan(store: SqlStore, q: str, params: dict[str, Any]) -> str:
    db = store._db
    prefix = "EXPLAIN QUERY PLAN " if db.dialect == "sqlite" else "EXPLAIN "
    with db.engine.connect() as conn:
        rows = conn.exec_driver_sql(prefix + q, params).fetchall()
    return "\n".join(str(r[-1] if db.dialect == "sqlite" else r[0]) for r in rows)


def _scans_every_run(dialect: str, text: str) -> bool:
    if dialect == "sqlite":  # ("SCAN flowkit_runs" with or without an index: every run,
        # but for the partial index of the leased runs: only those)
        return any(
            "SCAN flowkit_runs" in line and "ix_flowkit_runs_leased" not in line
            for line in text.splitlines()
        )
    return "Seq Scan on flowkit_runs" in text


async def test_the_poll_reads_go_through_indexes(sql_backend: Backend) -> None:
    """With 20,000 parked runs: each part of ``next_due_after`` / ``next_due_at`` and both
    parts of ``due_runs`` are index seeks (``ix_flowkit_runs_due`` for the parked runs,
    ``ix_flowkit_runs_leased`` for the leased ones), never a scan of ``flowkit_runs``."""
    store = sql_backend.store
    _fill(store)
    sql = store._sql
    skip = sql.in_list_param(["me"])
    cases = {
        "next_due_after": (sql.next_due_after, sql.params(now=T0)),
        "next_due_after_skip": (sql.next_due_after_skip, sql.params(now=T0, skip=skip)),
        "next_due": (sql.next_due, sql.params()),
        "next_due_skip": (sql.next_due_skip, sql.params(skip=skip)),
        "due_runs": (sql.due_runs, sql.params(now=T0, limit=100)),
        "due_runs_of": (
            sql.due_runs_of,
            sql.params(now=T0, limit=100, wfs=sql.in_list_param(["wf"])),
        ),
    }
    vers = sql.params(now=T0, limit=100)
    sql.versions_params(vers, "vers", [("wf", "1")])
    cases["due_runs_vers"] = (sql.due_runs_vers, vers)
    dialect = store._db.dialect
    for name, (q, params) in cases.items():
        text = _plan(store, q, params)
        assert not _scans_every_run(dialect, text), (name, text)
        assert "ix_flowkit_runs_due" in text, (name, text)
        if name.startswith("next_due"):
            assert "ix_flowkit_runs_leased" in text, (name, text)
    assert await store.next_due_after(T0 + 100) == T0 + 10_000
    assert await store.next_due_after(T0 + 10_000.5) == T0 + 10_001
    assert await store.next_due_after(T0, ["w"]) == T0 + 10_000
    assert await store.next_due_after(T0) == T0 + 30  # the lease of the runs in flight
    due = await store.due_runs(T0 + 10_002, 100)
    # (the leases of the runs in flight expired at T0 + 30: due before the sleepers)
    expired = [f"r{2 * PARKED + i:06d}" for i in range(20)]
    assert due == [*expired, "r000000", "r000001", "r000002"]
    assert await store.due_runs(T0 + 10_002, 100, versions=[("wf", "1")]) == due
    assert await store.due_runs(T0 + 10_002, 100, ["wf"]) == due
