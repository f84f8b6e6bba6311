"""SqlStore's database: the schema (version, created once by racing processes, indexes and
triggers added to an existing database), URLs and ``SqlStore.check``, an unreachable server,
a dropped connection, and the plans of the queries that must use their index."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from store_kit import (
    T0,
    TAG,
    Backend,
    S,
    fired,
    fresh_database,
    gated,
    mk,
    put,
    release,
)

from flowkit import RunStatus
from flowkit.errors import (
    FlowkitError,
    NotAFlowkitDatabaseError,
)
from flowkit.stores.base import Update, parse_filter
from flowkit.stores.sql import (
    SCHEMA_VERSION,
    SchemaVersionError,
    SqlStore,
    StoreUnavailableError,
    UnsupportedDatabaseError,
)

ROOT = Path(__file__).resolve().parent.parent


# -- SQL only ------------------------------------------------------------------------------


async def test_newer_schema_version_is_refused(sql_backend: Backend) -> None:
    from flowkit.stores.sql._schema import meta

    await put(sql_backend.store, mk("r"))
    assert sql_backend.url is not None
    engine = sa.create_engine(sql_backend.url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.update(meta).values(value=str(SCHEMA_VERSION + 98)))
    finally:
        engine.dispose()
    fresh = SqlStore(sql_backend.url)
    try:
        with pytest.raises(SchemaVersionError) as ei:
            await fresh.get_run("r")
    finally:
        fresh.close()
    assert isinstance(ei.value, FlowkitError)
    assert (ei.value.found, ei.value.supported) == (SCHEMA_VERSION + 98, SCHEMA_VERSION)
    assert f"version {SCHEMA_VERSION + 98}" in str(ei.value)
    assert f"version {SCHEMA_VERSION}" in str(ei.value)


async def test_schema_is_created_once_and_reopened(sql_backend: Backend) -> None:
    await put(sql_backend.store, mk("r"))
    other = sql_backend.another()
    assert (await other.get_run("r")) == (await sql_backend.store.get_run("r"))


@pytest.mark.parametrize(
    "url",
    [
        "mysql+pymysql://u:secret@host/db",
        "oracle://u@host/db",
        "sqlite+aiosqlite:///x.db",
        "postgresql+asyncpg://u@host/db",
        "not a url",
    ],
)
def test_unsupported_database_url_is_refused_at_construction(url: str) -> None:
    with pytest.raises(UnsupportedDatabaseError) as ei:
        SqlStore(url)
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, FlowkitError)
    assert "secret" not in str(ei.value)


async def test_unreachable_database_raises_one_clear_error(tmp_path: Path) -> None:
    missing = SqlStore(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'x.db'}")
    with pytest.raises(StoreUnavailableError, match="cannot connect"):
        await missing.get_run("r")
    down = SqlStore("postgresql+psycopg://u:pw@127.0.0.1:1/db?connect_timeout=3")
    with pytest.raises(StoreUnavailableError, match=r"127\.0\.0\.1") as ei:
        await down.list_runs()
    assert "pw@" not in str(ei.value)
    missing.close()
    down.close()


# -- PostgreSQL: a dropped connection ------------------------------------------------------


@pytest.mark.postgres
async def test_a_dropped_connection_is_replaced_and_the_call_retried(
    request: pytest.FixtureRequest,
) -> None:
    """The store's connection dies while idle (a server restart, an idle timeout): the next
    call fails on its first statement, before its transaction did anything, so the store
    reconnects and runs it again once; no pre-ping round trip is spent on every call."""
    url = fresh_database(request.getfixturevalue("pg_server"))
    s = SqlStore(url)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")

    def kill() -> None:
        conns = s._db.connections()  # (the write lane's and the read lane's)
        assert len(conns) == 2
        with engine.connect() as admin:
            for conn in conns:
                pid = conn.dbapi.info.backend_pid
                admin.exec_driver_sql(f"SELECT pg_terminate_backend({pid})")
        time.sleep(0.05)

    try:
        await put(s, mk("r"))
        assert (await s.get_run("r")) is not None  # (the read lane's connection opens)
        kill()
        assert (await s.get_run("r")) is not None  # a read
        kill()
        assert (await s.claim("r", "w", T0, T0 + 30)) is not None  # a write
        kill()
        res = await s.commit("r", "w", T0 + 1, Update(events=[fired(T0 + 1)]))
        assert res.seqs == (2,)
        # the claim and the commit went out as single statements in autocommit (one round
        # trip each): a session the server ended is retried there too
        assert s._db.stats["single"] >= 2
        assert [e.seq for e in await s.load_events("r")] == [1, 2]
        # a step's record, the store's most frequent write (``Database.returning_now``)
        await s.commit("r", "w", T0 + 2, Update(status=RunStatus.RUNNING))
        kill()
        single = s._db.stats["single"]
        assert await s.append_events("r", "w", T0 + 3, [fired(T0 + 3)]) == (3,)
        assert s._db.stats["single"] == single + 1
        assert [e.seq for e in await s.load_events("r")] == [1, 2, 3]
    finally:
        s.close()
        engine.dispose()


def _open_fresh(url: str, barrier: Any, out: Any) -> None:
    """A process opening the store at the same moment as others (see the test below)."""
    s = SqlStore(url)
    barrier.wait()
    try:
        asyncio.run(s.get_run("x"))
        out.put(None)
    except Exception as exc:
        out.put(repr(exc))
    finally:
        s.close()


def test_processes_opening_a_fresh_sqlite_file_at_once_all_succeed(tmp_path: Path) -> None:
    """Several processes open the same fresh SQLite file at the same moment: switching it to
    WAL mode needs an exclusive lock, and SQLite refuses competing switches at once instead of
    waiting ("database is locked"); the store tries again until the file is in WAL mode, so
    every process gets its store (this failed about once in 60 opens before)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    failures: list[str] = []
    for trial in range(15):
        url = f"sqlite:///{tmp_path / f'fresh-{trial}.db'}"
        n = 8
        barrier, out = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_open_fresh, args=(url, barrier, out)) for _ in range(n)]
        for p in procs:
            p.start()
        results = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        failures += [r for r in results if r is not None]
    assert failures == []


@pytest.mark.parametrize(
    "index",
    [
        "ix_flowkit_runs_queue",
        "ix_flowkit_runs_waiting",
        "ix_flowkit_runs_version",
        "ix_flowkit_runs_parent",
        "ix_flowkit_runs_leased",
    ],
)
async def test_an_index_added_later_is_created_on_an_existing_database(
    sql_backend: Backend, index: str
) -> None:
    """Additive schema changes need no new schema version: a database created before an
    index existed gets it on first use, and keeps its schema version (an older flowkit
    still opens it)."""
    s = sql_backend.store
    await put(s, mk("r"))
    with s._db.tx() as conn:
        conn.exec_driver_sql(f"DROP INDEX {index}")
    assert sql_backend.url is not None
    fresh = SqlStore(sql_backend.url)
    try:
        assert await fresh.get_run("r") is not None  # first use: the schema check
        with fresh._db.tx(write=False) as conn:
            names = {ix["name"] for ix in sa.inspect(conn).get_indexes("flowkit_runs")}
            version = conn.exec_driver_sql(
                "SELECT value FROM flowkit_meta WHERE key = 'schema_version'"
            ).scalar()
        assert index in names
        assert version == str(SCHEMA_VERSION)
    finally:
        fresh.close()


def test_the_waiting_index_holds_exactly_the_waiters() -> None:
    """``ix_flowkit_runs_waiting``'s predicate is ``singleton.waiters``' rule: active, not
    cancelling (and not admitted)."""
    from flowkit._core.run import ACTIVE_STATUSES
    from flowkit.stores.sql._schema import WAITING_SQL

    waiting = sorted({s.value for s in ACTIVE_STATUSES} - {"cancelling"})
    expected = "status IN (" + ", ".join(f"'{s}'" for s in waiting) + ")"
    assert expected == WAITING_SQL


async def test_a_keys_settled_runs_are_not_read_to_find_its_first_waiter(
    sql_backend: Backend,
) -> None:
    """A long-lived key gathers settled runs; an admission check or a release reads its first
    waiters through ``ix_flowkit_runs_waiting``, which holds none of them: the plan of that
    read uses the index (SQLite is told to; PostgreSQL picks it once the table has
    statistics), and the release hands the slot to the right waiter."""
    s = sql_backend.store
    for i in range(300):
        await put(s, mk(f"old{i:03d}", key="k", t=T0 - 1000 + i, status=S.COMPLETED))
    await gated(s)
    sql = s._sql
    q = f"{sql.waiters()} LIMIT 1"
    params = sql.sharing("wf", TAG)[1]
    with s._db.tx() as conn:
        if sql_backend.name == "postgres":
            conn.exec_driver_sql("ANALYZE flowkit_runs")
            plan = conn.exec_driver_sql("EXPLAIN " + q, params).scalars().all()
        else:
            plan = [r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + q, params)]
    assert any("ix_flowkit_runs_waiting" in line for line in plan), plan
    res = await s.commit("h", "x", T0 + 3, release())
    assert [h.run.id for h in res.handed] == ["w1"]


async def test_the_last_seq_trigger_is_created_on_an_existing_sqlite_database(
    tmp_path: Path,
) -> None:
    """The trigger that lets a step's record be one ``INSERT`` is an additive change: a
    database made before it existed gets it on first use (schema version unchanged), and
    what an older flowkit writes (events at seqs its own ``UPDATE`` reserved) is untouched."""
    from flowkit.stores.sql._schema import SQLITE_LAST_SEQ_TRIGGER

    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = SqlStore(url)
    try:
        await put(old, mk("r"))
        with old._db.tx() as conn:
            conn.exec_driver_sql("DROP TRIGGER flowkit_events_last_seq")
        assert await old.claim("r", "w", T0 + 1, T0 + 60) is not None
        # an older flowkit's commit: last_seq and updated_at set by its UPDATE
        res = await old.commit("r", "w", T0 + 2, Update(events=[fired(T0 + 2)]))
        assert res.seqs == (2,)
    finally:
        old.close()
    fresh = SqlStore(url)
    try:
        assert await fresh.get_run("r") is not None  # first use: the schema check
        with fresh._db.tx(write=False) as conn:
            sql = conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE name = 'flowkit_events_last_seq'"
            ).scalar()
            version = conn.exec_driver_sql(
                "SELECT value FROM flowkit_meta WHERE key = 'schema_version'"
            ).scalar()
        assert sql is not None and "last_seq < NEW.seq" in sql
        assert "IF NOT EXISTS" in SQLITE_LAST_SEQ_TRIGGER and version == str(SCHEMA_VERSION)
        assert await fresh.append_events("r", "w", T0 + 3, [fired(T0 + 3, "1")]) == (3,)
        res = await fresh.commit("r", "w", T0 + 4, Update(events=[fired(T0 + 4, "2")]))
        assert res.seqs == (4,) and res.run.updated_at == T0 + 4
        assert [e.seq for e in await fresh.load_events("r")] == [1, 2, 3, 4]
    finally:
        fresh.close()


async def test_a_version_1_database_is_migrated_on_first_use(sql_backend: Backend) -> None:
    """Schema version 2 added ``deadline_at`` and ``recoveries`` (and the ``dead`` status),
    version 3 ``parent_id``, version 4 ``search`` (and the additive ``flowkit_search``): a
    database of version 1 gets the columns and tables on first use, its runs read back with
    no deadline, no recovery, no parent and no search attributes, and its version becomes the
    current one (an older flowkit then refuses it rather than misread a ``dead`` run)."""
    s = sql_backend.store
    await put(s, mk("r"))
    with s._db.tx() as conn:
        conn.exec_driver_sql("ALTER TABLE flowkit_runs DROP COLUMN deadline_at")
        conn.exec_driver_sql("ALTER TABLE flowkit_runs DROP COLUMN recoveries")
        conn.exec_driver_sql("DROP INDEX ix_flowkit_runs_parent")
        conn.exec_driver_sql("ALTER TABLE flowkit_runs DROP COLUMN parent_id")
        conn.exec_driver_sql("ALTER TABLE flowkit_runs DROP COLUMN continued_as")
        conn.exec_driver_sql("ALTER TABLE flowkit_runs DROP COLUMN search")
        conn.exec_driver_sql("DROP TABLE flowkit_search")
        conn.exec_driver_sql("DROP INDEX ix_flowkit_runs_settled")
        conn.exec_driver_sql("UPDATE flowkit_meta SET value = '1' WHERE key = 'schema_version'")
    assert sql_backend.url is not None
    fresh = SqlStore(sql_backend.url)
    try:
        run = await fresh.get_run("r")
        assert run is not None and run.deadline_at is None and run.recoveries == 0
        assert run.parent_id is None and run.search == {}
        with fresh._db.tx(write=False) as conn:
            cols = {c["name"] for c in sa.inspect(conn).get_columns("flowkit_runs")}
            version = conn.exec_driver_sql(
                "SELECT value FROM flowkit_meta WHERE key = 'schema_version'"
            ).scalar()
        assert {"deadline_at", "recoveries", "parent_id", "continued_as", "search"} <= cols
        assert version == str(SCHEMA_VERSION) == "4"
        await put(fresh, dataclasses.replace(mk("r2"), search={"k": 1}))
        assert [r.id for r in await fresh.list_runs()] == ["r", "r2"]
        found = await fresh.list_runs(search=parse_filter({"k": 1}))
        assert [r.id for r in found] == ["r2"]  # (flowkit_search made on first use)
    finally:
        fresh.close()


# -- SqlStore.check: a URL looked at without writing -----------------------------------------


def test_check_names_what_is_not_a_flowkit_database_and_writes_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    with pytest.raises(NotAFlowkitDatabaseError, match="no flowkit database at") as ei:
        SqlStore.check(f"sqlite:///{missing}")
    assert ei.value.missing and not missing.exists()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    con.commit()
    con.close()
    cases = {
        f"sqlite:///{empty}": (NotAFlowkitDatabaseError, "it is empty"),
        f"sqlite:///{other}": (NotAFlowkitDatabaseError, r"other tables \(invoices\)"),
        f"sqlite:///{tmp_path}": (NotAFlowkitDatabaseError, "not a file"),
        "sqlite:///:memory:": (NotAFlowkitDatabaseError, "in-memory"),
        "no url": (UnsupportedDatabaseError, "not a database URL"),
        "mysql://u@localhost/db": (UnsupportedDatabaseError, "SqlStore supports"),
        "postgresql+psycopg://u@127.0.0.1:1/flowkit": (StoreUnavailableError, "cannot connect"),
    }
    for url, (error, message) in cases.items():
        with pytest.raises(error, match=message) as got:
            SqlStore.check(url)
        assert not getattr(got.value, "missing", False), url
    assert empty.stat().st_size == 0
    con = sqlite3.connect(other)
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master")] == ["invoices"]
    con.close()


async def test_check_accepts_a_flowkit_database(sql_backend: Backend) -> None:
    assert sql_backend.url is not None
    if sql_backend.name == "postgres":  # (a fresh server database has no tables yet)
        with pytest.raises(NotAFlowkitDatabaseError, match="no flowkit tables"):
            SqlStore.check(sql_backend.url)
    await sql_backend.store.get_run("nothing")  # (the first use creates the tables)
    SqlStore.check(sql_backend.url)
