"""The database side of ``SqlStore``: URL checks, the SQLAlchemy engine, dialect setup and
transactions.

* SQLite: WAL mode, a busy timeout, and ``BEGIN IMMEDIATE`` for every transaction that may
  write, emitted from SQLAlchemy's ``begin`` event after taking transaction control away from
  the ``sqlite3`` module (the recipe of SQLAlchemy's SQLite docs). Admission, commit and claim
  read state and then write based on it; taking the write lock *before* the first read means
  two processes can never both read "slot free" and both write "admitted". Pure reads keep a
  deferred ``BEGIN`` and never wait for writers (WAL snapshots).
* PostgreSQL: ``lock_key`` takes a transaction-scoped advisory lock on a hash of
  ``workflow:key``, so competing claims of one singleton key are serialized inside one
  transaction while different keys never wait for each other.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import sqlalchemy as sa

from ._rows import lock_name
from ._schema import StoreUnavailableError, UnsupportedDatabaseError, ensure_schema

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for another process' write lock before failing."""

_READ_ONLY = "flowkit_read_only"
_DRIVERS = {"sqlite": ("pysqlite",), "postgresql": ("psycopg", "psycopg2")}


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _setup_sqlite(engine: sa.Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module: it would otherwise BEGIN
        # lazily (deferred, and only before DML); we emit our own BEGIN in "begin" below.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA journal_mode = WAL")  # readers never block the writer
        finally:
            cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # BEGIN IMMEDIATE: admission (and every read-then-write) takes the write lock before
        # it reads; with a deferred BEGIN two processes could both read the same free slot
        # before either writes. Waits are bounded by busy_timeout.
        read_only = conn.get_execution_options().get(_READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def create_engine(url: str) -> sa.Engine:
    """A SQLAlchemy engine for a supported URL, or ``UnsupportedDatabaseError``."""
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise UnsupportedDatabaseError(f"not a database URL: {url!r}") from None
    backend, driver = u.get_backend_name(), u.get_driver_name()
    if backend not in _DRIVERS or driver not in _DRIVERS[backend]:
        raise UnsupportedDatabaseError(
            f"SqlStore supports sqlite:///path and postgresql+psycopg://..., "
            f"not {u.drivername!r} (URL {u.render_as_string(hide_password=True)!r})"
        )
    kwargs: dict[str, Any] = {"json_serializer": _json_dumps, "json_deserializer": orjson.loads}
    if backend == "postgresql":
        kwargs["pool_pre_ping"] = True  # a server restart must not poison pooled connections
    try:
        engine = sa.create_engine(u, **kwargs)
    except (ImportError, sa.exc.NoSuchModuleError) as exc:
        hint = " (pip install 'flowkit[postgres]')" if backend == "postgresql" else ""
        raise UnsupportedDatabaseError(
            f"cannot load the database driver for {u.drivername!r}: {exc}{hint}"
        ) from exc
    if backend == "sqlite":
        _setup_sqlite(engine)
    return engine


class Database:
    """One engine, shared by a ``SqlStore`` and its scoped views; the schema is checked (and
    created) once, on the first transaction."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        self.dialect = self.engine.dialect.name
        self._schema_ready = False
        self._lock = threading.Lock()

    @property
    def shown_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def connect(self) -> sa.Connection:
        try:
            return self.engine.connect()
        except sa.exc.DBAPIError as exc:
            raise StoreUnavailableError(
                f"cannot connect to the flowkit database {self.shown_url}: {exc.orig}"
            ) from exc

    def ensure_schema(self) -> None:
        if self._schema_ready:
            return
        with self._lock:
            if self._schema_ready:
                return
            with self.connect() as conn, conn.begin():
                ensure_schema(conn)
            self._schema_ready = True

    @contextmanager
    def tx(self, *, write: bool = True) -> Iterator[sa.Connection]:
        """One transaction; ``write`` ones take SQLite's write lock up front."""
        self.ensure_schema()
        with self.connect() as conn:
            if not write:
                conn.execution_options(**{_READ_ONLY: True})
            with conn.begin():
                yield conn

    def lock_key(self, conn: sa.Connection, workflow: str, tag: str) -> None:
        """Serialize work on one singleton key until the transaction ends (PostgreSQL; on
        SQLite ``BEGIN IMMEDIATE`` already serialized the whole transaction)."""
        if self.dialect == "postgresql":
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"),
                {"k": lock_name(workflow, tag)},
            )

    def dispose(self) -> None:
        self.engine.dispose()


__all__ = ["SQLITE_BUSY_TIMEOUT_MS", "Database", "create_engine"]
