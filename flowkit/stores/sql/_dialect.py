"""The engine of a URL: the supported databases (``Dialect``), ``create_engine`` with its
connect retry, flowkit's own URL option ``flowkit_stall_timeout``, and ``check``, which looks at
a URL without creating anything. Apart from ``Database`` because none of it needs a store."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa

from ...errors import NotAFlowkitDatabaseError, StoreUnavailableError, UnsupportedDatabaseError
from . import _errors
from ._connection import Conn
from ._errors import Attempt
from ._pgconnect import configure_url, guarded_connection_class, take_pooler
from ._pgstatements import PgStatements
from ._postgres import PgConn
from ._sqlite import BUSY_TIMEOUT_PARAM, SqliteConn, SqliteStatements, setup_engine
from ._statements import Statements


@dataclass(frozen=True)
class Dialect:
    """What differs between the supported databases, in one place."""

    drivers: tuple[str, ...]
    conn: type[Conn]
    statements: type[Statements]
    engine_options: dict[str, Any] = field(default_factory=dict)
    setup: Callable[[sa.Engine, dict[str, Any]], None] | None = None
    hint: str = ""  # how to install the driver


DIALECTS = {
    "sqlite": Dialect(("pysqlite",), SqliteConn, SqliteStatements, setup=setup_engine),
    "postgresql": Dialect(
        ("psycopg", "psycopg2"),
        PgConn,
        PgStatements,
        # a server restart must not poison pooled connections
        engine_options={"pool_pre_ping": True},
        hint=" (pip install 'flowkit[postgres]')",
    ),
}

_TABLES = {"flowkit_meta", "flowkit_runs", "flowkit_events"}


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _url(url: str) -> tuple[sa.URL, Dialect]:
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise UnsupportedDatabaseError(f"not a database URL: {url!r}") from None
    dialect = DIALECTS.get(u.get_backend_name())
    if dialect is None or u.get_driver_name() not in dialect.drivers:
        raise UnsupportedDatabaseError(
            f"SqlStore supports sqlite:///path and postgresql+psycopg://..., "
            f"not {u.drivername!r} (URL {u.render_as_string(hide_password=True)!r})"
        )
    if u.get_backend_name() == "sqlite" and not u.database:
        # (SQLAlchemy would open a private in-memory database: every run lost on close)
        raise UnsupportedDatabaseError(
            f"{url!r} names no database file: give a path (sqlite:///flowkit.db), or"
            " sqlite:///:memory: for a throwaway in-memory database"
        )
    return u, dialect


def create_engine(url: str) -> sa.Engine:
    """A SQLAlchemy engine for a supported URL, or ``UnsupportedDatabaseError``. PostgreSQL
    connections get flowkit's timeouts and keepalives unless the URL sets them
    (``_pgconnect.configure_url``), and a connect that fails for a transient reason is tried
    again for a moment (``_connect_retrying``)."""
    u, dialect = _url(url)
    shown = u.render_as_string(hide_password=True)
    setup: dict[str, Any] = {}
    io_timeout: float | None = None
    pooled = False  # behind a transaction-mode pooler (``_pgconnect.take_pooler``)
    if u.get_backend_name() == "postgresql":
        try:
            u, pooled = take_pooler(u)
        except ValueError as exc:
            raise UnsupportedDatabaseError(
                f"cannot use the database URL {shown!r}: {exc}"
            ) from None
        u, io_timeout = configure_url(u, session_settings=not pooled)
    elif BUSY_TIMEOUT_PARAM in u.query:
        setup[BUSY_TIMEOUT_PARAM] = u.query[BUSY_TIMEOUT_PARAM]
        u = u.difference_update_query([BUSY_TIMEOUT_PARAM])
    options = {"json_serializer": _json_dumps, "json_deserializer": orjson.loads}
    try:
        engine = sa.create_engine(u, **options, **dialect.engine_options)
    except (ImportError, sa.exc.NoSuchModuleError) as exc:
        raise UnsupportedDatabaseError(
            f"cannot load the database driver for {u.drivername!r}: {exc}{dialect.hint}"
        ) from exc
    except (TypeError, ValueError, sa.exc.ArgumentError) as exc:
        raise UnsupportedDatabaseError(f"cannot use the database URL {shown!r}: {exc}") from exc
    engine.flowkit_shown_url = shown  # type: ignore[attr-defined]
    engine.flowkit_pooled = pooled  # type: ignore[attr-defined]
    if dialect.setup is not None:
        dialect.setup(engine, setup)
    if u.get_backend_name() == "postgresql":
        _connect_retrying(engine, io_timeout, pooled)
    return engine


def _connect_retrying(engine: sa.Engine, io_timeout: float | None, pooled: bool) -> None:
    """Every new connection of ``engine``: psycopg 3's with its waits bounded by
    ``io_timeout`` (``guarded_connection_class``); a connect that fails for a transient reason
    (refused, reset, the server starting up) is tried again after 20 ms, 40 ms... within
    ``_errors.RETRY_BUDGET`` seconds, so a restarting server is waited for, briefly. Behind a
    transaction-mode pooler (``pooled``) they prepare no statements."""
    guarded = guarded_connection_class() if engine.dialect.driver == "psycopg" else None

    @sa.event.listens_for(engine, "do_connect")
    def _do_connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        attempt = Attempt()
        while True:
            try:
                if guarded is None:
                    return dialect.connect(*cargs, **cparams)
                conn = guarded.connect(*cargs, **cparams)
                conn.flowkit_io_timeout = io_timeout
                if pooled:  # no prepared statements: a pooler may route each to another server
                    conn.prepare_threshold = None
                conn.flowkit_pooled = pooled
                return conn
            except Exception as exc:
                if (
                    _errors.classify(exc) != _errors.TRANSIENT
                    or _errors.permanent_connect_failure(exc)
                    or not attempt.pause()
                ):
                    raise


def check(url: str) -> None:
    """That ``url`` names an existing flowkit database, without writing to it (``SqlStore``
    would create flowkit's tables in any database). ``UnsupportedDatabaseError``,
    ``StoreUnavailableError`` or ``NotAFlowkitDatabaseError`` say what is wrong."""
    u, _dialect = _url(url)
    if u.get_backend_name() == "sqlite":
        if u.database in (None, "", ":memory:"):
            raise NotAFlowkitDatabaseError(f"{url!r} is an in-memory database: it holds no runs")
        _check_sqlite_file(Path(u.database))
        return
    engine = create_engine(url)
    shown = engine.flowkit_shown_url  # type: ignore[attr-defined]
    try:
        with engine.connect() as conn:
            found = sa.inspect(conn).has_table("flowkit_meta")
    except Exception as exc:
        if not _errors.is_database_error(exc):
            raise
        raise StoreUnavailableError(
            f"cannot connect to the flowkit database {shown}: {_errors.root(exc)}"
        ) from exc
    finally:
        engine.dispose()
    if not found:
        raise NotAFlowkitDatabaseError(
            f"{shown} is not a flowkit database: it has no flowkit tables"
        )


def _check_sqlite_file(path: Path) -> None:
    if not path.exists():
        raise NotAFlowkitDatabaseError(f"no flowkit database at {path}", missing=True)
    if not path.is_file():
        raise NotAFlowkitDatabaseError(f"{path} is not a flowkit database: not a file")
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {
                row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise NotAFlowkitDatabaseError(f"{path} is not a flowkit database: {exc}") from None
    if tables >= _TABLES:
        return
    if not tables:
        why = "it is empty" if path.stat().st_size == 0 else "it has no tables"
    else:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        why = f"it has other tables ({shown})"
    raise NotAFlowkitDatabaseError(f"{path} is not a flowkit database: {why}")


STALL_TIMEOUT = 10.0
"""Seconds a store call may stay stuck on its connection before it is abandoned (the
default of ``SqlStore(stall_timeout=...)`` and of the URL's ``flowkit_stall_timeout``): well
below the default lease TTL (30 s), so a worker learns of a stalled database while its leases
still hold."""

_STALL_PARAM = "flowkit_stall_timeout"


def take_stall_timeout(url: str) -> tuple[str, float | None]:
    """``url`` without flowkit's own ``flowkit_stall_timeout`` query option, and its value
    (seconds; ``0``/``none``: never abandon) when it was there."""
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return url, None  # (``create_engine`` says what is wrong)
    if _STALL_PARAM not in u.query:
        return url, None
    raw = u.query[_STALL_PARAM]
    text = raw if isinstance(raw, str) else raw[-1]
    rest = u.difference_update_query([_STALL_PARAM])
    if text.lower() in ("", "0", "none", "off"):
        return rest.render_as_string(hide_password=False), 0.0
    try:
        value = float(text)
    except ValueError:
        raise UnsupportedDatabaseError(f"{_STALL_PARAM} must be a number of seconds") from None
    if not value >= 0:
        raise UnsupportedDatabaseError(f"{_STALL_PARAM} must be a number of seconds")
    return rest.render_as_string(hide_password=False), value


__all__ = [
    "DIALECTS",
    "STALL_TIMEOUT",
    "Dialect",
    "check",
    "create_engine",
    "take_stall_timeout",
]
