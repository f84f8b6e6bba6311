"""A write the store abandons (``stall_timeout``) must not commit behind the worker's back.

Another connection holds the lock a step's record needs (SQLite's write lock, or the run's
row on PostgreSQL) for longer than the store's ``stall_timeout``: the record is abandoned
and the worker tries again. The abandoned statement gives up (SQLite's busy wait sees its
lane retired; PostgreSQL's is cancelled, or commits once the lock is free) and the worker
reads the run again only once it has returned, so every step is recorded exactly once."""

from __future__ import annotations

import collections
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from pg import fresh_database

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores.sql import SqlStore

HOLD = 1.3  # seconds the other connection keeps the lock (the store abandons after 0.5 s)

calls: collections.Counter[str] = collections.Counter()
hold: list[Callable[[], None]] = []  # takes the lock the first step's record will need


@workflow(name="abandoned-record")
class Recorded:
    async def s0(self) -> str:
        calls["s0"] += 1
        if calls["s0"] == 1:
            hold[0]()
        return "a"

    async def s1(self) -> str:
        calls["s1"] += 1
        return "b"

    async def run(self, ctx: WorkflowCtx, n: int) -> list[str]:
        return [await ctx.step(self.s0, name="s0"), await ctx.step(self.s1, name="s1")]


def _holder(take: Callable[[], Callable[[], None]]) -> tuple[Callable[[], None], threading.Event]:
    """A function that takes a lock in another thread (``take`` returns its release) and
    keeps it ``HOLD`` seconds; the event is set once it let go."""
    released = threading.Event()

    def start() -> None:
        ready = threading.Event()

        def run() -> None:
            release = take()
            ready.set()
            released.wait(HOLD)  # (the fault's length, not a synchronization)
            release()
            released.set()

        threading.Thread(target=run, daemon=True).start()
        assert ready.wait(10)

    return start, released


def _sqlite_lock(path: Path) -> Callable[[], Callable[[], None]]:
    def take() -> Callable[[], None]:
        c = sqlite3.connect(path, isolation_level=None)
        c.execute("BEGIN IMMEDIATE")

        def release() -> None:
            c.execute("COMMIT")
            c.close()

        return release

    return take


def _row_lock(url: str, run_id: str) -> Callable[[], Callable[[], None]]:
    u = sa.engine.make_url(url)
    dsn = f"host={u.query['host']} user=postgres dbname={u.database}"

    def take() -> Callable[[], None]:
        c = psycopg.connect(dsn)
        c.execute("SELECT 1 FROM flowkit_runs WHERE id = %s FOR UPDATE", (run_id,))

        def release() -> None:
            c.commit()
            c.close()

        return release

    return take


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_an_abandoned_record_never_commits_a_second_record(
    db: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    calls.clear()
    if db == "sqlite":
        path = tmp_path / "abandoned.db"
        url = f"sqlite:///{path}"
        take = _sqlite_lock(path)
    else:
        url = fresh_database(request.getfixturevalue("pg_server"))
        take = _row_lock(url, "r")
    start, released = _holder(take)
    hold[:] = [start]
    store = SqlStore(url, stall_timeout=0.5)
    try:
        async with Engine(store, [Recorded()], lease_ttl=30) as engine:
            await engine.start("abandoned-record", 1, run_id="r")
            assert await engine.result("r", timeout=30) == ["a", "b"]
    finally:
        store.close()  # (waits for the abandoned calls too: nothing can land after this)
    assert released.wait(10)
    again = SqlStore(url)
    try:
        events = await again.load_events("r")
    finally:
        again.close()
    steps = [e.name for e in events if e.type == "step_completed"]  # type: ignore[union-attr]
    assert steps == ["s0", "s1"], [(e.seq, e.type) for e in events]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    # the record was abandoned (the path under test ran); whether its statement then gave up
    # (the step ran again) or committed before the worker read again (it did not), the
    # history holds each step once
    assert any("abandoned" in r.getMessage() for r in caplog.records)
    assert calls["s1"] == 1
