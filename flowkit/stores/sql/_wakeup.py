"""Wake-ups across processes: a write that leaves a run claimable now emits one with its
``COMMIT`` (``pg_notify``, or a counter row on SQLite); a ``Hub`` per database and event loop
watches for them and calls the workers back. How and why: docs/stores.md, "Wake-ups across
processes"."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import sqlite3
from collections.abc import Callable
from typing import Any, Protocol

import orjson
import sqlalchemy as sa

from ._inotify import drain, open_dir_watch

log = logging.getLogger("flowkit")

CHANNEL = "flowkit_wakeup"
"""The PostgreSQL notification channel (notifications are per database already)."""
SQLITE_COUNTER_KEY = "wakeups"
"""The ``flowkit_meta`` row that SQLite wake-ups increment."""
SQLITE_CHECK_INTERVAL = 0.01
"""Seconds between two ``PRAGMA data_version`` checks of a SQLite watcher (at least: with
``inotify`` it checks only after a file of the database's directory was written)."""
SQLITE_IDLE_CHECK = 1.0
"""Seconds between two checks of a SQLite watcher that ``inotify`` told nothing (a safety net:
a missed file event costs this much at most)."""
SQLITE_SETTLE = (0.0, 0.02, 0.1)
"""After a file event whose check found no new wake-up, a SQLite watcher with ``inotify``
looks again this many times, each this many seconds (plus ``SQLITE_CHECK_INTERVAL``) after the
check before, unless another event comes first: the event tells that a commit wrote its
``-wal`` file, which may be before the commit is visible (it becomes so in the shared-memory
index, which makes no file event), and waiting for the safety net would cost ~0.7 s on
average."""
PG_KEEPALIVE = 10.0
"""Seconds of silence after which a PostgreSQL watcher pings its connection."""
PG_TIMEOUT = 5.0
"""Seconds a PostgreSQL watcher waits for a connection or a ping."""
RECONNECT_MIN = 0.05
"""Seconds before a watcher's first reconnect after a failure (a restart: wake-ups resume at
once); the pause doubles after each failed try, up to ``RECONNECT_MAX``."""
RECONNECT_MAX = 2.0
ANY = "*"
_MAX_PAYLOAD = 7900  # PostgreSQL refuses payloads of 8000 bytes or more

SQLITE_EMIT = (
    f"INSERT INTO flowkit_meta (key, value) VALUES ('{SQLITE_COUNTER_KEY}', '1')"
    " ON CONFLICT (key) DO UPDATE SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)"
)
_SQLITE_READ = f"SELECT value FROM flowkit_meta WHERE key = '{SQLITE_COUNTER_KEY}'"

Callback = Callable[[], None]


class Source(Protocol):
    """The database a hub watches (``_database.Database``)."""

    @property
    def engine(self) -> sa.Engine: ...

    @property
    def dialect(self) -> str: ...

    @property
    def shown_url(self) -> str: ...

    def ensure_schema(self) -> None: ...


def payload(namespaces: set[str | None]) -> str:
    """The notification payload for wake-ups of runs in ``namespaces``."""
    ordered = sorted(namespaces, key=lambda n: (n is not None, n or ""))
    text = orjson.dumps(ordered).decode()
    return text if len(text.encode()) <= _MAX_PAYLOAD else ANY


def matches(data: str, namespace: str | None) -> bool:
    """Whether a watcher of ``namespace`` (``None``: every namespace) wants wake-up ``data``."""
    if namespace is None or data == ANY:
        return True
    try:
        namespaces = orjson.loads(data)
    except orjson.JSONDecodeError:
        return True  # not ours to judge: wake up
    return not isinstance(namespaces, list) or namespace in namespaces


class Hub:
    """The watchers of one database object on one event loop."""

    def __init__(self, db: Source, loop: asyncio.AbstractEventLoop) -> None:
        self.db = db
        self.loop = loop
        self._callbacks: dict[int, tuple[Callback, str | None]] = {}
        self._next = 0
        self.stopped = False
        self.ready = asyncio.Event()  # listening (tests and benchmarks wait for it)
        self.stats = {"received": 0, "fired": 0, "connects": 0, "failures": 0}
        self._streak = 0

    def add(self, callback: Callback, namespace: str | None) -> int:
        self._next += 1
        self._callbacks[self._next] = (callback, namespace)
        return self._next

    def remove(self, token: int) -> bool:
        """Forget a watcher; ``True`` when it was the last one."""
        self._callbacks.pop(token, None)
        return not self._callbacks

    def fire(self, data: str | None = None) -> None:
        """Call the callbacks that want wake-up ``data`` (``None``: all of them)."""
        self.stats["received"] += data is not None
        for callback, namespace in list(self._callbacks.values()):
            if data is None or matches(data, namespace):
                self.stats["fired"] += 1
                try:
                    callback()
                except Exception:  # a watcher's bug must not stop the others
                    log.exception("a wake-up callback failed")

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def _failed(self, what: str, exc: BaseException, delay: float) -> None:
        self.ready.clear()
        self.stats["failures"] += 1
        self._streak += 1
        # the first failure of a streak is worth a warning (and every 20th after it), the
        # retries in between are not
        level = logging.WARNING if self._streak % 20 == 1 else logging.DEBUG
        log.log(
            level,
            "flowkit wake-ups on %s: %s failed (%s); retrying in %.2f s (the timer poll covers"
            " the gap)",
            self.db.shown_url,
            what,
            exc,
            delay,
        )

    def _connected(self) -> None:
        self._streak = 0
        self.stats["connects"] += 1
        self.ready.set()
        self.fire()  # catch up with anything emitted while we were not looking


class SqliteHub(Hub):
    """Checks ``PRAGMA data_version`` on a dedicated connection, on the event loop: at most
    every ``interval``, and on Linux only once a file of the database's directory was written
    (``_inotify``; else every ``SQLITE_IDLE_CHECK``), so an idle engine is not woken a hundred
    times a second."""

    def __init__(self, db: Source, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(db, loop)
        self._conn: sqlite3.Connection | None = None
        self._handle: asyncio.Handle | None = None
        self._version: Any = None
        self._count: Any = None
        self._delay = RECONNECT_MIN
        self.interval = SQLITE_CHECK_INTERVAL
        self._fd: int | None = None  # the inotify descriptor (None: poll every interval)
        self._armed = False
        self._looks: list[float] = []  # the gaps of the looks left after a file event
        # what the next check is for: a file "event", a "look" again after one, the "idle"
        # safety net, or "poll" (without inotify, and while (re)connecting)
        self._cause = "poll"
        self.stats.update(checks=0, looks=0)
        for cause in ("event", "look", "idle", "poll"):
            self.stats[f"fired_{cause}"] = 0  # the wake-ups each kind of check found

    def start(self) -> None:
        self._handle = self.loop.call_soon(self._tick)

    def stop(self) -> None:
        self.stopped = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._disarm()
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _open(self) -> sqlite3.Connection:
        self.db.ensure_schema()  # the counter's table (what any first call would do)
        cargs, cparams = self.db.engine.dialect.create_connect_args(self.db.engine.url)
        cparams = {**cparams, "timeout": 0, "isolation_level": None}
        conn: sqlite3.Connection = self.db.engine.dialect.loaded_dbapi.connect(*cargs, **cparams)
        try:
            conn.execute("PRAGMA busy_timeout = 0")  # never block the event loop
            self._version = conn.execute("PRAGMA data_version").fetchone()[0]
            self._count = self._read(conn)
        except BaseException:
            conn.close()
            raise
        if self._fd is None:
            path = str(cargs[0]).removeprefix("file:").split("?", 1)[0]
            self._fd = open_dir_watch(os.path.dirname(os.path.realpath(path)))
        return conn

    @staticmethod
    def _read(conn: sqlite3.Connection) -> Any:
        row = conn.execute(_SQLITE_READ).fetchone()
        return None if row is None else row[0]

    def _arm(self) -> None:
        """Wait for a file event (or ``SQLITE_IDLE_CHECK``, or the next look again after a
        file event: ``SQLITE_SETTLE``), then check."""
        if self.stopped or self._fd is None:
            return
        self.loop.add_reader(self._fd, self._event)
        self._armed = True
        if self._looks:
            self._handle = self.loop.call_later(self._looks.pop(0), self._look)
        else:
            self._handle = self.loop.call_later(SQLITE_IDLE_CHECK, self._idle)

    def _disarm(self) -> None:
        if self._armed and self._fd is not None:
            self.loop.remove_reader(self._fd)
        self._armed = False

    def _event(self) -> None:
        """A file of the database's directory was written."""
        self._woken("event")

    def _look(self) -> None:
        self.stats["looks"] += 1
        self._woken("look")

    def _idle(self) -> None:
        self._woken("idle")

    def _woken(self, cause: str) -> None:
        self._disarm()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._fd is not None:
            drain(self._fd)
        if cause == "event":  # (a look again after it, unless this check finds the wake-up)
            self._looks = list(SQLITE_SETTLE)
        self._cause = cause
        self._tick()

    def _tick(self) -> None:
        if self.stopped:
            return
        delay = self.interval
        self.stats["checks"] += 1
        try:
            conn = self._conn
            if conn is None:
                self._conn = self._open()
                self._delay = RECONNECT_MIN
                self._connected()
            else:
                version = conn.execute("PRAGMA data_version").fetchone()[0]
                if version != self._version:  # another connection committed
                    self._version = version
                    count = self._read(conn)
                    if count != self._count:
                        self._count = count
                        self._looks.clear()  # (what the file event announced was seen)
                        self.stats[f"fired_{self._cause}"] += 1
                        self.fire(ANY)
        except sqlite3.OperationalError as exc:
            if self._conn is not None and "locked" in str(exc):
                pass  # a moment of contention: look again at the next tick
            else:
                self._close()
                delay = self._delay
                self._delay = min(self._delay * 2, RECONNECT_MAX)
                self._failed("checking the database", exc, delay)
        except Exception as exc:
            self._close()
            delay = self._delay
            self._delay = min(self._delay * 2, RECONNECT_MAX)
            self._failed("checking the database", exc, delay)
        self._cause = "poll"
        if not self.stopped:
            # (with inotify: not before ``delay`` either, so a busy database costs no more
            # checks than polling did)
            healthy = self._fd is not None and self._conn is not None
            self._handle = self.loop.call_later(delay, self._arm if healthy else self._tick)


def _pg_connect_params(db: Source) -> dict[str, Any]:
    _, params = db.engine.dialect.create_connect_args(db.engine.url)
    params = dict(params)
    params.pop("context", None)  # the sync connection's adapters: not needed to LISTEN
    params.pop("async_creator_fn", None)
    params.setdefault("application_name", "flowkit wake-ups")  # for pg_stat_activity
    return params


class PgHub(Hub):
    """A dedicated ``LISTEN`` connection (psycopg 3), reconnecting with back-off."""

    def __init__(self, db: Source, loop: asyncio.AbstractEventLoop, psycopg: Any) -> None:
        super().__init__(db, loop)
        self._psycopg = psycopg
        self._params = _pg_connect_params(db)
        self._task: asyncio.Task[None] | None = None
        self._conn: Any = None
        self.backend_pid: int | None = None

    def start(self) -> None:
        self._task = self.loop.create_task(self._run())

    def stop(self) -> None:
        self.stopped = True
        task, self._task = self._task, None
        cancelled = False
        if task is not None and not task.done():
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                task.cancel()
                cancelled = True
        if not cancelled:
            self._force_close()

    def _force_close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()

    async def _run(self) -> None:
        delay = RECONNECT_MIN
        query = f"LISTEN {CHANNEL}"
        while not self.stopped:
            try:
                conn = self._conn = await asyncio.wait_for(
                    self._psycopg.AsyncConnection.connect(**self._params, autocommit=True),
                    PG_TIMEOUT,
                )
                try:
                    await conn.execute(query)
                    self.backend_pid = conn.info.backend_pid
                    delay = RECONNECT_MIN
                    self._connected()
                    while True:
                        async for note in conn.notifies(timeout=PG_KEEPALIVE):
                            if note.channel == CHANNEL:
                                self.fire(note.payload)
                        # quiet for a while: make sure the peer is still there
                        await asyncio.wait_for(conn.execute("SELECT 1"), PG_TIMEOUT)
                finally:
                    self._conn = None
                    await conn.close()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed("listening", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX)


def make_hub(db: Source, loop: asyncio.AbstractEventLoop) -> Hub | None:
    """The hub for ``db`` on ``loop``, or ``None`` when wake-ups cannot be watched there (an
    in-memory SQLite database, PostgreSQL without psycopg 3)."""
    if db.dialect == "sqlite":
        cargs, _ = db.engine.dialect.create_connect_args(db.engine.url)
        if not cargs or cargs[0] in ("", ":memory:") or "mode=memory" in str(cargs[0]):
            return None
        return SqliteHub(db, loop)
    try:
        import psycopg
    except ImportError:
        log.warning("flowkit wake-ups on PostgreSQL need psycopg 3; polling only")
        return None
    if "timeout" not in inspect.signature(psycopg.AsyncConnection.notifies).parameters:
        log.warning("flowkit wake-ups need psycopg >= 3.2 (notifies(timeout=)); polling only")
        return None
    return PgHub(db, loop, psycopg)


__all__ = [
    "ANY",
    "CHANNEL",
    "SQLITE_CHECK_INTERVAL",
    "SQLITE_COUNTER_KEY",
    "SQLITE_EMIT",
    "SQLITE_IDLE_CHECK",
    "SQLITE_SETTLE",
    "Hub",
    "PgHub",
    "SqliteHub",
    "make_hub",
    "matches",
    "payload",
]
