"""The database side of ``SqlStore``: URL checks, the SQLAlchemy engine, dialect setup and
transactions.

* SQLite: WAL mode, a wait for another process's write lock (SQLite's busy timeout; on the
  store's own connection ``WaitingCursor``, in finer steps), and ``BEGIN IMMEDIATE`` for
  every transaction that may write (``Conn.begin``; for SQLAlchemy transactions emitted from
  its ``begin`` event), after taking transaction control away from the ``sqlite3`` module
  (the recipe of SQLAlchemy's SQLite docs). Admission, commit and claim read state and then
  write based on it; taking the write lock *before* the first read means two processes can
  never both read "slot free" and both write "admitted". Pure reads never wait for writers
  (WAL snapshots): the store's are single statements outside any transaction, SQLAlchemy's
  keep a deferred ``BEGIN``.
* PostgreSQL: ``lock_key`` takes a transaction-scoped advisory lock on a hash of
  ``workflow:key``, so competing claims of one singleton key are serialized inside one
  transaction while different keys never wait for each other.

The hot paths of ``SqlStore`` do not go through SQLAlchemy: ``Database`` keeps one DBAPI
connection of the engine's pool for them (``Conn``) and runs prebuilt SQL on it (``_sql``).
Writes go through ``Database.write``, which *group-commits*: write calls issued concurrently by
coroutines of one event loop run together in one transaction (see ``Database.write``).
SQLAlchemy (``Database.tx``) remains for the schema and the rarely used queries.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar, cast

import orjson
import sqlalchemy as sa

from . import _wakeup
from ._rows import lock_name
from ._schema import StoreUnavailableError, UnsupportedDatabaseError, ensure_schema

log = logging.getLogger("flowkit")
T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for another process' write lock before failing."""

_SQLITE_BUSY = 5
_SQLITE_BUSY_SNAPSHOT = 517  # (extended) a snapshot too old to write from: waiting cannot help
_BUSY_PAUSE_FIRST = 50e-6
_BUSY_PAUSE_MAX = 1e-3
_sleep = time.sleep  # (tests replace it to see the pauses without sleeping)

_READ_ONLY = "flowkit_read_only"
_DRIVERS = {"sqlite": ("pysqlite",), "postgresql": ("psycopg", "psycopg2")}


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _enable_wal(cur: Any) -> None:
    """Put the database file in WAL mode (persistent: once one connection did, the others
    find it so). Switching needs an exclusive lock, and when several connections open a fresh
    file at once and try together, SQLite refuses all but one *at once* ("database is
    locked", without waiting on the busy timeout, to avoid a deadlock between them): try
    again after a pause until the file is in WAL mode, for about the busy timeout."""
    pause, waited = 0.005, 0.0
    while True:
        try:
            if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
                return
            cur.execute("PRAGMA journal_mode = WAL").fetchall()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if waited >= SQLITE_BUSY_TIMEOUT_MS / 1000:
                raise
        time.sleep(pause)  # (connecting blocks anyway; no engine clock is involved)
        waited += pause
        pause = min(pause * 2, 0.1)


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` is SQLite's "database is locked": another connection holds the lock
    (not another ``SQLITE_BUSY``, such as a ``COMMIT`` refused while statements run)."""
    code = getattr(exc, "sqlite_errorcode", _SQLITE_BUSY)
    return bool(
        code & 0xFF == _SQLITE_BUSY
        and code != _SQLITE_BUSY_SNAPSHOT
        and "database is locked" in str(exc)
    )


class WaitingCursor(sqlite3.Cursor):
    """The cursor of the store's own SQLite connection, which has no busy timeout: a
    statement that finds another process holding the write lock is tried again here, after
    50 µs at first, then at most every millisecond, for up to ``SQLITE_BUSY_TIMEOUT_MS``.

    SQLite's own busy handler sleeps 1, 2, 5, 10, 15 … ms between its tries, with the event
    loop blocked, and a process that writes without pause can take the lock in each of those
    sleeps: behind one, waits averaged 13 to 18 ms, with a p95 of 79 ms, against 1.9 and 6.5 ms
    here (``bench/lock_bench.py``). Only what SQLite allows to be retried is: a statement
    outside a transaction (``BEGIN IMMEDIATE``, an autocommit write), or ``COMMIT``."""

    def execute(self, sql: str, parameters: Any = (), /) -> WaitingCursor:
        inside = self.connection.in_transaction  # (before: a failure may end the transaction)
        try:
            super().execute(sql, parameters)
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or (inside and sql != "COMMIT"):
                raise
            self._wait(sql, parameters, exc)
        return self

    def _wait(self, sql: str, parameters: Any, exc: sqlite3.OperationalError) -> None:
        # (the store's I/O blocks its event loop anyway; no engine clock is involved: the
        # pauses are summed, as SQLite's own handler does, so a wait lasts at least that long)
        pause, waited = _BUSY_PAUSE_FIRST, 0.0
        while waited < SQLITE_BUSY_TIMEOUT_MS / 1000:
            _sleep(pause)
            waited += pause
            pause = min(pause * 2, _BUSY_PAUSE_MAX)
            try:
                super().execute(sql, parameters)
                return
            except sqlite3.OperationalError as again:
                if not _busy(again):
                    raise
                exc = again
        raise exc


def _journal_mode(dbapi: sqlite3.Connection) -> str:
    return str(dbapi.execute("PRAGMA journal_mode").fetchone()[0]).lower()


def _setup_sqlite(engine: sa.Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module: it would otherwise BEGIN
        # lazily (deferred, and only before DML); we emit our own BEGIN in "begin" below.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            _enable_wal(cur)  # readers never block the writer
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


def _has_pipeline(dbapi: Any) -> bool:
    if not hasattr(dbapi, "pipeline"):
        return False
    try:
        from psycopg import capabilities

        return bool(capabilities.has_pipeline())
    except ImportError:  # pragma: no cover - older psycopg
        import psycopg

        return bool(psycopg.Pipeline.is_supported())


class Conn:
    """The store's own DBAPI connection, used on the hot paths under ``Database``'s lock.

    ``dirty`` records whether the current call wrote anything: a call of a group commit that
    fails *clean* (it raised before writing) leaves the batch's transaction usable."""

    def __init__(self, db: Database, fairy: Any) -> None:
        self.db = db
        self.fairy = fairy  # SQLAlchemy's pooled connection (kept checked out)
        self.dbapi: Any = fairy.driver_connection
        self.pg = db.dialect == "postgresql"
        # SQLite in WAL mode: it waits for another process's lock itself, in finer steps
        # than SQLite. (Not in another journal mode, such as an in-memory database's: an
        # autocommit write with RETURNING commits in its last step, in ``fetchall``, which
        # could meet a reader's lock there, outside ``WaitingCursor.execute``.)
        self.waits = not self.pg and _journal_mode(self.dbapi) == "wal"
        if self.waits:
            self.dbapi.execute("PRAGMA busy_timeout = 0")
            self.cur: Any = self.dbapi.cursor(WaitingCursor)
        else:
            self.cur = self.dbapi.cursor()
        self.dirty = False
        # the first statements of a batch's calls ran ahead in one pipeline (PostgreSQL): a
        # row lock a call's rest takes now would come out of the batch's run-id order
        self.pipelined = False
        self.sql = ""  # the last statement, for error messages
        self.statements = 0  # executed in the current transaction (or read)
        self.stats = db.stats
        # namespaces of the runs the current transaction left claimable now (or whose
        # waiters it woke): one wake-up goes out with its COMMIT (``_wakeup``)
        self.wakes: set[str | None] = set()
        # psycopg 3 sends the notification in the COMMIT's round trip (a literal statement)
        self._notify_literal = self.pg and hasattr(self.dbapi, "pgconn")
        # PostgreSQL group commits send their calls' first statements in one pipeline
        # (psycopg 3 on libpq >= 14)
        self.can_pipeline = self.pg and _has_pipeline(self.dbapi)
        # statements whose results nobody reads (``later``), sent in one pipeline with the
        # next statement that needs a result, or before the COMMIT (PostgreSQL)
        self._later: list[tuple[str, Any, list[Any] | None]] = []
        self._sends = 0  # times the queue was sent (``mark``)
        self.last_rowcount = 0
        if self.pg:
            self.dbapi.autocommit = True  # reads: one round trip, no BEGIN/COMMIT
            if hasattr(self.dbapi, "prepare_threshold"):
                # psycopg 3: prepare a statement on its first use, not its sixth: the store
                # runs a few statements many times, and parsing a release's statement costs
                # the server about a millisecond (the first handovers of every key paid it)
                self.dbapi.prepare_threshold = 0
        # the rest of a single-statement call runs after its statement committed: it must
        # not write (``_refuse_writes`` guards every write)
        self.committed = False
        # the advisory locks the current transaction holds (or has queued); once its calls'
        # declared locks are taken (``Op.locks``), no other may be: it would come after a
        # row lock, out of the order every transaction keeps
        self.held: set[str] = set()
        self.locks_closed = False

    def close(self) -> None:
        if self.pg and hasattr(self.dbapi, "prepare_threshold"):
            # (the connection goes back to SQLAlchemy's pool: its users keep psycopg's default)
            with contextlib.suppress(Exception):
                self.dbapi.prepare_threshold = 5
        if self.waits:  # (back to SQLAlchemy's pool: its users wait in SQLite's way)
            with contextlib.suppress(Exception):
                self.dbapi.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        with contextlib.suppress(Exception):  # closing a broken connection
            self.cur.close()
        with contextlib.suppress(Exception):
            if self.broken():
                self.fairy.invalidate()
            else:
                self.fairy.close()

    def broken(self) -> bool:
        c = self.dbapi
        return bool(getattr(c, "closed", False) or getattr(c, "broken", False))

    # -- statements ---------------------------------------------------------------------
    def later(
        self, sql: str, params: Any, *, wrote: bool = True, into: list[Any] | None = None
    ) -> None:
        """A statement inside a transaction whose result the caller does not need now (a lock
        that blocks until granted, an ``UPDATE`` or ``INSERT`` that must simply happen). On
        PostgreSQL it is sent in one pipeline with the next statement that returns something
        (or with the ``COMMIT``), saving a round trip; its errors surface there and fail the
        transaction. Elsewhere it runs at once. ``into`` receives ``(rows, rowcount)`` once
        it has run: a caller can read it after the ``COMMIT`` (``After``)."""
        if not self.can_pipeline or self.committed:
            if into is None:
                self.write(sql, params)  # (refused after a single statement committed)
            else:
                if wrote:
                    self._refuse_writes()
                into.append(self._rows(sql, params))
            return
        self._later.append((sql, params, into))
        if wrote:
            self.dirty = True

    def _rows(self, sql: str, params: Any) -> tuple[list[Any], int]:
        """A statement at once: its rows (a read, or a write's ``RETURNING``) and rowcount."""
        self.sql = sql
        cur = self.cur
        cur.execute(sql, params)
        self.statements += 1
        self.stats["statements"] += 1
        rows = list(cur.fetchall()) if cur.description is not None else []
        n = int(cur.rowcount)
        if n > 0:
            self.dirty = True
        return rows, n

    def _send_later(self, sql: str | None = None, params: Any = None) -> list[Any] | None:
        """Send the queued statements (and ``sql``, whose rows are returned) in one pipeline."""
        if sql is None:
            self._pipeline(())
            return None
        return self._pipeline(((sql, params),))[0]

    def _pipeline(
        self, stmts: Sequence[tuple[str, Any]], *, commit: bool = False
    ) -> list[list[Any]]:
        """What ``later`` queued, then ``stmts`` (and the ``COMMIT`` with ``commit``) in one
        pipeline: one round trip. The rows of each of ``stmts`` (``[]`` for a statement
        without rows); ``last_rowcount`` is the last one's. After an error nothing of the
        pipeline took effect for good: the transaction is failed."""
        queued, self._later = self._later, []
        self._sends += 1
        curs: list[Any] = []
        out: list[list[Any]] = []
        try:
            with self.dbapi.pipeline():
                for q, ps, _into in queued:
                    self.sql = q
                    cur = self.dbapi.cursor()
                    cur.execute(q, ps)
                    curs.append(cur)
                mine: list[Any] = []
                for q, ps in stmts:
                    self.sql = q
                    cur = self.dbapi.cursor()
                    curs.append(cur)
                    mine.append(cur)
                    cur.execute(q, ps)
                if commit:
                    self._commit_in_pipeline(curs)
            # (leaving the block syncs once and collects every result: one round trip; a
            # ``sync()`` inside it, or ``connection.commit()``, would cost a second one)
            for (_q, _ps, into), cur in zip(queued, curs, strict=False):
                if into is not None:
                    rows = list(cur.fetchall()) if cur.description is not None else []
                    into.append((rows, int(cur.rowcount)))
            for cur in mine:
                out.append(list(cur.fetchall()) if cur.description is not None else [])
                self.last_rowcount = int(cur.rowcount)
        finally:
            for cur in curs:
                cur.close()
        n = len(queued) + len(stmts)
        self.statements += n
        self.stats["statements"] += n
        return out

    def _commit_in_pipeline(self, curs: list[Any]) -> None:
        """Queue the transaction's ``COMMIT`` as a statement of the open pipeline. After a
        failed statement the server skips the rest of the pipeline, this ``COMMIT``
        included: nothing of it takes effect. (``connection.commit()`` would sync the
        pipeline by itself, and leaving the block would then sync it again.)"""
        self.sql = "COMMIT"
        cur = self.dbapi.cursor()
        curs.append(cur)
        cur.execute("COMMIT")

    def reads(self, stmts: Sequence[tuple[str, Any]], *, wrote: bool = False) -> list[list[Any]]:
        """The rows of several statements, run in order; on PostgreSQL in one pipeline with
        what ``later`` queued (one round trip). ``wrote``: some of them write."""
        if wrote:
            self._refuse_writes()
        if not self.can_pipeline or self.committed:
            return [self.all(q, ps) for q, ps in stmts]
        out = self._pipeline(stmts)
        if wrote:
            self.dirty = True
        return out

    def flushes_later(self) -> bool:
        """Whether statements are queued (``later``)."""
        return bool(self._later)

    def mark(self) -> tuple[int, int]:
        """Where the queue (``later``) stands: ``drop_later`` forgets what came after."""
        return self._sends, len(self._later)

    def drop_later(self, mark: tuple[int, int]) -> None:
        """Forget what ``later`` queued since ``mark``: the call that queued it failed clean
        (nothing it queued wrote). Once the queue was sent, what is left is the call's own."""
        if mark[0] != self._sends:
            self._later.clear()
        else:
            del self._later[mark[1] :]

    def one(self, sql: str, params: Any) -> Any:
        if self._later:
            got = self._send_later(sql, params)
            return got[0] if got else None
        self.sql = sql
        cur = self.cur
        cur.execute(sql, params)
        self.statements += 1
        self.stats["statements"] += 1
        rows = cur.fetchall()  # to the end: sqlite3 keeps a read open until a statement is done
        return rows[0] if rows else None

    def all(self, sql: str, params: Any) -> list[Any]:
        if self._later:
            return self._send_later(sql, params) or []
        self.sql = sql
        cur = self.cur
        cur.execute(sql, params)
        self.statements += 1
        self.stats["statements"] += 1
        return list(cur.fetchall())

    def write(self, sql: str, params: Any) -> int:
        """A write without ``RETURNING``: the number of rows it changed."""
        self._refuse_writes()
        if self._later:
            self._send_later(sql, params)
            n = self.last_rowcount
            if n:
                self.dirty = True
            return n
        self.sql = sql
        cur = self.cur
        cur.execute(sql, params)
        self.statements += 1
        self.stats["statements"] += 1
        n = int(cur.rowcount)
        if n:
            self.dirty = True
        return n

    def returning(self, sql: str, params: Any) -> Any:
        """A single-row write with ``RETURNING``: the row, or ``None`` when none matched."""
        self._refuse_writes()
        if self._later:
            got = self._send_later(sql, params)
            if got:
                self.dirty = True
                return got[0]
            return None
        self.sql = sql
        cur = self.cur
        cur.execute(sql, params)
        self.statements += 1
        self.stats["statements"] += 1
        rows = cur.fetchall()
        if rows:
            self.dirty = True
            return rows[0]
        return None

    def _refuse_writes(self) -> None:
        if self.committed:
            raise AssertionError("a write after a single-statement call committed")

    def lock(self, name: str) -> None:
        """PostgreSQL: take the transaction-scoped advisory lock ``name`` (a hash of it) unless
        this transaction holds it already; sent with the next statement (``later``)."""
        if not self.pg or name in self.held:
            return
        if self.locks_closed:
            raise AssertionError(f"advisory lock {name!r} not declared in the call's Op.locks")
        self.held.add(name)
        self.later(LOCK_SQL, {"k": name}, wrote=False)

    def lock_all(self, names: Iterable[str]) -> None:
        """``lock`` each of ``names`` in name order (the one order every transaction uses),
        then refuse any other lock for the rest of the transaction."""
        for name in sorted(set(names)):
            self.lock(name)
        self.locks_closed = True

    def first(self, f: tuple[str, Any, int]) -> Any:
        """Run an ``Op``'s first statement: the row (``RETURNING``, ``SELECT``) or rowcount."""
        if f[2] == RETURNING:
            return self.returning(f[0], f[1])
        if f[2] == SELECT:
            return self.one(f[0], f[1])
        if f[2] == ROWS:
            return self.all(f[0], f[1])
        return self.write(f[0], f[1])

    def wakeup(self, namespace: str | None) -> None:
        """The current transaction leaves a run of ``namespace`` claimable now (or stamped a
        waiter awake): emit a wake-up when it commits (once per transaction)."""
        self.wakes.add(namespace)

    # -- transactions ---------------------------------------------------------------------
    def begin(self) -> None:
        self.statements = 0
        self.wakes.clear()
        self._later.clear()
        self.held.clear()
        self.locks_closed = False
        self.stats["write_tx"] += 1
        if self.pg:
            self.dbapi.autocommit = False  # BEGIN goes out with the first statement
        else:
            self.sql = "BEGIN IMMEDIATE"
            self.cur.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        if self._later:  # PostgreSQL: the queued writes, the wake-up and COMMIT in one trip
            stmts: list[tuple[str, Any]] = []
            if self.wakes:
                stmts.append(self._notify_stmt())
            self._pipeline(stmts, commit=True)
            self.dbapi.autocommit = True
            return
        if self.wakes:
            self._emit()
        self.sql = "COMMIT"
        if self.pg:
            self.dbapi.commit()  # a no-op when the wake-up's statement committed already
            self.dbapi.autocommit = True
        else:
            self.cur.execute("COMMIT")

    def _notify_stmt(self) -> tuple[str, Any]:
        """PostgreSQL: the statement of the pending wake-up (``pg_notify``; it is delivered
        when its transaction commits)."""
        data = _wakeup.payload(self.wakes)
        self.wakes.clear()
        self.stats["wakeups"] += 1
        return "SELECT pg_notify(%(c)s, %(p)s)", {"c": _wakeup.CHANNEL, "p": data}

    def notify_now(self) -> None:
        """Outside a transaction (after a single-statement call): the wake-up on its own,
        one more round trip (``pg_notify`` in autocommit delivers at once)."""
        self.sql, params = self._notify_stmt()
        self.statements += 1
        self.stats["statements"] += 1
        self.cur.execute(self.sql, params)

    def _emit(self) -> None:
        """The transaction's one wake-up, right before its ``COMMIT`` (see ``_wakeup``)."""
        data = _wakeup.payload(self.wakes)
        self.wakes.clear()
        self.stats["wakeups"] += 1
        self.statements += 1
        self.stats["statements"] += 1
        if not self.pg:
            self.sql = _wakeup.SQLITE_EMIT
            self.cur.execute(_wakeup.SQLITE_EMIT)
        elif self._notify_literal:
            # NOTIFY and COMMIT in one simple-protocol query: no extra round trip
            self.sql = self.db.notify_commit_sql(self.dbapi, data)
            self.cur.execute(self.sql, prepare=False)
        else:  # psycopg2
            self.sql = "SELECT pg_notify(%(c)s, %(p)s)"
            self.cur.execute(self.sql, {"c": _wakeup.CHANNEL, "p": data})

    def rollback(self) -> None:
        self.wakes.clear()
        self._later.clear()
        self.held.clear()
        self.locks_closed = False
        try:
            if self.pg:
                if not self.broken():
                    self.dbapi.rollback()
                    self.dbapi.autocommit = True
            elif self.dbapi.in_transaction:
                self.cur.execute("ROLLBACK")
        except Exception:  # the original error matters, not this one
            log.debug("rollback failed", exc_info=True)


GENERIC_PLANS_SQL = "SET LOCAL plan_cache_mode = force_generic_plan"
"""PostgreSQL: the transaction's prepared statements use their generic plan at once."""

LOCK_ROWS_SQL = (
    'SELECT id FROM flowkit_runs WHERE id = ANY(%(ids)s) ORDER BY id COLLATE "C" FOR UPDATE'
)
"""PostgreSQL: lock the rows of these runs, in run-id order (the rows a batch will write):
code-point order, the order in which ``run_batch`` sends its calls (Python sorts ``str`` so),
whatever the database's collation; two orders would let two batches lock in a cycle."""

LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(%(k)s, 0))"
"""A transaction-scoped advisory lock on a name (a singleton key's ``lock_name``)."""

RETURNING = 1  # Op.first's kind: a single-row write with RETURNING (the row, or None)
ROWCOUNT = 2  # a write without RETURNING (the number of rows it changed)
SELECT = 3  # a read (the first row, or None), e.g. a row lock
ROWS = 4  # a read of all its rows (a list), e.g. a row lock together with related rows


class Op(Generic[T]):
    """One write call: ``rest(conn, result of first)`` in a write transaction.

    ``first`` is an optional single statement ``(sql, params, RETURNING|ROWCOUNT|SELECT)`` that
    runs before ``rest``: on PostgreSQL a group commit sends the first statements of its calls
    in one pipeline (one round trip), then runs each call's ``rest``. ``key`` (the run id)
    orders a batch.

    ``locks`` names the advisory locks (PostgreSQL: a singleton key's, ``lock_name``) the
    call's transaction must hold before it locks any row: a transaction takes all of its
    calls' locks first, in name order, so transactions of any process that share keys
    always wait for each other in the same order (no lock cycle), and a call with locks can
    still share a group commit with others.

    ``single(result of first)`` says the call is complete once ``first`` has run: ``rest``
    then only reads and decides. On PostgreSQL such a call, when it runs alone, sends
    ``first`` in autocommit: one statement is its own transaction, one round trip instead of
    ``BEGIN``, the statement and ``COMMIT`` (with ``locks``: ``BEGIN``, the locks, the
    statement and ``COMMIT`` in one pipeline, still one round trip). When ``single`` says
    no, ``first`` changed nothing (a conditional write that matched no row) and the call
    runs again in a transaction, where ``rest`` decides the general way. With ``lite`` it
    does so on SQLite too (one statement in autocommit: no ``BEGIN IMMEDIATE``/``COMMIT``
    statements; a write statement takes SQLite's write lock before it reads), for calls
    whose ``rest`` emits no wake-up. A ``rest`` that runs after its statement committed
    must not write; what it must write then, it does in an ``After``."""

    __slots__ = ("first", "fut", "key", "lite", "locks", "rest", "single")

    def __init__(
        self,
        rest: Callable[[Conn, Any], T],
        first: tuple[str, Any, int] | None = None,
        key: str = "",
        *,
        single: Callable[[Any], bool] | None = None,
        locks: tuple[str, ...] = (),
        lite: bool = False,
    ) -> None:
        self.rest = rest
        self.first = first
        self.key = key
        self.locks = locks
        self.single = single if first is not None else None
        # ``single`` holds on SQLite too: ``rest`` never asks for a wake-up (which SQLite
        # emits by a write inside the transaction), so ``first`` can run in autocommit there
        # (a call that needs advisory locks needs a transaction around its statements)
        self.lite = lite and self.single is not None and not locks
        self.fut: Any = None

    @property
    def releasing(self) -> bool:
        """A single statement under a key's advisory lock (``Sql.release_fast``): it locks a
        waiter's row too, without waiting (``SKIP LOCKED``), in the middle of its batch (see
        ``Database._single_batch``)."""
        return self.single is not None and bool(self.locks)

    def __call__(self, c: Conn) -> T:
        """Run on ``c`` (inside a transaction)."""
        f = self.first
        if f is None:
            return self.rest(c, None)
        return self.rest(c, c.first(f))


class Deferred(Exception):
    """Raised (before writing) by a call of a PostgreSQL group commit that must take row
    locks out of the batch's run-id order: it runs again in a transaction of its own after the
    batch commits, so two processes' batches never wait for each other's rows in a cycle."""


class _Unclean(Exception):
    """A call of a batch failed after it wrote (or with a database error): the batch's
    transaction cannot be committed as it is."""


Outcome = tuple[BaseException | None, Any]


class After(Generic[T]):
    """A call's result that needs what its queued statements returned (``Conn.later(...,
    into=...)``): ``finish()`` builds it once the transaction committed. On PostgreSQL such
    statements go out with the ``COMMIT`` (a call alone) or in one round trip for every call
    of a group commit, instead of a round trip each."""

    __slots__ = ("finish",)

    def __init__(self, finish: Callable[[], T]) -> None:
        self.finish = finish


def _finish(outcome: Outcome) -> Outcome:
    exc, value = outcome
    if exc is None and isinstance(value, After):
        try:
            return None, value.finish()
        except Exception as err:  # (after the COMMIT: this call's alone)
            return err, None
    return outcome


def _nothing() -> None:
    pass


class Database:
    """One engine, shared by a ``SqlStore`` and its scoped views; the schema is checked (and
    created) once, on the first transaction.

    The store's calls run as functions of its ``Conn`` (``read``, ``write``). With
    ``group_commit`` (the default) concurrent writes share one transaction (``write``);
    without, every write runs at once in a transaction of its own and no call ever yields to
    the event loop, as with ``MemoryStore`` (the mode ``TestEnv``'s reproducible interleavings
    need). ``stats`` counts transactions, statements and batches (for benchmarks)."""

    def __init__(self, url: str, *, group_commit: bool = True, wakeups: bool = True) -> None:
        self.engine = create_engine(url)
        self.dialect = self.engine.dialect.name
        self._schema_ready = False
        self._lock = threading.Lock()
        self.group_commit = group_commit
        self.wakeups = wakeups  # whether ``watch`` listens (writes emit wake-ups regardless)
        # the wake-up watchers, one hub per event loop (``_wakeup``)
        self._hubs: dict[asyncio.AbstractEventLoop, _wakeup.Hub] = {}
        self._hub_lock = threading.Lock()
        self._notify_sql: dict[str, str] = {}
        self.stats: collections.Counter[str] = collections.Counter()
        self._io = threading.RLock()  # the one Conn, one transaction at a time
        self._conn: Conn | None = None
        # the calls waiting for a scheduled flush, per event loop (each loop touches only its
        # own list; the connection itself is shared under ``_io``)
        self._queues: dict[asyncio.AbstractEventLoop, list[Op[Any]]] = {}
        self._pg = self.dialect == "postgresql"
        dbapi = self.engine.dialect.loaded_dbapi
        self._dbapi_error: type[Exception] = dbapi.Error

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
        """One SQLAlchemy transaction; ``write`` ones take SQLite's write lock up front. The
        store's hot paths use ``read``/``write`` instead."""
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
        with self._hub_lock:
            hubs = list(self._hubs.values())
            self._hubs.clear()
        for hub in hubs:
            hub.stop()
        with self._io:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        self.engine.dispose()

    # -- wake-ups across processes (``_wakeup``) ------------------------------------------
    def notify_commit_sql(self, dbapi: Any, data: str) -> str:
        """``SELECT pg_notify(<channel>, <data>); COMMIT`` with literals quoted by psycopg."""
        sql = self._notify_sql.get(data)
        if sql is None:
            from psycopg import sql as pgsql

            sql = (
                pgsql.SQL("SELECT pg_notify({}, {}); COMMIT")
                .format(pgsql.Literal(_wakeup.CHANNEL), pgsql.Literal(data))
                .as_string(dbapi)
            )
            if len(self._notify_sql) < 256:
                self._notify_sql[data] = sql
        return sql

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

    # -- the store's connection ---------------------------------------------------------
    def _connection(self) -> Conn:
        c = self._conn
        if c is not None:
            return c
        self.ensure_schema()
        try:
            fairy = self.engine.raw_connection()
        except sa.exc.DBAPIError as exc:
            raise StoreUnavailableError(
                f"cannot connect to the flowkit database {self.shown_url}: {exc.orig}"
            ) from exc
        c = self._conn = Conn(self, fairy)
        return c

    def _drop(self, c: Conn) -> None:
        """Forget a connection that failed (a server restart): the next call reconnects."""
        if self._conn is c:
            self._conn = None
        c.close()

    def _failed(self, c: Conn, exc: Exception) -> Exception:
        """What a call that failed on ``c`` raises (``_wrap``), after dropping ``c`` when the
        failure broke it (the next call reconnects)."""
        if isinstance(exc, self._dbapi_error) and c.broken():
            self._drop(c)
        return self._wrap(c, exc)

    def _wrap(self, c: Conn | None, exc: Exception) -> Exception:
        """A DBAPI error as SQLAlchemy's exception of the same kind (what the store raised
        before it bypassed SQLAlchemy); other exceptions as they are."""
        if isinstance(exc, self._dbapi_error):
            return sa.exc.DBAPIError.instance(
                c.sql if c is not None else None,
                None,
                exc,
                self._dbapi_error,
                hide_parameters=True,
                dialect=self.engine.dialect,
                connection_invalidated=c is not None and c.broken(),
            )
        return exc

    def _retryable(self, c: Conn, exc: BaseException) -> bool:
        """A connection that broke before the transaction did anything (a server restart
        while it sat in the pool): reconnect and run the transaction again, once."""
        if not isinstance(exc, self._dbapi_error) or c.statements or not c.broken():
            return False
        self._drop(c)
        return True

    def run_read(self, fn: Callable[[Conn], T]) -> T:
        """``fn`` on the store's connection outside a write transaction (autocommit reads:
        each statement sees the latest committed state)."""
        with self._io:
            for attempt in (0, 1):
                c = self._connection()
                c.statements = 0
                self.stats["read_tx"] += 1
                try:
                    return fn(c)
                except Exception as exc:
                    if attempt == 0 and self._retryable(c, exc):
                        continue
                    raise self._failed(c, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def run_write(self, fn: Callable[[Conn], T], *, single: bool = True) -> T:
        """``fn`` in a write transaction of its own (a single statement in autocommit, when
        ``fn`` is an ``Op`` that allows it: on PostgreSQL, and with ``Op.lite`` on SQLite;
        ``single=False``: the general way, after ``Op.single`` said no). A result that is
        ``After`` is finished once the transaction committed."""
        if single and isinstance(fn, Op) and fn.single is not None:
            if fn.locks:
                got = None
                if self._pg:  # BEGIN, the locks, the statement and COMMIT: one round trip
                    with self._io:
                        c = self._connection()
                        if c.can_pipeline and not c.broken():
                            got = self._single_batch(c, [fn])
                        if got is not None:
                            exc, value = got[0]
                            if exc is not None:
                                raise exc
                            return cast(T, value)
            elif self._pg or fn.lite:
                done, out = self._run_single(fn)
                if done:
                    return cast(T, out)
        with self._io:
            for attempt in (0, 1):
                c = self._connection()
                try:
                    c.begin()
                    c.dirty = False
                    if isinstance(fn, Op):
                        c.lock_all(fn.locks)
                    out = fn(c)
                    c.commit()
                    self.stats["ops"] += 1
                except BaseException as exc:
                    c.rollback()
                    if not isinstance(exc, Exception):
                        raise
                    if attempt == 0 and self._retryable(c, exc):
                        continue
                    raise self._failed(c, exc) from exc
                return cast(T, out.finish() if isinstance(out, After) else out)
        raise AssertionError("unreachable")  # pragma: no cover

    def _run_single(self, op: Op[T]) -> tuple[bool, T | None]:
        """PostgreSQL: ``op.first`` alone in autocommit, a transaction of one statement and one
        round trip. ``(True, result)`` when ``op.single`` accepts its result; ``(False, None)``
        when not: the statement changed nothing, and the caller runs ``op`` in a transaction.

        A statement that failed because the server had ended the session (the connection was
        terminated while idle: the server says so with SQLSTATE 57P0x before reading anything)
        never ran: it is sent again on a new connection, once. Any other failure is raised:
        the statement may have committed before the connection broke, and running it again
        could apply it twice."""
        assert op.first is not None and op.single is not None
        with self._io:
            for attempt in (0, 1):
                c = self._connection()
                if c.broken():  # known before anything was sent: safe to replace
                    self._drop(c)
                    c = self._connection()
                c.statements = 0
                try:
                    got = c.first(op.first)
                except Exception as exc:
                    if attempt == 0 and self._terminated(c, exc):
                        continue
                    raise self._failed(c, exc) from exc
                if not op.single(got):
                    return False, None
                self.stats["write_tx"] += 1
                self.stats["single"] += 1
                c.wakes.clear()
                c.committed = True
                try:
                    out = op.rest(c, got)
                finally:
                    c.committed = False
                self.stats["ops"] += 1
                if c.wakes and not self._pg:  # pragma: no cover - a bug (see Op.lite)
                    raise AssertionError("a call run in autocommit on SQLite asked to wake")
                self._notify_after(c)
                return True, out
        raise AssertionError("unreachable")  # pragma: no cover

    def returning_now(self, sql: str, params: Any) -> Any:
        """A lone write statement with ``RETURNING`` in autocommit (PostgreSQL; SQLite for a
        statement that may run so, see ``Op.lite``), run at once: its first row, or ``None``
        when it matched nothing. What ``run_write`` does for an ``Op`` whose ``single``
        always holds and whose ``rest`` reads only that row, without building the ``Op``:
        the record of every step goes this way (see ``_run_single`` for the retry rule)."""
        with self._io:
            for attempt in (0, 1):
                c = self._conn
                if c is None:
                    c = self._connection()
                if self._pg and c.broken():  # known before anything was sent
                    self._drop(c)
                    c = self._connection()
                if c._later or c.committed:  # pragma: no cover - a bug: outside a transaction
                    raise AssertionError("returning_now inside a call's transaction")
                c.statements = 0
                c.sql = sql
                try:
                    cur = c.cur
                    cur.execute(sql, params)
                    c.statements = 1
                    rows = cur.fetchall()
                except Exception as exc:
                    if attempt == 0 and self._terminated(c, exc):
                        continue
                    raise self._failed(c, exc) from exc
                stats = self.stats
                stats["statements"] += 1
                stats["write_tx"] += 1
                stats["single"] += 1
                stats["ops"] += 1
                return rows[0] if rows else None
        raise AssertionError("unreachable")  # pragma: no cover

    def idle(self) -> bool:
        """Nothing could join a write issued now: no group commit, or none scheduled on this
        event loop and no other coroutine ready to run (what ``write`` checks)."""
        if not self.group_commit:
            return True
        loop = asyncio.get_running_loop()
        if loop in self._queues:
            return False
        ready = getattr(loop, "_ready", None)
        return ready is not None and not ready

    def _notify_after(self, c: Conn) -> None:
        """The wake-up that single-statement calls asked for, after their commit (a hint: when
        it fails, the timer poll still finds the work)."""
        if not c.wakes:
            return
        try:
            c.notify_now()
        except Exception:
            log.warning("sending a wake-up failed", exc_info=True)
            if c.broken():
                self._drop(c)

    def _terminated(self, c: Conn, exc: BaseException) -> bool:
        """The server ended ``c``'s session before it read the statement (SQLSTATE class 57,
        ``admin_shutdown``/``crash_shutdown``/``cannot_connect_now``): drop it, retry safely."""
        if not isinstance(exc, self._dbapi_error) or not c.broken():
            return False
        state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        if state not in ("57P01", "57P02", "57P03"):
            return False
        self._drop(c)
        return True

    def _solo(self, fn: Callable[[Conn], Any], *, single: bool = True) -> Outcome:
        try:
            return None, self.run_write(fn, single=single)
        except Exception as exc:
            return exc, None

    def run_batch(self, ops: Sequence[Op[Any]]) -> list[Outcome]:
        """Run the calls of one group commit in one transaction (one ``COMMIT``): first the
        advisory locks they declare (``Op.locks``, in name order), then, on PostgreSQL, their
        first statements in run-id order, so two processes' batches take row locks in the
        same order.

        A call that fails clean (it raised before it wrote) keeps its exception and the
        batch goes on. One that fails after writing (or with a database error) rolls the
        batch back, and then every call of it runs again in a transaction of its own, so each
        call's outcome is that of a committed (or cleanly failed) transaction. A failing
        ``BEGIN``/``COMMIT`` fails every call of the batch. A call that raises ``Deferred``
        (clean) runs again in a transaction of its own after the batch committed."""
        out: list[Outcome | None] = [None] * len(ops)
        shared = list(range(len(ops)))
        solo: list[int] = []
        if self._pg:
            shared.sort(key=lambda i: ops[i].key)
        if len(shared) == 1:
            solo.insert(0, shared.pop())
        if shared:
            self.stats["batches"] += 1
            self.stats["batched_ops"] += len(shared)
            with self._io:
                res = self._shared([ops[i] for i in shared])
            if res is None:  # unclean: one transaction per call
                self.stats["batch_retries"] += 1
                solo = shared + solo
            else:
                for i, r in zip(shared, res, strict=True):
                    if isinstance(r[0], Deferred):
                        self.stats["deferred"] += 1
                        solo.append(i)
                    else:
                        out[i] = r
        for i in solo:
            out[i] = self._solo(ops[i])
        return [o if o is not None else (AssertionError("lost outcome"), None) for o in out]

    def _shared(self, ops: list[Op[Any]]) -> list[Outcome] | None:
        if self._pg and len(ops) >= 2 and all(op.single is not None for op in ops):
            c = self._connection()
            if c.can_pipeline and not c.broken():
                done = self._single_batch(c, ops)
                if done is not None:
                    return done
        for attempt in (0, 1):
            c = self._connection()
            res: list[Outcome] = []
            try:
                c.begin()
                # every call's advisory locks before any row lock (sent with the first
                # statements)
                c.lock_all(name for op in ops for name in op.locks)
                firsts = None
                if c.can_pipeline and len(ops) >= 2:  # (one round trip for all: one less at 2)
                    try:
                        firsts = self._pipelined(c, ops)
                        c.pipelined = True
                    except self._dbapi_error as exc:
                        if c.statements or not c.broken():
                            raise _Unclean from exc
                        raise  # a broken connection before anything ran: retried below
                for k, op in enumerate(ops):
                    c.dirty = False
                    mark = c.mark()
                    try:
                        if firsts is None:
                            got = op(c)
                        else:
                            c.dirty = firsts[k][1]
                            got = op.rest(c, firsts[k][0])
                        res.append((None, got))
                    except Exception as exc:
                        # (a database error, even one of an earlier call's queued statement
                        # sent with this call's: the transaction is failed)
                        if c.dirty or isinstance(exc, self._dbapi_error):
                            raise _Unclean from exc
                        c.drop_later(mark)
                        res.append((exc, None))
                c.pipelined = False
                self._commit_batch(c)
                self.stats["ops"] += len(ops)
                return [_finish(r) for r in res]
            except _Unclean:
                c.pipelined = False
                c.rollback()
                return None
            except BaseException as exc:
                c.pipelined = False
                c.rollback()
                if not isinstance(exc, Exception):
                    raise
                if attempt == 0 and self._retryable(c, exc):
                    continue
                err = self._failed(c, exc)
                return [(err, None)] * len(ops)
        raise AssertionError("unreachable")  # pragma: no cover

    def _commit_batch(self, c: Conn) -> None:
        """The ``COMMIT`` of a group commit, with the statements its calls queued and did not
        need a result of at once (their writes, the hand-offs whose results ``After`` reads):
        on PostgreSQL one round trip for all of them. When it fails and the server is still
        there, nothing of the transaction took effect (a failed statement aborts the rest of
        the pipeline, the ``COMMIT`` included): ``_Unclean``, each call runs again on its
        own. When the connection broke, the ``COMMIT`` may have taken effect: the error is
        every call's, as for a failed ``COMMIT``."""
        if not c.flushes_later():
            c.commit()
            return
        try:
            c.commit()
        except self._dbapi_error as exc:
            if not c.broken() or self._terminated(c, exc):
                raise _Unclean from exc
            raise

    def _single_batch(self, c: Conn, ops: list[Op[Any]]) -> list[Outcome] | None:
        """PostgreSQL, a batch of single-statement calls (``Op.single``): ``BEGIN``, every
        call's statement and ``COMMIT`` in one pipeline, one round trip for the whole batch.
        A call whose result ``single`` rejects changed nothing: it runs again in a
        transaction of its own. ``None`` when the pipeline failed and nothing was committed:
        the caller runs the batch the general way, which sorts out whose error it was. The
        calls' advisory locks (``Op.locks``) go first, in name order."""
        c.begin()
        if any(op.releasing for op in ops):
            # a one-statement release: planned once, not at each of its first executions
            # (a custom plan of that statement costs the server half a millisecond and is no
            # better: every read in it is an index lookup by equality)
            c.later(GENERIC_PLANS_SQL, None, wrote=False)
        c.lock_all(name for op in ops for name in op.locks)
        if len(ops) > 1 and any(op.releasing for op in ops):
            # A release locks its waiter's row mid-batch (without waiting): so that no later
            # statement of the batch waits for a row while it holds that one (a lock cycle
            # with another process), every row the batch's calls write is locked first, in
            # run-id order, by one statement.
            ids = sorted({op.key for op in ops if op.key})
            c.later(LOCK_ROWS_SQL, {"ids": ids}, wrote=False)
        try:
            firsts = self._pipelined(c, ops, commit=True)
        except Exception as exc:
            c.rollback()
            if not isinstance(exc, self._dbapi_error):
                raise
            if not c.broken():
                return None  # the server rolled the failed transaction back: nothing applied
            if self._terminated(c, exc):
                return None  # the session ended before the pipeline was read
            # the connection broke with the COMMIT on its way: it may have been applied, so
            # running the calls again could apply them twice; each fails like a failed COMMIT
            self._drop(c)
            err = self._wrap(c, exc)
            return [(err, None)] * len(ops)
        c.dbapi.autocommit = True
        out: list[Outcome] = []
        again: list[int] = []
        c.wakes.clear()
        c.committed = True
        try:
            for k, op in enumerate(ops):
                got = firsts[k][0]
                assert op.single is not None
                if not op.single(got):
                    again.append(k)
                    out.append((None, None))
                    continue
                try:
                    out.append((None, op.rest(c, got)))
                except Exception as exc:  # (a rest that raises after its statement committed)
                    out.append((exc, None))
        finally:
            c.committed = False
        self.stats["ops"] += len(ops) - len(again)
        self.stats["single_batches"] += 1
        self._notify_after(c)
        out = [_finish(o) for o in out]
        for k in again:
            out[k] = self._solo(ops[k], single=False)
        return out

    def _pipelined(
        self, c: Conn, ops: list[Op[Any]], *, commit: bool = False
    ) -> list[tuple[Any, bool]]:
        """PostgreSQL: send the first statement of every call in one pipeline, together with
        the transaction's ``BEGIN`` (the server runs them in order; with ``commit`` also its
        ``COMMIT``), and collect ``(result, wrote)`` per call. After a database error the
        rest of the pipeline did not run."""
        dbapi = c.dbapi
        curs: list[Any] = []
        queued, c._later = c._later, []  # (the batch's advisory locks) go first
        c._sends += 1
        extra: list[Any] = []  # (the COMMIT's cursor)
        try:
            with dbapi.pipeline():
                for q, ps, _into in queued:
                    c.sql = q
                    cur = dbapi.cursor()
                    cur.execute(q, ps)
                    curs.append(cur)
                    c.statements += 1
                    self.stats["statements"] += 1
                mine = len(curs)
                for op in ops:
                    f = op.first
                    if f is None:
                        curs.append(None)
                        continue
                    c.sql = f[0]
                    cur = dbapi.cursor()
                    cur.execute(f[0], f[1])
                    curs.append(cur)
                if commit:
                    c._commit_in_pipeline(extra)
            # (leaving the block syncs once: one round trip, see Conn._pipeline)
            out: list[tuple[Any, bool]] = []
            for op, cur in zip(ops, curs[mine:], strict=True):
                if cur is None:
                    out.append((None, False))
                elif op.first is not None and op.first[2] == ROWS:
                    out.append((list(cur.fetchall()), False))
                elif op.first is not None and op.first[2] != ROWCOUNT:
                    rows = cur.fetchall()
                    wrote = bool(rows) and op.first[2] == RETURNING
                    out.append((rows[0] if rows else None, wrote))
                else:
                    n = int(cur.rowcount)
                    out.append((n, n > 0))
        finally:
            for cur in [*curs, *extra]:
                if cur is not None:
                    cur.close()
        sent = sum(cur is not None for cur in curs[len(queued) :])
        c.statements += sent
        self.stats["statements"] += sent
        return out

    # -- the async face -----------------------------------------------------------------
    async def read(self, fn: Callable[[Conn], T]) -> T:
        return self.run_read(fn)

    async def write(self, op: Op[T]) -> T:
        """Run ``op`` in a write transaction and return its result once it is committed.

        Group commit: while other coroutines of this event loop are ready to run, the call is
        queued and a flush is scheduled behind them (``loop.call_soon``), so every write they
        issue before it runs joins the same transaction: one ``COMMIT`` (one fsync on SQLite,
        one commit round trip on PostgreSQL) for all of them. A call that nothing else could
        join (the loop's ready queue is empty, as for a sequential caller) runs at once
        without yielding."""
        if self.group_commit:
            loop = asyncio.get_running_loop()
            queue = self._queues.get(loop)
            if queue is not None:  # a flush is scheduled: join it
                op.fut = loop.create_future()
                queue.append(op)
                return cast(T, await op.fut)
            ready = getattr(loop, "_ready", None)  # asyncio's ready queue (None: unknown)
            if ready is None or len(ready):
                op.fut = loop.create_future()
                self._queues[loop] = [op]
                loop.call_soon(self._flush, loop)
                return cast(T, await op.fut)
        return self.run_write(op)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        ops = [op for op in self._queues.pop(loop, ()) if not op.fut.cancelled()]
        if not ops:
            return
        if self._pg and any(op.releasing for op in ops):
            # A release in one statement (``Sql.release_fast``) hands its slot over in one
            # round trip with the other single-statement calls; calls that need more round
            # trips (a start with its admission, ...) must not hold its handover up: they
            # commit on their own right after its callers resumed (once: a stream of
            # releases cannot keep postponing them).
            later = [op for op in ops if op.single is None]
            if later:
                try:
                    self._run(loop, [op for op in ops if op.single is not None])
                finally:
                    loop.call_soon(self._run, loop, later)
                return
        self._run(loop, ops)

    def _run(self, loop: asyncio.AbstractEventLoop, ops: list[Op[Any]]) -> None:
        """Run ``ops`` as one group commit and hand out their outcomes."""
        ops = [op for op in ops if not op.fut.cancelled()]
        if not ops:
            return
        try:
            outcomes = self.run_batch(ops)
        except Exception as failure:  # pragma: no cover - a bug: never leave a caller waiting
            outcomes = [(failure, None)] * len(ops)
        except BaseException:
            for op in ops:
                op.fut.cancel()
            raise
        # callers resume in the order their futures complete: the calls that serialize on a
        # singleton key (a release handing its slot over, an admission) first, since a
        # handover's latency waits on them
        done = sorted(zip(ops, outcomes, strict=True), key=lambda pair: not pair[0].locks)
        for op, (exc, value) in done:
            if op.fut.done():
                continue
            if exc is None:
                op.fut.set_result(value)
            else:
                op.fut.set_exception(exc)


__all__ = [
    "LOCK_SQL",
    "RETURNING",
    "ROWCOUNT",
    "ROWS",
    "SELECT",
    "SQLITE_BUSY_TIMEOUT_MS",
    "After",
    "Conn",
    "Database",
    "Deferred",
    "Op",
    "create_engine",
]
