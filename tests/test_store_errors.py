"""What a SqlStore caller sees when the database fails: typed errors only (``_errors``), the
classifier checked against real errors of a real PostgreSQL server and real SQLite files,
the connection defaults a URL can override, and SQLite's refusals (no path, a read-only
database, a lock held past the busy timeout). Outages through a proxy and a restarting
server: tests/test_store_outages.py."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from store_kit import T0, first_events, mk, put

try:
    from pg import fresh_database
except ImportError:  # tests/ imported as a package
    from tests.pg import fresh_database

from flowkit.errors import (
    ConflictError,
    FlowkitError,
    SerializationError,
    StoreUnavailableError,
    UnsupportedDatabaseError,
)
from flowkit.stores.sql import SqlStore
from flowkit.stores.sql import _errors as E
from flowkit.stores.sql._pgconnect import configure_url


def _raw(url: str) -> str:
    """A libpq conninfo for a test server's SQLAlchemy URL."""
    u = sa.engine.make_url(url)
    return f"host={u.query['host']} user=postgres dbname={u.database}"


def _error_of(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Exception:
    try:
        conn.execute(sql, params)
    except psycopg.Error as exc:
        return exc
    raise AssertionError(f"{sql} did not fail")


@pytest.fixture
def pg_url(pg_server: str) -> str:
    return fresh_database(pg_server)


@pytest.fixture
def pg_conn(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(_raw(pg_url), autocommit=True) as conn:
        yield conn


# -- the classifier, with the server's own errors ----------------------------------------------


def test_the_classifier_sorts_real_postgresql_errors(pg_conn: psycopg.Connection[Any]) -> None:
    div = _error_of(pg_conn, "SELECT 1/0")
    assert (E.sqlstate(div), E.classify(div)) == ("22012", E.DATA)
    nul = _error_of(pg_conn, "SELECT %s::jsonb", ['{"a": "\\u0000"}'])
    assert (E.sqlstate(nul), E.classify(nul)) == ("22P05", E.DATA)  # untranslatable character
    client_nul = _error_of(pg_conn, "SELECT %s::text", ["a\x00b"])  # refused by psycopg
    assert E.classify(client_nul) == E.DATA
    big = _error_of(pg_conn, "SELECT 99999999999::int4")
    assert (E.sqlstate(big), E.classify(big)) == ("22003", E.DATA)
    pg_conn.execute("CREATE TABLE t (k int PRIMARY KEY)")
    pg_conn.execute("INSERT INTO t VALUES (1)")
    dup = _error_of(pg_conn, "INSERT INTO t VALUES (1)")
    assert (E.sqlstate(dup), E.classify(dup)) == ("23505", E.CONFLICT)
    null = _error_of(pg_conn, "INSERT INTO t VALUES (NULL)")
    assert (E.sqlstate(null), E.classify(null)) == ("23502", E.DATA)
    pg_conn.execute("SET statement_timeout = 50")
    slow = _error_of(pg_conn, "SELECT pg_sleep(5)")
    pg_conn.execute("SET statement_timeout = 0")
    assert (E.sqlstate(slow), E.classify(slow)) == ("57014", E.TRANSIENT)
    assert E.rolled_back(slow) and not E.ended(slow)
    missing = _error_of(pg_conn, "SELECT * FROM no_such_table")
    assert (E.sqlstate(missing), E.classify(missing)) == ("42P01", E.OTHER)
    # the same errors wrapped by SQLAlchemy classify the same
    wrapped = sa.exc.DBAPIError.instance("SELECT 1/0", None, div, psycopg.Error)
    assert E.classify(wrapped) == E.DATA and E.root(wrapped) is div


def test_the_classifier_sorts_a_terminated_session_and_a_refused_connect(
    pg_url: str, pg_conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(_raw(pg_url), autocommit=True) as victim:
        pid = victim.info.backend_pid
        pg_conn.execute("SELECT pg_terminate_backend(%s)", [pid])
        ended = _error_of(victim, "SELECT 1")
        assert E.classify(ended) == E.TRANSIENT and victim.broken
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect("host=/nonexistent-flowkit-dir user=postgres connect_timeout=2")
    assert E.classify(refused.value) == E.TRANSIENT
    assert not E.permanent_connect_failure(refused.value)
    with pytest.raises(psycopg.OperationalError) as nodb:
        psycopg.connect(_raw(pg_url).replace(sa.engine.make_url(pg_url).database or "", "nope"))
    assert E.permanent_connect_failure(nodb.value)  # no such database: not worth a retry


def test_the_classifier_sorts_real_sqlite_errors(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    a = sqlite3.connect(path, isolation_level=None)
    b = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        a.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        a.execute("INSERT INTO t VALUES (1, 'x')")
        with pytest.raises(sqlite3.IntegrityError) as dup:
            a.execute("INSERT INTO t VALUES (1, 'y')")
        assert E.classify(dup.value) == E.CONFLICT
        with pytest.raises(sqlite3.IntegrityError) as null:
            a.execute("INSERT INTO t VALUES (2, NULL)")
        assert E.classify(null.value) == E.DATA
        with pytest.raises(sqlite3.Error) as bad:
            a.execute("INSERT INTO t VALUES (3, ?)", [object()])
        assert E.classify(bad.value) == E.DATA
        a.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as locked:
            b.execute("BEGIN IMMEDIATE")
        assert E.classify(locked.value) == E.TRANSIENT
        a.execute("ROLLBACK")
    finally:
        a.close()
        b.close()
    ro = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        with pytest.raises(sqlite3.OperationalError) as readonly:
            ro.execute("INSERT INTO t VALUES (4, 'z')")
        assert E.classify(readonly.value) == E.OTHER  # no retry cures a read-only file
        err = E.translate(readonly.value, "x.db")
        assert isinstance(err, StoreUnavailableError) and err.__cause__ is readonly.value
    finally:
        ro.close()


def test_translate_gives_typed_errors_with_the_cause_chained(
    pg_conn: psycopg.Connection[Any],
) -> None:
    div = _error_of(pg_conn, "SELECT 1/0")
    err = E.translate(div, "db")
    assert isinstance(err, SerializationError) and err.__cause__ is div and "22012" in str(err)
    pg_conn.execute("CREATE TABLE u (k int PRIMARY KEY)")
    pg_conn.execute("INSERT INTO u VALUES (1)")
    dup = E.translate(_error_of(pg_conn, "INSERT INTO u VALUES (1)"), "db")
    assert isinstance(dup, ConflictError)
    other = ValueError("not a database error")
    assert E.translate(other, "db") is other  # left alone


# -- typed errors out of the store ------------------------------------------------------------


async def test_a_value_postgresql_cannot_hold_is_a_serialization_error(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backstop behind the limits (``flowkit.stores.limits``, which refuse NUL before any
    write): a value the database itself refuses is a ``SerializationError`` too."""
    from flowkit.stores import limits

    monkeypatch.setattr(limits, "check_run", lambda *args: None)
    store = SqlStore(pg_url)
    try:
        run = dataclasses.replace(mk("nul"), input={"text": "a\x00b"})  # refused by jsonb
        with pytest.raises(SerializationError) as got:
            await store.create_run(run, first_events(run))
        assert E.sqlstate(got.value.__cause__) == "22P05"
        assert await store.get_run("nul") is None  # nothing written
        await put(store, mk("ok"))  # the store is still good
        assert (await store.get_run("ok")) is not None
    finally:
        store.close()


def test_the_url_defaults_and_their_overrides() -> None:
    u, io = configure_url(sa.engine.make_url("postgresql+psycopg://u@h/db"))
    assert u.query["connect_timeout"] == "5" and u.query["keepalives"] == "1"
    assert u.query["tcp_user_timeout"] == "10000"
    assert "statement_timeout=30s" in str(u.query["options"]) and io == 35.0
    given = (
        "postgresql+psycopg://u@h/db?connect_timeout=2&statement_timeout=1500&options=-c%20x%3D1"
    )
    u, io = configure_url(sa.engine.make_url(given))
    assert u.query["connect_timeout"] == "2"
    assert "statement_timeout" not in u.query  # (translated: libpq would refuse it)
    assert str(u.query["options"]).startswith("-c x=1 -c statement_timeout=1500")
    assert io == 6.5
    u, io = configure_url(sa.engine.make_url(given + "&flowkit_io_timeout=2"))
    assert io == 2.0 and "flowkit_io_timeout" not in u.query


async def test_the_store_connection_carries_the_defaults_or_the_urls_settings(
    pg_url: str,
) -> None:
    def shown(store: SqlStore, name: str) -> str:
        return str(store._db.connection().dbapi.execute(f"SHOW {name}").fetchone()[0])

    default = SqlStore(pg_url)
    sep = "&" if "?" in pg_url else "?"
    tuned = SqlStore(
        f"{pg_url}{sep}statement_timeout=1234&idle_in_transaction_session_timeout=7s"
        "&lock_timeout=2s&connect_timeout=3"
    )
    try:
        await default.get_run("x")
        await tuned.get_run("x")
        assert shown(default, "statement_timeout") == "30s"
        assert shown(default, "idle_in_transaction_session_timeout") == "20s"
        assert shown(default, "lock_timeout") == "0"
        assert shown(tuned, "statement_timeout") == "1234ms"
        assert shown(tuned, "idle_in_transaction_session_timeout") == "7s"
        assert shown(tuned, "lock_timeout") == "2s"
        assert "statement_timeout" not in repr(tuned).split("?")[0]
        assert "keepalives" not in repr(default)  # shown as given
    finally:
        default.close()
        tuned.close()


# -- SQLite -----------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://"])
def test_a_sqlite_url_without_a_path_is_refused(url: str) -> None:
    with pytest.raises(UnsupportedDatabaseError, match="names no database file"):
        SqlStore(url)


async def test_an_explicit_in_memory_sqlite_database_still_works() -> None:
    store = SqlStore("sqlite:///:memory:")
    try:
        await put(store, mk("m"))
        assert (await store.get_run("m")) is not None
    finally:
        store.close()


async def test_a_read_only_sqlite_database_fails_the_first_write_clearly(tmp_path: Path) -> None:
    """A database the process may read but not write (here opened ``mode=ro``: the tests may
    run as root, whom file permissions do not stop): reads work, the first write raises
    ``StoreUnavailableError`` saying what to fix, and nothing is written."""
    path = tmp_path / "flowkit.db"
    store = SqlStore(f"sqlite:///{path}")
    await put(store, mk("a"))
    store.close()
    ro = SqlStore(f"sqlite:///file:{path}?mode=ro&uri=true")
    try:
        assert (await ro.get_run("a")) is not None
        with pytest.raises(StoreUnavailableError, match=r"readonly.*must be writable") as got:
            await put(ro, mk("b"))
        assert isinstance(got.value.__cause__, sqlite3.OperationalError)
        assert await ro.get_run("b") is None
    finally:
        ro.close()


async def test_a_fresh_sqlite_file_in_a_read_only_place_fails_at_the_first_call(
    tmp_path: Path,
) -> None:
    """No file yet and nowhere to create one (a path under a regular file stands in for a
    directory the process may not write, which root could): the first call raises
    ``StoreUnavailableError``."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    store = SqlStore(f"sqlite:///{blocker / 'flowkit.db'}")
    try:
        with pytest.raises(StoreUnavailableError, match="must be writable"):
            await store.get_run("a")
    finally:
        store.close()


async def test_a_sqlite_lock_held_past_the_busy_timeout_is_store_unavailable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "flowkit.db"
    store = SqlStore(f"sqlite:///{path}?busy_timeout=100")
    await put(store, mk("a"))
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        with pytest.raises(StoreUnavailableError, match="locked") as got:
            await store.claim("a", "w", T0 + 1, T0 + 31)
        assert isinstance(got.value.__cause__, sqlite3.OperationalError)
        assert (await store.get_run("a")) is not None  # WAL: reads go on
        other.execute("ROLLBACK")
        assert (await store.claim("a", "w", T0 + 1, T0 + 31)) is not None
    finally:
        other.close()
        store.close()


def test_a_bad_busy_timeout_is_refused() -> None:
    with pytest.raises(UnsupportedDatabaseError, match="busy_timeout"):
        SqlStore("sqlite:///x.db?busy_timeout=soon")


def test_every_store_error_is_a_flowkit_error() -> None:
    for cls in (StoreUnavailableError, SerializationError, ConflictError):
        assert issubclass(cls, FlowkitError)
