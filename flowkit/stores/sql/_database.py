"""``Database``: one SQLAlchemy engine (``_engine``: URL, pool, dialect), the schema
bootstrap, the store's own connection with what its failures mean, and the wake-up watchers;
shared by a ``SqlStore`` and its scoped views. Its I/O lanes are ``_io_lanes``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import sqlalchemy as sa

from ...errors import StoreUnavailableError
from . import _errors, _wakeup
from ._connection import Conn, log
from ._dialect import DIALECTS, STALL_TIMEOUT, Dialect, check, create_engine, take_stall_timeout
from ._errors import Attempt, attempts
from ._io_lanes import Lanes
from ._iothread import Stats
from ._schema import ensure_schema
from ._sqlite import READ_ONLY
from ._statements import Statements

T = TypeVar("T")


def _nothing() -> None:
    pass


class Database(Lanes):
    """One engine, shared by a ``SqlStore`` and its scoped views; the schema is checked (and
    created) once, on the first use. The async face runs the store's calls on I/O threads
    (``_iothread.Lane``: one for writes, one for reads, each with its own ``Conn``); calls made
    without a running loop or without group commit run inline on the caller's thread, on the
    inline lane's connection, one at a time (``io``). ``conn`` and ``io`` are those of the lane
    the current thread serves. ``stats`` counts transactions, statements and batches."""

    def __init__(
        self, url: str, *, wakeups: bool = True, stall_timeout: float | None = None
    ) -> None:
        url, from_url = take_stall_timeout(url)
        self.engine = create_engine(url)
        self.dialect = self.engine.dialect.name
        self.kind = DIALECTS[self.dialect]
        self.pg = self.dialect == "postgresql"
        self._schema_ready = False
        self._lock = threading.Lock()
        # whether ``watch`` listens (writes emit wake-ups regardless); never behind a
        # transaction-mode pooler: ``LISTEN`` needs a server session of its own
        self.wakeups = wakeups and not getattr(self.engine, "flowkit_pooled", False)
        # the wake-up watchers, one hub per event loop (``_wakeup``)
        self._hubs: dict[asyncio.AbstractEventLoop, _wakeup.Hub] = {}
        self._hub_lock = threading.Lock()
        self.stats = Stats()
        if stall_timeout is None:
            stall_timeout = STALL_TIMEOUT if from_url is None else from_url
        if not stall_timeout >= 0:
            raise ValueError("stall_timeout must be a number of seconds (0: never abandon)")
        self.stall_timeout = float(stall_timeout)  # 0: never abandon a call
        # an in-memory SQLite database is one per connection (per thread): it runs inline
        memory = self.dialect == "sqlite" and self.engine.url.database in (None, "", ":memory:")
        self._open_lanes(pg=self.pg, threaded=not memory)
        self.dbapi_error: type[Exception] = self.engine.dialect.loaded_dbapi.Error
        # (SQLite) the connection of ``change_stamp``'s ``PRAGMA data_version``: it never
        # writes, so every commit of another connection, ours included, changes it
        self.stamp_conn: Any = None

    @property
    def shown_url(self) -> str:
        """The URL as given, password hidden (without the defaults flowkit added)."""
        return str(self.engine.flowkit_shown_url)  # type: ignore[attr-defined]

    def statements(self, namespace: str | None) -> Statements:
        """The statements of a store of ``namespace`` on this database."""
        return self.kind.statements(namespace)

    def connect(self) -> sa.Connection:
        try:
            return self.engine.connect()
        except Exception as exc:
            raise self.connect_failed(exc) from exc

    def connect_failed(self, exc: Exception) -> Exception:
        """What a failed connect raises: ``StoreUnavailableError`` for a database error."""
        if not _errors.is_database_error(exc):
            return exc
        err = StoreUnavailableError(
            f"cannot connect to the flowkit database {self.shown_url}: {_errors.root(exc)}"
            + self._read_only_hint(exc)
        )
        err.__cause__ = exc
        return err

    def _read_only_hint(self, exc: BaseException) -> str:
        """(SQLite) what to do about a file or directory flowkit may not write."""
        if self.pg:
            return ""
        text = str(_errors.root(exc))
        if "readonly" in text or "read-only" in text or "unable to open" in text:
            return (
                " (flowkit writes to the database file and, in WAL mode, creates its -wal and"
                " -shm files beside it: the file and its directory must be writable)"
            )
        return ""

    def ensure_schema(self) -> None:
        if self._schema_ready:
            return
        with self._lock:
            if self._schema_ready:
                return
            try:
                with self.connect() as conn, conn.begin():
                    ensure_schema(conn)
            except Exception as exc:
                err = self.wrap(None, exc)
                if err is exc:
                    raise
                raise err from exc
            self._schema_ready = True

    @contextmanager
    def tx(self, *, write: bool = True) -> Iterator[sa.Connection]:
        """One SQLAlchemy transaction; ``write`` ones take SQLite's write lock up front. The
        store's hot paths run on ``connection`` instead. A database error comes out typed
        (``wrap``)."""
        self.ensure_schema()
        try:
            with self.connect() as conn:
                if not write:
                    conn.execution_options(**{READ_ONLY: True})
                with conn.begin():
                    yield conn
        except Exception as exc:
            err = self.wrap(None, exc)
            if err is exc:
                raise
            raise err from exc

    def dispose(self) -> None:
        with self._hub_lock:
            hubs = list(self._hubs.values())
            self._hubs.clear()
        for hub in hubs:
            hub.stop()
        self._close_lanes()
        if self.stamp_conn is not None:
            self.stamp_conn.close()
            self.stamp_conn = None
        self.engine.dispose()

    # -- wake-ups across processes (``_wakeup``) ----------------------------------------------
    def watch(self, callback: Callable[[], None], namespace: str | None) -> Callable[[], None]:
        """Call ``callback()`` on the running event loop whenever a wake-up of ``namespace``
        (``None``: any) is emitted by any store object on this database; the returned function
        stops it. The loop's watcher starts with its first callback and stops with its last."""
        loop = asyncio.get_running_loop()
        if not self.wakeups:
            return _nothing
        with self._hub_lock:
            hub = self._hubs.get(loop)
            new = hub is None
            if hub is None:
                hub = _wakeup.make_hub(self, loop)
                if hub is None:
                    return _nothing
                self._hubs[loop] = hub
            token = hub.add(callback, namespace)
        if new:
            hub.start()
        done = False

        def unwatch() -> None:
            nonlocal done
            if done:
                return
            done = True
            with self._hub_lock:
                last = hub.remove(token) and self._hubs.get(loop) is hub
                if last:
                    del self._hubs[loop]
            if last:
                hub.stop()

        return unwatch

    def hub(self) -> _wakeup.Hub | None:
        """The running event loop's wake-up watcher, if one is running (tests, benchmarks)."""
        return self._hubs.get(asyncio.get_running_loop())

    # -- the store's connection and its failures --------------------------------------------
    def connection(self) -> Conn:
        c = self.conn
        if c is not None:
            return c
        self.ensure_schema()
        try:
            fairy = self.engine.raw_connection()
        except Exception as exc:
            raise self.connect_failed(exc) from exc
        try:
            c = self.conn = self.kind.conn(fairy, self.counts)
        except Exception as exc:  # setting the connection up failed
            fairy.invalidate()
            raise self.connect_failed(exc) from exc
        return c

    def drop(self, c: Conn) -> None:
        """Forget a connection that failed (a server restart): the next call reconnects."""
        if self.conn is c:
            self.conn = None
        c.close()

    def failed(self, c: Conn, exc: Exception) -> Exception:
        """What a call that failed on ``c`` raises (``wrap``), after dropping ``c`` when the
        failure broke it (the next call reconnects)."""
        if _errors.is_database_error(exc) and c.broken():
            self.drop(c)
        return self.wrap(c, exc)

    def wrap(self, c: Conn | None, exc: Exception) -> Exception:
        """A database error as the typed error a caller sees (``_errors.translate``:
        ``StoreUnavailableError``, ``SerializationError``, ``ConflictError``), the original
        chained as its cause; other exceptions as they are."""
        err = _errors.translate(exc, self.shown_url)
        assert isinstance(err, Exception)
        if isinstance(err, StoreUnavailableError):
            err.args = (str(err) + self._read_only_hint(exc),)
        return err

    def attempts(self) -> Iterator[Attempt]:
        """``for attempt in db.attempts():`` the tries of one call (``retryable``)."""
        return attempts()  # type: ignore[no-any-return]

    def retryable(
        self, c: Conn, exc: BaseException, attempt: Attempt | None = None, *, read: bool = False
    ) -> bool:
        """Whether a call that failed on ``c`` may run again, on a fresh connection when
        ``c`` broke: a transient failure that provably did not commit (``c`` broke before
        the transaction sent anything, the server ended the session before reading it, or
        the server reported the error and rolled back: ``_errors.rolled_back``); ``read``:
        a call that only reads, any transient failure. With ``attempt``, only within its
        budget, after its pause."""
        if not _errors.is_database_error(exc) or _errors.classify(exc) != _errors.TRANSIENT:
            return False
        broken = c.broken()
        if read:
            safe = True
        elif broken:
            safe = c.statements == 0 or _errors.ended(exc)
        else:
            safe = _errors.rolled_back(exc)
        if not safe:
            return False
        if broken or _errors.sqlstate(exc) == "25006":
            # (25006: the server is a standby now, a failover: a fresh connection finds the
            # new primary through the URL's hosts and target_session_attrs)
            self.drop(c)
        return attempt is None or attempt.pause()

    def terminated(self, c: Conn, exc: BaseException, attempt: Attempt | None = None) -> bool:
        """Whether a single statement sent in autocommit on ``c`` surely did not take effect,
        and may be sent again: the server ended the session before it read it (SQLSTATE
        ``57P01`` to ``57P03``; ``c`` is dropped), or the server reported a transient error and
        rolled it back (a deadlock, a lock or statement timeout). Any other broken connection
        may have committed it. With ``attempt``, only within its budget, after its pause."""
        if not _errors.is_database_error(exc):
            return False
        if c.broken():
            if not _errors.ended(exc):
                return False
            self.drop(c)
        elif not _errors.rolled_back(exc):
            return False
        elif _errors.sqlstate(exc) == "25006":  # a standby now: find the primary afresh
            self.drop(c)
        return attempt is None or attempt.pause()

    def notify_after(self, c: Conn) -> None:
        """The wake-up that single-statement calls asked for, after their commit (a hint: when
        it fails, the timer poll still finds the work)."""
        if not c.wakes:
            return
        try:
            c.notify_now()
        except Exception:
            log.warning("sending a wake-up failed", exc_info=True)
            if c.broken():
                self.drop(c)

    # -- calls outside a write transaction --------------------------------------------------
    def run_read(self, fn: Callable[[Conn], T]) -> T:
        """``fn`` on the store's connection outside a write transaction (autocommit reads:
        each statement sees the latest committed state)."""
        with self.io:
            for attempt in self.attempts():
                c = self.connection()
                c.statements = 0
                self.counts["read_tx"] += 1
                try:
                    return fn(c)
                except Exception as exc:
                    if self.retryable(c, exc, attempt, read=True):
                        continue
                    raise self.failed(c, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def returning_now(self, sql: str, params: Any) -> Any:
        """A lone write statement with ``RETURNING`` in autocommit (PostgreSQL; SQLite for a
        statement that may run so, see ``Op.lite``), run at once: its first row, or ``None``
        when it matched nothing. The record of every step goes this way; a statement is sent
        again only when the server had ended the session before reading it."""
        with self.io:
            for attempt in self.attempts():
                c = self.conn
                if c is None:
                    c = self.connection()
                if self.pg and c.broken():  # known before anything was sent
                    self.drop(c)
                    c = self.connection()
                if (
                    c.flushes_later() or c.committed
                ):  # pragma: no cover - a bug: outside a transaction
                    raise AssertionError("returning_now inside a call's transaction")
                c.statements = 0
                c.sql = sql
                try:
                    cur = c.cur
                    cur.execute(sql, params)
                    c.statements = 1
                    rows = cur.fetchall()
                except Exception as exc:
                    if self.terminated(c, exc, attempt):
                        continue
                    raise self.failed(c, exc) from exc
                stats = self.counts
                stats["statements"] += 1
                stats["write_tx"] += 1
                stats["single"] += 1
                stats["ops"] += 1
                return rows[0] if rows else None
        raise AssertionError("unreachable")  # pragma: no cover


__all__ = ["DIALECTS", "Database", "Dialect", "check", "create_engine"]
