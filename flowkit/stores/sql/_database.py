"""``Database``: one SQLAlchemy engine (URL, pool, dialect), the schema bootstrap, the store's
own connection with what its failures mean, and the wake-up watchers; shared by a ``SqlStore``
and its scoped views. ``check`` looks at a URL without creating anything."""

from __future__ import annotations

import asyncio
import collections
import itertools
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
import sqlalchemy as sa

from ...errors import NotAFlowkitDatabaseError, StoreUnavailableError, UnsupportedDatabaseError
from . import _errors, _wakeup
from ._connection import Conn, log
from ._errors import Attempt, attempts
from ._iothread import DONE, QUEUED, Job, Lane, Stats
from ._pgconnect import configure_url, guarded_connection_class
from ._postgres import PgConn, PgStatements
from ._schema import ensure_schema
from ._sqlite import BUSY_TIMEOUT_PARAM, READ_ONLY, SqliteConn, SqliteStatements, setup_engine
from ._statements import Statements

T = TypeVar("T")


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
    if u.get_backend_name() == "postgresql":
        u, io_timeout = configure_url(u)
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
    if dialect.setup is not None:
        dialect.setup(engine, setup)
    if u.get_backend_name() == "postgresql":
        _connect_retrying(engine, io_timeout)
    return engine


def _connect_retrying(engine: sa.Engine, io_timeout: float | None) -> None:
    """Every new connection of ``engine``: psycopg 3's with its waits bounded by
    ``io_timeout`` (``guarded_connection_class``); a connect that fails for a transient reason
    (refused, reset, the server starting up) is tried again after 20 ms, 40 ms... within
    ``_errors.RETRY_BUDGET`` seconds, so a restarting server is waited for, briefly."""
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


def _nothing() -> None:
    pass


LANES = {"postgresql": {"write": 4, "read": 4}, "sqlite": {"write": 1, "read": 1}}
"""How many I/O threads (each with a connection) a store runs at most, per kind: on
PostgreSQL several write batches and several reads are in flight at once (their round trips
overlap); SQLite has one writer per file anyway. Lanes start on demand and exit when idle."""

STALL_TIMEOUT = 10.0
"""Seconds a store call may stay stuck on its connection before it is abandoned (the
default of ``SqlStore(stall_timeout=...)`` and of the URL's ``flowkit_stall_timeout``): well
below the default lease TTL (30 s), so a worker learns of a stalled database while its leases
still hold."""

_STALL_PARAM = "flowkit_stall_timeout"


def _take_stall_timeout(url: str) -> tuple[str, float | None]:
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


class Database:
    """One engine, shared by a ``SqlStore`` and its scoped views; the schema is checked (and
    created) once, on the first use. The async face runs the store's calls on I/O threads
    (``_iothread.Lane``: one for writes, one for reads, each with its own ``Conn``); calls made
    without a running loop or without group commit run inline on the caller's thread, on the
    inline lane's connection, one at a time (``io``). ``conn`` and ``io`` are those of the lane
    the current thread serves. ``stats`` counts transactions, statements and batches."""

    def __init__(
        self, url: str, *, wakeups: bool = True, stall_timeout: float | None = None
    ) -> None:
        url, from_url = _take_stall_timeout(url)
        self.engine = create_engine(url)
        self.dialect = self.engine.dialect.name
        self.kind = DIALECTS[self.dialect]
        self.pg = self.dialect == "postgresql"
        self._schema_ready = False
        self._lock = threading.Lock()
        self.wakeups = wakeups  # whether ``watch`` listens (writes emit wake-ups regardless)
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
        self.threaded = not memory  # whether the async face uses the I/O threads
        self.read_lane = True  # reads on lanes of their own (not behind write batches)
        # how many lanes of each kind at most (each with a connection: see ``LANES``)
        self.max_lanes = dict(LANES["postgresql" if self.pg else "sqlite"])
        self._local = threading.local()
        self._inline = Lane("flowkit-inline", self.stats.part(), thread=False)
        self._lanes: dict[str, list[Lane]] = {"read": [], "write": []}
        self._lanes_lock = threading.Lock()
        self._serial = itertools.count(1)
        self.dbapi_error: type[Exception] = self.engine.dialect.loaded_dbapi.Error

    # -- the lanes: the current thread's connection, the I/O threads ---------------------------
    def _here(self) -> Lane:
        lane: Lane | None = getattr(self._local, "lane", None)
        return self._inline if lane is None else lane

    @property
    def conn(self) -> Conn | None:
        """The connection of the lane the current thread serves (``None``: not open yet)."""
        return self._here().conn

    @conn.setter
    def conn(self, c: Conn | None) -> None:
        self._here().conn = c

    @property
    def io(self) -> threading.RLock:
        """The lock of the current thread's connection: one transaction at a time on it."""
        return self._here().io

    @property
    def counts(self) -> collections.Counter[str]:
        """The current thread's part of ``stats``, to count into."""
        return self._here().counts

    def connections(self) -> list[Conn]:
        """Every open connection of the store (tests)."""
        with self._lanes_lock:
            lanes = [self._inline, *(lane for ls in self._lanes.values() for lane in ls)]
        return [lane.conn for lane in lanes if lane.conn is not None]

    def lanes(self, kind: str) -> list[Lane]:
        """The live lanes of ``kind`` (``"read"``/``"write"``; tests, benchmarks)."""
        with self._lanes_lock:
            return [lane for lane in self._lanes[kind] if lane.usable]

    def _lane(self, kind: str) -> Lane:
        """The lane of ``kind`` a job goes to: an idle one, else a new one while there are
        fewer than ``max_lanes[kind]``, else the least loaded (it waits there)."""
        with self._lanes_lock:
            lanes = self._lanes[kind] = [lane for lane in self._lanes[kind] if lane.usable]
            best = min(lanes, key=Lane.load, default=None)
            if best is not None and (best.load() == 0 or len(lanes) >= self.max_lanes[kind]):
                return best
            lane = Lane(f"flowkit-{kind}-{next(self._serial)}", self.stats.part(), thread=True)
            lanes.append(lane)
            lane.start(self._serve)
            return lane

    def _serve(self, lane: Lane) -> None:
        """(on a lane's thread) The thread serves ``lane``: ``conn``, ``io`` are its."""
        self._local.lane = lane

    def submit(
        self,
        loop: asyncio.AbstractEventLoop,
        fn: Callable[[], Any],
        on_done: Callable[[BaseException | None, Any], None],
        *,
        read: bool = False,
        fut: asyncio.Future[Any] | None = None,
    ) -> None:
        """Run ``fn()`` on a write lane (``read``: a read lane; ``_lane`` picks which), then
        ``on_done(exc, value)`` on ``loop``. Without I/O threads (an in-memory database) both
        run now."""
        job = Job(fn, loop, on_done, fut)
        if not self.threaded:
            try:
                out: tuple[BaseException | None, Any] = (None, fn())
            except Exception as exc:
                out = (exc, None)
            job.finish(out)
            return
        kind = "read" if read and self.read_lane else "write"
        while not self._lane(kind).put(job):
            pass  # (retired or stopped meanwhile: a fresh lane takes it)
        if self.stall_timeout:
            job.timer = loop.call_later(self.stall_timeout, self._check, job)

    def _check(self, job: Job) -> None:
        """(on the job's loop) Abandon ``job`` if it has been running on its connection for
        ``stall_timeout``: its caller gets ``StoreUnavailableError`` now, its lane is retired
        and a fresh one runs what was queued behind it."""
        lane = job.lane
        assert lane is not None
        bound = self.stall_timeout
        with lane.cond:
            if job.state == DONE:
                return
            left = bound if job.state == QUEUED else job.started + bound - job.loop.time()
            if left > 0 or lane.current is not job:
                job.timer = job.loop.call_later(max(left, 0.001), self._check, job)
                return
            job.state = DONE  # abandoned: the thread discards what the call returns
            moved = lane.retire()
        with self._lanes_lock:
            kind = next((k for k, ls in self._lanes.items() if lane in ls), None)
            if kind is not None:
                self._lanes[kind].remove(lane)
        for queued in moved:
            target = self._lane(kind or "write")
            while not target.put(queued):
                target = self._lane(kind or "write")
        log.warning(
            "a call to the flowkit database %s stalled for %.1f s: its connection is abandoned",
            self.shown_url,
            bound,
        )
        job.timer = None
        job.finish(
            (
                StoreUnavailableError(
                    f"the flowkit database {self.shown_url} did not answer within {bound:g} s "
                    "(stall_timeout): the call was abandoned; a write may still have committed"
                ),
                None,
            )
        )

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
        with self._lanes_lock:
            lanes = [lane for ls in self._lanes.values() for lane in ls]
            self._lanes = {"read": [], "write": []}
        for lane in lanes:
            lane.stop(self.stall_timeout or None)
        with self._inline.io:
            c, self._inline.conn = self._inline.conn, None
            if c is not None:
                c.close()
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
        if broken:
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
