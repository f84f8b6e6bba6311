"""SqlStore's own wait for another process's SQLite write lock (``WaitingCursor``).

Another real process holds the write lock; the store's write must wait for it in short pauses
(50 µs, doubling up to 1 ms, never SQLite's 1, 2, 5, 10, … ms), succeed once the lock is free,
fail with "database is locked" after ``SQLITE_BUSY_TIMEOUT_MS`` of pauses without writing, and
never retry what SQLite forbids retrying (a statement inside a transaction). The pooled
connection gets SQLite's busy timeout back when the store lets it go.

The pauses are observed by replacing the store module's ``_sleep``: a pause is where the test
lets the other process commit, so nothing sleeps in place of synchronization."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flowkit import Engine, RunStatus, WorkflowCtx, workflow
from flowkit.stores.sql import SqlStore
from flowkit.stores.sql import _sqlite as sql_sqlite

HOLDER = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
c.execute("BEGIN IMMEDIATE")
c.execute("INSERT INTO held (x) VALUES (1)")
print("held", flush=True)
sys.stdin.readline()
c.execute("COMMIT")
print("released", flush=True)
sys.stdin.readline()
"""


class Holder:
    """A process that holds ``path``'s write lock until ``release``."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.released = False

    def wait_held(self) -> None:
        assert self._line() == "held"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def release(self) -> None:
        if self.released:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self._line() == "released"
        self.released = True

    def stop(self) -> None:
        self.release()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Callable[[Path], Holder]]:
    holders: list[Holder] = []

    def start(path: Path) -> Holder:
        with sqlite3.connect(path) as c:
            c.execute("CREATE TABLE IF NOT EXISTS held (x INTEGER)")
        h = Holder(path)
        holders.append(h)  # (stopped even if it failed to take the lock)
        h.wait_held()
        return h

    yield start
    for h in holders:
        if h.proc.poll() is None:
            h.stop()


def _fake_sleep(asked: list[float], then: Callable[[], None] = lambda: None) -> Any:
    """A ``_sleep`` that records each pause instead of sleeping, and calls ``then``."""

    def pause(s: float) -> None:
        asked.append(s)
        if len(asked) > 100_000:  # a wait that would never end: fail, do not spin
            raise AssertionError("the store kept waiting")
        then()

    return pause


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every pause the store's module asks for (not slept)."""
    asked: list[float] = []
    monkeypatch.setattr(sql_sqlite, "_sleep", _fake_sleep(asked))
    return asked


@workflow(name="lock-wait-echo")
class Echo:
    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> dict[str, Any]:
        return input


def test_a_write_waits_for_another_processs_lock_in_short_pauses(
    tmp_path: Path, held: Callable[[Path], Holder], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "flowkit.db"
    store = SqlStore(f"sqlite:///{path}")
    asked: list[float] = []
    holder: list[Holder] = []

    def free() -> None:  # the store is waiting: free the lock after a few pauses
        if len(asked) == 8:
            holder[0].release()

    monkeypatch.setattr(sql_sqlite, "_sleep", _fake_sleep(asked, free))

    async def main() -> None:
        client = Engine(store, [Echo()], worker=False)
        assert await store.get_run("nothing") is None  # the schema and the store's connection
        holder.append(held(path))
        await client.start("lock-wait-echo", {"n": 1}, "r1")
        run = await store.get_run("r1")
        assert run is not None and run.status == RunStatus.PENDING

    try:
        asyncio.run(main())
    finally:
        store.close()
    assert holder[0].released
    assert len(asked) >= 8  # it waited (and went on once the lock was free)
    assert asked[0] == pytest.approx(50e-6)
    assert asked[:6] == pytest.approx([50e-6, 100e-6, 200e-6, 400e-6, 800e-6, 1e-3])
    assert max(asked) <= 1e-3  # never SQLite's own 2, 5, 10 … ms
    with sqlite3.connect(path) as c:  # the other process's write was not disturbed
        assert c.execute("SELECT count(*) FROM held").fetchone() == (1,)


def test_a_write_that_waits_too_long_fails_and_writes_nothing(
    tmp_path: Path,
    held: Callable[[Path], Holder],
    pauses: list[float],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sql_sqlite, "SQLITE_BUSY_TIMEOUT_MS", 20)
    path = tmp_path / "flowkit.db"
    store = SqlStore(f"sqlite:///{path}")

    async def main() -> None:
        client = Engine(store, [Echo()], worker=False)
        assert await store.get_run("nothing") is None
        h = held(path)
        with pytest.raises(Exception, match="database is locked"):
            await client.start("lock-wait-echo", {"n": 1}, "r1")
        h.release()
        assert await store.get_run("r1") is None

    try:
        asyncio.run(main())
    finally:
        store.close()
    assert 0.020 <= sum(pauses) < 0.022  # the pauses add up to the timeout, then it gave up


def test_a_statement_inside_a_transaction_is_not_retried(
    tmp_path: Path, held: Callable[[Path], Holder], pauses: list[float]
) -> None:
    """SQLite's rule: after "busy" inside a transaction, roll back; only a statement outside
    one (or ``COMMIT``) may be tried again. A rollback-journal file makes it happen: the
    other process's reserved lock lets this one read, then refuses its write."""
    path = tmp_path / "journal.db"
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA journal_mode = DELETE")
    held(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 0")
        cur = conn.cursor(sql_sqlite.WaitingCursor)
        cur.execute("BEGIN")
        assert cur.execute("SELECT count(*) FROM held").fetchall() == [(0,)]
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            cur.execute("INSERT INTO held (x) VALUES (2)")
        assert pauses == []
        cur.execute("ROLLBACK")
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            cur.execute("SELECT * FROM nothing_here")  # not "busy": raised at once
        assert pauses == []
    finally:
        conn.close()


def test_the_pool_gets_sqlites_busy_timeout_back(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'flowkit.db'}")
    try:
        asyncio.run(store.get_run("nothing"))
        db = store._db
        c = db.connection()
        assert isinstance(c.cur, sql_sqlite.WaitingCursor)
        assert c.dbapi.execute("PRAGMA busy_timeout").fetchone() == (0,)
        dbapi = c.dbapi
        db.drop(c)  # (what a failed connection goes through) back to SQLAlchemy's pool
        assert dbapi.execute("PRAGMA busy_timeout").fetchone() == (
            sql_sqlite.SQLITE_BUSY_TIMEOUT_MS,
        )
    finally:
        store.close()


def test_a_database_not_in_wal_mode_keeps_sqlites_own_wait() -> None:
    """An in-memory database has no WAL: an autocommit write could meet a lock in its last
    step, outside ``WaitingCursor.execute``, so the store keeps SQLite's busy timeout."""
    store = SqlStore("sqlite:///:memory:")
    try:
        asyncio.run(store.get_run("nothing"))
        c = store._db.connection()
        assert not isinstance(c.cur, sql_sqlite.WaitingCursor)
        assert c.dbapi.execute("PRAGMA busy_timeout").fetchone() == (
            sql_sqlite.SQLITE_BUSY_TIMEOUT_MS,
        )
    finally:
        store.close()
